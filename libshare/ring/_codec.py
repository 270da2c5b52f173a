"""The one descriptor codec of the Python side: what a client writes, what the arbiter reads.

``struct ls_desc`` is declared once, in ring.h. Its offsets reach Python through cffi
(``_binding.DESC_BUFFERS_AT`` and ``DESC_PUSH_AT``) and the fixed head below is checked
against them when this module loads, so no other module spells a layout or an offset:
the session encodes with :func:`encode` and the arbiter decodes with :func:`decode`.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Sequence

from ._binding import DESC_BUFFERS_AT, DESC_DTYPE, DESC_PUSH_AT, C

__all__ = ["BODY", "Descriptor", "decode", "encode", "push_of"]

_HEAD = struct.Struct("<QIHBB3II")  # ticket, program, opcode, nbuffers, push_size, groups x3, flags
_IDS = struct.Struct(f"<{C.MAX_BUFFERS}I{C.MAX_BUFFERS}Q")  # buffer ids, then byte offsets
_ZEROS = (0,) * C.MAX_BUFFERS

BODY = slice(DESC_DTYPE.fields["program"][1], C.DESC_SIZE)
"""A descriptor without its ticket: two descriptors that agree here ask for the same command."""

if (_HEAD.size, DESC_BUFFERS_AT + _IDS.size, DESC_DTYPE.itemsize) != (DESC_BUFFERS_AT, DESC_PUSH_AT, C.DESC_SIZE):
    raise ImportError("libshare/ring/_codec.py disagrees with struct ls_desc in ring.h")


class Descriptor(NamedTuple):
    """One decoded descriptor: ``buffers`` cut to ``nbuffers`` (at most 8), all 8 ``offsets``
    (an ``LS_OP_COPY`` keeps its size in the third)."""

    ticket: int
    program: int
    opcode: int
    nbuffers: int
    push_size: int
    groups: tuple[int, int, int]
    flags: int
    buffers: tuple[int, ...]
    offsets: tuple[int, ...]


def encode(ticket: int, opcode: int, program: int, buffers: Sequence[int], offsets: Sequence[int],
           groups: Sequence[int], push: bytes = b"") -> bytes:
    """A descriptor's bytes. For ``LS_OP_COPY``, ``offsets`` are (source, destination, size)."""
    desc = bytearray(C.DESC_SIZE)
    _HEAD.pack_into(desc, 0, ticket, program, opcode, len(buffers), len(push), *groups, 0)
    _IDS.pack_into(desc, DESC_BUFFERS_AT, *buffers, *_ZEROS[len(buffers):], *offsets, *_ZEROS[len(offsets):])
    desc[DESC_PUSH_AT:DESC_PUSH_AT + len(push)] = push
    return bytes(desc)


def decode(raw) -> Descriptor:
    """Read a descriptor from ``raw`` (a private copy: the ring's memory is the peer's to change)."""
    ticket, program, opcode, nbuffers, push_size, gx, gy, gz, flags = _HEAD.unpack_from(raw)
    fields = _IDS.unpack_from(raw, DESC_BUFFERS_AT)
    return Descriptor(ticket, program, opcode, nbuffers, push_size, (gx, gy, gz), flags,
                      fields[:min(nbuffers, C.MAX_BUFFERS)], fields[C.MAX_BUFFERS:])


def push_of(raw, push_size: int) -> bytes:
    """A descriptor's push-constant bytes."""
    return bytes(raw[DESC_PUSH_AT:DESC_PUSH_AT + push_size])
