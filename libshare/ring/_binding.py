"""The binding layer: the only module that names the cffi ``ffi`` and ``lib``.

It turns C return codes into exceptions (in one function, :func:`check`) and
exports the ABI's constants and numpy dtypes, read from C rather than copied.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from libshare import errors
from libshare.ring._ring_cffi import ffi, lib

__all__ = ["ffi", "lib", "check", "DESC_DTYPE", "DESC_BUFFERS_AT", "DESC_PUSH_AT", "CQE_DTYPE", "C"]


class _Constants:
    """The ring ABI's constants, as compiled into the C core."""

    MAGIC = lib.LS_RING_MAGIC
    VERSION = lib.LS_RING_VERSION
    DESC_SIZE = lib.LS_DESC_SIZE
    CQE_SIZE = lib.LS_CQE_SIZE
    MAX_BUFFERS = lib.LS_MAX_BUFFERS
    MAX_PUSH = lib.LS_MAX_PUSH
    MAX_LANES = lib.LS_MAX_LANES
    MAX_ENTRIES = lib.LS_MAX_ENTRIES
    OP_NOP = lib.LS_OP_NOP
    OP_DISPATCH = lib.LS_OP_DISPATCH
    OP_COPY = lib.LS_OP_COPY
    OP_BAD = lib.LS_OP_BAD
    ECORRUPT = lib.LS_ECORRUPT
    EPEERDEAD = lib.LS_EPEERDEAD
    EBADSLOT = lib.LS_EBADSLOT
    ENOPROGRAM = lib.LS_ENOPROGRAM
    ENOBUFFER = lib.LS_ENOBUFFER
    EBINDINGS = lib.LS_EBINDINGS
    ERANGE = lib.LS_ERANGE
    EGROUPS = lib.LS_EGROUPS
    EPUSH = lib.LS_EPUSH
    EFAULT = lib.LS_EFAULT
    ECANCELED = lib.LS_ECANCELED
    EMOVED = lib.LS_EMOVED
    SPIN_YIELD = lib.LS_SPIN_YIELD
    SPIN_KEEP = lib.LS_SPIN_KEEP
    SPIN_NONE = lib.LS_SPIN_NONE
    PEER_ALIVE = lib.LS_PEER_ALIVE
    PEER_CLOSED = lib.LS_PEER_CLOSED


C = _Constants


def _dtype(struct: str, fields: list[tuple[str, str, tuple[int, ...]]]) -> np.dtype:
    names, formats, offsets = [], [], []
    for name, fmt, shape in fields:
        names.append(name)
        formats.append((fmt, shape) if shape else fmt)
        offsets.append(ffi.offsetof(struct, name))
    return np.dtype(
        {"names": names, "formats": formats, "offsets": offsets, "itemsize": ffi.sizeof(struct)}
    )


DESC_DTYPE = _dtype(
    "struct ls_desc",
    [
        ("ticket", "<u8", ()),
        ("program", "<u4", ()),
        ("opcode", "<u2", ()),
        ("nbuffers", "u1", ()),
        ("push_size", "u1", ()),
        ("groups", "<u4", (3,)),
        ("flags", "<u4", ()),
        ("buffer", "<u4", (8,)),
        ("offset", "<u8", (8,)),
        ("push", "u1", (128,)),
    ],
)
"""numpy dtype of one submission slot (``struct ls_desc``)."""

DESC_BUFFERS_AT = ffi.offsetof("struct ls_desc", "buffer")
"""Byte offset of a descriptor's buffer ids (8 x u32), then its offsets (8 x u64)."""
DESC_PUSH_AT = ffi.offsetof("struct ls_desc", "push")
"""Byte offset of a descriptor's inline push constants."""

CQE_DTYPE = _dtype(
    "struct ls_cqe",
    [
        ("ticket", "<u8", ()),
        ("status", "<i4", ()),
        ("flags", "<u4", ()),
        ("device_ns", "<u8", ()),
        ("reserved", "<u8", ()),
    ],
)
"""numpy dtype of one completion slot (``struct ls_cqe``)."""


def describe_corruption(region_handle) -> str:
    """Say which index of a region failed validation, from ls_last_error."""
    info = ffi.new("struct ls_error_info *")
    lib.ls_last_error(region_handle, info)
    where = "completion ring" if info.lane == 0xFFFFFFFF else f"submission lane {info.lane}"
    return (
        f"{where}: head {info.head} and tail {info.tail} are {(info.tail - info.head) & 0xFFFFFFFF} "
        f"apart, beyond its capacity {info.capacity}"
    )


def check(rc: int, region_handle=None, what: str = "ring operation") -> int:
    """Return ``rc`` when it is not negative, else raise the matching libshare error."""
    if rc >= 0:
        return rc
    code = -rc
    if code == C.ECORRUPT:
        detail = describe_corruption(region_handle) if region_handle is not None else "bad header"
        raise errors.RingCorrupted(f"{what}: shared-memory region failed validation ({detail}); "
                                   "the peer wrote garbage into it, so it must be dropped")
    if code == C.EPEERDEAD:
        raise errors.ArbiterLost(f"{what}: the process on the other side of the ring exited or closed it")
    if code == C.EBADSLOT:
        raise errors.InvalidSubmission(f"{what}: descriptor fields out of range")
    if code == errno.ETIMEDOUT:
        raise errors.Timeout(f"{what}: timed out")
    if code == errno.EBUSY:
        raise errors.RingFull(f"{what}: every submission lane is owned by a live thread; "
                              "create the region with more lanes")
    raise OSError(code, f"{what}: {os.strerror(code)}")
