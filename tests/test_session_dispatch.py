"""Session.dispatch and copy through the ring's C encoder (ls_push_op), against a real daemon:
what they send, what they refuse before a ticket exists, and a ring the arbiter has closed."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare
from libshare.protocol import control as _control

from tests.arbiter.conftest import daemon  # noqa: F401 - the daemon fixture

pytestmark = pytest.mark.usefixtures("vulkan_device_name")


def connect(pipe_dir) -> libshare.Session:
    return libshare.connect(name="dispatch", mode="daemon", pipe_directory=pipe_dir)


def test_dispatch_takes_groups_buffers_and_push_in_every_accepted_form(daemon):
    with connect(daemon[1]) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x = session.array(256)
        x[:] = np.arange(256)
        y_buffer = session.alloc(1024)
        y = y_buffer.array(256)
        forms = [(1, [x, y], struct.pack("If", 64, 1.0)),  # an int, arrays, bytes
                 ((1,), (x, y_buffer), bytearray(struct.pack("If", 64, 1.0))),  # a Buffer binds from 0
                 ((1, 1), [x[64:], y[64:]], memoryview(struct.pack("If", 64, 1.0))),  # slices
                 ([1, 1, 1], [x[128:], y[128:]], np.array([64, 0x3F800000], np.uint32))]
        tickets = [session.dispatch(program, groups, buffers, push) for groups, buffers, push in forms]
        for ticket in tickets:
            ticket.wait(30)
        assert [t.id for t in tickets] == list(range(tickets[0].id, tickets[0].id + 4))
        expected = np.concatenate([2 * np.arange(64), np.arange(64, 192), np.zeros(64)])  # y[:64] twice
        assert np.array_equal(y, expected)


@pytest.mark.parametrize("bad", ["nine buffers", "129 push bytes", "four group counts", "negative group",
                                 "group beyond u32", "negative copy size"])
def test_a_refused_operation_spends_no_ticket_and_leaves_no_record(daemon, bad):
    with connect(daemon[1]) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        push = struct.pack("If", 64, 1.0)
        first = session.dispatch(program, 1, [x, y], push)
        call = {"nine buffers": lambda: session.dispatch(program, 1, [x] * 9, push),
                "129 push bytes": lambda: session.dispatch(program, 1, [x, y], bytes(129)),
                "four group counts": lambda: session.dispatch(program, (1, 1, 1, 1), [x, y], push),
                "negative group": lambda: session.dispatch(program, -1, [x, y], push),
                "group beyond u32": lambda: session.dispatch(program, (1, 2**32), [x, y], push),
                "negative copy size": lambda: session.copy(x, y, -1)}[bad]
        with pytest.raises(libshare.InvalidSubmission):
            call()
        last = session.copy(x, y, 4)
        assert last.id == first.id + 1
        session.wait_idle(30)  # a record left by the refusal would never complete
        assert first.wait(0) is first and last.wait(0) is last


def test_dispatch_after_the_arbiter_closed_the_ring_raises_at_once(daemon):
    process, pipe_dir = daemon
    with connect(pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0)).wait(30)
        _control.run("quit", pipe_directory=pipe_dir)
        process.wait(60)  # it closed this session's ring on its way out
        for _ in range(2):  # not a ticket into the void, and sticky
            with pytest.raises(libshare.ArbiterLost):
                session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0))
        with pytest.raises(libshare.ArbiterLost):
            session.copy(x, y)


@pytest.mark.parametrize("groups", [(65535, 65535, 65535), (65535, 65535, 2), (2, 65535, 65535)])
def test_group_counts_that_multiply_past_32_bits_are_refused_not_run_in_part(daemon, groups):
    """Each count within the device's limit, their product past 2^32 - 1: lavapipe counted the
    workgroups in 32 bits and ran the remainder (196,607 of 65535^3), and the ticket said success."""
    with connect(daemon[1]) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        with pytest.raises(libshare.InvalidSubmission, match="multiply past 2"):
            session.dispatch(program, groups, [x, y], struct.pack("If", 64, 1.0)).wait(30)
        x[:], y[:] = 1.0, 2.0
        session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0)).wait(30)  # the session goes on
        assert np.all(y == 3.0)


def test_load_program_from_an_endless_or_huge_file_is_refused_without_reading_it_all(daemon, tmp_path):
    """A path such as /dev/zero was read until the client ran out of memory (ls_load_program_file too)."""
    from libshare.protocol.wire import MAX_FRAME

    huge = tmp_path / "huge.spv"
    with open(huge, "wb") as file:
        file.truncate(MAX_FRAME + 1)
    with connect(daemon[1]) as session:
        for path in ("/dev/zero", huge):
            with pytest.raises(libshare.InvalidSubmission, match=f"more than {MAX_FRAME} bytes"):
                session.load_program(path)
        assert session.load_program(libshare.shaders.path("saxpy")).bindings == 2  # a real file still loads
