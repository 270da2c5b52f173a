"""The descriptor reader of the Python side: what a client wrote, as the arbiter reads it.

``struct ls_desc`` is declared once, in ring.h. A client writes it with one encoder in C,
``ls_push_op`` in ring.c (the Python session and bindings/c both call it), never from Python.
Its offsets reach Python through cffi (``_binding.DESC_BUFFERS_AT`` and ``DESC_PUSH_AT``)
and the fixed head below is checked against them when this module loads, so no other module
spells a layout or an offset: the arbiter, and tests of the encoder, read with :func:`decode`.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ._binding import DESC_BUFFERS_AT, DESC_DTYPE, DESC_PUSH_AT, C

__all__ = ["BODY", "Descriptor", "decode", "push_of"]

_HEAD = struct.Struct("<QIHBB3II")  # ticket, program, opcode, nbuffers, push_size, groups x3, flags
_IDS = struct.Struct(f"<{C.MAX_BUFFERS}I{C.MAX_BUFFERS}Q")  # buffer ids, then byte offsets

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


def decode(raw) -> Descriptor:
    """Read a descriptor from ``raw`` (a private copy: the ring's memory is the peer's to change)."""
    ticket, program, opcode, nbuffers, push_size, gx, gy, gz, flags = _HEAD.unpack_from(raw)
    fields = _IDS.unpack_from(raw, DESC_BUFFERS_AT)
    return Descriptor(ticket, program, opcode, nbuffers, push_size, (gx, gy, gz), flags,
                      fields[:min(nbuffers, C.MAX_BUFFERS)], fields[C.MAX_BUFFERS:])


def push_of(raw, push_size: int) -> bytes:
    """A descriptor's push-constant bytes."""
    return bytes(raw[DESC_PUSH_AT:DESC_PUSH_AT + push_size])
