"""What the arbiter holds for each client: its ring region, buffers, texel views, programs and counters.

Everything here is owned by the control thread (see _drain.py); connection threads reach
it through tasks. The native engine keeps its own table of each client's buffers and
programs, and its counts of descriptors (read into ``counters`` by ``Drainer.refresh``).
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field, fields

from libshare.protocol.wire import trusted_uid
from libshare.errors import InvalidSubmission, QuotaExceeded
from libshare.ring import Region
from libshare.ring._region import SharedMapping
from libshare.arbiter.device import DeviceBuffer, DeviceView
from libshare.arbiter.device import Pipeline

MOST_ID = (1 << 31) - 1  # the highest object id: a list's buffer id LS_LIST_ARG | k is a parameter (lists.c)


@dataclass
class SharedMemory:
    """The arbiter's own mapping of a shared buffer's memfd (imported into Vulkan)."""

    fd: int
    mapping: SharedMapping
    address: int

    def take_fd(self) -> int:
        """The memfd, to hand to the client; this record no longer owns it (the mapping stays)."""
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        """Unmap, and close the memfd unless it was handed over; the client's mapping stays valid."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.mapping.close()


class Doorbell:
    """One client's doorbell: a datagram socket pair; the client rings one end, the native engine
    sleeps on the other.

    The client receives only its end (in the welcome). What it writes there arrives at the
    arbiter's end, which no other process holds: it can ring, but it cannot read a ring (and
    swallow a wake-up) nor change how the arbiter reads (O_NONBLOCK belongs to an open file,
    which an eventfd would share with the client). Unlike a pipe, a ring after the arbiter
    died fails with ECONNREFUSED instead of raising SIGPIPE in the client. The client's end
    holds a few rings (the least send buffer); a full bell rings anyway. The arbiter keeps its
    copy of the client's end until the client is reclaimed, or :meth:`handed_over` once the
    welcome is sent. The engine reads the rings (a datagram read without room for descriptors
    closes any it carried) and budgets the wake-ups that find no work (engine/wait.c, "Doorbells").
    """

    def __init__(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # the kernel's least: a few rings
        except OSError:
            pass  # the default will do
        self.fd, self.writer = mine.detach(), theirs.detach()

    def handed_over(self) -> None:
        """Close the arbiter's copy of the client's end, once the client has its own (one fd less)."""
        if self.writer >= 0:
            os.close(self.writer)
            self.writer = -1

    def close(self) -> None:
        """Close the arbiter's end and its copy of the client's (the client's own stays). Idempotent."""
        for fd in (self.fd, self.writer):
            if fd >= 0:
                os.close(fd)
        self.fd = self.writer = -1

    def __del__(self):  # a hello that failed before the control thread took the client
        if getattr(self, "fd", -1) >= 0:
            self.close()


@dataclass
class BufferRecord:
    """One buffer of one client."""

    id: int
    kind: str  # "shared" or "device"
    size: int
    device_buffer: DeviceBuffer
    memory: SharedMemory | None
    in_flight: int = 0  # submitted commands that use it and have not retired
    freed: bool = False  # the client let go; destroy once in_flight reaches 0


@dataclass
class ViewRecord:
    """One texel view of one client: part of one of its buffers, seen as texels (serve/views.py)."""

    id: int
    buffer_id: int
    format: str  # a name of libshare.protocol.texels.TEXEL_FORMATS
    device_view: DeviceView
    freed: bool = False


@dataclass
class ListRecord:
    """One command list of one client (its commands live in the engine: engine/lists.c)."""

    id: int
    commands: int
    freed: bool = False


@dataclass
class GroupRecord:
    """One bind group of one client: for the layout of program ``program``, (buffer id, offset, range: 0 to
    its end) per binding; the engine holds the same entries and checks them (engine/validate.c)."""

    id: int
    program: int
    entries: tuple[tuple[int, int, int], ...]
    freed: bool = False


@dataclass
class ProgramRecord:
    """One loaded program of one client."""

    id: int
    pipeline: Pipeline
    bindings: int
    push_size: int
    cuttable: bool = False  # its dispatches may run in pieces (it does not read NumWorkgroups)
    in_flight: int = 0
    freed: bool = False


@dataclass
class Counters:
    """Per-client accounting."""

    submitted: int = 0
    completed: int = 0
    errors: int = 0
    device_ns: int = 0
    cut: int = 0  # dispatches run in pieces (policy/engine_policy.c, "Pieces")
    pieces: int = 0  # ... and the pieces they ran in
    listed: int = 0  # commands of command lists run (engine/lists.c)
    control_bytes: int = 0  # bytes received on the control socket: stays small (zero-copy)
    memory_bytes: int = 0
    peak_memory_bytes: int = 0

    def add(self, other: Counters) -> None:
        """Add ``other``'s counts to these (the server's totals outlive its clients)."""
        for f in fields(self):
            if f.name == "peak_memory_bytes":
                continue  # a peak does not add up; the server keeps its own
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict:
        """The counters by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Client:
    """A connected client, from hello to reclaim."""

    id: int
    pid: int
    uid: int
    name: str
    priority: str
    region: Region
    group: str = ""
    cmdline: str = ""
    connected: float = field(default_factory=time.time)
    requested_share: int = 100  # compute share from the client's environment (may only lower)
    own_priority: bool = False  # it asked for its priority (hello, set_client_priority): defaults pass it by
    operator_priority: bool = False  # the operator set it (set_client_priority): a lowered default passes it by too
    state: str = "ACTIVE"  # INACTIVE once terminated or faulted, as in Volta MPS
    sticky: Exception | None = None  # raised for every later request (ClientTerminated, ServerFault)
    buffers: dict[int, BufferRecord] = field(default_factory=dict)
    programs: dict[int, ProgramRecord] = field(default_factory=dict)
    lists: dict[int, ListRecord] = field(default_factory=dict)
    list_commands: int = 0  # the commands of its lists, freed ones still running included
    views: dict[int, ViewRecord] = field(default_factory=dict)
    groups: dict[int, GroupRecord] = field(default_factory=dict)
    releasing: Counter = field(default_factory=Counter)  # freed and not yet destroyed, by record type:
    # they wait for their last use (LS_EV_RELEASED), and the client's limits count them (held)
    counters: Counters = field(default_factory=Counters)
    slot: int = -1  # its slot in the native engine, from add_client to reclaim
    closing: bool = False  # disconnected: drain nothing more, reclaim once nothing is outstanding
    doorbell: Doorbell = field(default_factory=Doorbell)  # closed when the client is reclaimed
    next_id: int = 1
    mem_limit: int | None = None  # the operator's limit for this client (set_device_pinned_mem_limit PID)
    env_mem_limit: int | None = None  # the client's own LIBSHARE_DEVICE_MEM_LIMIT: may only lower its limit
    share: str | None = None  # the group whose share socket it came through (_share_sockets.py)

    @property
    def trusted(self) -> bool:
        """See :func:`trusted_peer`."""
        return trusted_peer(self.uid, self.share)

    def held(self, kind: type) -> int:
        """The buffers (kind BufferRecord) or programs (ProgramRecord) it holds, freed ones still in
        use included: a client whose descriptors waited in its ring could free and make more for ever
        (a free waits for them), past its count limits, where its memory was counted all along."""
        return len(self.buffers if kind is BufferRecord else self.programs) + self.releasing[kind]

    def records(self) -> list:
        """Every texel view, buffer, program, command list and bind group it holds (its views before the
        buffers they hold)."""
        return [*self.views.values(), *self.buffers.values(), *self.programs.values(), *self.lists.values(),
                *self.groups.values()]

    def describe(self) -> str:
        """"client 3 (name, pid 1234)" for logs and errors."""
        return f"client {self.id} ({self.name}, pid {self.pid})"

    def new_id(self, wanted: int | None = None) -> int:
        """A fresh buffer, program or list id (never reused within this client): the next one, or
        ``wanted`` (a session that reattaches keeps its ids) if this client never had it here. Every
        id is below 2^31: a command list's buffer id with the high bit set is a parameter (LS_LIST_ARG)."""
        if wanted is None:
            wanted = self.next_id
        elif wanted < self.next_id:
            raise InvalidSubmission(f"id {wanted} was given out already; a kept id must be above {self.next_id - 1}")
        if wanted > MOST_ID:
            raise QuotaExceeded(f"this session has used all {MOST_ID} object ids; open a new session")
        self.next_id = wanted + 1
        return wanted


def trusted_peer(uid: int, share: str | None) -> bool:
    """Root's or the arbiter's uid's, through the arbiter's own socket (through a share socket a
    client is a tenant, whatever its uid): its own choices stand (hello.py, policy/scheduler.py)."""
    return trusted_uid(uid) and share is None
