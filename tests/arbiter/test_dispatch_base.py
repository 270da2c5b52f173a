"""A dispatch that starts at a workgroup other than 0 (LS_DESC_BASE: vkCmdDispatchBase), as the driver sends it.

The flag rides on a dispatch through a bind group, whose descriptor holds the group's id in buffer[0]
and has room for the first workgroup in buffer[1..3] (ring.h). The engine runs workgroups
base..base+count-1 alone; a base plus its count past the device's limit is refused (LS_EGROUPS) for
that client alone, beside an honest stream; the ring's one encoder refuses the flag anywhere but on a
dispatch through a group.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare
from libshare.errors import InvalidSubmission
from libshare.ring import C, DESC_DTYPE
from libshare.ring._binding import encode_op

from tests.arbiter.test_command_lists import beside_a_stream
from tests.arbiter.test_indirect import N, _saxpy

BASED = C.OP_DISPATCH | (C.DESC_GROUP | C.DESC_BASE) << 16


def _from(session, program, group, base: tuple[int, int, int], count: int):
    """saxpy (a = 2) of ``count`` workgroups from ``base`` through ``group``, pushed with raw fields."""
    return session._push(BASED, program.id, count, 1, 1, [group.id, *base], [], struct.pack("If", N, 2.0))


def test_a_dispatch_from_a_base_runs_those_workgroups_alone(tmp_path, streams):
    with beside_a_stream(tmp_path, streams) as (_honest, session):
        program, x, y = _saxpy(session)
        group = session.bind_group(program, [x, y])
        _from(session, program, group, (5, 0, 0), 3).wait(30)
        expected = np.ones(N, np.float32)
        expected[5 * 64:8 * 64] = 2.0 * x[5 * 64:8 * 64] + 1.0  # workgroups 5, 6 and 7
        assert np.array_equal(y, expected)
        y[:] = 1.0
        _from(session, program, group, (0, 0, 0), 2).wait(30)  # a base of 0 flagged: the plain dispatch
        expected = np.ones(N, np.float32)
        expected[:128] = 2.0 * x[:128] + 1.0
        assert np.array_equal(y, expected)


def test_a_base_past_the_device_limit_is_refused_for_its_client_alone(tmp_path, streams):
    with beside_a_stream(tmp_path, streams) as (_honest, attacker):
        program, x, y = _saxpy(attacker)
        group = attacker.bind_group(program, [x, y])
        for base in ((0xFFFFFFFF, 0, 0), (0, 0xFFFFFFFF, 0), (0, 0, 1 << 31)):  # past any device's limit
            with pytest.raises(InvalidSubmission, match="group count"):
                _from(attacker, program, group, base, 1).wait(30)
        assert np.all(y == 1.0)  # nothing ran
        _from(attacker, program, group, (1, 0, 0), 1).wait(30)  # and the session goes on
        assert np.array_equal(y[64:128], 2.0 * x[64:128] + 1.0) and np.all(y[:64] == 1.0)


def test_the_encoder_puts_a_base_only_on_a_dispatch_through_a_group():
    slot = np.frombuffer(encode_op(BASED, 3, (2, 1, 1), [77, 5, 6, 7], [], b""), DESC_DTYPE)[0]
    ids = slot["buffer"].tolist()
    assert (slot["flags"], slot["nbuffers"], ids) == (C.DESC_GROUP | C.DESC_BASE, 0, [77, 5, 6, 7, 0, 0, 0, 0])
    for opcode, ids in ((C.OP_DISPATCH | C.DESC_BASE << 16, [77, 5, 6, 7]),  # no group
                        (BASED, [77]),  # no base beside the group
                        (C.OP_DISPATCH_INDIRECT | (C.DESC_GROUP | C.DESC_BASE) << 16, [77, 5, 6, 7])):
        with pytest.raises(libshare.LibshareError):
            encode_op(opcode, 3, (1, 1, 1), ids, [], b"")
