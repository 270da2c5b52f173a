"""What the arbiter's drain engine costs, how fast it drains, and whether the GIL stalls it.

a. Engine cost: one client pipelines 100,000 cached tiny dispatches (saxpy over 64 floats, one
   workgroup, the same arguments every time) through an untimed daemon, in chunks of 1,000 (push
   them, then wait for the last). Printed: the daemon's CPU time over the run per dispatch (utime +
   stime of all its threads from /proc/PID/stat, which keeps the time of threads that ended; the
   schedstat sum of the live threads beside it), target <= 2 us. Lavapipe runs the shaders inside
   the arbiter's process, so the same dispatches submitted in-process with libshare's device layer
   (batches of a lane's worth, 256, one at a time) give the driver's own CPU per dispatch
   (``time.process_time()`` of this process); the difference is what the arbiter adds.
b. NOP drain rate: 4 producer processes (bench/_engine_workers.py) push ``LS_OP_NOP`` descriptors a
   lane's worth at a time through the same daemon for ``NOP_SECONDS`` and read their completions.
   Printed: completions with status 0 per second, all producers together, target >= 10^6/s.
c. GIL: the arbiter in this process, a client in another timing tiny round trips (each after a
   2 ms pause, in which the arbiter goes idle), and a pure-Python
   spinner either in a thread of this process ("inside") or in a process of its own ("apart"), or
   none ("alone"), in alternating blocks (tests/arbiter/test_engine_gil.py, which asserts a
   generous bound). Printed: the median round trip of each, and inside / apart, target <= 2.

On a machine with few cores the producers, the client, lavapipe's threads and the spinners share
them with the arbiter: the figures say as much about the machine as about the engine.
"""

from __future__ import annotations

import mmap
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import libshare
from libshare._proc import cpu_seconds
from bench.test_attach_bench import run_seconds, start_daemon
from libshare.arbiter.device import Device, Dispatch
from tests.arbiter.test_engine_gil import compare, serving
from tests.conftest import ROOT, stop_process

CACHED = 100_000  # dispatches in the engine-cost run
CHUNK = 1_000  # dispatches pushed before waiting for the last of them
DIRECT_BATCH = 256  # dispatches per in-process submission (a lane's worth)
PRODUCERS = 4
NOP_SECONDS = 3.0
GIL_BLOCKS, GIL_PER_BLOCK = 8, 50
PUSH = struct.pack("If", 64, 1.0)
SAXPY = libshare.shaders.path("saxpy")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """An untimed daemon (no timestamps: the direct path has none either); yields (process, pipe dir)."""
    process, pipe_dir = start_daemon(tmp_path_factory.mktemp("engine"), "--no-timestamps")
    yield process, pipe_dir
    stop_process(process)


# ---------------------------------------------------------------- a. engine cost

def direct_cpu_per_dispatch() -> float:
    """This process's CPU seconds per dispatch, CACHED tiny dispatches submitted in-process in batches."""
    with Device() as device:
        memory = [mmap.mmap(-1, 4096) for _ in range(2)]
        buffers = [device.import_host(np.frombuffer(m, np.uint8).ctypes.data, 4096) for m in memory]
        pipeline = device.create_pipeline(SAXPY.read_bytes(), 2, 8)
        batch = [Dispatch(pipeline, [(b, 0) for b in buffers], (1, 1, 1), PUSH)] * DIRECT_BATCH

        def run(batches: int) -> None:
            for _ in range(batches):
                submission = device.submit(batch, timed=False)
                submission.wait(60)
                submission.release()

        run(4)  # recorded once, then resubmitted from the cache
        before = time.process_time()
        run(CACHED // DIRECT_BATCH)
        spent = time.process_time() - before
        for b in buffers:
            device.destroy_buffer(b)
        device.destroy_pipeline(pipeline)
    return spent / (CACHED // DIRECT_BATCH * DIRECT_BATCH)


def test_engine_cpu_per_cached_dispatch(benchmark, daemon, report_ratio):
    direct = direct_cpu_per_dispatch()
    process, pipe_dir = daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(SAXPY)
        x, y = session.array(64), session.array(64)
        x[:], y[:] = 1.0, 0.0

        def chunks(count: int) -> None:
            for _ in range(count):
                for _ in range(CHUNK):
                    last = session.dispatch(program, 1, [x, y], PUSH)
                last.wait(120)

        chunks(1)  # the program's recordings are made here, not in the window
        stat, ran = cpu_seconds(process.pid), run_seconds(process.pid)
        benchmark.pedantic(chunks, args=(CACHED // CHUNK,), rounds=1)
        stat, ran = cpu_seconds(process.pid) - stat, run_seconds(process.pid) - ran
        session.wait_idle(60)
        assert np.all(y == CACHED + CHUNK), "not every dispatch ran"
    arbiter = stat / CACHED
    report_ratio(f"a. arbiter CPU per cached tiny dispatch: {arbiter * 1e6:.2f} us (target <= 2 us; schedstat of "
                 f"live threads {ran / CACHED * 1e6:.2f} us); direct in-process (lavapipe alone) "
                 f"{direct * 1e6:.2f} us; arbiter - direct = {(arbiter - direct) * 1e6:.2f} us")


# ---------------------------------------------------------------- b. NOP drain rate

def drain_nops(pipe_dir) -> tuple[float, int]:
    """Completions with status 0 per second over PRODUCERS processes, and those with another status."""
    workers = [subprocess.Popen([sys.executable, "-m", "bench._engine_workers", "nop", str(pipe_dir), str(NOP_SECONDS)],
                                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(PRODUCERS)]
    try:
        for w in workers:
            assert w.stdout.readline().strip() == "ready", "a producer did not start"
        for w in workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        results = [w.communicate(timeout=120)[0].split() for w in workers]
    finally:
        for w in workers:
            stop_process(w)
    rate = sum(int(good) / float(elapsed) for good, _, elapsed in results)
    return rate, sum(int(bad) for _, bad, _ in results)


def test_nop_drain_rate(benchmark, daemon, report_ratio):
    _, pipe_dir = daemon
    rate, refused = benchmark.pedantic(drain_nops, args=(pipe_dir,), rounds=1)
    assert refused == 0, f"{refused} NOPs were answered with an error status"
    report_ratio(f"b. NOP drain rate, {PRODUCERS} producer processes: {rate:,.0f} descriptors/s end to end "
                 f"(target >= 1,000,000/s)")


# ---------------------------------------------------------------- c. the GIL

def test_gil_spinner_round_trips(benchmark, tmp_path, report_ratio):
    with serving(tmp_path):
        times = benchmark.pedantic(compare, args=(tmp_path, GIL_BLOCKS, GIL_PER_BLOCK, True), rounds=1)
    inside, apart, alone = (np.median(times[name]) for name in ("inside", "apart", "alone"))
    report_ratio(f"c. median tiny round trip with a pure-Python spinner in the arbiter's process "
                 f"{inside * 1e6:.0f} us, in another process {apart * 1e6:.0f} us, none {alone * 1e6:.0f} us: "
                 f"inside / apart = {inside / apart:.2f}x (target <= 2)")
