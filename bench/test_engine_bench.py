"""What the arbiter's drain engine costs, how fast it drains, and whether the GIL stalls it.

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default), its
sides alternated, and is printed as the median over blocks with its range.

E1. Engine cost: one client pipelines ``CACHED`` cached tiny dispatches per block (saxpy over 64
    floats, one workgroup, the same arguments every time) through an untimed daemon, in chunks of
    1,000 (push them, then wait for the last). The figure: the daemon's CPU time over the block per
    dispatch (utime + stime of all its threads from /proc/PID/stat, 10 ms ticks, which keeps the time
    of threads that ended; the schedstat sum of its threads beside it), target <= 2 us. Lavapipe runs
    the shaders inside the arbiter's process, so the same number of dispatches submitted in-process
    with libshare's device layer (batches of a lane's worth, 256, one at a time), alternated with the
    daemon's blocks, give the driver's own CPU per dispatch (``time.process_time()`` of this process);
    the difference is what the arbiter adds.
E2. NOP drain rate: 4 producer processes (bench/_engine_workers.py) push ``LS_OP_NOP`` descriptors a
    lane's worth at a time through the same daemon for ``NOP_SECONDS`` per block and read their
    completions. The figure: completions with status 0 per second, all producers together, target
    >= 10^6/s.
E3. GIL: the arbiter in this process, a client in another timing tiny round trips (each after a
    2 ms pause, in which the arbiter goes idle), and a pure-Python
    spinner either in a thread of this process ("inside") or in a process of its own ("apart"), or
    none ("alone"), in blocks of ``GIL_PER_BLOCK`` round trips each, the order alternating
    (bench/_gil_workers.py). The figure: inside / apart of each block's medians, target <= 2.

On a machine with few cores the producers, the client, lavapipe's threads and the spinners share
them with the arbiter: the figures say as much about the machine as about the engine.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import libshare
from bench._compare import at_least, at_most, blocks, interleave, pick, ratio, record
from bench._gil_workers import compare
from bench._helpers import close_workers
from bench.test_attach_bench import run_since, start_daemon, thread_run_ns
from libshare._proc import cpu_seconds
from libshare.arbiter.device import Device, Dispatch
from tests.arbiter.test_engine_gil import serving
from tests.conftest import ROOT, stop_process

CACHED = 100_000  # dispatches per block in the engine-cost run
CHUNK = 1_000  # dispatches pushed before waiting for the last of them
DIRECT_BATCH = 256  # dispatches per in-process submission (a lane's worth)
PRODUCERS = 4
NOP_SECONDS = 1.0
GIL_PER_BLOCK = 100
PUSH = struct.pack("If", 64, 1.0)
SAXPY = libshare.shaders.path("saxpy")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """An untimed daemon (no timestamps: the direct path has none either); yields (process, pipe dir)."""
    process, pipe_dir = start_daemon(tmp_path_factory.mktemp("engine"), "--no-timestamps")
    yield process, pipe_dir
    stop_process(process)


# ---------------------------------------------------------------- E1. engine cost

@contextlib.contextmanager
def direct_batches():
    """A device of this process's own; yields ``run(batches)``, which submits that many batches of
    DIRECT_BATCH cached tiny dispatches one at a time and returns this process's CPU seconds."""
    with Device() as device:
        memory = [mmap.mmap(-1, 4096) for _ in range(2)]
        buffers = [device.import_host(np.frombuffer(m, np.uint8).ctypes.data, 4096) for m in memory]
        pipeline = device.create_pipeline(SAXPY.read_bytes(), 2, 8)
        batch = [Dispatch(pipeline, [(b, 0) for b in buffers], (1, 1, 1), PUSH)] * DIRECT_BATCH

        def run(batches: int) -> float:
            before = time.process_time()
            for _ in range(batches):
                submission = device.submit(batch, timed=False)
                submission.wait(60)
                submission.release()
            return time.process_time() - before

        run(4)  # recorded once, then resubmitted from the cache
        try:
            yield run
        finally:
            for b in buffers:
                device.destroy_buffer(b)
            device.destroy_pipeline(pipeline)


def test_engine_cpu_per_cached_dispatch(benchmark, daemon):
    process, pipe_dir = daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session, direct_batches() as direct:
        program = session.load_program(SAXPY)
        x, y = session.array(64), session.array(64)
        x[:], y[:] = 1.0, 0.0
        sent = 0

        def chunks(count: int) -> None:
            nonlocal sent
            for _ in range(count):
                for _ in range(CHUNK):
                    last = session.dispatch(program, 1, [x, y], PUSH)
                last.wait(120)
            sent += count * CHUNK

        def arbiter_block() -> dict:
            stat, ran = cpu_seconds(process.pid), thread_run_ns(process.pid)
            chunks(CACHED // CHUNK)
            return {"stat": (cpu_seconds(process.pid) - stat) / CACHED,
                    "schedstat": run_since(process.pid, ran) / CACHED}

        direct_count = CACHED // DIRECT_BATCH * DIRECT_BATCH
        chunks(1)  # the program's recordings are made here, not in a block
        values = benchmark.pedantic(interleave, args=({
            "arbiter": arbiter_block, "direct": lambda: direct(CACHED // DIRECT_BATCH) / direct_count},), rounds=1)
        session.wait_idle(60)
        assert np.all(y == sent), "not every dispatch ran"
    method = (f"{CACHED:,} cached tiny dispatches per block pipelined through an untimed daemon in chunks of "
              f"{CHUNK:,}, the daemon's CPU per dispatch; alternated with as many submitted in-process in "
              f"batches of {DIRECT_BATCH} (lavapipe's own CPU per dispatch)")
    arbiter = pick(values["arbiter"], "stat")
    record("E1. arbiter CPU per cached tiny dispatch", arbiter, "us", target=at_most(2.0), scale=1e6,
           method=method + "; utime + stime of the daemon (10 ms ticks)")
    record("E1. arbiter CPU per cached tiny dispatch, schedstat", pick(values["arbiter"], "schedstat"), "us",
           scale=1e6, method=method + "; run time of the daemon's threads from schedstat")
    record("E1. CPU per tiny dispatch in-process (lavapipe alone)", values["direct"], "us", scale=1e6,
           method=method)
    record("E1. arbiter CPU - in-process CPU per dispatch", [a - d for a, d in zip(arbiter, values["direct"])],
           "us", scale=1e6, method=method + "; the difference of each block's pair")


# ---------------------------------------------------------------- E2. NOP drain rate

class Producers:
    """PRODUCERS processes pushing NOPs through the daemon of ``pipe_dir``; ``window()`` runs one window."""

    def __init__(self, pipe_dir):
        self.workers = [subprocess.Popen([sys.executable, "-m", "bench._engine_workers", "nop", str(pipe_dir),
                                          str(NOP_SECONDS)], cwd=ROOT, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True) for _ in range(PRODUCERS)]
        self.refused = 0
        for w in self.workers:
            assert w.stdout.readline().strip() == "ready", "a producer did not start"

    def window(self) -> float:
        """Completions with status 0 per second over all producers (those with another status are counted)."""
        for w in self.workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        results = [w.stdout.readline().split() for w in self.workers]
        self.refused += sum(int(bad) for _, bad, _ in results)
        return sum(int(good) / float(elapsed) for good, _, elapsed in results)

    def close(self) -> None:
        close_workers(self.workers, 60, stop_process)


def test_nop_drain_rate(benchmark, daemon):
    _, pipe_dir = daemon
    producers = Producers(pipe_dir)
    try:
        producers.window()  # warm
        rates = benchmark.pedantic(lambda: [producers.window() for _ in range(blocks())], rounds=1)
    finally:
        producers.close()
    assert producers.refused == 0, f"{producers.refused} NOPs were answered with an error status"
    record(f"E2. NOP drain rate, {PRODUCERS} producer processes", rates, "/s", target=at_least(1_000_000),
           method=f"{PRODUCERS} processes push LS_OP_NOP descriptors a lane's worth at a time for {NOP_SECONDS:g} s "
                  "per block and read their completions; completions with status 0 per second, all together")


# ---------------------------------------------------------------- E3. the GIL

def test_gil_spinner_round_trips(benchmark, tmp_path):
    count = blocks()
    with serving(tmp_path):
        times = benchmark.pedantic(compare, args=(tmp_path, count, GIL_PER_BLOCK, True), rounds=1)
    medians = {name: [float(np.median(t[k * GIL_PER_BLOCK:(k + 1) * GIL_PER_BLOCK])) for k in range(count)]
               for name, t in times.items()}
    ratio("E3. tiny round trip, pure-Python spinner in the arbiter's process / in another process",
          medians["inside"], medians["apart"], target=at_most(2.0), names=("inside", "apart"),
          detail=f"no spinner {np.median(medians['alone']) * 1e6:.0f} us",
          method=f"an in-process arbiter, a client in another process timing tiny round trips (each after a 2 ms "
                 f"pause), with a pure-Python spinner thread in the arbiter's process, in a process of its own, or "
                 f"none: {GIL_PER_BLOCK} round trips of each per block, the order alternating; medians per block")
