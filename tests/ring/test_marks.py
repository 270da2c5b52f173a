"""Marks: what the consumer must pop before everything published so far is taken (ls_sq_marks).

A free waits on them in the arbiter (engine/objects.c, defer_drop): the descriptors a client pushed
before it must still find the buffer."""

from __future__ import annotations

import threading

from libshare.ring import C, Region
from libshare.ring._binding import ffi, lib

from tests.ring._peer import descriptors


def test_marks_are_passed_once_every_lane_is_popped_up_to_them_and_not_before():
    with Region.create(lanes=4, lane_entries=64, cq_entries=16) as region:
        region.lanes.push(descriptors(1, 0, 10))  # this thread's lane
        other = threading.Thread(target=region.lanes.push, args=(descriptors(2, 0, 5),))
        other.start()
        other.join()  # a second lane
        marks = ffi.new("uint32_t[]", C.MAX_LANES)
        lanes = lib.ls_sq_marks(region._handle, marks, C.MAX_LANES)
        assert lanes == 4 and sorted(marks[0:lanes]) == [0, 0, 5, 10]
        assert lib.ls_sq_marks(region._handle, marks, 3) < 0  # too few places for the lanes
        region.lanes.push(descriptors(1, 10, 20))  # published after the marks: not waited for
        popped = list(region.lanes.pop(12)["ticket"])
        assert len(popped) == 12 and lib.ls_sq_passed(region._handle, marks, lanes) == 0
        popped += list(region.lanes.pop(100)["ticket"])
        assert len(popped) == 35 and lib.ls_sq_passed(region._handle, marks, lanes) == 1
