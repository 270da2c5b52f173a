"""Fixtures for arbiter tests: a real daemon in a temporary pipe directory, client processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, stop_process


@pytest.fixture
def daemon(tmp_path, vulkan_device_name):
    """A running ``python -m libshare.arbiter`` on lavapipe; yields (process, pipe directory)."""
    yield from run_daemon(tmp_path / "pipe")


@pytest.fixture
def hooked_daemon(tmp_path, vulkan_device_name):
    """Like ``daemon``, with the test hooks (``inject_fault``) enabled."""
    yield from run_daemon(tmp_path / "pipe", LIBSHARE_TEST_HOOKS="1")


def run_daemon(pipe_dir, **env):
    """Start an arbiter on ``pipe_dir`` with extra ``env``; yield (process, pipe_dir); stop it."""
    stderr_path = pipe_dir.parent / f"{pipe_dir.name}.stderr"  # a file: a full pipe would stall the arbiter
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir)],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **env})
    deadline = time.monotonic() + 30
    while not (pipe_dir / "control").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"arbiter did not start: {stderr_path.read_text()[-2000:]}")
        time.sleep(0.05)
    try:  # (a failure inside ``with contextmanager(run_daemon)(...)`` is thrown in here: stop the arbiter all the same)
        yield process, pipe_dir
    finally:
        stop_process(process)


def open_fds(pid: int) -> int:
    """How many file descriptors process ``pid`` holds, not counting ring memfds: the arbiter keeps
    one only for the spare rings it makes ahead of its next clients (a client's ring keeps none
    there), on a thread of their own, so they come and go beside what a test counts."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:libshare-ring")
        except OSError:  # closed meanwhile
            pass
    return count


def accepted_connections(pid: int) -> int:
    """How many connections accepted on its listening sockets (sessions and control connections
    alike) process ``pid`` holds open now: its socket descriptors that /proc/net/unix lists as
    connected (state 03) under the path one of its listening sockets was bound to (the arbiter
    binds a temporary name and renames it, so the path is not the socket's name now)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    with open("/proc/net/unix") as table:
        next(table)  # Num RefCount Protocol Flags Type St Inode Path
        rows = [fields for fields in map(str.split, table) if len(fields) >= 8 and fields[6] in inodes]
    listening = {fields[7] for fields in rows if int(fields[3], 16) & 0x10000}  # __SO_ACCEPTCON
    return sum(fields[5] == "03" and fields[7] in listening for fields in rows)


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll ``predicate`` until it returns something true, and return that; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def start_client(role: str, pipe_dir, *args) -> subprocess.Popen:
    """Start ``tests/arbiter/_client.py ROLE PIPE_DIR ARGS`` with its stdout piped."""
    return subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", role, str(pipe_dir), *map(str, args)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
