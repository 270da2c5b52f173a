"""The binding layer: the only module that names the cffi ``ffi`` and ``lib``.

It turns C return codes into exceptions (in one function, :func:`check`),
exports the ABI's constants and numpy dtypes, read from C rather than copied,
and holds the C core as thin functions, which the ring's objects call (the
layers: cffi's ``lib``, these functions, the objects of ``libshare.ring``).
"""

from __future__ import annotations

import errno
import os

import numpy as np

from libshare import errors
from libshare.ring._ring_cffi import ffi, lib

__all__ = ["ffi", "lib", "check", "code_error", "DESC_DTYPE", "DESC_BUFFERS_AT", "DESC_PUSH_AT", "CQE_DTYPE", "C"]


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
    OP_LIST = lib.LS_OP_LIST
    OP_FILL = lib.LS_OP_FILL
    OP_UPDATE = lib.LS_OP_UPDATE
    OP_BARRIER = lib.LS_OP_BARRIER
    OP_DISPATCH_INDIRECT = lib.LS_OP_DISPATCH_INDIRECT
    OP_TIMESTAMP = lib.LS_OP_TIMESTAMP
    OP_MAX = lib.LS_OP_MAX
    OP_BAD = lib.LS_OP_BAD
    DESC_SUBMISSION_PUSH = lib.LS_DESC_SUBMISSION_PUSH
    LIST_ARG = lib.LS_LIST_ARG
    DESC_GROUP = lib.LS_DESC_GROUP
    DESC_BASE = lib.LS_DESC_BASE
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
    EUNSUPPORTED = lib.LS_EUNSUPPORTED
    SPIN_YIELD = lib.LS_SPIN_YIELD
    SPIN_KEEP = lib.LS_SPIN_KEEP
    SPIN_NONE = lib.LS_SPIN_NONE
    PEER_ALIVE = lib.LS_PEER_ALIVE
    PEER_CLOSED = lib.LS_PEER_CLOSED
    SPIN_NS = lib.LS_SPIN_NS
    TICKET_NONE = lib.LS_TICKET_NONE
    TICKET_PENDING = lib.LS_TICKET_PENDING
    TICKET_DONE = lib.LS_TICKET_DONE
    TICKET_MOVED = lib.LS_TICKET_MOVED
    TICKET_ORPHAN = lib.LS_TICKET_ORPHAN


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


def _code_names() -> dict[int, str]:
    """The error table's codes this binding knows, by number: ring.h's LS_E* and errno values."""
    names = {}
    for row in errors.TABLE:
        number = getattr(lib, row.name, None) if row.name.startswith("LS_") else getattr(errno, row.name, None)
        if number is not None:
            names[number] = row.name
    return names


_CODE_NAMES = _code_names()


def code_error(code: int, context: str, detail: str = "", unknown: type[Exception] = OSError) -> Exception:
    """The exception C code ``code`` (positive: an LS_E* code of ring.h or an errno value, as the ring
    returns it negated and an arbiter answers a ticket) stands for, through the error table
    (:func:`libshare.errors.error_for`); a code the table lacks gives ``unknown``."""
    name = _CODE_NAMES.get(code)
    if name is not None:
        return errors.error_for(name, context, detail)
    if issubclass(unknown, OSError):
        return unknown(code, f"{context}: {os.strerror(code)}")
    return unknown(f"{context}: {os.strerror(code)}")


def check(rc: int, region_handle=None, what: str = "ring operation") -> int:
    """Return ``rc`` when it is not negative, else raise the error it stands for (:func:`code_error`)."""
    if rc >= 0:
        return rc
    detail = describe_corruption(region_handle) if -rc == C.ECORRUPT and region_handle is not None else ""
    raise code_error(-rc, what, detail)


# -------------------------------------------------------------------- the C core, as thin functions
#
# The ring's objects (_region.py, _lanes.py, _completions.py, _peers.py, _tickets.py) hold C
# handles (an ``ls_region *``, an ``ls_producer *``, an ``ls_tickets *``) and call the functions
# below, never ``lib``: each takes handles and Python values, makes one C call and returns what it
# means, a negative code going through ``check``. A hot path is the C function itself, named once
# here (``push``, ``push_op``, ``tickets_push``): a cffi call is the cheapest call Python makes, and
# a caller binds it to its handle once (``functools.partial``).

push = lib.ls_push
"""``push(producer, descs, count)``: copy ``count`` descriptors into the lane and publish them; how
many fitted (0 when it is full), or a negative code for :func:`check`."""

push_op = lib.ls_push_op
"""``push_op(producer, ticket, opcode, program, gx, gy, gz, nbuffers, ids, noffsets, offsets, push,
push_size)``: ring.h's one descriptor encoder; 1, 0 when the lane is full, or a negative code."""

tickets_push = lib.ls_tickets_push
"""``tickets_push(book, producer, <push_op's arguments>)``: :data:`push_op`, and the ticket recorded
pending once pushed; 1, 0 when the lane is full, or a negative code (``-ENOMEM``: no room for the
record)."""


def encode_op(opcode: int, program: int, groups, ids: list, offsets: list, push: bytes) -> bytes:
    """One descriptor (ticket 0) as ring.h's encoder writes it (``ls_encode_op``: the encoding and
    check of :data:`push_op`), for a command list; a refused operation raises its code's error."""
    slot = ffi.new("char[]", lib.LS_DESC_SIZE)
    try:
        rc = lib.ls_encode_op(slot, opcode, program, *groups, len(ids), ids, len(offsets), offsets, push, len(push))
    except OverflowError:  # cffi: a count, id or offset beyond its C type
        rc = -lib.LS_EBADSLOT
    if rc < 0:
        raise code_error(-rc, "recording a command")
    return ffi.buffer(slot)[:]


def pointer(array):
    """A C pointer to the bytes of ``array`` (bytes, or a C-contiguous numpy array), valid while the
    returned object lives (or until :func:`release`)."""
    return ffi.from_buffer("char[]", array)


def release(pointer_) -> None:
    """Give back a :func:`pointer` at once instead of when it is collected."""
    ffi.release(pointer_)


def entries(values, dtype: np.dtype):
    """A C pointer and an entry count for ``values``: bytes (a whole number of ``dtype`` entries, passed
    as they are) or a C-contiguous numpy array of ``dtype``."""
    if isinstance(values, bytes):
        if len(values) % dtype.itemsize:
            raise ValueError(f"{len(values)} bytes is not a whole number of {dtype.itemsize}-byte entries")
        return values, len(values) // dtype.itemsize
    array = np.asarray(values)
    if array.dtype != dtype:
        raise TypeError(f"expected entries of dtype {dtype}, got {array.dtype}")
    if not array.flags.c_contiguous:
        raise BufferError("entries must be C-contiguous; copy them first (np.ascontiguousarray)")
    return ffi.from_buffer("char[]", array), array.size


# ---------------------------------------------------------------- the region (ring.c)

def region_size(lanes: int, lane_entries: int, cq_entries: int) -> int:
    """Bytes a region of this geometry takes; ValueError for a geometry the ring refuses."""
    size = lib.ls_region_size(lanes, lane_entries, cq_entries)
    if size < 0:
        raise ValueError(
            f"bad ring geometry: lanes={lanes} (1..{C.MAX_LANES}), lane_entries={lane_entries} and "
            f"cq_entries={cq_entries} (powers of two up to {C.MAX_ENTRIES})"
        )
    return size


def region_format(address: int, size: int, lanes: int, lane_entries: int, cq_entries: int,
                  creator_pid: int) -> None:
    """Write a new region's header and indexes into the ``size`` mapped bytes at ``address``."""
    check(lib.ls_region_format(ffi.cast("char *", address), size, lanes, lane_entries, cq_entries, creator_pid))


def region_open(address: int, size: int):
    """This process's view (``ls_region *``) of the region mapped at ``address``, its header checked
    and its geometry copied; RingCorrupted when the header fails."""
    handle = ffi.new("ls_region **")
    check(lib.ls_region_open(ffi.cast("char *", address), size, handle), None, "attach")
    return handle[0]


def region_close(region) -> None:
    """Free a view made by :func:`region_open` (the mapping stays the caller's)."""
    lib.ls_region_close(region)


def region_geometry(region) -> tuple[int, int, int]:
    """``(lane_count, lane_entries, cq_entries)`` from the region's header."""
    header = lib.ls_region_header_of(region)
    return header.lane_count, header.lane_entries, header.cq_entries


def lane_offsets(region, lane_count: int) -> list[tuple[int, int, int]]:
    """For each of the first ``lane_count`` lanes, the byte offsets in the region of its tail, its head
    and its first slot."""
    header = lib.ls_region_header_of(region)
    tail_at, head_at = ffi.offsetof("struct ls_lane", "tail"), ffi.offsetof("struct ls_lane", "head")
    slots_at = ffi.sizeof("struct ls_lane")
    starts = [header.lanes_offset + lane * header.lane_stride for lane in range(lane_count)]
    return [(start + tail_at, start + head_at, start + slots_at) for start in starts]


# ---------------------------------------------------------------- the peers and their wake-ups (wake.c)

def set_consumer(region, pid: int, alive: bool) -> None:
    """Record ``pid`` as the consumer, alive or closed (a close wakes the client's waiters)."""
    lib.ls_set_consumer(region, pid, C.PEER_ALIVE if alive else C.PEER_CLOSED)


def set_client(region, pid: int, alive: bool) -> None:
    """Record ``pid`` as the client, alive or closed."""
    lib.ls_set_client(region, pid, C.PEER_ALIVE if alive else C.PEER_CLOSED)


def close_consumer(region, reason: int) -> None:
    """Close the consumer side for ``reason`` (0, C.ECANCELED, C.EFAULT or C.EMOVED); wakes waiters."""
    lib.ls_close_consumer(region, reason)


def close_reason(region) -> int:
    """Why the consumer closed (0 while it is open or after a plain shutdown)."""
    return lib.ls_close_reason(region)


def set_peer_pidfd(region, pidfd: int) -> None:
    """The pidfd of the process on the other side, which this view's waits check between slices."""
    lib.ls_set_peer_pidfd(region, pidfd)


def set_wake_fd(region, doorbell_fd: int) -> None:
    """The doorbell socket this view rings instead of a futex (and sends async waiters' bytes on)."""
    lib.ls_set_wake_fd(region, doorbell_fd)


def set_spin_mode(region, mode: int) -> None:
    """How this view's waits spin (C.SPIN_YIELD, C.SPIN_KEEP or C.SPIN_NONE)."""
    check(lib.ls_set_spin_mode(region, mode), None, "set the spin mode")


# ---------------------------------------------------------------- the submission lanes (lanes.c)

def producer_open(region, tid: int, pid: int):
    """Claim a lane of ``region`` for thread ``tid`` of ``pid``: its ``ls_producer *``; RingFull when
    every lane is held by a live thread."""
    handle = ffi.new("ls_producer **")
    check(lib.ls_producer_open(region, tid, pid, handle), None, "claim lane")
    return handle[0]


def producer_close(producer) -> None:
    """Give the lane back and free the producer."""
    lib.ls_producer_close(producer)


def producer_lane(producer) -> int:
    """The index of the lane ``producer`` holds."""
    return lib.ls_producer_lane(producer)


def lane_space(producer, region) -> int:
    """Free slots in the producer's lane."""
    return check(lib.ls_space(producer), region, "space")


def sq_pending(region) -> int:
    """Descriptors published and not yet popped, over all lanes."""
    return check(lib.ls_sq_pending(region), region, "pending")


def sq_pop(region, out, count: int) -> int:
    """Pop up to ``count`` descriptors into ``out`` (a :func:`pointer`); how many."""
    return check(lib.ls_sq_pop(region, out, count), region, "pop")


def sq_wait(region, spin_ns: int, timeout_ns: int) -> int:
    """Wait until descriptors are pending (``timeout_ns`` < 0: forever); how many are."""
    return check(lib.ls_sq_wait(region, spin_ns, timeout_ns), region, "wait")


def sq_arm(region) -> int:
    """Ask producers to ring, then look: how many descriptors are pending already."""
    return check(lib.ls_sq_arm(region), region, "arm")


def sq_disarm(region) -> None:
    """Clear the request :func:`sq_arm` made."""
    lib.ls_sq_disarm(region)


# ---------------------------------------------------------------- the completion ring (completions.c)

def cq_post(region, cqes, count: int) -> int:
    """Post up to ``count`` completions from ``cqes``; how many fitted."""
    return check(lib.ls_cq_post(region, cqes, count), region, "post")


def cq_space(region) -> int:
    """Free completion slots, as the poster sees them."""
    return check(lib.ls_cq_space(region), region, "completion space")


def cq_pop(region, out, count: int) -> int:
    """Take up to ``count`` ready completions into ``out`` (a :func:`pointer`); how many."""
    return check(lib.ls_cq_pop(region, out, count), region, "completions")


def cq_arm(region) -> int:
    """Ask for a byte on the doorbell with the next completion, then look: how many are ready."""
    return check(lib.ls_cq_arm(region), region, "arm completions")


def cq_wait(region, min_count: int, spin_ns: int, timeout_ns: int) -> int:
    """Wait until ``min_count`` completions are ready (``timeout_ns`` < 0: forever); how many are."""
    return check(lib.ls_cq_wait(region, min_count, spin_ns, timeout_ns), region, "wait for completions")


# ---------------------------------------------------------------- the ticket book (tickets.c)

def tickets_new():
    """A new, empty ticket book (``ls_tickets *``)."""
    handle = ffi.new("ls_tickets **")
    check(lib.ls_tickets_new(handle), None, "ticket book")
    return handle[0]


def tickets_free(book) -> None:
    """Free a ticket book."""
    lib.ls_tickets_free(book)


def tickets_cancelled(book):
    """The book's count of completions filed with -LS_ECANCELED: the word itself (read ``[0]``)."""
    return lib.ls_tickets_cancelled(book)


def outcome():
    """A place for one ticket's outcome, ``(status, device_ns)``, for :func:`tickets_take` and
    :func:`tickets_wait_take` (one per thread that takes)."""
    return ffi.new("int32_t *"), ffi.new("uint64_t *")


def tickets_add(book, ticket: int) -> None:
    """Record ``ticket`` pending."""
    check(lib.ls_tickets_add(book, ticket), None, "record a ticket")


def tickets_collect(book, region) -> int:
    """File every completion ready in ``region``; how many were read."""
    return check(lib.ls_tickets_collect(book, region), region, "completions")


def tickets_wait(book, region, ticket: int, spin_ns: int, timeout_ns: int) -> int:
    """One wait step for ``ticket`` (0: any), GIL released; its state."""
    return check(lib.ls_tickets_wait(book, region, ticket, spin_ns, timeout_ns, ffi.NULL, ffi.NULL),
                 region, "wait for completions")


def tickets_wait_take(book, region, ticket: int, spin_ns: int, timeout_ns: int, out) -> tuple[int, int, int]:
    """:func:`tickets_wait`, and the ticket taken if it is done, into ``out`` (an :func:`outcome`):
    ``(state, status, device_ns)``."""
    status, device_ns = out
    state = lib.ls_tickets_wait(book, region, ticket, spin_ns, timeout_ns, status, device_ns)
    if state == lib.LS_TICKET_DONE:
        return state, status[0], device_ns[0]
    return check(state, region, "wait for completions"), 0, 0


def tickets_take(book, ticket: int, out) -> tuple[int, int, int]:
    """``(state, status, device_ns)`` of ``ticket``, through ``out`` (an :func:`outcome`); a done
    ticket's record goes."""
    status, device_ns = out
    state = lib.ls_tickets_take(book, ticket, status, device_ns)
    if state == lib.LS_TICKET_DONE:
        return state, status[0], device_ns[0]
    return state, 0, 0


def tickets_forget(book, tickets: list[int]) -> None:
    """Drop the outcomes of ``tickets`` (now, or when they come)."""
    lib.ls_tickets_forget(book, tickets, len(tickets))


def tickets_settle(book, ticket: int, status: int, device_ns: int) -> bool:
    """File a completion read elsewhere; False when ``ticket`` was not pending."""
    return bool(lib.ls_tickets_settle(book, ticket, status, device_ns))


def tickets_drop(book, ticket: int) -> None:
    """Remove ``ticket``'s record, whatever its state."""
    lib.ls_tickets_drop(book, ticket)


_LIST_ROOM = 1024  # tickets read per look at the pending ones (more: the look is made again, larger)


def tickets_list(book) -> dict[int, int]:
    """Every pending ticket, with its marks (C.TICKET_MOVED, C.TICKET_ORPHAN)."""
    room = _LIST_ROOM
    while True:
        tickets, marks = ffi.new("uint64_t[]", room), ffi.new("uint8_t[]", room)
        count = lib.ls_tickets_list(book, tickets, marks, room)
        if count <= room:
            return {tickets[i]: marks[i] for i in range(count)}
        room = count * 2


def tickets_resent(book) -> None:
    """Clear the MOVED marks."""
    lib.ls_tickets_resent(book)


def tickets_pending(book) -> int:
    """How many tickets are pending."""
    return lib.ls_tickets_pending(book)
