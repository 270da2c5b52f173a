"""Many producers, threads and processes, into one submission ring: exactly once, in order."""

from __future__ import annotations

import threading
import time

import numpy as np

from libshare.ring import Region

from tests.conftest import spawn_peer
from tests.ring._peer import produce

PER_PRODUCER = 250_000  # 4 producers: 10^6 descriptors


def drain_and_check(region: Region, producers: int, per_producer: int, timeout: float) -> np.ndarray:
    """Pop until every producer's descriptors arrived; assert each arrives once and in order."""
    next_expected = np.zeros(producers, np.int64)
    deadline = time.monotonic() + timeout
    while next_expected.sum() < producers * per_producer:
        assert time.monotonic() < deadline, f"stalled at {next_expected} of {per_producer} each"
        batch = region.lanes.pop(512)
        if len(batch) == 0:
            region.lanes.wait(timeout=1.0) if region.lanes.pending() == 0 else None
            continue
        for pid in np.unique(batch["program"]):
            tickets = batch["ticket"][batch["program"] == pid].astype(np.int64)
            start = next_expected[pid]
            assert np.array_equal(tickets, np.arange(start, start + len(tickets))), (
                f"producer {pid}: expected from {start}, got {tickets[:5]}..."
            )
            next_expected[pid] += len(tickets)
    assert region.lanes.pending() == 0
    return next_expected


def test_million_descriptors_from_two_threads_and_two_processes():
    with Region.create(lanes=8, lane_entries=1024, cq_entries=16) as region:
        processes = [spawn_peer("produce", region.fd, pid, PER_PRODUCER, 64) for pid in (0, 1)]
        threads = [
            threading.Thread(target=produce, args=(region, str(pid), str(PER_PRODUCER), "64"))
            for pid in (2, 3)
        ]
        for thread in threads:
            thread.start()
        counts = drain_and_check(region, 4, PER_PRODUCER, timeout=240)
        for thread in threads:
            thread.join()
        assert [p.wait(timeout=30) for p in processes] == [0, 0]
        assert counts.tolist() == [PER_PRODUCER] * 4


def test_single_descriptor_pushes_from_four_threads_interleave_without_loss():
    per_thread = 5_000
    with Region.create(lanes=4, lane_entries=16, cq_entries=16) as region:
        threads = [
            threading.Thread(target=produce, args=(region, str(pid), str(per_thread), "1"))
            for pid in range(4)
        ]
        for thread in threads:
            thread.start()
        drain_and_check(region, 4, per_thread, timeout=120)
        for thread in threads:
            thread.join()
