"""The arbiter against direct Vulkan, side by side in one run; ratios in the summary.

1. tiny dispatch round trip (64 floats, one workgroup): through a daemon, and through the
   embedded arbiter, vs the same dispatch submitted in-process with the ``vulkan`` package
   and a prerecorded command buffer (libshare's own device layer, which records once and
   resubmits). Targets <= 1.15x (daemon) and <= 1.10x (embedded). Every side waits for each
   dispatch before the next, and none takes timestamps.
   1b. The round trip through the daemon with a pure-Python busy process pinned to the core
   where the daemon placed its engine (whose polls yield that core: engine.c, "Cores"), against
   the same process stopped, in alternating blocks; median and p99 ratios. No target: it shows
   what a busy neighbour on that core costs (README, How fast; ``--no-placement`` avoids it).
2. one client pipelining 10,000 tiny dispatches vs direct serial submission. Target >= 5x.
3. 8 client processes through one arbiter vs 8 processes that each open their own device,
   aggregate dispatches/s. Target >= 1.0x on lavapipe. Beside it, the CPU time per round trip
   of a client process, of the arbiter and of a process with its own device, and the most round
   trips per second the machine's cores allow at those costs.
"""

from __future__ import annotations

import mmap
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare._proc import cpu_seconds
from libshare.arbiter.device import Device, Dispatch
from tests.arbiter.conftest import daemon as _daemon_fixture  # noqa: F401
from tests.conftest import ROOT

RESULTS: dict[str, float] = {}
PIPELINED = 10_000


@pytest.fixture(scope="module")
def arbiter_dir(tmp_path_factory):
    """An untimed daemon (no timestamps: the direct path has none either)."""
    pipe_dir = tmp_path_factory.mktemp("bench") / "pipe"
    process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir),
                                "--no-timestamps"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (pipe_dir / "control").exists():
        assert process.poll() is None, "arbiter failed to start"
        time.sleep(0.05)
    yield pipe_dir
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def direct():
    """In-process: device, saxpy pipeline, two imported host buffers, the tiny dispatch."""
    with Device() as device:
        memory = [mmap.mmap(-1, 4096) for _ in range(2)]
        buffers = [device.import_host(np.frombuffer(m, np.uint8).ctypes.data, 4096) for m in memory]
        pipeline = device.create_pipeline(libshare.shaders.path("saxpy").read_bytes(), 2, 8)
        tiny = Dispatch(pipeline, [(b, 0) for b in buffers], (1, 1, 1), struct.pack("If", 64, 1.0))
        yield device, tiny
        for b in buffers:
            device.destroy_buffer(b)
        device.destroy_pipeline(pipeline)


@pytest.fixture(scope="module")
def remote(arbiter_dir):
    with libshare.connect(mode="daemon", pipe_directory=arbiter_dir) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        yield session, lambda: session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0))


@pytest.fixture(scope="module")
def embedded():
    """A session of this process's embedded arbiter, untimed like the others."""
    with libshare.connect(mode="embedded") as session:
        from libshare.client.session import _embedded

        _embedded().drainer.timed = False  # the direct path takes no timestamps either
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        yield lambda: session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0))


def ratio_line(label: str, numerator: str, denominator: str, target: str, report_ratio) -> None:
    if numerator in RESULTS and denominator in RESULTS:
        report_ratio(f"{label}: {RESULTS[numerator] / RESULTS[denominator]:.3f}x ({target}); "
                     f"{numerator} {RESULTS[numerator] * 1e6:.1f} us, {denominator} {RESULTS[denominator] * 1e6:.1f} us")


# ---------------------------------------------------------------- 1. tiny round trip

def test_round_trip_direct(benchmark, direct):
    device, tiny = direct

    def once():
        submission = device.submit([tiny], timed=False)
        submission.wait(10)
        submission.release()

    benchmark(once)
    RESULTS["direct round trip"] = benchmark.stats.stats.median


def test_round_trip_arbiter(benchmark, remote, report_ratio):
    _, dispatch = remote
    benchmark(lambda: dispatch().wait(10))
    RESULTS["arbiter round trip"] = benchmark.stats.stats.median
    ratio_line("1. tiny round trip, arbiter / direct", "arbiter round trip", "direct round trip",
               "target <= 1.15", report_ratio)


def test_round_trip_embedded(benchmark, embedded, report_ratio):
    benchmark(lambda: embedded().wait(10))
    RESULTS["embedded round trip"] = benchmark.stats.stats.median
    ratio_line("1. tiny round trip, embedded / direct", "embedded round trip", "direct round trip",
               "target <= 1.10", report_ratio)


BUSY_BLOCKS, BUSY_PER_BLOCK = 4, 2000


def device_core(pipe_dir: Path) -> int | None:
    """The core where the daemon of ``pipe_dir`` placed its engine (its log says), or None."""
    named = re.findall(r"engine and driver threads on core (\d+)", (pipe_dir / "server.log").read_text())
    return int(named[-1]) if named else None


def test_round_trip_beside_a_busy_process(benchmark, arbiter_dir, remote, report_ratio):
    """1b. The tiny round trip through the daemon with a pure-Python busy loop pinned to the
    arbiter's device core (where its engine yields between looks: engine.c, "Cores"), against
    the same loop stopped, in alternating blocks."""
    session, dispatch = remote
    core = device_core(arbiter_dir)
    if core is None:
        pytest.skip("the arbiter was not placed (one core, or not a CPU device)")
    busy = subprocess.Popen([sys.executable, "-c", "x = 0\nwhile True:\n    x += 1\n"])
    times: dict[str, list[float]] = {"busy": [], "idle": []}
    try:
        os.sched_setaffinity(busy.pid, {core})

        def blocks():
            for block in range(BUSY_BLOCKS):
                for name in ("busy", "idle") if block % 2 else ("idle", "busy"):
                    busy.send_signal(signal.SIGCONT if name == "busy" else signal.SIGSTOP)
                    for _ in range(BUSY_PER_BLOCK):
                        begun = time.perf_counter()
                        dispatch().wait(10)
                        times[name].append(time.perf_counter() - begun)

        benchmark.pedantic(blocks, rounds=1)
    finally:
        busy.kill()
        busy.wait()
    (b50, b99), (i50, i99) = (np.percentile(times[name], [50, 99]) * 1e6 for name in ("busy", "idle"))
    report_ratio(f"1b. tiny round trip with a busy process on the arbiter's device core / without: median "
                 f"{b50 / i50:.2f}x ({b50:.1f} vs {i50:.1f} us), p99 {b99 / i99:.2f}x ({b99:.0f} vs {i99:.0f} us)")


# ---------------------------------------------------------------- 2. pipelining

def test_pipelined_direct_serial(benchmark, direct):
    device, tiny = direct

    def serial():
        for _ in range(PIPELINED // 10):
            submission = device.submit([tiny], timed=False)
            submission.wait(10)
            submission.release()

    benchmark.pedantic(serial, rounds=3)
    RESULTS["direct serial per dispatch"] = benchmark.stats.stats.median / (PIPELINED // 10)


def test_pipelined_arbiter(benchmark, remote, report_ratio):
    session, dispatch = remote

    def pipelined():
        for _ in range(PIPELINED):
            dispatch()
        session.wait_idle(120)

    benchmark.pedantic(pipelined, rounds=3)
    RESULTS["arbiter pipelined per dispatch"] = benchmark.stats.stats.median / PIPELINED
    d, a = RESULTS.get("direct serial per dispatch"), RESULTS["arbiter pipelined per dispatch"]
    if d:
        report_ratio(f"2. pipelined 10,000 tiny dispatches: arbiter {1 / a:.0f}/s vs direct serial "
                     f"{1 / d:.0f}/s = {d / a:.2f}x the direct rate (target >= 5)")


# ---------------------------------------------------------------- 3. eight processes

WORKER = """
import struct, sys, time, numpy as np, libshare, mmap
mode, pipe_dir, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
push = struct.pack("If", 64, 1.0)
if mode == "arbiter":
    s = libshare.connect(mode="daemon", pipe_directory=pipe_dir)
    p = s.load_program(libshare.shaders.path("saxpy")); x, y = s.array(64), s.array(64)
    go = lambda: s.dispatch(p, 1, [x, y], push).wait(10)
    finish = s.wait_idle
else:
    from libshare.arbiter.device import Device, Dispatch
    d = Device(); m = [mmap.mmap(-1, 4096) for _ in range(2)]
    b = [d.import_host(np.frombuffer(k, np.uint8).ctypes.data, 4096) for k in m]
    p = d.create_pipeline(libshare.shaders.path("saxpy").read_bytes(), 2, 8)
    tiny = Dispatch(p, [(k, 0) for k in b], (1, 1, 1), push)
    def go():
        sub = d.submit([tiny], timed=False); sub.wait(10); sub.release()
    finish = lambda: None
print("ready", s.arbiter_pid if mode == "arbiter" else 0, flush=True); sys.stdin.readline()
count, end, cpu = 0, time.perf_counter() + seconds, time.process_time()
while time.perf_counter() < end:
    for _ in range(32):
        go()
    count += 32
finish()
print(count / seconds, (time.process_time() - cpu) / count, flush=True)
"""


def _arbiter_cpu(pid: int) -> float:
    """utime + stime of the arbiter ``pid`` so far; 0 for pid 0 (the "own" workers have none)."""
    return cpu_seconds(pid) if pid else 0.0


def run_eight(mode: str, pipe_dir, seconds: float = 3.0) -> tuple[float, float, float]:
    """Eight workers' aggregate round trips per second, and the CPU seconds per round trip of a
    worker process (mean) and of the arbiter ("arbiter" mode; 0 for "own")."""
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, mode, str(pipe_dir), str(seconds)], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(8)]
    arbiter_pids = set()
    for w in workers:
        word, pid = w.stdout.readline().split()
        assert word == "ready"
        arbiter_pids.add(int(pid))
    (arbiter_pid,) = arbiter_pids
    arbiter_cpu = _arbiter_cpu(arbiter_pid)
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    results = [tuple(map(float, w.communicate(timeout=120)[0].split())) for w in workers]
    arbiter_cpu = _arbiter_cpu(arbiter_pid) - arbiter_cpu
    rate = sum(r for r, _ in results)
    return rate, sum(c for _, c in results) / len(results), arbiter_cpu / (rate * seconds)


def test_eight_processes(benchmark, arbiter_dir, report_ratio):
    own, own_cpu, _ = run_eight("own", arbiter_dir)
    shared, client_cpu, arbiter_cpu = benchmark.pedantic(run_eight, args=("arbiter", arbiter_dir), rounds=1)
    report_ratio(f"3. eight processes, aggregate tiny dispatches/s: arbiter {shared:.0f} vs own device "
                 f"each {own:.0f} = {shared / own:.2f}x (target >= 1.0)")
    cores = os.cpu_count()
    report_ratio(f"3. CPU per round trip: client {client_cpu * 1e6:.1f} us + arbiter {arbiter_cpu * 1e6:.1f} us "
                 f"vs own device {own_cpu * 1e6:.1f} us; on {cores} cores at most "
                 f"{cores / (client_cpu + arbiter_cpu):.0f}/s through the arbiter and {cores / own_cpu:.0f}/s on "
                 "own devices")
