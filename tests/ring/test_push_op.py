"""ls_push_op, the client's one descriptor encoder: what it writes (read back through DESC_DTYPE, whose
offsets cffi takes from ring.h) and what it refuses (the worst value of each field, NULL arrays, a
closed consumer)."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import numpy as np
import pytest

from libshare import InvalidSubmission
from libshare.ring import C, DESC_DTYPE, Region
from libshare.ring._binding import ffi, lib

U32, U64 = 2**32 - 1, 2**64 - 1
NULL = ffi.NULL
BODY = slice(DESC_DTYPE.fields["program"][1], C.DESC_SIZE)  # a slot without its ticket


def decode(raw: bytes) -> SimpleNamespace:
    """One slot's fields; ``buffers`` cut to its ``nbuffers``, all eight ``offsets``."""
    d = np.frombuffer(raw, DESC_DTYPE)[0]
    return SimpleNamespace(ticket=int(d["ticket"]), program=int(d["program"]), opcode=int(d["opcode"]),
                           nbuffers=int(d["nbuffers"]), push_size=int(d["push_size"]), flags=int(d["flags"]),
                           groups=tuple(d["groups"].tolist()), buffers=tuple(d["buffer"][:d["nbuffers"]].tolist()),
                           offsets=tuple(d["offset"].tolist()), push=d["push"].tobytes())


def push_of(raw: bytes, size: int) -> bytes:
    """The first ``size`` push-constant bytes of a slot."""
    return decode(raw).push[:size]


def op(producer, ticket=1, opcode=C.OP_DISPATCH, program=7, groups=(1, 1, 1), ids=(), offsets=(), push=b"",
       nbuffers=None, noffsets=None, push_size=None):
    """Call the encoder; counts default to the lengths of the arrays."""
    return producer.push_op(ticket, opcode, program, *groups, len(ids) if nbuffers is None else nbuffers, ids,
                            len(offsets) if noffsets is None else noffsets, offsets, push,
                            len(push) if push_size is None else push_size)


def lane_indexes(region: Region, producer) -> tuple[int, int]:
    """(tail, reserved_tail) of the producer's lane, read through the C structs."""
    header = lib.ls_region_header_of(region._c())
    base = ffi.cast("char *", header)
    lane = ffi.cast("struct ls_lane *", base + header.lanes_offset + producer.lane * header.lane_stride)
    return lane.tail, lane.reserved_tail


@pytest.fixture
def region():
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        yield region


def test_every_field_arrives_as_given_at_its_widest(region):
    producer = region.lanes.producer()
    ids = list(range(U32 - 7, U32 + 1))
    offsets = [0, 1, 256, 4096, 2**32, 2**40, 2**63, U64]
    push = bytes(range(1, 129))
    assert op(producer, U64, C.OP_DISPATCH, U32, (1, U32, 65535), ids, offsets, push) == 1
    raw = region.lanes.pop(4).tobytes()
    d = decode(raw)
    assert (d.ticket, d.program, d.opcode, d.nbuffers, d.push_size, d.flags) == (U64, U32, C.OP_DISPATCH, 8, 128, 0)
    assert d.groups == (1, U32, 65535) and list(d.buffers) == ids and list(d.offsets) == offsets
    assert push_of(raw, d.push_size) == push


def test_unused_ids_offsets_and_push_bytes_are_zero_even_in_a_reused_slot():
    with Region.create(lanes=1, lane_entries=1, cq_entries=4) as region:  # one slot: every push reuses it
        producer = region.lanes.producer()
        assert op(producer, 1, ids=[U32] * 8, offsets=[U64] * 8, push=b"\xff" * 128) == 1
        region.lanes.pop(1)
        assert op(producer, 2, ids=[5], offsets=[64], push=b"\1\2\3\4") == 1
        raw = region.lanes.pop(1).tobytes()
        d = decode(raw)
        assert d.buffers == (5,) and d.offsets == (64,) + (0,) * 7
        assert push_of(raw, C.MAX_PUSH) == b"\1\2\3\4" + bytes(C.MAX_PUSH - 4)
        assert op(producer, 3, ids=[5], offsets=[64], push=b"\1\2\3\4") == 1
        assert region.lanes.pop(1).tobytes()[BODY] == raw[BODY]  # equal operations, equal slots (the arbiter's key)


def test_a_copy_carries_its_size_in_the_third_offset(region):
    producer = region.lanes.producer()
    assert op(producer, 9, C.OP_COPY, 0, (0, 0, 0), [3, 4], [16, 32, 4096]) == 1
    d = decode(region.lanes.pop(1).tobytes())
    assert (d.opcode, d.buffers, d.offsets[:4]) == (C.OP_COPY, (3, 4), (16, 32, 4096, 0))


def test_every_opcode_the_consumer_accepts_is_accepted(region):
    producer = region.lanes.producer()
    opcodes = [C.OP_NOP, C.OP_DISPATCH, C.OP_COPY, C.OP_LIST, C.OP_FILL, C.OP_UPDATE, C.OP_BARRIER,
               C.OP_DISPATCH_INDIRECT, C.OP_TIMESTAMP]
    assert opcodes == list(range(C.OP_MAX + 1))
    for half in (opcodes[:4], opcodes[4:8], opcodes[8:]):  # the lane holds four
        for opcode in half:
            assert op(producer, opcode, opcode) == 1
        assert list(region.lanes.pop(4)["opcode"]) == half  # none turned into OP_BAD


@pytest.mark.parametrize("fields", [
    {"opcode": C.OP_MAX + 1}, {"opcode": C.OP_BAD}, {"opcode": 0x10001}, {"opcode": U32},
    {"ids": [1] * 9}, {"ids": [1] * 2, "nbuffers": 258}, {"ids": [1] * 2, "nbuffers": U32},
    {"offsets": [0] * 9}, {"offsets": [0] * 2, "noffsets": U32},
    {"push": bytes(129)}, {"push": bytes(4), "push_size": 256 + 4}, {"push": bytes(4), "push_size": U32},
], ids=lambda fields: ",".join(f"{k}={v if isinstance(v, int) else len(v)}" for k, v in fields.items()))
def test_a_field_out_of_range_is_refused_before_a_slot_is_touched(region, fields):
    """Counts are checked whole: 258 buffers or 260 push bytes must not wrap into a u8 field."""
    producer = region.lanes.producer()
    before = lane_indexes(region, producer)
    assert op(producer, **fields) == -C.EBADSLOT
    assert lane_indexes(region, producer) == before and region.lanes.pending() == 0
    with pytest.raises(InvalidSubmission, match="out of range"):
        producer.raise_for(-C.EBADSLOT)
    assert op(producer, 5) == 1 and list(region.lanes.pop(4)["ticket"]) == [5]  # the lane is intact


@pytest.mark.parametrize("fields", [
    {"ids": NULL, "nbuffers": 2}, {"offsets": NULL, "noffsets": 1}, {"push": NULL, "push_size": 4},
])
def test_a_null_array_with_a_count_is_refused(region, fields):
    producer = region.lanes.producer()
    before = lane_indexes(region, producer)
    assert op(producer, **fields) == -errno.EINVAL
    assert lane_indexes(region, producer) == before and region.lanes.pending() == 0


def test_null_arrays_without_a_count_are_fine(region):
    producer = region.lanes.producer()
    assert op(producer, 4, ids=NULL, nbuffers=0, offsets=NULL, noffsets=0, push=NULL, push_size=0) == 1
    d = decode(region.lanes.pop(1).tobytes())
    assert (d.ticket, d.nbuffers, d.push_size, d.offsets) == (4, 0, 0, (0,) * 8)


def test_a_full_lane_takes_nothing_and_reserves_nothing(region):
    producer = region.lanes.producer()
    assert [op(producer, t) for t in range(6)] == [1, 1, 1, 1, 0, 0]
    tail, reserved = lane_indexes(region, producer)
    assert tail == reserved == 4
    assert list(region.lanes.pop(8)["ticket"]) == [0, 1, 2, 3]


def test_a_closed_consumer_is_refused_as_a_dead_peer(region):
    producer = region.lanes.producer()
    region.peers.announce_consumer()
    assert op(producer, 1) == 1
    region.peers.close_consumer(C.ECANCELED)
    assert op(producer, 2) == -C.EPEERDEAD
    assert list(region.lanes.pop(4)["ticket"]) == [1]  # nothing after the close reached the ring


def test_the_encoder_and_the_consumer_share_one_check():
    """A slot that ls_desc_check refuses is exactly one ls_push_op refuses: checked on a few edges."""
    past_last = C.OP_MAX + 1
    for opcode, nbuffers, push_size in [(C.OP_COPY, 8, 128), (past_last, 0, 0), (0, 9, 0), (0, 0, 129)]:
        desc = ffi.new("struct ls_desc *", {"opcode": opcode, "nbuffers": nbuffers, "push_size": push_size})
        with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
            pushed = op(region.lanes.producer(), ids=[1] * nbuffers, push=bytes(push_size), opcode=opcode)
        assert (pushed == 1) == (lib.ls_desc_check(desc) == 0), (opcode, nbuffers, push_size)
