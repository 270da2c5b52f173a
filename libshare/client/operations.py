"""The fields of fills, updates, timestamps and indirect dispatches, shared by a session and a command list.

Each function turns a call's arguments into what the ring's one encoder takes (``ls_push_op``,
``ls_encode_op``): ``(opcode, program, groups, buffer ids, offsets, push)``, binding arrays and
buffers through ``binding`` (``Submitter.binding``). The arbiter checks every field again
(engine/validate.c): these only shape them and refuse what no arbiter would take.

- A fill (``LS_OP_FILL``) writes a 32-bit value (an int from -2^31 to 2^32 - 1, a negative one as
  its two's complement, or a float, as float32) over ``nbytes`` (by default to the end of the array
  or buffer) from ``offset``: the destination offset in ``offset[0]``, the size in ``offset[1]``,
  the value in ``push[0..4)``.
- An update (``LS_OP_UPDATE``) writes up to ``LS_MAX_PUSH`` (128) inline bytes, a multiple of 4,
  carried in ``push[]``, at ``offset``.
- A timestamp (``LS_OP_TIMESTAMP``) names one buffer and an offset (a multiple of 8): the device's
  timestamp once the commands before it have ended, a uint64 there, and a uint64 1 (its
  availability) 8 bytes past it.
- An indirect dispatch (``LS_OP_DISPATCH_INDIRECT``) binds as a dispatch does (buffers, or a bind
  group: flags ``LS_DESC_GROUP``, its id the one buffer id); its ``groups`` name the buffer that
  holds the three uint32 counts and their byte offset (low, high word).
"""

from __future__ import annotations

import struct

import numpy as np

from libshare import errors
from libshare.client.buffers import Program, byte_size
from libshare.client.groups import BindGroup
from libshare.ring import C

__all__ = ["fill_fields", "indirect_fields", "timestamp_fields", "update_bytes", "update_fields"]


def fill_fields(binding, buffer, value, nbytes: int | None, offset: int) -> tuple:
    """The fields of a fill of ``buffer`` (an array or a Buffer) with ``value``."""
    if isinstance(value, float):
        word = struct.pack("<f", value)
    elif isinstance(value, (int, np.integer)) and -(1 << 31) <= int(value) < 1 << 32:
        word = struct.pack("<I", int(value) & 0xFFFFFFFF)
    else:
        raise errors.InvalidSubmission(f"a fill's value is a 32-bit int or a float (got {value!r})")
    _, buffer_id, base = binding(buffer)
    if nbytes is None:
        nbytes = byte_size(buffer) - offset
    return C.OP_FILL, 0, (0, 0, 0), [buffer_id], [base + int(offset), int(nbytes)], word


def update_bytes(data) -> bytes:
    """The bytes an update writes: those of ``data`` (bytes-like, or an array in C order)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).tobytes()
    return bytes(data)


def update_fields(binding, buffer, data: bytes, offset: int) -> tuple:
    """The fields of an update of ``buffer`` at ``offset`` with ``data`` (at most LS_MAX_PUSH bytes)."""
    if not data or len(data) > C.MAX_PUSH or len(data) % 4:
        raise errors.InvalidSubmission(f"an update writes 4 to {C.MAX_PUSH} bytes, a multiple of 4 (got "
                                       f"{len(data)}): copy from a shared buffer for more")
    _, buffer_id, base = binding(buffer)
    return C.OP_UPDATE, 0, (0, 0, 0), [buffer_id], [base + int(offset)], data


def timestamp_fields(binding, buffer, offset: int) -> tuple:
    """The fields of a timestamp into ``buffer`` at ``offset``: 16 bytes, the stamp then its availability."""
    _, buffer_id, base = binding(buffer)
    return C.OP_TIMESTAMP, 0, (0, 0, 0), [buffer_id], [base + int(offset)], b""


def indirect_fields(binding, program: Program, counts, buffers, push: bytes, offset: int) -> tuple:
    """The fields of an indirect dispatch of ``program`` whose counts are 12 bytes of ``counts`` at
    ``offset``."""
    if program.lost is not None:
        raise errors.InvalidSubmission(f"program {program.id} is lost: {program.lost}")
    _, counts_id, base = binding(counts)
    at = base + int(offset)
    if not 0 <= at < 1 << 64:
        raise errors.InvalidSubmission(f"the counts' offset must be within 64 bits (got {at})")
    groups = (counts_id, at & 0xFFFFFFFF, at >> 32)
    if isinstance(buffers, BindGroup):
        if buffers.lost is not None:
            raise errors.InvalidSubmission(f"bind group {buffers.id} is lost: {buffers.lost}")
        return C.OP_DISPATCH_INDIRECT | C.DESC_GROUP << 16, program.id, groups, [buffers.id], [], bytes(push)
    bound = [binding(item) for item in buffers]
    return (C.OP_DISPATCH_INDIRECT, program.id, groups, [buffer_id for _, buffer_id, _ in bound],
            [base_k for _, _, base_k in bound], bytes(push))
