"""The disk an attacker can make the arbiter fill, bounded: server.log and the shader cache.

A client that attaches in a loop writes two lines to server.log an attach, and one that loads
distinct modules leaves a shader-cache entry each in the pipe directory (usually tmpfs, which is
memory). Each test performs the attack against a real daemon arbiter on lavapipe, with an honest
session beside it whose saxpy results are checked, at the smallest bound the settings allow.
"""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import libshare
from libshare.daemon.logs import ROTATED

from tests.arbiter import _spirv_attacks as attacks
from tests.arbiter.conftest import run_daemon
from tests._wait import wait_until

BOUND = 64 << 10  # the smallest LIBSHARE_LOG_MAX_SIZE and LIBSHARE_SHADER_CACHE_MAX_SIZE
LINE = 4096  # more than any one line of server.log here
SALT = 12345.0  # the constant of salted() that each distinct module changes


class Honest:
    """A session that does saxpy round trips, each checked against numpy."""

    def __init__(self, pipe_dir: Path):
        self.session = libshare.connect(name="honest", mode="daemon", pipe_directory=pipe_dir)
        self.program = self.session.load_program(libshare.shaders.path("saxpy"))
        self.x, self.y = self.session.array(1024, np.float32), self.session.array(1024, np.float32)
        self.done = 0

    def round_trip(self) -> None:
        """One saxpy (y = a x + y, a new ``a`` each time) on the device, checked."""
        a = float(self.done % 7 + 1)
        self.x[:] = np.arange(1024, dtype=np.float32)
        self.y[:] = 1.0
        self.session.dispatch(self.program, 16, [self.x, self.y], struct.pack("If", 1024, a)).wait(60)
        assert np.array_equal(self.y, a * np.arange(1024, dtype=np.float32) + 1.0), f"round trip {self.done}"
        self.done += 1

    def close(self) -> None:
        """End the session."""
        self.session.close()


@contextlib.contextmanager
def daemon_with(tmp_path, monkeypatch, **env):
    """A daemon arbiter whose environment adds ``env`` (and names no shader cache of Mesa's own), with
    an honest session; yields (pipe directory, Honest)."""
    for variable in ("MESA_SHADER_CACHE_DIR", "MESA_SHADER_CACHE_MAX_SIZE", "LIBSHARE_LOG_DIRECTORY"):
        monkeypatch.delenv(variable, raising=False)
    with contextlib.contextmanager(run_daemon)(tmp_path / "pipe", **env) as (_process, pipe_dir):
        honest = Honest(pipe_dir)
        try:
            yield pipe_dir, honest
        finally:
            honest.close()


def test_server_log_is_rotated_at_its_bound_under_an_attach_loop(tmp_path, monkeypatch, vulkan_device_name):
    """Attach after attach (two lines each) until server.log has been rotated twice: it is renamed
    server.log.1 at the bound, and again (one older copy only), and logging goes on."""
    with daemon_with(tmp_path, monkeypatch, LIBSHARE_LOG_MAX_SIZE="64K") as (pipe_dir, honest):
        log, rotated = pipe_dir / "server.log", pipe_dir / ("server.log" + ROTATED)
        seen: list[int] = []  # the inodes server.log.1 has had
        attaches, most = 0, 8 * BOUND // 200  # an attach writes some 290 bytes: 4 bounds' worth at least
        while len(seen) < 2 and attaches < most:
            with libshare.connect(name=f"attacker-{attaches}", mode="daemon", pipe_directory=pipe_dir):
                attaches += 1
            with contextlib.suppress(FileNotFoundError):
                if not seen or rotated.stat().st_ino != seen[-1]:
                    seen.append(rotated.stat().st_ino)
            if attaches % 40 == 0:
                honest.round_trip()
        assert len(seen) == 2, f"server.log was rotated {len(seen)} times in {attaches} attaches"
        # One attach after the second rotation was seen: its lines go to the new server.log (the last
        # attach's own lines may have been written before the rotation they caused, into server.log.1).
        with libshare.connect(name="after-rotation", mode="daemon", pipe_directory=pipe_dir):
            pass
        last = "(after-rotation, pid "
        wait_until(lambda: last in log.read_text(), 30, f"{last} in server.log: logging goes on after a rotation")
        honest.round_trip()
        assert log.stat().st_size < BOUND + LINE and BOUND <= rotated.stat().st_size < BOUND + LINE
        assert sorted(f.name for f in pipe_dir.glob("server.log*")) == ["server.log", "server.log.1"]
        assert honest.done >= 2


def salted_module(directory: Path) -> Callable[[int], bytes]:
    """``salted(n)``: a valid storage-buffer kernel whose code holds the float ``n`` (a distinct
    module, and a distinct shader-cache entry, for each ``n``); compiled once."""
    if (missing := attacks.have_tools()) is not None:
        pytest.skip(missing)
    base = attacks.compile_glsl(attacks.slow_compile_glsl(1, int(SALT)), directory, "salted")
    constant = struct.pack("<f", SALT)
    assert base.count(constant) == 1
    return lambda n: base.replace(constant, struct.pack("<f", float(n)))


def run_distinct(session, salted: Callable[[int], bytes], count: int, each: Callable[[int], object]) -> None:
    """Load, run once and free ``salted(n)`` for ``n`` below ``count`` in ``session``; ``each(n)`` after each."""
    buffer = session.array(64, np.float32)
    for n in range(count):
        program = session.load_program(salted(n))
        session.dispatch(program, 1, [buffer], struct.pack("If", 64, 1.0)).wait(60)
        session.free(program)
        each(n)


def cache_usage(pipe_dir: Path) -> tuple[int, int]:
    """(entries, bytes on disk) of the shader cache in the pipe directory, Mesa's index left out."""
    entries = [f for f in (pipe_dir / "shader-cache").rglob("*") if f.is_file() and f.name != "index"]
    return len(entries), sum(f.stat().st_blocks * 512 for f in entries)


def test_the_shader_cache_is_bounded_under_distinct_modules(tmp_path, monkeypatch, vulkan_device_name):
    """A client loads, runs and frees distinct modules, each of which leaves an entry in the shader
    cache: the cache stays within LIBSHARE_SHADER_CACHE_MAX_SIZE, its oldest entries evicted."""
    salted = salted_module(tmp_path / "glsl")
    with daemon_with(tmp_path, monkeypatch, LIBSHARE_SHADER_CACHE_MAX_SIZE="64K") as (pipe_dir, honest):
        loads = 48
        with libshare.connect(name="attacker", mode="daemon", pipe_directory=pipe_dir) as attacker:
            run_distinct(attacker, salted, loads, lambda n: n % 8 or honest.round_trip())
        honest.round_trip()
        entries, used = cache_usage(pipe_dir)
        assert 0 < entries < loads, f"{entries} shader-cache entries after {loads} distinct modules"
        assert used <= BOUND + LINE, f"the shader cache holds {used} bytes"
