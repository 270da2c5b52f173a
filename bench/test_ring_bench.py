"""Ring latency from Python: push in process, batched push, cross-process ping-pong.

Run: ``python -m pytest bench/test_ring_bench.py``. A figure is the median over blocks
(``LIBSHARE_BENCH_BLOCKS``, 5 by default) of each block's median round, a round being an inner
loop of operations (the timer's own cost would swamp one sub-microsecond call); printed per
operation in the "libshare ratios" section with its range over the blocks. Targets on a 2-core
machine: one push <= 0.5 us, batched <= 50 ns per descriptor, polled cross-process round trip
<= 1 us.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench._compare import Target, at_most, blocks, measure
from libshare.ring import CQE_DTYPE, DESC_DTYPE, Region
from libshare.ring._binding import ffi
from tests.conftest import spawn_peer

INNER = 200  # operations per timed round
ROUNDS = 200  # rounds per block


@pytest.fixture
def region():
    with Region.create(lanes=4, lane_entries=256, cq_entries=256) as r:
        yield r


def per_op_ns(fn, count: int, rounds: int = ROUNDS) -> float:
    """One block: ``rounds`` calls of ``fn`` (``count`` operations each); the median round's ns per operation."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / count)
    return float(np.median(times))


def figure(benchmark, name: str, fn, count: int, target: Target, method: str, rounds: int = ROUNDS) -> None:
    for _ in range(5):  # warm up
        fn()
    benchmark.pedantic(measure, args=(name, lambda: per_op_ns(fn, count, rounds), "ns"),
                       kwargs={"target": target, "method": method}, rounds=1)


def test_push_one(benchmark, region):
    """200 single-descriptor pushes from Python, then one pop call that empties the lane."""
    producer, one = region.lanes.producer(), np.zeros(1, DESC_DTYPE).tobytes()
    out = np.empty(256, DESC_DTYPE)
    out_ptr = ffi.from_buffer("char[]", out)
    push = producer.try_push

    def pushes():
        for _ in range(INNER):
            push(one)
        region.lanes.pop_into(out, out_ptr)

    figure(benchmark, "ring: push one descriptor from Python (+1/200 of a pop)", pushes, INNER, at_most(500),
           f"{INNER} Producer.try_push calls of one descriptor, then one pop that empties the lane; "
           f"a block's value is the median of {ROUNDS} such rounds, per push")


def test_push_pop_one(benchmark, region):
    """Push one descriptor and pop it again, in one process."""
    producer, one = region.lanes.producer(), np.zeros(1, DESC_DTYPE).tobytes()
    out = np.empty(1, DESC_DTYPE)
    out_ptr = ffi.from_buffer("char[]", out)

    def round_trips():
        for _ in range(INNER):
            producer.try_push(one)
            region.lanes.pop_into(out, out_ptr)

    benchmark.pedantic(measure, args=("ring: push + pop one descriptor", lambda: per_op_ns(round_trips, INNER),
                                      "ns"),
                       kwargs={"method": f"one push and one pop in one process, {INNER} per round, median of "
                                         f"{ROUNDS} rounds per block"}, rounds=1)


def test_push_batch_64(benchmark, region):
    """Three pushes of 64 descriptors, then one pop; reported per descriptor."""
    producer, batch = region.lanes.producer(), np.zeros(64, DESC_DTYPE)
    out = np.empty(256, DESC_DTYPE)
    out_ptr = ffi.from_buffer("char[]", out)

    def batches():
        producer.try_push(batch)
        producer.try_push(batch)
        producer.try_push(batch)
        region.lanes.pop_into(out, out_ptr)

    figure(benchmark, "ring: batched push of 64 (+ the pop), per descriptor", batches, 3 * 64, at_most(50),
           f"three pushes of 64 descriptors and one pop of the 192, per descriptor; median of {ROUNDS} rounds "
           "per block")


@pytest.mark.parametrize("mode", ["polled", "futex"])
def test_cross_process_round_trip(benchmark, region, mode):
    """Push one descriptor to an echo process and wait for its completion."""
    spin = 1.0 if mode == "polled" else 0.0  # both sides poll for up to a second, or sleep at once
    inner = INNER if mode == "polled" else 20
    rounds = 50
    echo = spawn_peer("echo", region.fd, (rounds * blocks() + 5) * inner + 10, spin)
    producer, one = region.lanes.producer(), np.zeros(1, DESC_DTYPE).tobytes()
    cqe = np.empty(1, CQE_DTYPE)
    cqe_ptr = ffi.from_buffer("char[]", cqe)

    def ping():
        producer.try_push(one)
        region.completions.wait(1, timeout=5, spin=spin)
        region.completions.take_into(cqe, cqe_ptr)

    for _ in range(10):  # the echo process starts
        producer.try_push(one)
        region.completions.wait(1, timeout=30)
        region.completions.take_into(cqe, cqe_ptr)

    def pings():
        for _ in range(inner):
            ping()

    how = "both sides poll" if spin else "both sides sleep on a futex at once"
    try:
        figure(benchmark, f"ring: {mode} cross-process round trip", pings, inner,
               at_most(1000) if mode == "polled" else None,
               f"push one descriptor to an echo process and wait for its completion ({how}), {inner} per "
               f"round, median of {rounds} rounds per block", rounds=rounds)
    finally:
        echo.kill()
        echo.wait(timeout=30)
