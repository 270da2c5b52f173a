"""The engine's recordings (engine/recordings.c, "Recordings"): a client's distinct dispatches are recorded once
and reused, at most CACHE_MAX (64) of them kept; every dispatch still runs with its own content.
(Recordings of freed buffers: test_session's test_bindings_remembered_per_array_follow_new_arrays...)"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare

pytestmark = pytest.mark.usefixtures("vulkan_device_name")

DISTINCT = 200  # more than a client keeps recordings of


@pytest.fixture
def session():
    with libshare.connect(name="test", mode="embedded") as s:
        yield s


def test_more_distinct_dispatches_than_recordings_kept_each_run_their_own(session):
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y, z = session.array(64), session.array(64), session.array(64)
    x[:], y[:], z[:] = 1.0, 0.0, 0.0
    for round in range(3):
        tickets = []
        for k in range(DISTINCT):  # a new push constant each (evicts), and one repeated (hits)
            tickets.append(session.dispatch(program, 1, [x, y], struct.pack("If", 64, float(k))))
            tickets.append(session.dispatch(program, 1, [x, z], struct.pack("If", 64, 1.0)))
        for t in tickets:
            t.wait(60)
        assert np.all(y == (round + 1) * sum(range(DISTINCT))), f"round {round}: a dispatch ran another's recording"
        assert np.all(z == (round + 1) * DISTINCT), f"round {round}: a repeated dispatch was lost or doubled"


def test_cached_dispatches_and_copies_keep_their_order(session):
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y, w = session.array(64), session.array(64), session.array(64)
    x[:], y[:], w[:] = 1.0, 0.0, 0.0
    push = struct.pack("If", 64, 1.0)
    for _ in range(100):  # two recordings, alternating and pipelined: y += x, then x = y (x doubles)
        session.dispatch(program, 1, [x, y], push)
        session.copy(y, x)
    session.copy(x, w).wait(60)
    assert np.all(w == 2.0 ** 99), "a cached command ran out of order"
