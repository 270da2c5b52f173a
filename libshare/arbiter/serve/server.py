"""The arbiter: the control server in front of the drain loop.

Requests that touch the device (program load, alloc, free) run as control tasks
(_tasks.py: under the control lock, on the control thread or on the request's own). The
same class runs as a daemon (``serve``) and embedded inside a client process (``attach``
on one end of a socketpair).

Connections. A connection costs a thread only once it is a client. Until it has
said hello, and between an operator's control commands, it waits in the gate
(_gate.py): one selector thread that accepts, reads first frames in steps, and
holds a bounded number of connections, each for a bounded time (10 s to say
hello, 30 s to finish a frame once begun). A hello that passes its schema and the
admission checks (uid, server state, --max-clients) takes a client slot there, and
the gate's thread makes the client and sends its welcome (nothing in that waits on the
peer); the connection then gets a thread of its own (one that a departed client left
idle, or a new one), which answers its requests; a control command runs on one of the
gate's few worker threads, and its connection then goes back to the gate. The peer's pid and uid come from SO_PEERCRED, never
from a message. An embedded session's hello goes through the gate as well.

Between requests a session thread polls its connection for _REQUEST_SPIN (200 us), yielding
the core at each look, before it sleeps in ``recv`` (``_RequestPoll``): an idle core halts,
and waking it cost this 2-core VM tens of microseconds per request (an attach went from 0.99
to 0.87 ms). One thread polls at a time; a client whose request did not come within that time
is not polled for again until one does; a client's polling is held to a tenth of its time
connected (a new client's first millisecond of it is there at once, so an attach is polled
throughout); an embedded arbiter never polls (its client needs the GIL). A client polls for
its replies the same way (``_session._await_reply``).

Requests. Every frame is checked before anything reads it: its framing by
_protocol.py, then its fields against the request's schema (_REQUESTS, _HELLO,
_commands.FIELDS: the type and range of each field; unknown fields and ops are
refused, so a new request needs its schema in _REQUESTS). A bad request, or a
whole frame that does not parse (deep JSON, a list where an id belongs), gets an
error reply (ProtocolError, InvalidSubmission) and the connection goes on; only a
frame the reader cannot follow (a bad header, a length past the bound, a frame
begun and not finished in time) ends it. A request that fails with an OSError
(out of descriptors or memory) is answered too, never taken for the client's
departure, and a client that does not read its replies for _SEND_TIMEOUT seconds
is dropped.

Descriptors. A daemon arbiter raises its open-file soft limit to the hard limit,
and no arbiter starts when the hard limit cannot hold --max-clients clients.
Every client slot keeps _FDS_PER_CLIENT descriptors free until it is taken, the
gate keeps room for the connections it may hold, and shared buffers (none once
the reply has carried the memfd to the client: the arbiter's mapping keeps no
descriptor) get what is left, counted with a bound of _FDS_PER_BUFFER each:
past that an alloc is refused with QuotaExceeded (_gate.FdBudget), so the last
client can always connect. A hello
that runs out all the same (a limit lowered under a running arbiter) is refused
with TooManyClients, and once the control thread knows a client, the end of its
connection reclaims it whatever failed: no exited process keeps a slot.

Users. Without --multi-user the socket is 0600 in a 0700 directory, and a peer of
another uid is refused with AccessDenied (by the file system at connect, or here
at hello if the modes were opened). With it (root only) the directory is 0711 and
the socket 0666 (_daemon.py): any user may connect and the arbiter checks uids
itself. State-changing control commands are taken from root and the arbiter's uid
only, and ``ps`` shows another uid's clients as MPS would (_commands.py). A client of
another uid may ask only for the default priority or lower (_check_priority_allowed), and
may join only the groups it owns (set_group_owner) or unowned ones of no raised priority,
naming one of its own when it owns any (_check_group_allowed), and one uid other than root's
and the arbiter's leaves a quarter of the client slots to the others (user_clients: one user
that opened every slot locked the others out). A hello through a group's share
socket (_share_sockets.py, a container's pipe directory) joins that group whatever it names;
whatever its uid, it gets no priority above the default and is held to the group's owner rules,
and no control command is taken there. A client, for its part, talks only to a listener of its
own uid or root's (_protocol.dial).

Reattaching. A session whose arbiter died hands the new one what it kept: ``import`` (one
descriptor: a shared buffer's memfd, checked by check_sealed_memfd to be a memfd of the
size it says, writable, sealed against shrinking, growing and new seals, so that mapping it
can never fault; counted against the client's limits like an alloc) and ``load_program``,
each with the ``id`` it had (Client.new_id takes one only above every id it gave out).
Every other request carries no descriptor.

Memory a client receives is its own and nothing else: a shared buffer is a fresh
memfd (its pages start as zeros), sealed against resizing before it is sent, so
that a client cannot truncate it under the arbiter's mapping (see
ring/_region.py); a device buffer reads as zeros too: fresh anonymous pages on a
CPU device, else a fill of zeros queued before its id is returned (the device package, _memory.py).
Every allocation is checked against the memory limits, down to the total that
the device fits (_limits.py), before any memory exists.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import queue
import resource
import select
import socket
import struct
import threading
import time
from pathlib import Path


from libshare.protocol import wire as protocol
from libshare.errors import (AccessDenied, InvalidSubmission, LibshareError, ProtocolError, QuotaExceeded, ServerNotReady, TooManyClients)
from libshare.ring import C, Region
from libshare.ring._region import SharedMapping, check_sealed_memfd, sealed_memfd
from libshare.arbiter.serve.clients import (BufferRecord, Client, Counters, ProgramRecord, SharedMemory, trusted_peer)
from libshare.arbiter.serve.commands import FIELDS as _CONTROL
from libshare.arbiter.serve.commands import Commands
from libshare.arbiter.serve.gate import HELLO_TIMEOUT, MAX_WAITING, MIN_WAITING, FdBudget, Gate, open_fds
from libshare.arbiter.serve.share_sockets import ShareSockets, bind_listener, check_share_hello
from libshare.protocol.control import printable
from libshare.arbiter.policy.scheduler import UNSCHEDULED, mode_name, outranks, percentage, priority_name
from libshare.arbiter.drain.drainer import Drainer
from libshare.arbiter.drain.tasks import CALL_TIMEOUT
from libshare.arbiter.serve.config import Config, max_clients_count, watchdog_seconds
from libshare.arbiter.policy.limits import (MAX_BUFFERS, MemoryLimits, buffer_ceiling, device_limit, fitting_total_limit, parse_device_limits, total_limit)
from libshare.arbiter.programs.admission import validator_path
from libshare.arbiter.programs.compiler import Compilers
from libshare.arbiter.programs.loading import (MAX_PROGRAMS, MAX_TOTAL_PROGRAMS, Interfaces, check_program_quota)
from libshare.arbiter.drain.quarantine import COMPILE
from libshare.arbiter.device import Device

log = logging.getLogger("libshare.arbiter")

_PAGE = mmap.PAGESIZE
_MAX_BUFFER = 1 << 40
# Kept for each client slot: its socket, pidfd and doorbell (the arbiter's end). Its ring is a
# mapping that keeps no descriptor (ring/_region.py, SharedMapping). A welcome being sent holds two
# more (the client's end of the doorbell, the ring's memfd): the slack covers a few at once, and a
# hello that finds none left is refused with TooManyClients.
_FDS_PER_CLIENT = 3
_FDS_PER_BUFFER = 1  # a shared buffer's memfd, until the reply carries it; its mapping keeps none
_FD_SLACK = 64  # for the rest: logs, control commands, a vetting compile, /proc reads
_SCARCE = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS)  # out of descriptors or memory
_SEND_TIMEOUT = 30  # seconds a reply may wait for a client to read (SO_SNDTIMEO); then it is dropped
_WATCHDOG = 120.0  # default seconds one submission may run before the server faults
_REQUEST_TIMEOUT = 30.0  # a frame begun must be finished within this (LIBSHARE_REQUEST_TIMEOUT)
_ID = protocol.integer(0, (1 << 63) - 1)
_KEPT_ID = protocol.integer(1, (1 << 31) - 1)  # an id a reattaching session asks to keep (Client.new_id)


def _op(name: str) -> dict:
    return {"op": (protocol.choice(name), True)}


_REQUESTS = {
    "load_program": {**_op("load_program"), "id": (_KEPT_ID, False)},  # the SPIR-V module is the payload
    "alloc": {**_op("alloc"), "size": (protocol.integer(1, _MAX_BUFFER), True),
              "kind": (protocol.choice("shared", "device"), False)},
    "import": {**_op("import"), "size": (protocol.integer(_PAGE, _MAX_BUFFER), True),  # the memfd rides along
               "id": (_KEPT_ID, False)},
    "free": {**_op("free"), "buffer_id": (_ID, False), "program_id": (_ID, False)},
    "stats": _op("stats"),
}
"""The schema of each request of a session (see _protocol.check_fields)."""


def _group_name(name: str, value):
    value = protocol.text(256)(name, value)
    if not value.isprintable():
        raise InvalidSubmission(f"{name} must be printable text (got {protocol.short(value)})")
    return value


_HELLO = {**_op("hello"), "name": (protocol.text(1024), False), "version": (protocol.integer(0, 65535), False),
          "priority": (protocol.text(32), False), "group": (_group_name, False),
          "share": (protocol.either(protocol.text(16), protocol.integer(0, 100)), False),
          "mem_limit": (protocol.byte_counts(16, 64, 1 << 62), False)}
"""The schema of a hello (checked by the gate: a bad one is answered and may be sent again)."""
_SPARE_REGIONS = 2  # ring regions made ahead of the hellos that will take them
_IDLE_SESSION_THREADS = 4  # session threads kept waiting for the next client once theirs left
_IDLE_SESSION_SECONDS = 2.0  # ... for this long at most
_REQUEST_SPIN = 200e-6  # seconds a session thread polls for a client's next request before it sleeps (_RequestPoll)
_POLL_SHARE = 0.1  # ... within a budget that grows by this share of the time the client is connected
_POLL_BURST = 1e-3  # ... up to this many seconds: a new client's first requests are all polled for
_COMPILE_TIMEOUT = 10.0  # default seconds a vetting compile may take


class _RequestPoll:
    """How a session thread waits for its client's next request (see "Between requests" in the
    module's essay): it polls the connection for _REQUEST_SPIN (``protocol.poll_briefly``), then
    sleeps in ``recv``.

    It polls only while the client's requests come within that time of each other, only while no
    other session thread polls (``lock``), and within a budget: _POLL_SHARE of the client's time
    connected, _POLL_BURST at most. Without the budget a client that sent a request 90 us after
    each reply kept a core polling (the arbiter at 94-96% of a core, 20% without polling)."""

    def __init__(self, conn: socket.socket, lock: threading.Lock, enabled: bool):
        self._poller = select.poll()
        self._poller.register(conn, select.POLLIN)
        self._lock, self._enabled, self._armed = lock, enabled, enabled
        self._budget = _POLL_BURST
        self._refilled = self._waited_from = time.perf_counter()

    def wait(self) -> None:
        """Poll until a request can be read or the poll's time is up (or not at all)."""
        start = self._waited_from = time.perf_counter()
        if not self._armed:
            return
        self._budget = min(_POLL_BURST, self._budget + (start - self._refilled) * _POLL_SHARE)
        self._refilled = start
        if self._budget <= 0 or not self._lock.acquire(blocking=False):
            return
        try:
            protocol.poll_briefly(self._poller, min(_REQUEST_SPIN, self._budget))
        finally:
            self._lock.release()
        self._budget -= time.perf_counter() - start

    def arrived(self) -> None:
        """A request came: poll before the next one only if this one came within a poll's time of
        the last :meth:`wait`."""
        self._armed = self._enabled and time.perf_counter() - self._waited_from < _REQUEST_SPIN


class Arbiter:
    """Owns one Vulkan device and serves clients over Unix sockets.

    ``device`` is an index or UUID (``LIBSHARE_DEVICE``); ``max_clients`` bounds
    how many may be connected at once; ``timed=False`` skips the per-command
    timestamps (device-time accounting) for the last few microseconds.
    ``multi_user`` (root only) serves clients of every uid; otherwise only the
    arbiter's own uid may connect. ``test_hooks`` (or LIBSHARE_TEST_HOOKS=1)
    enables the ``inject_fault`` control command. ``mem_limit`` (or LIBSHARE_DEVICE_MEM_LIMIT,
    "2G" or "0=2G,1=1G") is the default device memory limit of each client; ``mem_total`` (or
    LIBSHARE_DEVICE_MEM_TOTAL, a size or "unlimited") caps all clients' memory together, by
    default what the device fits (see _limits.py).
    ``max_programs`` (LIBSHARE_MAX_PROGRAMS) bounds the programs one client may hold, ``max_buffers``
    (LIBSHARE_MAX_BUFFERS) its buffers;
    ``compile_timeout`` (LIBSHARE_COMPILE_TIMEOUT, seconds) bounds the vetting compile of a
    new module when the arbiter serves other processes (see _programs.py and _compiler.py).
    ``place_threads`` (a daemon, whose process is the arbiter's alone) puts the engine and the
    driver's threads on a core of their own (see _placement.py).
    """

    def __init__(self, device: str | None = None, *, max_clients: int = 48,
                 lanes: int = 4, lane_entries: int = 256, cq_entries: int = 1024, timed: bool = True,
                 multi_user: bool = False, test_hooks: bool | None = None, scheduling: str | None = None,
                 watchdog: float | None = None, mem_limit: str | None = None, max_programs: int | None = None,
                 compile_timeout: float | None = None, mem_total: str | None = None,
                 place_threads: bool = False, max_buffers: int | None = None):
        if multi_user and os.getuid() != 0:
            raise AccessDenied("multi-user mode needs the arbiter to run as root")
        selector = device if device is not None else os.environ.get("LIBSHARE_DEVICE")
        try:
            max_clients_count(max_clients)
        except ValueError as exc:
            raise InvalidSubmission(str(exc)) from None
        self.max_clients = max_clients
        validator_path()  # no client module may run unvalidated: refuse to start without spirv-val
        self.max_programs = _setting(max_programs, "LIBSHARE_MAX_PROGRAMS", int, MAX_PROGRAMS, most=MAX_TOTAL_PROGRAMS)
        self.compile_timeout = _setting(compile_timeout, "LIBSHARE_COMPILE_TIMEOUT", float, _COMPILE_TIMEOUT)
        self._selector = selector or ""
        self.compilers: Compilers | None = None
        """The vetting compilers (set by :meth:`serve`: embedded arbiters compile unvetted)."""
        _raise_fd_limit(max_clients)
        self.multi_user = multi_user
        self.group_owners: dict[str, int] = {}
        """The uid that owns each group (set_group_owner): see _check_group_allowed."""
        self.test_hooks = test_hooks if test_hooks is not None else os.environ.get("LIBSHARE_TEST_HOOKS") == "1"
        self.started = time.time()
        mem_limit = mem_limit if mem_limit is not None else os.environ.get("LIBSHARE_DEVICE_MEM_LIMIT", "")
        default_limits = parse_device_limits(mem_limit) if mem_limit.strip() else {}
        self.limits = MemoryLimits(max_buffers=_setting(max_buffers, "LIBSHARE_MAX_BUFFERS", int, MAX_BUFFERS,
                                                        most=1 << 20))
        """Device memory limits: default, server, groups, total (the per-client ones are on each Client)."""
        mem_total = mem_total if mem_total is not None else os.environ.get("LIBSHARE_DEVICE_MEM_TOTAL", "")
        if mem_total.strip():
            self.limits.total = total_limit(mem_total)
        self.client_oom_score_adj: int | None = None
        """The oom_score_adj each client is raised to at least when it connects (None: left alone).
        Set by a daemon that could not lower its own (see _daemon.py)."""
        self.quit_requested = threading.Event()
        """Set by the ``quit`` control command; the daemon then calls :meth:`close`."""
        self.quit_timeout = 10.0
        self.on_restart = None
        """Called by the ``restart`` command: set by a daemon that a control daemon supervises."""
        self._geometry = (lanes, lane_entries, cq_entries)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.drainer = Drainer(lambda: Device(selector), self._wake_fd, timed, max_clients=2 * max_clients + 64)
        self.limits.buffer_ceiling = buffer_ceiling(self.drainer.max_slots)
        _configure_scheduling(self.drainer, scheduling, watchdog)
        self.commands = Commands(self)
        self.interfaces = Interfaces()
        """Reflected SPIR-V modules by content (a program another client loaded is not reflected again)."""
        self._lock = threading.Lock()
        self._next_client = 1
        self._connections: set[socket.socket] = set()
        self._attached: dict[int, tuple[str | None, int]] = {}  # client id -> (its share socket's group, its
        # uid), for the clients whose connection is open (the client limit, and a tenant's)
        self._gate: Gate | None = None  # made by the first serve or attach
        self.shares: ShareSockets | None = None  # a daemon's share sockets (serve makes it)
        self._fd_budget: FdBudget | None = None
        self.socket_path: Path | None = None
        self.closed = False
        self._spare_regions: list[Region] = []
        for _ in range(_SPARE_REGIONS):  # made now, so that the arbiter's fd count stays level afterwards
            self._make_spare_region()
        self._spares_wanted = threading.Event()  # a hello took a spare region: the spares thread makes one
        self._spares_thread: threading.Thread | None = None
        self._sessions: queue.SimpleQueue = queue.SimpleQueue()  # admitted connections for idle session threads
        self._idle_sessions = 0  # session threads waiting for a connection (under _lock)
        self._polling = threading.Lock()  # held by the one session thread that polls for a request
        self.drainer.placement = place_threads
        self.drainer.start()
        self.limits.default = device_limit(default_limits, self.device.index, self.device.uuid)
        if not mem_total.strip():
            self.limits.total = fitting_total_limit(self.device)
        log.info("memory of all clients together: %s", self.limits.total.describe() if self.limits.total
                 else "unlimited (LIBSHARE_DEVICE_MEM_TOTAL)")
        log.info("arbiter pid %d on device %d: %s (%s); server status is ACTIVE", os.getpid(),
                 self.device.index, self.device.name, self.device.uuid)
        self.config = Config(self)
        """The operator's configuration file (a daemon's --config) and where each setting comes from."""

    @property
    def device(self) -> Device:
        """The device (a new one after recovery from a fault)."""
        return self.drainer.device

    @property
    def state(self) -> str:
        """The server's state: INITIALIZING, ACTIVE or FAULT."""
        return self.drainer.state

    # ---------------------------------------------------------------- accepting

    def serve(self, path: Path) -> None:
        """Listen on the Unix socket ``path``: mode 0600, or 0666 in multi-user mode, where the
        arbiter checks each peer's uid itself. The gate's thread accepts (see _gate.py)."""
        self.drainer.quarantine.open(path.parent)  # strikes for what a dead arbiter left, before anyone connects
        self._vet_compiles()
        self.compilers.remember_passed(path.parent / "vetted")
        _raise_fd_limit(self.max_clients, to_hard=True)
        gate = self._start_gate()
        listener = bind_listener(path, self.multi_user)
        self.socket_path = path
        gate.listen(listener)
        self.shares = ShareSockets(path.parent, self.multi_user, gate.listen, gate.unlisten)

    supervised = False
    """A control daemon supervises this arbiter (the daemon sets it): a session may wait for the next
    one when it dies, which the welcome says (a container cannot see the control daemon's lock)."""

    @property
    def share_clients(self) -> int:
        """The most clients one share socket may serve at once: a quarter of ``max_clients``."""
        return max(1, self.max_clients // 4)

    @property
    def user_clients(self) -> int:
        """The most clients one uid other than root's and the arbiter's may have at once: all but a
        quarter of ``max_clients``, which stays for the other users (one user that opened every
        slot locked every other user out). A job of many ranks on one device keeps most slots."""
        return max(1, self.max_clients - self.share_clients)

    def prepare_to_serve(self) -> None:
        """Start what :meth:`serve` needs before it listens (the vetting compilers): a standby does
        this while it waits, so that it serves at once when it takes over."""
        self._vet_compiles()

    def stop_accepting(self) -> None:
        """Hand-over, first step: close the listener and every connection not yet a client, and
        remove the socket (a new arbiter binds its own). Clients keep being served."""
        if self._gate is not None:
            self._gate.close()
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
            self.socket_path = None

    def move_clients(self) -> None:
        """Hand-over, second step: close every client's ring with LS_EMOVED. The engine answers
        what it had not started with LS_EMOVED and finishes what runs; the session sends the
        work that did not run to the new arbiter, under the same tickets (see _session.py)."""
        drainer = self.drainer
        drainer.call(lambda: [drainer.engine.close_client(c.slot, C.EMOVED)
                              for c in list(drainer.clients.values()) if not c.closing])

    def load_bound(self) -> float:
        """The most seconds a load_program takes to be answered: the vetting compile (its wait for a
        vetting process included), then the arbiter's own compile, bounded by what the vetting one
        was allowed, and the control task that registers the program. A client waits this long."""
        vetting = self.compilers.answer_bound if self.compilers is not None else 0.0
        return vetting + self.compile_timeout + CALL_TIMEOUT

    def _vet_compiles(self) -> None:
        """Other processes will connect: compile each new module in a vetting child first."""
        if self.compilers is None:
            self.compilers = Compilers(self._selector, self.compile_timeout, self.drainer.cores)
            self.compilers.prestart()

    def attach(self, conn: socket.socket) -> None:
        """Serve one connected socket (a socketpair end in embedded mode); it says hello to the gate."""
        self._start_gate().add(conn)

    def _start_gate(self) -> Gate:
        with self._lock:
            if self._gate is None:
                if self.closed:
                    raise ServerNotReady("the arbiter is shutting down")
                limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                room = (MAX_WAITING if limit == resource.RLIM_INFINITY else
                        limit - open_fds() - _FD_SLACK - _FDS_PER_CLIENT * self.max_clients)
                waiting = max(MIN_WAITING, min(MAX_WAITING, room // 4))  # the rest serves shared buffers
                self._fd_budget = FdBudget(_FDS_PER_CLIENT, _FDS_PER_BUFFER, waiting, _FD_SLACK)
                self._gate = Gate(self._route, self._start_session, self.commands.answer, max_waiting=waiting,
                                  hello_timeout=_setting(None, "LIBSHARE_HELLO_TIMEOUT", float, HELLO_TIMEOUT),
                                  request_timeout=_setting(None, "LIBSHARE_REQUEST_TIMEOUT", float, _REQUEST_TIMEOUT))
            return self._gate

    def _route(self, frame: protocol.Frame, pid: int, uid: int, control: bool, share: str | None = None):
        """What the gate does with a connection's first frame: ("session", client id) for an admitted
        hello, ("control", None) for a control command. A bad frame raises ProtocolError or
        InvalidSubmission (answered; the connection stays), a refusal another LibshareError. ``share``:
        the group whose share socket the connection came through (_share_sockets.py)."""
        op = frame.fields.get("op")
        if frame.payload:
            raise ProtocolError("a hello or a control command carries no payload")
        if op == "control" and share is not None:
            raise AccessDenied(f"this socket is the share of group {share}: it takes sessions only, and control "
                               "commands go to the arbiter's own socket")
        if op == "control":
            protocol.check_fields(frame.fields, _CONTROL, "control")
            return "control", None
        if op != "hello":
            raise ProtocolError(f"the first message must be hello or a control command (got op "
                                f"{protocol.short(op)})")
        if control:
            raise ProtocolError("a control connection carries only control commands")
        protocol.check_fields(frame.fields, _HELLO, "hello")
        scheduler = self.drainer.scheduler
        priority, _ = _requested_priority_and_share(frame.fields, scheduler.default_priority)
        trusted = trusted_peer(uid, share)
        _check_priority_allowed(priority, scheduler.default_priority, trusted)
        if share is not None:
            check_share_hello(frame.fields, share)  # its group is the share's, and the owner rules apply
        _check_group_allowed(_requested_group(frame.fields), uid, self.group_owners, scheduler, trusted)
        return "session", self._admit(pid, uid, share)

    def _admit(self, pid: int, uid: int, share: str | None = None) -> int:
        """A client slot for the peer (pid, uid), by its id; refuses with AccessDenied, ServerNotReady
        or TooManyClients (also past :attr:`share_clients` of one share socket, and :attr:`user_clients`
        of one uid that is not trusted)."""
        if uid != os.getuid() and not self.multi_user:
            log.warning("refused pid %d: uid %d is not the arbiter's uid %d", pid, uid, os.getuid())
            raise AccessDenied(f"uid {uid} may not use this arbiter: it runs as uid {os.getuid()} "
                               "and was not started in multi-user mode")
        self.drainer.quarantine.check_client(pid, uid)  # Quarantined: it brought the arbiter down twice
        with self._lock:
            if self.closed:
                raise ServerNotReady("the arbiter is shutting down")
            if self.state != "ACTIVE":
                raise ServerNotReady(f"server not ready: its state is {self.state}; retry once it is ACTIVE")
            if share is not None and sum(s == share for s, _ in self._attached.values()) >= self.share_clients:
                raise TooManyClients(f"the share socket of group {share} serves {self.share_clients} clients "
                                     "already, its limit (a quarter of --max-clients)")
            if not protocol.trusted_uid(uid) and sum(u == uid for _, u in self._attached.values()) >= \
                    self.user_clients:
                raise TooManyClients(f"uid {uid} has {self.user_clients} clients already, the most one user other "
                                     "than root and the arbiter's may have (a quarter of --max-clients stays for "
                                     "the others)")
            if len(self._attached) >= self.max_clients:
                raise TooManyClients(f"the arbiter already serves {len(self._attached)} clients (its limit is "
                                     f"{self.max_clients}); wait for one to leave or raise --max-clients")
            client_id = self._next_client
            self._next_client += 1
            self._attached[client_id] = (share, uid)
        return client_id

    def _start_session(self, conn: socket.socket, hello: protocol.Frame, pid: int, uid: int,
                       client_id: int) -> None:
        """Welcome an admitted connection on the gate's thread (:meth:`_welcome`), then give it a
        thread of its own for its requests: an idle session thread when one waits, else a new one.
        Handed over while the client maps its ring (after :meth:`_joined`), that thread is awake
        before the first request comes; handed over before the welcome, its wake-up (and a new
        thread's start, which a burst of clients can afford but a lone attach notices) delayed the
        welcome."""
        with self._lock:
            self._connections.add(conn)
        client = self._welcome(conn, hello.fields, pid, uid, client_id)
        if client is None:
            return
        try:
            self._joined(client)  # while the client maps its ring
            job = (conn, client)
            with self._lock:
                idle = self._idle_sessions > 0
                if idle:  # claimed and queued under one lock: an idle thread that gives up checks both
                    self._idle_sessions -= 1  # that thread's: each job handed over had one counted idle
                    self._sessions.put(job)
            if not idle:
                threading.Thread(target=self._session_thread, args=(job,), name="libshare-client",
                                 daemon=True).start()
        except BaseException:
            self._end_connection(conn, client, client.id)
            raise
        self._spares_wanted.set()  # a head start for the next hello, made on the spares thread once
        self._start_spares()  # the session thread has its wake-up under way (made before, it held that up)

    def _session_thread(self, job: tuple) -> None:
        """Serve one connection after another; wait for the next one while fewer than
        _IDLE_SESSION_THREADS others wait (an idle thread costs no CPU: it sleeps in ``get``, named
        libshare-idle: it is nobody's connection thread then), and for _IDLE_SESSION_SECONDS at
        most, so that a quiet arbiter goes back to the threads it started with.

        Every waiting thread stands for an idle count not yet claimed or a job queued (the gate
        claims and queues under the lock): one whose wait ran out takes a job still queued, if
        any, else gives its count back and ends."""
        me = threading.current_thread()
        while job is not None:
            me.name = "libshare-client"
            self._serve_connection(*job)
            job = None
            with self._lock:
                if self.closed or self._idle_sessions >= _IDLE_SESSION_THREADS:
                    return
                self._idle_sessions += 1
            me.name = "libshare-idle"
            try:
                job = self._sessions.get(timeout=_IDLE_SESSION_SECONDS)
            except queue.Empty:
                with self._lock:
                    try:
                        job = self._sessions.get_nowait()
                    except queue.Empty:
                        self._idle_sessions -= 1
                        return

    # ---------------------------------------------------------------- one connection

    def _welcome(self, conn: socket.socket, fields: dict, pid: int, uid: int, client_id: int) -> Client | None:
        """Make and welcome the client the gate admitted (:meth:`_hello`), on the gate's thread: the
        socket is still non-blocking there, and the empty send buffer of a new connection takes the
        welcome whole. None when that failed: the peer was told why if it could be, and it is closed."""
        with self._handler_end(conn):
            try:
                return self._hello(conn, fields, pid, uid, client_id)
            except OSError as exc:  # making its ring, pidfd or doorbell: the peer is told, not dropped
                if exc.errno not in _SCARCE:
                    raise
                raise TooManyClients(f"the arbiter could not make this client ({exc.strerror}): it is out of "
                                     "file descriptors or memory; try again later") from exc
        self._end_connection(conn, None, client_id)
        return None

    def _serve_connection(self, conn: socket.socket, client: Client) -> None:
        """Serve a welcomed client's requests until its connection ends (on its session thread)."""
        try:
            with self._handler_end(conn):
                conn.setblocking(True)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", _SEND_TIMEOUT, 0))
                timeout = self._gate.request_timeout
                poll = _RequestPoll(conn, self._polling, enabled=client.pid != os.getpid())  # embedded: its GIL
                while True:
                    poll.wait()
                    try:
                        frame = protocol.recv(conn, max_fds=1, timeout=timeout)
                    except protocol.MalformedFrame as exc:  # whole, and bad: answered; the next one is read
                        self._reply_error(conn, exc)
                        continue
                    poll.arrived()
                    client.counters.control_bytes += len(frame.payload) + 64
                    self._answer(conn, client, frame)
        finally:
            self._end_connection(conn, client, client.id)

    @contextlib.contextmanager
    def _handler_end(self, conn: socket.socket):
        """How a connection's handling ends: a LibshareError is answered, the peer's departure ends it
        quietly, anything else is logged (the caller closes the connection)."""
        try:
            yield
        except LibshareError as exc:  # before OSError: some libshare errors are OSErrors too
            self._reply_error(conn, exc)
        except (EOFError, OSError):
            pass  # the client went away
        except Exception:
            log.exception("connection handler error")

    def _end_connection(self, conn: socket.socket, client: Client | None, client_id: int) -> None:
        """Close a connection; its client slot goes back, and the control thread reclaims its client
        (``client`` None: the hello failed, and no client was made, or it was reclaimed already)."""
        if client is None:  # the hello failed: its place goes back (it may have done so already)
            with self._lock:
                self._attached.pop(client_id, None)
        else:  # the control thread logs the end (with the reclaim, when that comes at once)
            with self._lock:
                self._attached.pop(client.id, None)
            try:  # not waited for: this thread may serve the next client meanwhile
                self.drainer.post(self.drainer.connection_closed, client)
            except LibshareError:
                pass  # the arbiter is shutting down, and its shutdown reclaims every client
        with self._lock:
            self._connections.discard(conn)
        conn.close()

    def _reply_error(self, conn: socket.socket, exc: Exception) -> None:
        try:
            protocol.send(conn, protocol.error_reply(exc))
        except (LibshareError, OSError):
            pass

    def _answer(self, conn: socket.socket, client: Client, frame: protocol.Frame) -> None:
        try:
            self._answer_request(conn, client, frame)
        finally:
            frame.close_fds()  # only import takes one, and it keeps none (its mapping needs no descriptor)

    def _answer_request(self, conn: socket.socket, client: Client, frame: protocol.Frame) -> None:
        op = frame.fields.get("op")
        try:
            if client.sticky is None and self.drainer.engine.dropped(client.slot):
                self._call(self.drainer.handle_events)  # its DROPPED: the sticky error, the log line
            if client.sticky is not None:
                raise client.sticky
            handler = self._handler(frame)
            if op == "alloc" and frame.fields.get("kind", "shared") == "shared" and self._fd_budget is not None:
                self._fd_budget.reserve_buffer(self.max_clients - len(self._attached))
            fields, fds = handler(self, client, frame)
        except LibshareError as exc:
            self._reply_error(conn, exc)
            return
        except OSError as exc:  # the request's own failure: the connection is fine
            self._reply_error(conn, _resource_error(exc, op))
            return
        except Exception as exc:  # a bug; the client is told, and its connection goes on
            log.exception("%s: request %s failed", client.describe(), protocol.short(op))
            self._reply_error(conn, ProtocolError(f"the arbiter failed on this request: {type(exc).__name__}"))
            return
        try:
            protocol.send(conn, {"ok": True, **fields}, fds=fds)
        finally:
            for fd in fds:  # a handler's descriptors are handed over: the arbiter keeps no copy
                os.close(fd)

    def _handler(self, frame: protocol.Frame):
        """The handler of a request, once its fields passed its schema (else ProtocolError or
        InvalidSubmission)."""
        op = frame.fields.get("op")
        schema = _REQUESTS.get(op) if isinstance(op, str) else None
        handler = self._HANDLERS.get(op) if schema is not None else None
        if handler is None:
            raise ProtocolError(f"unknown request {protocol.short(op)}; the requests are {', '.join(_REQUESTS)}")
        protocol.check_fields(frame.fields, schema, op)
        if op == "free" and ("buffer_id" in frame.fields) == ("program_id" in frame.fields):
            raise ProtocolError("free names one buffer_id or one program_id")
        if op == "load_program" and not frame.payload:
            raise InvalidSubmission("load_program carries a SPIR-V module as its payload (got none)")
        if op != "load_program" and frame.payload:
            raise ProtocolError(f"{op} carries no payload (got {len(frame.payload)} bytes)")
        if op != "import" and frame.fds:
            raise ProtocolError(f"{op} carries no file descriptors (got {len(frame.fds)}; they were closed)")
        return handler

    def _call(self, fn, *args, policy: bool = True):
        return self.drainer.call(fn, *args, policy=policy)

    # ---------------------------------------------------------------- requests

    def _hello(self, conn: socket.socket, fields: dict, pid: int, uid: int, client_id: int) -> Client:
        """Make and welcome the client that the gate admitted as ``client_id`` (its hello passed
        _HELLO there). A failure gives its slot back; once the control thread knows the client, the
        end of its connection reclaims it."""
        priority, requested_share = _requested_priority_and_share(fields, self.drainer.scheduler.default_priority)
        name = printable(fields.get("name") or f"pid{pid}")[:64]  # it goes into logs and ps
        group = _requested_group(fields)
        env_limit = fields.get("mem_limit")
        if env_limit is not None:
            env_limit = device_limit(env_limit, self.device.index, self.device.uuid)
        with self._lock:
            if self.closed:
                raise ServerNotReady("the arbiter is shutting down")
            region = self._spare_regions.pop() if self._spare_regions else None
            share, _ = self._attached.get(client_id, (None, uid))
        try:
            region = region or Region.create(*self._geometry)
            region.announce_consumer()
            if pid != os.getpid():  # an embedded client is this process: nothing to watch
                region.watch_peer(pid)
        except BaseException:
            if region is not None:
                region.close()
            with self._lock:
                self._attached.pop(client_id, None)
            raise
        try:
            client = Client(client_id, pid, uid, name, priority, region, group=group, cmdline=_cmdline(pid),
                            requested_share=requested_share, env_mem_limit=env_limit,
                            own_priority=bool(fields.get("priority")), share=share)
        except BaseException:  # its doorbell takes descriptors too
            region.close()
            raise
        try:  # queued ahead of every later task (ps, once the client has its welcome, lists it), but run
            # only once the welcome is out (_joined flushes it), while the client maps its ring
            self.drainer.post(self.drainer.add_client, client, policy=False, wake=False)  # it sets the policy
        except BaseException:  # shutting down: the control thread never knew it
            region.close()
            client.doorbell.close()
            raise
        try:
            protocol.send(conn, {"ok": True, "client_id": client_id, "arbiter_pid": os.getpid(),
                                 "device": self.device.name, "priority": priority,
                                 "load_timeout": self.load_bound(), "supervised": self.supervised,
                                 "share": share},
                          fds=(region.fd, client.doorbell.writer))
            log.info("%s connected (uid %d%s)", client.describe(), uid, f", group {group}" if group else "")
            region.forget_fd()  # the client has them now: the mappings and the arbiter's own bell stay
            client.doorbell.handed_over()
        except BaseException:  # gone before (or failed right after) the welcome: reclaim what was made for it
            self.drainer.post(self.drainer.connection_closed, client)
            with self._lock:
                self._attached.pop(client_id, None)
            raise
        return client

    def _joined(self, client: Client) -> None:
        """The rest of a hello, on the gate's thread once the welcome is out, before the connection
        has a thread of its own (so before any request of the client is served): the client maps
        its ring meanwhile, and its session thread, woken after this, is ready for its first request
        (run on that thread, this held up the first request)."""
        self.drainer.flush()  # add_client: here, unless the control thread is awake anyway
        if self.client_oom_score_adj is not None and client.pid != os.getpid():
            _raise_oom_score_adj(client.pid, self.client_oom_score_adj)
        if self._fd_budget is not None:
            self._fd_budget.client_joined()

    def _start_spares(self) -> None:
        """Start the thread that makes spare regions, once (should it fail, hellos make their own)."""
        with self._lock:
            if self._spares_thread is not None or self.closed:
                return
            self._spares_thread = threading.Thread(target=self._make_spares, name="libshare-spares", daemon=True)
        try:
            self._spares_thread.start()
        except RuntimeError as exc:  # no thread to be had now: the next hello tries again
            log.warning("could not start the spare-region thread: %s", exc)
            with self._lock:
                self._spares_thread = None

    def _make_spares(self) -> None:
        """The spares thread: keep _SPARE_REGIONS ring regions made ahead of the hellos, off their
        path (a region took some 0.3 ms to format, 0.1 ms since the format leaves the slots
        alone: made by the connection thread after the welcome, it held up the new client's first
        request). It sleeps until a hello takes one.

        It makes one at once: waiting for a quiet moment (no request for a millisecond) spared a
        lone client's next requests, which share the CPU and the GIL with it, but cost clients
        that attach one after another more than it saved (measured)."""
        while True:
            self._spares_wanted.wait()
            self._spares_wanted.clear()
            while not self.closed:
                with self._lock:
                    full = len(self._spare_regions) >= _SPARE_REGIONS
                if full:
                    break
                try:
                    self._make_spare_region()
                except OSError as exc:  # the next hello makes its own
                    log.warning("could not make a spare ring region: %s", exc)
                    break
            if self.closed:
                return

    def _make_spare_region(self) -> None:
        """Keep a ring region or two made ahead, so that the next hello does not wait for one."""
        with self._lock:
            if self.closed or len(self._spare_regions) >= _SPARE_REGIONS:
                return
        region = Region.create(*self._geometry)
        with self._lock:
            if not self.closed and len(self._spare_regions) < _SPARE_REGIONS:
                self._spare_regions.append(region)
                return
        region.close()

    def _load_program(self, client: Client, frame: protocol.Frame):
        check_program_quota(client, list(self.drainer.clients.values()), self.max_programs)  # before any work
        digest, interface = self.interfaces.of(frame.payload, self.device)
        self.drainer.quarantine.check_program(digest)
        push_size = -(-interface.push_constant_size // 4) * 4  # Vulkan ranges are whole words
        if self.compilers is not None and not self.drainer.pipelines.has(digest):
            try:
                self.compilers.vet(frame.payload, len(interface.bindings), push_size, interface.entry_point)
            except InvalidSubmission as exc:  # it crashed or outran the time limit: refuse it for everyone
                self.interfaces.refuse(digest, exc)
                log.warning("%s: program %s refused: %s", client.describe(), digest.hex()[:16], exc)
                raise
        with self.drainer.quarantine.risk(COMPILE, client, digest, unless=self.drainer.pipelines.has(digest)):
            pipeline = self.drainer.pipelines.acquire(self.device, digest, frame.payload, interface, push_size)

        def register():
            self.drainer.pipelines.collect(self.device)
            try:
                _require_attached(client)
                check_program_quota(client, self.drainer.clients.values(), self.max_programs)
                program_id = client.new_id(frame.fields.get("id"))
            except LibshareError:  # the pipeline was acquired for this record: give it back
                self.drainer.pipelines.release(self.device, pipeline)
                raise
            record = ProgramRecord(program_id, pipeline, len(interface.bindings), push_size,
                                   cuttable=not interface.counts_workgroups)
            self.drainer.adopt(client, record)
            return record.id

        program_id = self._call(register, policy=False)  # a record: the engine's policy stays
        return {"program_id": program_id, "bindings": len(interface.bindings),
                "push_size": push_size, "local_size": list(interface.local_size)}, ()

    def _alloc(self, client: Client, frame: protocol.Frame):
        size, kind = frame.fields.get("size"), frame.fields.get("kind", "shared")
        if not isinstance(size, int) or not 0 < size <= _MAX_BUFFER:
            raise InvalidSubmission(f"buffer size must be an integer in 1..{_MAX_BUFFER} (got {size!r})")
        if kind not in ("shared", "device"):
            raise InvalidSubmission(f"buffer kind must be 'shared' or 'device' (got {kind!r})")
        rounded = -(-size // _PAGE) * _PAGE
        self.limits.check(client, list(self.drainer.clients.values()), rounded)  # before any memory exists
        memory = _shared_memory(rounded) if kind == "shared" else None
        buffer_id = self._register_buffer(client, kind, rounded, memory, None)
        return {"buffer_id": buffer_id, "size": rounded}, ((memory.take_fd(),) if memory else ())

    def _import(self, client: Client, frame: protocol.Frame):
        """A shared buffer's memfd that the client kept from an earlier arbiter (a session that
        reattaches after a restart): checked (see check_sealed_memfd), mapped, and counted against
        the client's limits like a new buffer. The client's memory is the very same."""
        size = frame.fields["size"]
        if len(frame.fds) != 1:
            raise InvalidSubmission(f"import carries exactly one memfd (got {len(frame.fds)})")
        if size % _PAGE:
            raise InvalidSubmission(f"an imported buffer is a whole number of {_PAGE}-byte pages (got {size})")
        check_sealed_memfd(frame.fds[0], size)
        self.limits.check(client, list(self.drainer.clients.values()), size)  # before mapping anything
        mapping = SharedMapping(frame.fds[0], size)  # the frame's descriptor is closed by _answer
        buffer_id = self._register_buffer(client, "shared", size, SharedMemory(-1, mapping, mapping.address),
                                          frame.fields.get("id"))
        return {"buffer_id": buffer_id, "size": size}, ()

    def _register_buffer(self, client: Client, kind: str, rounded: int, memory: SharedMemory | None,
                         wanted_id: int | None) -> int:
        """Make the device buffer over ``memory`` (or a device-local one) and the client's record of
        it (id ``wanted_id`` if given), as a control task; the memory is released if that fails."""
        def create():
            _require_attached(client)
            self.limits.check(client, self.drainer.clients.values(), rounded,  # again, one alloc at a time
                              self.device.clearing_bytes)
            buffer_id = client.new_id(wanted_id)  # before the device buffer: a refused id leaves nothing
            if memory is not None:
                device_buffer = self.device.import_host(memory.address, rounded)
            else:
                device_buffer = self.device.alloc_device(rounded)
            record = BufferRecord(buffer_id, kind, rounded, device_buffer, memory)
            self.drainer.adopt(client, record)
            client.counters.memory_bytes += rounded
            client.counters.peak_memory_bytes = max(client.counters.peak_memory_bytes,
                                                    client.counters.memory_bytes)
            self.drainer.note_memory()
            return record.id

        try:
            return self._call(create, policy=False)  # a record: the engine's policy stays
        except BaseException:
            if memory is not None:
                memory.close()
            raise

    def _free(self, client: Client, frame: protocol.Frame):
        def free():  # descriptors pushed before this request still find it (ls_engine_drop waits for them)
            record = (client.buffers.get(frame.fields.get("buffer_id"))
                      if "buffer_id" in frame.fields else client.programs.get(frame.fields.get("program_id")))
            if record is None:
                raise InvalidSubmission(f"no such buffer or program: {frame.fields}")
            self.drainer.free(client, record)

        self._call(free, policy=False)  # records: the engine's policy stays
        return {}, ()

    def _stats(self, client: Client, frame: protocol.Frame):
        c = self.drainer.refresh(client)
        return {"client_id": client.id, "submitted": c.submitted, "completed": c.completed,
                "errors": c.errors, "device_ns": c.device_ns, "cut": c.cut, "pieces": c.pieces,
                "control_bytes": c.control_bytes,
                "memory_bytes": c.memory_bytes,
                "clients": len(self._attached)}, ()  # connections: the control thread may not have added this one yet

    _HANDLERS = {"load_program": _load_program, "alloc": _alloc, "import": _import, "free": _free, "stats": _stats}

    # ---------------------------------------------------------------- shutdown

    # ---------------------------------------------------------------- accounting

    def snapshot(self) -> dict:
        """The server's and every connected client's state and counters (for ps and metrics)."""
        try:  # on the control thread, which moves a reclaimed client's counts into the totals
            return self.drainer.call(self._snapshot)
        except ServerNotReady:  # the control thread has stopped: nothing moves any more
            return self._snapshot()

    def _snapshot(self) -> dict:
        # Every client the control thread still holds is listed: one that disconnected while its
        # in-flight work holds memory shows as CLOSING (or INACTIVE) until it is reclaimed, when
        # its counts move into the totals. "clients" counts the connected ones.
        everyone = list(self.drainer.clients.values())
        for client in everyone:
            self.drainer.refresh(client)
        totals = Counters()
        totals.add(self.drainer.totals)
        for client in everyone:
            totals.add(client.counters)
        device = self.device
        server = {"pid": os.getpid(), "state": self.state, "started": self.started,
                  "clients": sum(not c.closing for c in everyone),
                  "device": {"index": device.index, "uuid": device.uuid, "name": device.name},
                  **totals.as_dict(),
                  "memory_bytes": sum(c.counters.memory_bytes for c in everyone),
                  "peak_memory_bytes": self.drainer.peak_memory_bytes}
        return {"server": server, "clients": [_client_row(c, self.limits) for c in everyone]}

    def close(self, timeout: float = 10.0) -> bool:
        """Stop accepting, cancel queued work, let in-flight work end (at most ``timeout`` s),
        tell clients, release the device, unlink the socket. Idempotent.

        Returns within about ``timeout`` s whatever the device does: True once the device is
        released, False when work that never ended kept it (it is abandoned to the process's
        exit; see "States" in _drain.py).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            if self.closed:
                return not self.device._abandoned
            self.closed = True
            connections = list(self._connections)
            spares, self._spare_regions = self._spare_regions, []
            idle, self._idle_sessions = self._idle_sessions, 0
        for region in spares:
            region.close()
        for _ in range(idle):  # the idle session threads end
            self._sessions.put(None)
        self._spares_wanted.set()  # the spares thread ends
        if self._gate is not None:
            self._gate.close()  # the listener, and every connection that has not said hello
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
        log.info("shutting down: %d clients connected", len(self.drainer.clients))
        if self.compilers is not None:
            self.compilers.close()
        self.drainer.quarantine.close()  # a compile still running did not end the arbiter
        stopped = self.drainer.stop(timeout)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if not stopped:  # the control thread still uses the device: leave both
            log.error("the control thread did not stop within %.1f s; the device is abandoned", timeout)
            return False
        if self.drainer.abandoned:  # the engine's work still runs on the device: leave it
            log.warning("work still ran on the device at the shutdown timeout: it is abandoned, not destroyed")
            return False
        released = self.device.close(max(deadline - time.monotonic(), 0.0))
        if not released:
            log.warning("work still ran on the device at the shutdown timeout: it is abandoned, not destroyed")
        os.close(self._wake_fd)
        return released


def _require_attached(client: Client) -> None:
    """In a control task, before a request adds to what a client holds: refuse once the client
    was dropped, terminated or reclaimed meanwhile (its reclaim would never see the new object)."""
    if client.closing:
        raise client.sticky or ServerNotReady("this session was closed by the arbiter; reconnect")


def _setting(value, variable: str, kind, default, most=86400):
    """An arbiter setting: the argument, else the environment variable, else the default; in (0, most]."""
    if value is None:
        text = os.environ.get(variable, "").strip()
        try:
            value = kind(text) if text else default
        except ValueError:
            raise InvalidSubmission(f"bad arbiter setting {variable}={text!r}: not a number") from None
    if not 0 < value <= most:
        raise InvalidSubmission(f"bad arbiter setting {variable}: {value!r} must be in (0, {most}]")
    return value


def _raise_fd_limit(max_clients: int, to_hard: bool = False) -> None:
    """Lift the soft open-file limit: to the hard one for a daemon (``to_hard``), else as far as
    ``max_clients`` clients need (an embedded arbiter shares its client's process).

    InvalidSubmission when even the hard limit cannot hold ``max_clients`` clients.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = _nr_open() if hard == resource.RLIM_INFINITY else hard
    base = open_fds() + _FD_SLACK + _FDS_PER_CLIENT * max_clients
    if ceiling < base + MIN_WAITING:
        raise InvalidSubmission(f"{max_clients} clients need about {base + MIN_WAITING} open files and the "
                                f"hard limit is {ceiling}: raise it (ulimit -Hn, LimitNOFILE= in a systemd "
                                "unit) or lower --max-clients")
    target = ceiling if to_hard else min(ceiling, base + MAX_WAITING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)


def _nr_open() -> int:
    """The most descriptors a process may be allowed (fs.nr_open)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def _resource_error(exc: OSError, op) -> LibshareError:
    """What a request that failed with ``exc`` tells its client."""
    if exc.errno in _SCARCE:
        return QuotaExceeded(f"the arbiter is out of file descriptors or memory ({exc.strerror}); free "
                             "buffers, or ask the operator to raise the arbiter's limits")
    return LibshareError(f"the arbiter failed on request {protocol.short(op)}: {exc}")


def _configure_scheduling(drainer: Drainer, mode: str | None, watchdog: float | None) -> None:
    """Scheduling mode, default compute share and priority, and watchdog, from arguments or LIBSHARE_*."""
    env = os.environ
    try:
        mode = mode or env.get("LIBSHARE_SCHEDULING") or "throughput"
        drainer.scheduler.mode = mode if mode == UNSCHEDULED else mode_name(mode)
        drainer.scheduler.default_share = percentage(env.get("LIBSHARE_ACTIVE_THREAD_PERCENTAGE") or 100)
        drainer.scheduler.default_priority = priority_name(env.get("LIBSHARE_DEFAULT_CLIENT_PRIORITY") or "normal")
        seconds = watchdog_seconds(watchdog if watchdog is not None else env.get("LIBSHARE_WATCHDOG_SECONDS") or _WATCHDOG)
    except ValueError as exc:
        drainer.device.close()
        raise InvalidSubmission(f"bad arbiter setting: {exc}") from None
    drainer.watchdog = seconds if seconds > 0 else None


def _requested_priority_and_share(fields: dict, default_priority: str) -> tuple[str, int]:
    """The priority and compute share a hello asks for (the share may only lower the arbiter's)."""
    try:
        priority = priority_name(fields.get("priority") or default_priority)
        share = fields.get("share")
        share = 100 if share in (None, "") else percentage(share)  # 0 is no share, not "unset"
    except ValueError as exc:
        raise InvalidSubmission(str(exc)) from None
    return priority, share


def _requested_group(fields: dict) -> str:
    """The group a hello names ("" for none), cut to 64 characters as it is kept."""
    return (fields.get("group") or "")[:64]


def _check_priority_allowed(priority: str, default_priority: str, trusted: bool) -> None:
    """AccessDenied when a peer that is not ``trusted`` (root or the arbiter's uid, on the arbiter's
    own socket) asks for a priority above the default: in multi-user mode a tenant could otherwise
    make itself realtime, and hold every other client to one short slice per pass (MPS's clients may
    only lower theirs)."""
    if not trusted and outranks(priority, default_priority):
        raise AccessDenied(f"priority {priority} is above the default ({default_priority}): only uid {os.getuid()} "
                           "or root may ask for it; the operator may set it (set_client_priority PID PRIORITY)")


def _check_group_allowed(group: str, uid: int, owners: dict[str, int], scheduler, trusted: bool) -> None:
    """AccessDenied when a peer that is not ``trusted`` (clients.trusted_peer: root or the arbiter's
    uid, through the arbiter's own socket) names a group that another uid owns (set_group_owner),
    or an unowned group whose priority is above the default, or, owning groups, names none of them.
    A group is a name: without owners, a tenant could join another job's group to spend its memory
    limit and compute share, or a group the operator made realtime, or leave its own group to escape
    its limits. Through a share socket root is a tenant too: the operator lets a root container into
    a raised-priority share group by making uid 0 its owner."""
    if trusted:
        return
    if group and owners.get(group, uid) != uid:
        raise AccessDenied(f"group {printable(group)!r} belongs to uid {owners[group]}")
    if group and group not in owners and outranks(scheduler.group_priority.get(group), scheduler.default_priority):
        raise AccessDenied(f"group {printable(group)!r} has priority {scheduler.group_priority[group]}, above the "
                           f"default: only uid {os.getuid()} or root may join it unless the operator gives it an "
                           "owner (set_group_owner GROUP UID)")
    mine = sorted(g for g, owner in list(owners.items()) if owner == uid)  # a control worker may write meanwhile
    if mine and group not in mine:
        raise AccessDenied(f"uid {uid} owns groups ({', '.join(map(printable, mine[:4]))}): name one of them "
                           "(LIBSHARE_GROUP)")


def _client_row(client: Client, limits: MemoryLimits) -> dict:
    limit = limits.client_limit(client)
    # CLOSING: disconnected, its in-flight work still running (and holding its memory).
    state = "CLOSING" if client.closing and client.state == "ACTIVE" else client.state
    return {"pid": client.pid, "client_id": client.id, "name": client.name, "group": client.group,
            "state": state, "priority": client.priority, "connected": client.connected,
            "cmdline": client.cmdline, "mem_limit": None if limit is None else limit.value,
            **client.counters.as_dict()}


def _raise_oom_score_adj(pid: int, floor: int) -> None:
    """Raise process ``pid``'s oom_score_adj to ``floor`` if it is lower (never lower it)."""
    try:  # four system calls (a buffered open() in "r+" makes nine): this is on the way to a client's requests
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
        try:
            if int(os.read(fd, 32)) < floor:
                os.pwrite(fd, str(floor).encode(), 0)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        log.info("cannot raise the oom_score_adj of pid %d to %d: %s", pid, floor, exc)


def _cmdline(pid: int) -> str:
    """The command line of process ``pid`` (from /proc), or "" if it is gone."""
    try:  # three system calls (a buffered open() makes eight): this is on the way to a client's welcome
        fd = os.open(f"/proc/{pid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return ""
    return text.replace(b"\0", b" ").decode(errors="replace").strip()


def _shared_memory(size: int) -> SharedMemory:
    """A new sealed memfd of ``size`` bytes (see ring/_region.py), mapped here (page-aligned, so it
    can be imported). A memfd's pages start as zeros, so the client reads no one else's data."""
    fd = sealed_memfd("libshare-buffer", size)
    try:
        mapping = SharedMapping(fd, size)  # keeps no descriptor: the memfd goes to the client
    except OSError:
        os.close(fd)
        raise
    return SharedMemory(fd, mapping, mapping.address)
