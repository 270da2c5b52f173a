"""Vetting compiles: a module that crashes or outruns the compiler costs a child process, not the arbiter."""

from __future__ import annotations

import hashlib
import os
import signal
import struct
import subprocess
import threading
import time

import numpy as np
import pytest

import libshare
from libshare._proc import running
from libshare.errors import InvalidSubmission

from tests.arbiter.conftest import run_daemon, wait_until


def saxpy_round_trip(session) -> bool:
    """One saxpy through the arbiter, checked against the expected values."""
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(256), session.array(256)
    x[:], y[:] = np.arange(256), 1.0
    session.dispatch(program, 4, [x, y], struct.pack("If", 256, 2.0)).wait(30)
    return bool(np.array_equal(y, 2.0 * np.arange(256) + 1.0))


def children(pid: int) -> set[int]:
    """Pids of the direct children of process ``pid``."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.update(int(child) for child in f.read().split())
        except FileNotFoundError:  # a thread that ended since the listing
            pass
    return found


@pytest.fixture
def crashing_daemon(tmp_path, vulkan_device_name):
    """A daemon whose compiler children crash (SIGSEGV) on the vadd module; yields (process, pipe dir)."""
    vadd = libshare.shaders.path("vadd").read_bytes()
    yield from run_daemon(tmp_path / "pipe", LIBSHARE_TEST_HOOKS="1",
                          LIBSHARE_TEST_CRASH_COMPILES=hashlib.sha256(vadd).hexdigest())


def test_a_module_that_crashes_the_compiler_is_refused_and_the_arbiter_lives(crashing_daemon):
    process, pipe_dir = crashing_daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as honest, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as hostile:
        assert saxpy_round_trip(honest)
        with pytest.raises(InvalidSubmission, match="crashed the driver's compiler.*SIGSEGV"):
            hostile.load_program(libshare.shaders.path("vadd"))
        assert process.poll() is None
        before = children(process.pid)
        with pytest.raises(InvalidSubmission, match="crashed"):  # remembered: no child is asked again
            honest.load_program(libshare.shaders.path("vadd"))
        assert children(process.pid) == before
        assert saxpy_round_trip(honest) and saxpy_round_trip(hostile)
        assert hostile.load_program(libshare.shaders.path("sum")) is not None  # a new child vets it
    assert "refused" in (pipe_dir / "server.log").read_text()


def slow_module(directory, device_is_cpu: bool) -> bytes:
    """A valid module whose vetting outlasts a 2 s limit, new code each run (no shader cache hit).

    On lavapipe, a 470 kB kernel of 3,000 dependent sin() steps: 0.07 s to create its pipeline
    and 8.8 s to run it once (llvmpipe's machine-code compile), against 0.06 s for saxpy. A
    GPU's compiler took it in stride (an H100 vetted it within the limit), so there the kernel
    loops 4e9 dependent rounds in its trial run instead (lavapipe would cut that loop at 65,535
    trips)."""
    salt = time.time_ns() % 100_000
    if device_is_cpu:
        body = "\n".join(f"  a = a * {1.0001 + k * 1e-7:.7f} + sin(a + {k}.0);" for k in range(3000))
        source = ("layout(std430, binding = 0) buffer B { float v[]; };\n"
                  f"void main() {{\n  uint i = gl_GlobalInvocationID.x; float a = v[i];\n{body}\n"
                  f"  v[i] = a + {salt}.0;\n}}\n")
    else:
        source = ("layout(std430, binding = 0) buffer B { uint v[]; };\n"
                  f"void main() {{\n  uint i = gl_GlobalInvocationID.x; uint x = v[i] + i + {salt}u;\n"
                  "  for (uint k = 0u; k < 4000000000u; ++k) {\n"
                  "    x ^= x << 13; x ^= x >> 17; x ^= x << 5; x = x * 1664525u + 1013904223u;\n  }\n"
                  "  v[i] = x;\n}\n")
    (directory / "slow.comp").write_text("#version 450\nlayout(local_size_x = 64) in;\n" + source)
    subprocess.run(["glslangValidator", "-V", str(directory / "slow.comp"), "-o", str(directory / "slow.spv")],
                   check=True, capture_output=True)
    return (directory / "slow.spv").read_bytes()


def test_a_compile_past_the_time_limit_is_refused(tmp_path, vulkan_device_is_cpu):
    module = slow_module(tmp_path, vulkan_device_is_cpu)
    for process, pipe_dir in run_daemon(tmp_path / "pipe", LIBSHARE_COMPILE_TIMEOUT="2"):
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
            assert saxpy_round_trip(session)  # the child is warm: what follows times the compile alone
            with pytest.raises(InvalidSubmission, match="took more than 2 s of CPU"):
                session.load_program(module)
            assert process.poll() is None
            assert session.load_program(libshare.shaders.path("sum")) is not None  # a new child vets it
            assert saxpy_round_trip(session)


@pytest.fixture
def held(tmp_path, vulkan_device_name):
    """A daemon (vetting limit 3 s of CPU, 6 s on the clock) whose vetting child holds the vadd module, using
    no CPU, until the FIFO it reads is closed: yields (pipe dir, the FIFO's path)."""
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    vadd = libshare.shaders.path("vadd").read_bytes()
    yield from ((pipe_dir, fifo) for _process, pipe_dir in run_daemon(
        tmp_path / "pipe", LIBSHARE_COMPILE_TIMEOUT="3", LIBSHARE_TEST_HOOKS="1",
        LIBSHARE_TEST_HOLD_COMPILES=f"{hashlib.sha256(vadd).hexdigest()}={fifo}"))


def loading(session, module) -> tuple[threading.Thread, list]:
    """``session.load_program(module)`` in a thread: the thread, and a list that gets its outcome."""
    outcome = []

    def load():
        try:
            outcome.append(session.load_program(module))
        except libshare.LibshareError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    return thread, outcome


def test_a_vet_that_waits_past_its_cpu_limit_on_the_clock_is_not_refused(held):
    """The limit counts the child's CPU, not the clock: a child kept from running (here held on a FIFO,
    as a busy machine keeps it waiting for a core) is not refused when the clock passes the limit."""
    pipe_dir, fifo = held
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        assert saxpy_round_trip(session)
        thread, outcome = loading(session, libshare.shaders.path("vadd"))
        with open(fifo, "wb"):  # opens once the child reads it: the compile is held from here
            time.sleep(4)  # the stimulus: the clock passes the 3 s limit (no condition to wait for)
        thread.join(120)
        assert len(outcome) == 1 and isinstance(outcome[0], libshare.Program), outcome


def test_a_vet_held_past_its_limit_on_the_clock_is_refused(held):
    """... but a child that answers nothing for WALL_FACTOR times the limit on the clock is killed and the
    module refused, saying so."""
    pipe_dir, fifo = held
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        assert saxpy_round_trip(session)
        thread, outcome = loading(session, libshare.shaders.path("vadd"))
        with open(fifo, "wb"):  # held until the refusal
            thread.join(120)
        assert len(outcome) == 1 and isinstance(outcome[0], InvalidSubmission), outcome
        assert "(or 6 s waiting)" in str(outcome[0])
        assert saxpy_round_trip(session)


def test_a_load_that_vets_past_the_request_bound_is_answered_and_the_session_lives(tmp_path, vulkan_device_is_cpu,
                                                                                    monkeypatch):
    """A load_program may take longer than other requests (the arbiter vets the module first; two
    test suites at once once saw a minute go by): the session waits for the answer instead of
    taking the arbiter for lost at the request bound (here cut to 1 s, the vetting limit 2 s)."""
    module = slow_module(tmp_path, vulkan_device_is_cpu)
    monkeypatch.setattr(libshare.client.exchange, "REPLY_TIMEOUT", 1.0)
    for process, pipe_dir in run_daemon(tmp_path / "pipe", LIBSHARE_COMPILE_TIMEOUT="2"):
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
            assert saxpy_round_trip(session)
            with pytest.raises(InvalidSubmission, match="took more than 2 s of CPU"):
                session.load_program(module)
            assert session.stats()["client_id"] == session.client_id  # not lost: requests go on
            assert saxpy_round_trip(session)


def test_a_new_module_that_waits_past_the_queue_bound_is_told_to_retry_and_not_refused(tmp_path, vulkan_device_is_cpu,
                                                                                        monkeypatch):
    """Both vetting processes busy (two slow modules, each until its 2 s limit): a third module waits
    _QUEUE_WAIT (cut to 0.5 s) and is answered Timeout; it is not refused, and vets once one is free."""
    from libshare.arbiter.programs import compiler as _compiler

    monkeypatch.setattr(_compiler, "_QUEUE_WAIT", 0.5)
    compilers = _compiler.Compilers("", 2.0)
    slow = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        slow.append(slow_module(tmp_path / name, vulkan_device_is_cpu))
    assert slow[0] != slow[1]
    outcomes = []

    def vet(module):
        try:
            compilers.vet(module, 1, 0, "main")
        except Exception as exc:  # the 2 s limit: InvalidSubmission
            outcomes.append(exc)

    vetting = [threading.Thread(target=vet, args=(module,)) for module in slow]
    try:
        for thread in vetting:
            thread.start()
        wait_until(lambda: compilers._running == 2, 30, "both vetting processes busy")
        saxpy = libshare.shaders.path("saxpy").read_bytes()
        with pytest.raises(libshare.Timeout, match="stayed busy with other new programs for 0.5 s"):
            compilers.vet(saxpy, 2, 8, "main")
        for thread in vetting:
            thread.join(120)
        assert [type(exc) for exc in outcomes] == [InvalidSubmission, InvalidSubmission]
        compilers.vet(saxpy, 2, 8, "main")  # not refused: vetted now
    finally:
        for thread in vetting:
            thread.join(120)
        compilers.close()


@pytest.mark.parametrize("limit, below", [("2", True), (None, False), ("200", False)],
                         ids=["2 s limit", "default limit", "200 s limit"])
def test_a_session_waits_for_load_program_as_long_as_its_arbiter_may_take(tmp_path, limit, below):
    """The welcome carries the arbiter's bound on a load_program answer; the session waits that long and a
    margin (at least _LOAD_TIMEOUT), so a long vetting limit does not make a live arbiter look lost. A
    vet's bound on the clock is WALL_FACTOR times its CPU limit."""
    from libshare.client.attachment import LOAD_MARGIN as _LOAD_MARGIN, LOAD_TIMEOUT as _LOAD_TIMEOUT
    from libshare.arbiter.programs.compiler import _QUEUE_WAIT, _START_TIMEOUT, WALL_FACTOR
    from libshare.arbiter.drain.tasks import CALL_TIMEOUT

    env = {"LIBSHARE_COMPILE_TIMEOUT": limit} if limit else {}
    seconds = WALL_FACTOR * float(limit or libshare.settings.default("compile_timeout"))
    arbiter_bound = _QUEUE_WAIT + 2 * (_START_TIMEOUT + seconds) + seconds + CALL_TIMEOUT
    for process, pipe_dir in run_daemon(tmp_path / "pipe", **env):
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
            assert session._gate.attached.load_timeout == max(_LOAD_TIMEOUT, arbiter_bound + _LOAD_MARGIN)
            assert saxpy_round_trip(session)
    assert below == (arbiter_bound + _LOAD_MARGIN < _LOAD_TIMEOUT)  # the floor, or the arbiter's bound


@pytest.mark.parametrize("bound, waited", [(None, 300.0), ("600", 300.0), (True, 300.0), (-5, 300.0), (0, 300.0),
                                           (float("nan"), 300.0), (float("inf"), 300.0), (1e9, 300.0),
                                           (100, 300.0), (400, 430.0), (999_000.5, 999_030.5)])
def test_a_welcomes_load_bound_is_believed_only_when_it_is_a_sane_number(bound, waited):
    from libshare.client.attachment import load_timeout as _load_timeout

    assert _load_timeout(bound) == waited


def test_a_compiler_child_killed_while_idle_is_replaced_without_blaming_the_module(daemon):
    process, pipe_dir = daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        assert saxpy_round_trip(session)  # a child has vetted saxpy and waits for more
        idle = wait_until(lambda: children(process.pid), 30, "a compiler child")
        for pid in idle:
            os.kill(pid, signal.SIGKILL)
        assert session.load_program(libshare.shaders.path("vadd")) is not None


def test_compiler_children_end_with_the_arbiter(daemon):
    process, pipe_dir = daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        assert saxpy_round_trip(session)
    kids = wait_until(lambda: children(process.pid), 30, "a compiler child")
    process.kill()
    process.wait()
    for pid in kids:
        wait_until(lambda: not running(pid), 30, f"compiler {pid} to exit")  # gone, or a zombie


def test_the_list_of_vetted_modules_is_read_as_hostile(tmp_path):
    """The pipe directory's "vetted" list (modules the arbiter before this one vetted) can be
    written by any process of the arbiter's uid: only whole 32-byte digests count, read up to the
    bound, and a module it does not name is still vetted."""
    from libshare.arbiter.programs.compiler import _MAX_PASSED, Compilers

    good = hashlib.sha256(b"vetted module").digest()
    path = tmp_path / "vetted"
    path.write_bytes(b"\n".join([b"\xff\xfe not text", b"zz" * 32, b"ab" * 16, good.hex().encode(),
                                 b"0" * 10_000_000]))  # garbage, a short digest, one good, a huge line
    compilers = Compilers("", 1.0)
    compilers.remember_passed(path)
    assert compilers._passed == {good}
    many = tmp_path / "many"
    many.write_text("\n".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(_MAX_PASSED + 100)))
    compilers = Compilers("", 1.0)
    compilers.remember_passed(many)
    assert len(compilers._passed) == _MAX_PASSED  # bounded
    compilers.remember_passed(tmp_path / "absent")  # no list: nothing trusted, nothing raised
