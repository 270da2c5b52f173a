"""The consumer against peers that die mid-push or write garbage into the region."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from libshare import RingCorrupted
from libshare.ring import CQE_DTYPE, Region
from libshare.ring._binding import ffi

from tests.conftest import spawn_peer
from tests.ring._peer import descriptors


def test_producer_killed_mid_push_loses_only_its_half_written_slot():
    with Region.create(lanes=4, lane_entries=64, cq_entries=16) as region:
        region.lanes.producer().try_push(descriptors(7, 0, 3))
        victim = spawn_peer("half_push_then_die", region.fd, 1, 5)
        assert victim.wait(timeout=30) == -signal.SIGKILL
        region.lanes.producer().try_push(descriptors(7, 3, 2))

        popped = region.lanes.pop(100)
        assert sorted(popped["ticket"][popped["program"] == 1]) == [0, 1, 2, 3, 4]
        assert list(popped["ticket"][popped["program"] == 7]) == [0, 1, 2, 3, 4]
        assert 999_999 not in popped["ticket"]



def test_producer_killed_at_a_random_moment_leaves_a_clean_prefix():
    with Region.create(lanes=2, lane_entries=256, cq_entries=16) as region:
        victim = spawn_peer("produce", region.fd, 3, 10_000_000, 8)
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 20_000 and time.monotonic() < deadline:
            seen.extend(region.lanes.pop(256)["ticket"])
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=30) == -signal.SIGKILL
        seen.extend(region.lanes.pop(1024)["ticket"])
        assert seen == list(range(len(seen))), "published descriptors must arrive in order, none lost"


def lane_word(region: Region, lane: int, field: str) -> slice:
    """Byte range of one index word of one lane (lanes start after header and bells)."""
    stride = ffi.sizeof("struct ls_lane") + region.lane_entries * ffi.sizeof("struct ls_desc")
    offset = 256 + lane * stride + ffi.offsetof("struct ls_lane", field)
    return slice(offset, offset + 4)


@pytest.mark.parametrize("bad_tail", [0xFFFFFFFF, 65, 1 << 31])
def test_corrupted_tail_is_rejected_with_a_clear_and_sticky_error(bad_tail):
    with Region.create(lanes=2, lane_entries=64, cq_entries=16) as region:
        region._map[lane_word(region, 1, "tail")] = bad_tail.to_bytes(4, "little")
        with pytest.raises(RingCorrupted, match="submission lane 1.*capacity 64"):
            region.lanes.pop(10)
        with pytest.raises(RingCorrupted):
            region.lanes.pending()
        with pytest.raises(RingCorrupted):
            region.lanes.wait(timeout=0.01)


def test_corrupted_completion_head_is_rejected_by_the_poster():
    with Region.create(lanes=1, lane_entries=4, cq_entries=8) as region:
        cq_offset = 256 + (128 + 4 * 256)
        head = slice(cq_offset + 64, cq_offset + 68)
        region._map[head] = (12345).to_bytes(4, "little")
        with pytest.raises(RingCorrupted, match="completion ring"):
            region.completions.post(np.zeros(1, CQE_DTYPE))


def test_garbage_everywhere_never_crashes_or_hangs_the_consumer():
    rng = np.random.default_rng(1)
    for _ in range(200):
        with Region.create(lanes=2, lane_entries=8, cq_entries=8) as region:
            body = rng.integers(0, 256, region.size - 256, dtype=np.uint8).tobytes()
            region._map[256:] = body
            try:
                popped = region.lanes.pop(64)
                assert len(popped) <= 16
                region.reap()
                region.completions.post(np.zeros(2, CQE_DTYPE))
            except RingCorrupted:
                pass
