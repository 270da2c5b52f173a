"""Where the arbiter's threads run (libshare/arbiter/policy/placement.py).

A daemon on a CPU device (unless started with --no-placement or LIBSHARE_PLACEMENT=0) puts its
engine thread (named libshare-engine) and the threads the driver started with the device on one
core, and every other thread, those started later included, on the other cores. An embedded
arbiter moves none of its process's threads; nor does a daemon allowed one core only, or one
with placement turned off, nor one on a GPU (where no driver thread runs the work). Each thread's cores are read from
/proc/PID/task/TID/status (Cpus_allowed_list), as the kernel holds them.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.protocol import control as _control
from libshare._proc import parent_of, stat_fields
from libshare.arbiter import Arbiter

from tests._busy import busy_iterations
from tests.conftest import ROOT, stop_process
from tests.arbiter.conftest import rest_seen_during, run_daemon, wait_until

ALL_CORES = frozenset(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(ALL_CORES) < 2, reason="placement needs at least two cores")


def threads(pid: int) -> dict[int, tuple[str, frozenset[int]]]:
    """Every thread of ``pid``, but Mesa's shader-cache writer: its name and the cores it may run on.

    The cache writer (named like ``python:disk$0``) asks for every core itself when it starts
    (Mesa's util_queue does so for it), whenever that is. It then sets its nice value to 19 and
    only then its name: on a busy machine it can sit at nice 19, still named ``python``, for a
    while, so either mark tells it apart."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            fields = stat_fields(pid, int(tid))
        except OSError:  # it ended meanwhile
            continue
        if fields is None:  # it ended meanwhile
            continue
        nice = int(fields[16])
        if ":disk$" in name or nice == 19:
            continue
        cores = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M).group(1)
        found[int(tid)] = (name, frozenset(_cores(cores)))
    return found


def _cores(text: str):
    for part in text.split(","):
        low, _, high = part.partition("-")
        yield from range(int(low), int(high or low) + 1)


def check_placed(pid: int, pipe_dir) -> int:
    """Assert that ``pid``'s engine shares the core its log names with the driver's threads alone,
    and that every other thread runs on every other core; return that core."""
    named = re.findall(r"engine and driver threads on core (\d+)", (pipe_dir / "server.log").read_text())
    assert named, "the arbiter did not say where it placed its engine"
    core = int(named[-1])
    placed = threads(pid)
    (engine,) = [cores for name, cores in placed.values() if name == "libshare-engine"]
    assert engine == {core}, f"the engine may run on {sorted(engine)}, not on core {core} alone"
    drivers = {tid: name for tid, (name, cores) in placed.items() if cores == {core} and name != "libshare-engine"}
    elsewhere = {(tid, name): cores for tid, (name, cores) in placed.items()
                 if tid not in drivers and name != "libshare-engine"}
    assert drivers, f"nothing but the engine on core {core}: lavapipe's queue thread is not there"
    assert elsewhere and all(cores == ALL_CORES - {core} for cores in elsewhere.values()), (
        f"threads off core {core} should run on all the others: {elsewhere}")
    return core


def check_unplaced(pid: int, pipe_dir) -> None:
    """Assert that every thread of ``pid`` may run on every core, and that its log names no device core."""
    assert all(cores == ALL_CORES for _, cores in threads(pid).values()), threads(pid)
    assert "engine and driver threads on core" not in (pipe_dir / "server.log").read_text()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and parent_of(int(entry.name)) == pid:  # None once it ended
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def round_trip(pipe_dir) -> None:
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        x[:], y[:] = 1.0, 2.0
        for _ in range(20):
            session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0)).wait(30)
        assert np.all(y == 22.0)


@pytest.fixture
def placed(tmp_path, vulkan_device_is_cpu):
    """A daemon placed whatever the environment says (LIBSHARE_PLACEMENT=1), with the test hooks."""
    if not vulkan_device_is_cpu:
        pytest.skip("placement is for CPU devices (lavapipe); a daemon on a GPU is not placed, as "
                    "test_a_daemon_places_by_default_and_not_with_no_placement checks")
    yield from run_daemon(tmp_path / "pipe", LIBSHARE_PLACEMENT="1", LIBSHARE_TEST_HOOKS="1")


@needs_two_cores
def test_a_daemon_puts_its_engine_with_the_drivers_threads_and_the_rest_elsewhere(placed):
    process, pipe_dir = placed
    core = check_placed(process.pid, pipe_dir)
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir):  # its session thread starts now
        assert check_placed(process.pid, pipe_dir) == core
    round_trip(pipe_dir)  # its first load of saxpy is vetted in a compiler child
    assert check_placed(process.pid, pipe_dir) == core
    compilers = [pid for pid in children(process.pid) if "libshare.arbiter.programs.compiler" in cmdline(pid)]
    assert compilers, "no vetting compiler ran"
    for pid in compilers:  # on the arbiter's cores, not its placed threads': llvmpipe keys its cache by them
        assert threads(pid)[pid][1] == ALL_CORES, threads(pid)


@needs_two_cores
def test_a_recreated_device_is_placed_again(placed):
    process, pipe_dir = placed
    first_engine = [tid for tid, (name, _) in threads(process.pid).items() if name == "libshare-engine"]
    holder = subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", "hold", str(pipe_dir), "holder"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert _control.run("inject_fault", str(holder.pid), pipe_directory=pipe_dir) == "FAULT"
    finally:
        holder.communicate("\n", timeout=60)
    wait_until(lambda: _control.run("get_server_status", pipe_directory=pipe_dir) == "ACTIVE", what="recovery")
    engines = [tid for tid, (name, _) in threads(process.pid).items() if name == "libshare-engine"]
    assert engines and engines != first_engine, "the device was not recreated with an engine of its own"
    check_placed(process.pid, pipe_dir)
    assert (pipe_dir / "server.log").read_text().count("engine and driver threads on core") == 2
    round_trip(pipe_dir)


def test_a_daemon_allowed_one_core_is_not_placed(tmp_path, vulkan_device_name):
    core = min(ALL_CORES)
    os.sched_setaffinity(0, {core})  # the daemon inherits it
    try:
        running = run_daemon(tmp_path / "pipe", LIBSHARE_PLACEMENT="1")
        process, pipe_dir = next(running)
    finally:
        os.sched_setaffinity(0, ALL_CORES)
    try:
        wait_until(lambda: all(cores == {core} for _, cores in threads(process.pid).values()), timeout=10,
                   what=f"every thread on core {core} alone")  # the cache writer starting may be mid-way
        round_trip(pipe_dir)
        assert "engine and driver threads on core" not in (pipe_dir / "server.log").read_text()
    finally:
        next(running, None)


@needs_two_cores
def test_a_daemon_with_placement_off_leaves_every_thread_on_every_core(tmp_path, vulkan_device_name):
    running = run_daemon(tmp_path / "pipe", LIBSHARE_PLACEMENT="0")
    process, pipe_dir = next(running)
    try:
        round_trip(pipe_dir)
        check_unplaced(process.pid, pipe_dir)
    finally:
        next(running, None)


@needs_two_cores
@pytest.mark.parametrize("option", [[], ["--no-placement"]], ids=["default", "no-placement"])
def test_a_daemon_places_by_default_and_not_with_no_placement(tmp_path, vulkan_device_is_cpu, option):
    """Placed by default on a CPU device; not with --no-placement, nor on a GPU."""
    pipe_dir = tmp_path / "pipe"
    with open(tmp_path / "daemon.stderr", "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir),
                                    *option], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                   env={k: v for k, v in os.environ.items() if k != "LIBSHARE_PLACEMENT"})
    try:
        wait_until(lambda: (pipe_dir / "control").exists() or process.poll() is not None, what="the daemon")
        assert process.poll() is None, (tmp_path / "daemon.stderr").read_text()[-2000:]
        round_trip(pipe_dir)
        if option or not vulkan_device_is_cpu:
            check_unplaced(process.pid, pipe_dir)
        else:
            check_placed(process.pid, pipe_dir)
    finally:
        stop_process(process)


def test_an_embedded_arbiter_moves_none_of_its_process_threads(tmp_path, vulkan_device_name):
    before = {tid: cores for tid, (_, cores) in threads(os.getpid()).items()}
    pipe_dir = tmp_path / "pipe"
    pipe_dir.mkdir(mode=0o700)
    arbiter = Arbiter()
    try:
        arbiter.serve(pipe_dir / "control")
        now = threads(os.getpid())
        assert all(now[tid][1] == cores for tid, cores in before.items() if tid in now), "a thread was moved"
        engines = [cores for name, cores in now.values() if name == "libshare-engine"]
        assert engines and all(cores == os.sched_getaffinity(0) for cores in engines), (
            f"an embedded engine runs on {engines}, not on every core this process may use")
        round_trip(pipe_dir)
    finally:
        arbiter.close()


@pytest.mark.parametrize("placement", ["1", "0"], ids=["placed", "unplaced"])
def test_the_engine_sleeps_while_a_long_dispatch_runs(tmp_path, vulkan_device_name, placement):
    """The engine polls a submission's fence only while it is young: one that has run longer is
    slept on. Before, it polled every long one in 25 us naps: placed, that took half the core
    the dispatch ran on (a 4-second dispatch took 5.0 s against 2.6 s), and unplaced it burnt a
    core of its own. While the long dispatch runs, five looks in a row find the engine's thread
    asleep. (The CPU it uses meanwhile against the dispatch's time: bench/test_engine_mechanism_bench.py.)"""
    running = run_daemon(tmp_path / "pipe", LIBSHARE_PLACEMENT=placement)
    process, pipe_dir = next(running)
    try:
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
            program = session.load_program(libshare.shaders.path("busy"))
            data = session.array(1 << 16, np.uint32)
            session.dispatch(program, 1024, [data], struct.pack("II", 1 << 16, 16)).wait(30)  # compiled
            (engine,) = [tid for tid, (name, _) in threads(process.pid).items() if name == "libshare-engine"]
            push = struct.pack("II", 1 << 16, busy_iterations(60000))  # ~1.5 s on this VM's lavapipe
            tickets = rest_seen_during(process.pid, [engine],
                                       lambda size: [session.dispatch(program, 1024, [data], push) for _ in range(size)],
                                       "the engine to sleep while the dispatch runs")
            for ticket in tickets:
                ticket.wait(120)
    finally:
        next(running, None)


@needs_two_cores
def test_a_process_that_pins_itself_to_the_device_core_runs_during_a_long_dispatch(placed):
    """A process of another session that pins itself to the device core is not starved while
    a long submission runs there, on a machine whose cores are all busy. Mesa pins every process
    that loads lavapipe to each core in turn (a vetting compiler child, a client opening a
    private device), and an engine that napped every 25-500 us beside the pinned queue thread
    kept such a process off the core for the whole submission (engine/wait.c, wait_for_fence). The
    check is an order, not a time: the pinned process prints before the dispatch has ended."""
    process, pipe_dir = placed
    core = check_placed(process.pid, pipe_dir)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in ALL_CORES]
    try:
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
            program = session.load_program(libshare.shaders.path("busy"))
            data = session.array(1 << 16, np.uint32)
            session.dispatch(program, 1024, [data], struct.pack("II", 1 << 16, 16)).wait(30)  # compiled
            ticket = session.dispatch(program, 1024, [data], struct.pack("II", 1 << 16, 120000))  # seconds
            pinned = subprocess.run([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}}); "
                                     "print('ran', flush=True)"], capture_output=True, text=True,
                                    start_new_session=True, timeout=120)
            assert pinned.stdout.strip() == "ran", pinned.stderr
            assert not ticket.done(), "the process pinned to the device core ran only after the dispatch ended"
            ticket.wait(120)
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()
