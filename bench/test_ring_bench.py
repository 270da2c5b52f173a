"""Ring latency from Python: push in process, batched push, cross-process ping-pong.

Run: ``python -m pytest bench/test_ring_bench.py``. Each round runs an inner
loop (the timer's own cost would swamp one sub-microsecond call); the
per-operation figures are printed in the "libshare ratios" section. Targets
on a 2-core machine: one push <= 0.5 us, batched <= 50 ns per descriptor,
polled cross-process round trip <= 1 us.
"""

from __future__ import annotations

import numpy as np
import pytest

from libshare.ring import CQE_DTYPE, DESC_DTYPE, Region
from libshare.ring._binding import ffi
from tests.conftest import spawn_peer

INNER = 200  # operations per timed round


@pytest.fixture
def region():
    with Region.create(lanes=4, lane_entries=256, cq_entries=256) as r:
        yield r


def per_op(benchmark, report_ratio, label: str, count: int) -> None:
    median_ns = benchmark.stats.stats.median / count * 1e9
    report_ratio(f"{label}: {median_ns:.0f} ns per operation (median of rounds of {count})")


def test_push_one(benchmark, region, report_ratio):
    """200 single-descriptor pushes from Python, then one pop call that empties the lane."""
    producer, one = region.producer(), np.zeros(1, DESC_DTYPE).tobytes()
    out = np.empty(256, DESC_DTYPE)
    out_ptr = ffi.from_buffer("char[]", out)
    push = producer.try_push

    def pushes():
        for _ in range(INNER):
            push(one)
        region.pop_into(out, out_ptr)

    benchmark(pushes)
    per_op(benchmark, report_ratio, "push one descriptor (+1/200 of a pop)", INNER)


def test_push_pop_one(benchmark, region, report_ratio):
    """Push one descriptor and pop it again, in one process."""
    producer, one = region.producer(), np.zeros(1, DESC_DTYPE).tobytes()
    out = np.empty(1, DESC_DTYPE)
    out_ptr = ffi.from_buffer("char[]", out)

    def round_trips():
        for _ in range(INNER):
            producer.try_push(one)
            region.pop_into(out, out_ptr)

    benchmark(round_trips)
    per_op(benchmark, report_ratio, "push + pop one descriptor", INNER)


def test_push_batch_64(benchmark, region, report_ratio):
    """Three pushes of 64 descriptors, then one pop; reported per descriptor."""
    producer, batch = region.producer(), np.zeros(64, DESC_DTYPE)
    out = np.empty(256, DESC_DTYPE)
    out_ptr = ffi.from_buffer("char[]", out)

    def batches():
        producer.try_push(batch)
        producer.try_push(batch)
        producer.try_push(batch)
        region.pop_into(out, out_ptr)

    benchmark(batches)
    per_op(benchmark, report_ratio, "batched push of 64 (+ the pop), per descriptor", 3 * 64)


@pytest.mark.parametrize("mode", ["polled", "futex"])
def test_cross_process_round_trip(benchmark, region, mode, report_ratio):
    """Push one descriptor to an echo process and wait for its completion."""
    spin = 1.0 if mode == "polled" else 0.0  # both sides poll for up to a second, or sleep at once
    inner = INNER if mode == "polled" else 20
    rounds = 50
    echo = spawn_peer("echo", region.fd, (rounds + 5) * inner + 10, spin)
    producer, one = region.producer(), np.zeros(1, DESC_DTYPE).tobytes()
    cqe = np.empty(1, CQE_DTYPE)
    cqe_ptr = ffi.from_buffer("char[]", cqe)

    def ping():
        producer.try_push(one)
        region.wait_completions(1, timeout=5, spin=spin)
        region.completions_into(cqe, cqe_ptr)

    for _ in range(10):  # the echo process starts
        producer.try_push(one)
        region.wait_completions(1, timeout=30)
        region.completions_into(cqe, cqe_ptr)

    def pings():
        for _ in range(inner):
            ping()

    benchmark.pedantic(pings, rounds=rounds, warmup_rounds=5)
    echo.kill()
    echo.wait(timeout=30)
    per_op(benchmark, report_ratio, f"{mode} cross-process round trip", inner)
