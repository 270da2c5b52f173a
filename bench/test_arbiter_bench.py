"""The arbiter against direct Vulkan, side by side in one run; figures in the summary.

Every figure comes from interleaved blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by
default, sides alternated ABBA or rotated) and is printed as the median over blocks with its range.

1. tiny dispatch round trip (64 floats, one workgroup): through a daemon, and through the
   embedded arbiter, vs the same dispatch submitted in-process with the ``vulkan`` package
   and a prerecorded command buffer (libshare's own device layer, which records once and
   resubmits). Targets <= 1.15x (daemon) and <= 1.10x (embedded). Every side waits for each
   dispatch before the next, and none takes timestamps. A block is ``RT_TURNS`` turns of
   ``RT_PER_TURN`` round trips of each side, the order rotated every turn; a side's block value
   is the median of its round trips in the block.
   1b. The round trip through the daemon with a pure-Python busy process pinned to the core
   where the daemon placed its engine (whose polls yield that core: engine/wait.c, "Cores"), against
   the same process stopped, in alternating turns; median and p99 ratios. No target: it shows
   what a busy neighbour on that core costs (docs/benchmarks.md; ``--no-placement`` avoids it).
2. one client pipelining 10,000 tiny dispatches vs direct serial submission (1,000 per block),
   dispatches per second. Target >= 5x.
3. 8 client processes through one arbiter vs 8 processes that each open their own device,
   aggregate dispatches/s over ``EIGHT_SECONDS`` per block (all 16 processes start once and run
   a window each time they are told). Target >= 1.0x on lavapipe, >= 2x on a GPU. Beside it, the CPU time per
   round trip of a client process, of the arbiter and of a process with its own device, and the
   most round trips per second the machine's cores allow at those costs.
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
from bench._compare import at_least, at_most, interleave, note, pick, ratio, record
from bench._helpers import timed
from libshare._proc import cpu_seconds
from libshare.arbiter.device import Device, Dispatch
from tests.arbiter.conftest import daemon as _daemon_fixture  # noqa: F401
from tests.conftest import ROOT, stop_process, vulkan_device_is_cpu  # noqa: F401 - a fixture

PIPELINED = 10_000
SERIAL = 1_000  # direct serial dispatches per block
RT_TURNS, RT_PER_TURN = 10, 300
BUSY_TURNS, BUSY_PER_TURN = 4, 500
EIGHT_SECONDS = 2.0


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

        def once():
            submission = device.submit([tiny], timed=False)
            submission.wait(10)
            submission.release()

        yield once
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
        from libshare.client.connect import _embedded

        _embedded().drainer.timed = False  # the direct path takes no timestamps either
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        yield lambda: session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0))


# ---------------------------------------------------------------- 1. tiny round trip

def test_round_trip(benchmark, direct, remote, embedded):
    _, dispatch = remote
    sides = {"direct": direct, "daemon": lambda: dispatch().wait(10), "embedded": lambda: embedded().wait(10)}
    for once in sides.values():
        timed(once, 200)  # warm
    values = benchmark.pedantic(interleave, args=({name: (lambda o=once: timed(o, RT_PER_TURN))
                                                   for name, once in sides.items()},),
                                kwargs={"turns": RT_TURNS}, rounds=1)
    method = (f"tiny saxpy (64 floats, one workgroup) dispatched and waited, one at a time; per block "
              f"{RT_TURNS} turns of {RT_PER_TURN} round trips of each side (direct, daemon, embedded), the order "
              "rotated each turn; a side's block value is the median of its round trips, the figure the "
              "ratio of the block values; no side takes timestamps")
    ratio("1. tiny round trip, daemon / direct", values["daemon"], values["direct"], target=at_most(1.15),
          names=("daemon", "direct"), method=method)
    ratio("1. tiny round trip, embedded / direct", values["embedded"], values["direct"], target=at_most(1.10),
          names=("embedded", "direct"), method=method)


def device_core(pipe_dir: Path) -> int | None:
    """The core where the daemon of ``pipe_dir`` placed its engine (its log says), or None."""
    log = pipe_dir / "server.log"
    named = re.findall(r"engine and driver threads on core (\d+)", log.read_text() if log.exists() else "")
    return int(named[-1]) if named else None


def p50_p99(results: list) -> dict:
    samples = np.concatenate(results)
    return {"p50": float(np.percentile(samples, 50)), "p99": float(np.percentile(samples, 99))}


def test_round_trip_beside_a_busy_process(benchmark, arbiter_dir, remote):
    """1b. The tiny round trip through the daemon with a pure-Python busy loop pinned to the
    arbiter's device core (where its engine yields between looks: engine/wait.c, "Cores"), against
    the same loop stopped, in alternating turns."""
    session, dispatch = remote
    core = device_core(arbiter_dir)
    if core is None:
        pytest.skip("the arbiter was not placed (one core, or not a CPU device)")
    busy = subprocess.Popen([sys.executable, "-c", "x = 0\nwhile True:\n    x += 1\n"])

    def turn(running: bool):
        busy.send_signal(signal.SIGCONT if running else signal.SIGSTOP)
        return timed(lambda: dispatch().wait(10), BUSY_PER_TURN)

    try:
        os.sched_setaffinity(busy.pid, {core})
        values = benchmark.pedantic(interleave, args=({"busy": lambda: turn(True), "idle": lambda: turn(False)},),
                                    kwargs={"turns": BUSY_TURNS, "reduce": p50_p99}, rounds=1)
    finally:
        busy.kill()
        busy.wait()
    method = (f"tiny round trip through the daemon, per block {BUSY_TURNS} turns of {BUSY_PER_TURN} with a "
              f"pure-Python busy process pinned to the engine's core (core {core}) running, and as many with it "
              "stopped, alternated")
    for q in ("p50", "p99"):
        ratio(f"1b. tiny round trip {q}, busy process on the arbiter's device core / none",
              pick(values["busy"], q), pick(values["idle"], q), names=("busy", "idle"), method=method)


# ---------------------------------------------------------------- 2. pipelining

def test_pipelined(benchmark, direct, remote):
    session, dispatch = remote

    def pipelined() -> float:
        begun = time.perf_counter()
        for _ in range(PIPELINED):
            dispatch()
        session.wait_idle(120)
        return PIPELINED / (time.perf_counter() - begun)

    def serial() -> float:
        begun = time.perf_counter()
        for _ in range(SERIAL):
            direct()
        return SERIAL / (time.perf_counter() - begun)

    pipelined(), serial()  # warm
    values = benchmark.pedantic(interleave, args=({"arbiter": pipelined, "direct": serial},), rounds=1)
    ratio("2. pipelined 10,000 tiny dispatches through a daemon / direct serial, dispatches/s", values["arbiter"],
          values["direct"], target=at_least(5), names=("pipelined", "direct serial"), side_unit="/s", side_scale=1,
          method=f"one client pushes {PIPELINED:,} tiny dispatches without waiting, then waits for all; against "
                 f"{SERIAL:,} dispatches submitted and waited one at a time in-process; dispatches per second of "
                 "each, alternated per block")


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
for _ in range(32):
    go()
print("ready", s.arbiter_pid if mode == "arbiter" else 0, flush=True)
for line in sys.stdin:  # a window of round trips for each line; the end of stdin ends it
    count, end, cpu = 0, time.perf_counter() + seconds, time.process_time()
    while time.perf_counter() < end:
        for _ in range(32):
            go()
        count += 32
    finish()
    print(count / seconds, (time.process_time() - cpu) / count, flush=True)
"""


class Eight:
    """Eight worker processes of one mode, set up once; ``window()`` runs them together."""

    def __init__(self, mode: str, pipe_dir: Path):
        self.workers = [subprocess.Popen([sys.executable, "-c", WORKER, mode, str(pipe_dir), str(EIGHT_SECONDS)],
                                         cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                        for _ in range(8)]
        pids = set()
        for w in self.workers:
            word, pid = w.stdout.readline().split()
            assert word == "ready", f"a {mode} worker failed to start"
            pids.add(int(pid))
        (self.arbiter_pid,) = pids  # 0 for "own": those have no arbiter

    def window(self) -> dict:
        """One window: aggregate round trips per second, CPU seconds per round trip of a worker (mean)
        and of the arbiter (0 for "own")."""
        arbiter = cpu_seconds(self.arbiter_pid) if self.arbiter_pid else 0.0
        for w in self.workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        results = [tuple(map(float, w.stdout.readline().split())) for w in self.workers]
        arbiter = (cpu_seconds(self.arbiter_pid) - arbiter) if self.arbiter_pid else 0.0
        rate = sum(r for r, _ in results)
        return {"rate": rate, "cpu": sum(c for _, c in results) / len(results),
                "arbiter cpu": arbiter / (rate * EIGHT_SECONDS)}

    def close(self) -> None:
        for w in self.workers:
            try:
                w.stdin.close()
            except OSError:
                pass
        for w in self.workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            stop_process(w)
            w.stdout.close()


def test_eight_processes(benchmark, arbiter_dir, vulkan_device_is_cpu):
    groups = {}
    try:
        for mode in ("arbiter", "own"):
            groups[mode] = Eight(mode, arbiter_dir)
        values = benchmark.pedantic(interleave, args=({m: g.window for m, g in groups.items()},), rounds=1)
    finally:
        for g in groups.values():
            g.close()
    shared, own = values["arbiter"], values["own"]
    method = (f"8 processes doing tiny round trips through one daemon, against 8 that each opened a device of "
              f"their own, a {EIGHT_SECONDS:g} s window each per block, alternated; all 16 processes set up once")
    ratio("3. eight processes, aggregate tiny dispatches/s, through one arbiter / own device each",
          pick(shared, "rate"), pick(own, "rate"), target=at_least(1.0 if vulkan_device_is_cpu else 2.0),
          names=("arbiter", "own devices"),
          side_unit="/s", side_scale=1, method=method)
    cpu = {"client": pick(shared, "cpu"), "arbiter": pick(shared, "arbiter cpu"), "own device": pick(own, "cpu")}
    for who, values_ in cpu.items():
        record(f"3. CPU per round trip, eight processes: {who}", values_, "us", scale=1e6, method=method + (
            "; CPU time of the process (utime + stime of the arbiter, 10 ms ticks) over the window per round trip"))
    cores = os.cpu_count()
    through = np.median(cpu["client"]) + np.median(cpu["arbiter"])
    note(f"3. on {cores} cores at those CPU costs: at most {cores / through:,.0f} round trips/s through the arbiter "
         f"and {cores / np.median(cpu['own device']):,.0f}/s on own devices")
