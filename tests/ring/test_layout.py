"""Layout of the shared region: the ABI sizes, the header, the geometry rules, wrap-around."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from libshare import RingCorrupted
from libshare.ring import C, CQE_DTYPE, DESC_DTYPE, Region
from libshare.ring._binding import ffi, lib

from tests.conftest import ROOT


def test_slot_sizes_match_the_c_structs():
    assert DESC_DTYPE.itemsize == ffi.sizeof("struct ls_desc") == 256
    assert CQE_DTYPE.itemsize == ffi.sizeof("struct ls_cqe") == 32
    assert ffi.sizeof("struct ls_region_header") == 128


def test_descriptor_holds_eight_buffers_and_128_push_bytes():
    assert DESC_DTYPE["buffer"].shape == (C.MAX_BUFFERS,)
    assert DESC_DTYPE["offset"].shape == (C.MAX_BUFFERS,)
    assert DESC_DTYPE["push"].shape == (C.MAX_PUSH,)


def test_head_and_tail_live_on_separate_cache_lines():
    assert ffi.offsetof("struct ls_lane", "head") - ffi.offsetof("struct ls_lane", "tail") >= 64
    assert ffi.offsetof("struct ls_cq", "head") - ffi.offsetof("struct ls_cq", "tail") >= 64
    assert ffi.offsetof("struct ls_bells", "cq_flags") - ffi.offsetof("struct ls_bells", "sq_flags") >= 64


def test_header_starts_with_magic_and_version():
    with Region.create(lanes=2, lane_entries=4, cq_entries=4) as region:
        words = np.frombuffer(region._map[:8], np.uint32)
        assert words[0] == C.MAGIC == int.from_bytes(b"LSR1", "little")
        assert words[1] == C.VERSION
        assert region.size % 4096 == 0


@pytest.mark.parametrize(
    "lanes, entries, cq",
    [(0, 4, 4), (C.MAX_LANES + 1, 4, 4), (1, 3, 4), (1, 4, 6), (1, 0, 4), (1, 2 * C.MAX_ENTRIES, 4)],
)
def test_bad_geometry_is_refused(lanes, entries, cq):
    with pytest.raises(ValueError, match="bad ring geometry"):
        Region.create(lanes=lanes, lane_entries=entries, cq_entries=cq)


def numbered(start: int, count: int) -> np.ndarray:
    d = np.zeros(count, DESC_DTYPE)
    d["ticket"] = np.arange(start, start + count)
    d["opcode"] = C.OP_DISPATCH
    return d


def test_lane_wraps_around_many_times_in_order():
    with Region.create(lanes=1, lane_entries=8, cq_entries=4) as region:
        producer, seen = region.lanes.producer(), []
        for start in range(0, 300, 5):
            assert producer.try_push(numbered(start, 5)) == 5
            seen.extend(region.lanes.pop(3)["ticket"])
            seen.extend(region.lanes.pop(8)["ticket"])
        assert seen == list(range(300))


def test_full_lane_takes_only_what_fits():
    with Region.create(lanes=1, lane_entries=8, cq_entries=4) as region:
        producer = region.lanes.producer()
        assert producer.try_push(numbered(0, 20)) == 8
        assert producer.space() == 0
        assert producer.try_push(numbered(8, 1)) == 0
        assert list(region.lanes.pop(100)["ticket"]) == list(range(8))


def test_completion_ring_wraps_and_refuses_overflow():
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        got = []
        for start in range(0, 40, 3):
            cqe = np.zeros(3, CQE_DTYPE)
            cqe["ticket"] = np.arange(start, start + 3)
            assert region.completions.post(cqe) == 3
            got.extend(region.completions.take()["ticket"])
        assert got == list(range(42))
        assert region.completions.post(np.zeros(9, CQE_DTYPE)) == 4
        assert region.completions.space() == 0


def test_garbage_slot_arrives_marked_bad_and_neighbours_intact():
    with Region.create(lanes=1, lane_entries=8, cq_entries=4) as region:
        d = numbered(0, 4)
        d[1]["nbuffers"] = 200
        d[2]["push_size"] = 255
        region.lanes.producer().try_push(d)
        popped = region.lanes.pop()
        assert list(popped["opcode"]) == [C.OP_DISPATCH, C.OP_BAD, C.OP_BAD, C.OP_DISPATCH]
        assert list(popped["ticket"]) == [0, 1, 2, 3]


def test_wrong_dtype_and_non_contiguous_input_are_refused():
    with Region.create(lanes=1, lane_entries=8, cq_entries=4) as region:
        producer = region.lanes.producer()
        with pytest.raises(TypeError):
            producer.try_push(np.zeros(2, np.float32))
        with pytest.raises(BufferError):
            producer.try_push(numbered(0, 4)[::2])
        with pytest.raises(ValueError, match="whole number"):
            producer.try_push(b"x" * 100)


def test_attach_rejects_a_region_with_a_corrupt_header():
    region = Region.create(lanes=2, lane_entries=4, cq_entries=4)
    for offset, value in [(0, 0xDEADBEEF), (4, 99), (16, 1000), (32, 1 << 20)]:
        saved = region._map[offset : offset + 4]
        region._map[offset : offset + 4] = value.to_bytes(4, "little")
        with pytest.raises(RingCorrupted):
            Region.attach(region.fd)
        region._map[offset : offset + 4] = saved
    Region.attach(region.fd).close()
    region.close()


def test_attach_rejects_a_file_too_small_for_its_header():
    import os

    fd = os.memfd_create("tiny")
    os.ftruncate(fd, 64)
    with pytest.raises(RingCorrupted):
        Region.attach(fd)
    os.close(fd)


def test_close_is_idempotent_and_later_calls_say_closed():
    region = Region.create(lanes=1, lane_entries=4, cq_entries=4)
    region.close()
    region.close()
    assert region.closed
    with pytest.raises(ValueError, match="closed"):
        region.lanes.pending()


def test_more_threads_than_lanes_is_a_clear_error():
    import threading

    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        region.lanes.producer()
        failures = []

        def second_thread():
            try:
                region.lanes.producer()
            except Exception as exc:
                failures.append(exc)

        worker = threading.Thread(target=second_thread)
        worker.start()
        worker.join()
        assert failures and "lane" in str(failures[0])


def test_lane_of_an_exited_thread_is_reused():
    import threading

    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        worker = threading.Thread(target=lambda: region.lanes.producer().try_push(numbered(0, 1)))
        worker.start()
        worker.join()
        assert region.lanes.producer().try_push(numbered(1, 1)) == 1
        assert list(region.lanes.pop()["ticket"]) == [0, 1]


def test_region_size_function_agrees_with_mapping():
    size = lib.ls_region_size(3, 16, 32)
    with Region.create(lanes=3, lane_entries=16, cq_entries=32) as region:
        assert region.size == size


_ATTACH_FAULTS = """
import resource
from libshare.ring import Region
region = Region.create(lanes=8)
counts = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    view = Region.attach(region.fd)
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    view.close()
print(min(counts))
"""


def test_a_view_opened_by_a_client_does_not_fault_in_every_lane():
    """Opening a region reads its header, bells and completion ring; each lane's head lies on a page
    of its own and is read by the consumer alone, at its first look (a client paid a page fault
    per lane on its way to its welcome: 9 faults for 8 lanes, now 2). A fresh process counts them."""
    faults = int(subprocess.run([sys.executable, "-c", _ATTACH_FAULTS], cwd=ROOT, capture_output=True, text=True,
                                check=True, timeout=60).stdout)
    assert faults < 8, f"opening a view of an 8-lane region took {faults} page faults"


def test_a_consumer_view_starts_from_the_heads_at_its_first_look():
    """A consumer reads the lanes' heads when it first looks, not when it opens the region: a view
    opened before another consumer popped takes up where that one left off."""
    with Region.create(lanes=2, lane_entries=8, cq_entries=8) as region:
        region.lanes.push(np.zeros(5, DESC_DTYPE))
        late = Region.attach(region.fd)
        try:
            assert len(region.lanes.pop(3)) == 3
            assert len(late.lanes.pop(8)) == 2
        finally:
            late.close()
