"""Sessions and tickets: the client side of libshare.

A Session holds a control socket (rare requests: programs, buffers) and a
ring region (every dispatch). ``dispatch`` hands the operation to the ring's
C encoder (``ls_push_op``, the one bindings/c calls too), which checks it and
writes it straight into this thread's lane, and returns a Ticket at once. The
session keeps its tickets in flight in the ring's ticket book (ring/tickets.c, the
one bindings/c keeps for a C session): the push and the ticket's record are one
C call (``ls_tickets_push``). Completions come back on the completion ring;
whichever thread waits pops them all into the book in C, and each ticket takes
its outcome from there, so tickets may be waited in any order, from any thread,
or awaited under anyio. A thread waits in C with the GIL released (a short spin,
then the completion ring's futex); an ``await`` waits in its event loop on the
session's doorbell socket, on which the arbiter sends a byte when the ring was
armed for it (LS_NEED_WAKEUP_FD), so awaiting starts no thread.

Connecting to a daemon imports nothing from Vulkan: the session is sockets,
memfds and the ring. Embedded mode starts one arbiter inside this process
(shared by every embedded session of the process) and talks to it over a
socketpair with the very same protocol.

Tickets tell the truth. A ticket's outcome lives on the Ticket itself and is
sticky: once known (the arbiter's status, the arbiter's loss, or this
session's close), every later ``wait``, ``done`` and ``await`` gives the same
answer. The book keeps a ticket's record while its work is in flight and then
its outcome until the Ticket takes it; a Ticket dropped unread lists its number
(``Ticket.__del__``, a deque append), and the next read of the completion ring
tells the book to forget it, so a completion nobody will ask for is dropped and
pipelining without waiting (the README's pattern) holds no memory per
dispatch. A reattach or a loss that fails tickets takes them out of the book
and leaves each failure in ``_failures`` for its Ticket. Ticket numbers come
from one counter under the session's gate lock, so threads never share one,
and an operation the encoder refuses spends none (and its Ticket, numbered 0,
forgets nothing).

Every way of asking sees the arbiter's death within one wait slice (50 ms):
a blocking wait sleeps on the completion ring in slices and the ring checks
the arbiter's pidfd (or, embedded, its state word) between them; ``done()``
never blocks, so it takes a zero-length look that makes the same check.
Once the loss is known it is sticky for the session: every unfinished ticket
fails with it and ``dispatch()`` raises it at once. A cancelled completion
(the arbiter shut down or terminated this client) counts as that loss too, and
so does the encoder's refusal to push into a ring whose arbiter side is closed
(a dispatch notices a shutdown, a termination or a fault by itself).

Surviving the arbiter. Under the control daemon (``libshare-control -d``; see
arbiter/_supervisor.py) an arbiter that dies is replaced within about 50 ms, and a session
reattaches instead of ending: a plain loss becomes ArbiterRestarted, and the next call or
wait runs :meth:`Session._reattach`. That keeps other threads out of the old ring (they
wait at ``_enter`` while ``_moving``), settles the tickets in flight, says hello to the new
arbiter and hands it every live buffer and program under the ids they had (``import``
sends the sealed memfd a shared buffer kept, so the arrays stay the same objects over the
same pages; a program's SPIR-V is loaded again; a device buffer is lost: BufferLost), then
swaps in the new ring and resends, first and in ticket order, the work the old arbiter
never ran: descriptors still unconsumed in the old lanes (the producer's own writes, read
back) and, after a hand-over (``restart``: the old arbiter closes the ring with LS_EMOVED
and answers what it had not started LS_EMOVED), those answered so. It waits for the old
arbiter to answer what it had started before it decides. Work the old arbiter took and
never answered fails with ArbiterRestarted: it may or may not have run. A loss that is not
the arbiter's death (terminated, a fault, a corrupt ring), or one with no control daemon,
stays sticky as before.

Closing never pulls the ring from under a thread. A dispatch pushes while it
holds the gate lock (one lock round trip: its number, the check that the session
is open, the push); every other use of the mapped region (a wait, a dispatch
waiting for room in a full lane) counts itself in and out under that lock; ``close()``
marks the session closed, shuts the socket (waking a control request), then
waits for the count to drop to zero before it unmaps. Whichever thread brings
it to zero unmaps, so a close from inside a wait (a finalizer, say) cannot
deadlock: after _CLOSE_WAIT it returns and leaves the unmap to that thread,
on its way out. A thread asleep on the ring wakes within one slice, sees the
close, and fails its ticket with ``SessionClosed``, which is also the sticky
outcome of every ticket whose completion had not been read (the work itself
still completes at the arbiter).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import math
import os
import select
import socket
import threading
import time
import weakref
from pathlib import Path

import anyio
import numpy as np

from libshare.protocol import paths as _config
from libshare.protocol import wire as protocol
from libshare import errors
from libshare.client.buffers import Buffer, Program, find_buffer
from libshare.ring import C, Region, TicketBook

__all__ = ["Session", "Ticket", "connect"]

_SEEN_ARRAYS = 1024  # arrays whose binding a session remembers
_WAIT_SLICE = 0.05  # seconds per completion wait, between liveness checks
# How a session's waits spin before they sleep, by its priority (see wait_for in ring.c): a
# realtime one keeps its core (a yield could give it to a busy thread for a whole time slice) and
# spins only while its waits end within the spin; a low one sleeps at once (background work does
# not poll for the cores others need); the others spin longer, yielding the core at each look.
_SPIN_MODES = {"realtime": C.SPIN_KEEP, "low": C.SPIN_NONE}
_CLOSE_WAIT = 2.0  # seconds close() waits for threads inside the ring before leaving the unmap to them
_REPLY_SPIN = 200e-6  # seconds a control request polls for its reply before it sleeps (_await_reply)
_polling = threading.Lock()  # held by the one thread of this process that polls for a reply
_REQUEST_TIMEOUT = 60.0  # a control request the arbiter does not answer in this long fails
# load_program's bound instead, unless the arbiter's welcome names a longer one (its load_timeout, plus
# _LOAD_MARGIN): a daemon vets a new module in a compiler process first, and may wait for one to be free
# and to start, then for its time limit (LIBSHARE_COMPILE_TIMEOUT), twice if the first process dies; at the
# request bound, a session was lost while its arbiter lived (two test suites at once: the refusal came
# 60 s after the request, past a 10 s limit)
_LOAD_TIMEOUT = 300.0
_LOAD_MARGIN = 30.0
_MOST_LOAD_TIMEOUT = 1e6  # a welcome's load_timeout past this (or not a number) is not believed
_REDIAL_PAUSE = 0.01  # seconds between looks for the arbiter that replaces a lost one
_REATTACH_TRIES = 3  # pushes a dispatch tries, reattaching between them
_MOVE_POLL = 0.001  # seconds between looks at a handed-over ring, for the answers still due
_OP_DISPATCH, _OP_COPY = C.OP_DISPATCH, C.OP_COPY
_NONE, _DONE, _MOVED, _ORPHAN = TicketBook.NONE, TicketBook.DONE, TicketBook.MOVED, TicketBook.ORPHAN
_TOO_BIG = (f"at most {C.MAX_BUFFERS} buffers, {C.MAX_PUSH} push bytes and 3 group counts, each count "
            "and offset not negative and within 32 bits (offsets and sizes: 64 bits)")
_STATUS_TEXT = {
    C.EBADSLOT: "descriptor fields out of range",
    C.ENOPROGRAM: "unknown program id",
    C.ENOBUFFER: "unknown or freed buffer id",
    C.EBINDINGS: "number of buffers differs from the program's bindings",
    C.ERANGE: "offset or size outside the buffer, or misaligned",
    C.EGROUPS: "group count is 0 or beyond the device limit, or the three multiply past 2^32 - 1",
    C.EPUSH: "more push-constant bytes than the program declares (or not a multiple of 4)",
    C.EFAULT: "the device faulted while running it",
    C.ECANCELED: "cancelled",
}


def _status_error(ticket: int, status: int) -> errors.LibshareError:
    text = _STATUS_TEXT.get(-status, f"status {status}")
    if -status == C.EFAULT:
        return errors.ServerFault(f"ticket {ticket}: {text}")
    if -status == C.ECANCELED:
        return errors.ArbiterLost(f"ticket {ticket} was cancelled: the arbiter shut down or ended this session")
    return errors.InvalidSubmission(f"ticket {ticket} rejected by the arbiter: {text}")


class _Moved(errors.ArbiterRestarted):
    """The arbiter handed this session over to a new one (``restart``): nothing failed, the work
    it did not run goes to the new arbiter (see Session._unrun_work)."""


def _fresh(error: errors.LibshareError) -> errors.LibshareError:
    """A new instance of a sticky error, so that raising it again does not grow one traceback for ever."""
    return type(error)(*error.args)


class Ticket:
    """A submitted dispatch or copy; ``wait()``, ``done()`` or ``await`` it.

    Its outcome is sticky: once known, every ``wait()`` returns or raises the same.
    """

    __slots__ = ("_session", "id", "device_ns", "_status", "_error")

    def __init__(self, session: Session, ticket_id: int):
        self._session = session
        self.id = ticket_id
        """The ticket number echoed by the arbiter."""
        self.device_ns: int | None = None
        """Device time the work took (nanoseconds), once done."""
        self._status: int | None = None  # the arbiter's status, once its completion was read
        self._error: errors.LibshareError | None = None  # the sticky failure, once known

    def _settled(self) -> bool:
        return self._status is not None or self._error is not None

    def done(self) -> bool:
        """True once ``wait()`` would return or raise at once: the work completed (successfully
        or not), or its outcome can no longer be known (the arbiter is gone, the session closed).
        Never raises; notices a dead arbiter. Blocks only to reattach after an arbiter restart
        (milliseconds with the control daemon's standby; the session's timeout at most)."""
        if not self._settled():
            self._session._poll(self)
        return self._settled()

    def wait(self, timeout: float | None = None) -> Ticket:
        """Block until done; raise Timeout past ``timeout`` seconds, or the work's error (every time)."""
        if not self._settled():
            deadline = None if timeout is None else time.monotonic() + timeout
            self._session._wait_ticket(self, deadline)
        if self._status and self._error is None:
            self._error = self._session._status_error(self)
        if self._error is not None:
            raise _fresh(self._error)
        return self

    def __await__(self):
        return self._wait_async().__await__()

    async def _wait_async(self) -> Ticket:
        # done() reads what is ready and notices a lost arbiter or a closed session; between looks
        # the task waits on the session's doorbell socket, never in a thread (see _completion_bell).
        while not self.done():
            await self._session._completion_bell()
        return self.wait(0)

    def __repr__(self) -> str:
        return f"<libshare.Ticket {self.id}>"

    def __del__(self):
        # Nobody can ask for this outcome any more: the session's ticket book drops it (a list
        # append here; the book is told on the next read of the completion ring).
        if self._status is None and self._error is None and self.id:
            session = self._session
            session._forgotten.append(self.id)
            session._failures.pop(self.id, None)


class Session:
    """A client's connection to an arbiter. Use ``libshare.connect()`` to make one."""

    def __init__(self, sock: socket.socket, welcome: protocol.Frame, embedded: bool, hello: dict | None = None,
                 socket_path: Path | None = None, timeout: float = 10.0):
        self._sock = sock
        self._request_lock = threading.RLock()  # re-entrant: close() from a finalizer inside a request
        self._cq_lock = threading.Lock()
        self.embedded = embedded
        """True when the arbiter runs inside this process."""
        self._hello, self._socket_path, self._timeout = hello, socket_path, timeout  # to reattach
        self._adopt(welcome)
        self._gate = threading.Lock()  # guards closed, _users, _torn_down, _moving, _next_ticket
        self._gone = threading.Condition(self._gate)  # close() and a reattach wait on it for the users to leave
        self._users = 0  # threads inside the mapped region now: it is unmapped only when none is
        self._torn_down = False
        self._moving = False  # a reattach swaps the region: nobody enters meanwhile
        self._reattach_lock = threading.Lock()
        self.reattached = 0
        """How many times this session reattached to a new arbiter."""
        self._next_ticket = 1
        self._book = TicketBook()  # the tickets in flight and their outcomes, in C (ring/tickets.c)
        self._forgotten: collections.deque[int] = collections.deque()  # tickets dropped unread: for the book
        self._failures: dict[int, errors.LibshareError] = {}  # ticket -> what it failed with, off the book
        self._cancelled = 0  # the book's count of cancelled completions, as last seen
        self._lanes = threading.local()  # .push_op: ls_push_op on this thread's lane, claimed on its first push
        self._by_mapping: dict[int, Buffer] = {}
        self._objects: dict[int, Buffer | Program] = {}  # id -> each live buffer and program (for a reattach)
        self._seen: dict[int, tuple[weakref.ref, int, int]] = {}  # id(item) -> (the item, buffer id, offset)
        self._lost: errors.LibshareError | None = None  # sticky (until a reattach): the arbiter is gone or ended this session
        self._tickets_outside = False  # True: other code (the C API) reads the completion ring and numbers
        # the tickets; only _reattach_external reattaches then (a call that meets the loss raises it)
        self.closed = False
        """True after close()."""

    def _adopt(self, welcome: protocol.Frame) -> None:
        """Take the ring and doorbell an arbiter's welcome carries (at connect, and at each reattach)."""
        self.client_id: int = welcome.fields["client_id"]
        """This session's client id at the arbiter."""
        self.device_name: str = welcome.fields["device"]
        """The name of the arbiter's device."""
        self.arbiter_pid: int = welcome.fields["arbiter_pid"]
        """The pid of the arbiter this session is attached to."""
        self.priority: str = welcome.fields.get("priority", "normal")
        """The priority the arbiter gave this session when it connected (asked for, or its default)."""
        self._load_timeout = _load_timeout(welcome.fields.get("load_timeout"))
        # Through a share socket (a container's pipe directory) the control daemon's lock is out of
        # sight: whether a new arbiter will come is what the welcome said.
        self._contained = isinstance(welcome.fields.get("share"), str)
        self._welcome_supervised = welcome.fields.get("supervised") is True
        region_fd, wake_fd = welcome.fds
        try:
            self._region = Region.attach(region_fd)
        finally:
            os.close(region_fd)
        self._wake_fd = wake_fd
        os.set_blocking(wake_fd, False)  # a ring never waits; nor does reading the arbiter's bytes
        self._region.set_wake_fd(wake_fd)
        self._region.set_spin_mode(_SPIN_MODES.get(self.priority, C.SPIN_YIELD))
        if self.arbiter_pid != os.getpid():
            self._region.watch_peer(self.arbiter_pid)
        self._region.announce_client()

    # ---------------------------------------------------------------- the region's users

    # _enter and _leave run on every wait step: the gate is taken with acquire and release, not
    # with ``with`` (whose two method lookups and calls cost 170 ns of a step's 2 us).

    def _enter(self) -> None:
        """Count this thread in as a user of the mapped region; SessionClosed once closed."""
        gate = self._gate
        gate.acquire()
        try:
            while self._moving and not self.closed:
                self._gone.wait()
            if self.closed:
                raise _closed_error()
            self._users += 1
        finally:
            gate.release()

    def _leave(self) -> None:
        """Count this thread out; the last one out of a closed session unmaps the region."""
        gate = self._gate
        gate.acquire()
        try:
            self._users -= 1
            if not (self.closed or self._moving):
                return  # the common case
            last = self.closed and not self._users and not self._torn_down
            if last:
                self._torn_down = True
            self._gone.notify_all()
        finally:
            gate.release()
        if last:
            self._tear_down()

    @contextlib.contextmanager
    def _inside(self):
        """Counted in for the block, which is told True; told False (and not counted) once closed."""
        try:
            self._enter()
        except errors.SessionClosed:
            yield False
            return
        try:
            yield True
        finally:
            self._leave()

    # ---------------------------------------------------------------- control requests

    def _request(self, op: str, payload: bytes = b"", max_fds: int = 0, fds: tuple[int, ...] = (),
                 reply_timeout: float | None = None, **fields) -> protocol.Frame:
        """Send one request and read its reply, which may take ``reply_timeout`` seconds (default
        _REQUEST_TIMEOUT); the reply, or the arbiter's refusal raised (ArbiterLost when it does not
        answer in time: the session is lost then)."""
        self._check_usable()
        reply_timeout = reply_timeout or _REQUEST_TIMEOUT
        with self._request_lock:
            try:
                if self._sock.gettimeout() != reply_timeout:
                    self._sock.settimeout(reply_timeout)
                reply = _exchange(self._sock, {"op": op, **fields}, payload, max_fds, fds,
                                  poll=not self.embedded)
            except (EOFError, OSError) as exc:
                if self.closed:
                    raise _closed_error() from exc
                with self._inside() as inside:
                    why = self._closed_by_arbiter() if inside else None
                lost = self._record_loss(why or errors.ArbiterLost(f"the arbiter closed the connection ({exc or 'EOF'})"))
                raise _fresh(lost) from exc
        if not reply.fields.get("ok"):
            reply.close_fds()
            raise errors.remote_error(reply.fields)
        return reply

    def _check_usable(self) -> None:
        """Raise SessionClosed, or the sticky loss (noticing one the arbiter left in the ring);
        after an arbiter restart, reattach first (see :meth:`_reattach`)."""
        if self._lost is None:
            self._enter()
            try:
                self._lost = self._closed_by_arbiter()
            finally:
                self._leave()
        elif self.closed:
            raise _closed_error()
        if isinstance(self._lost, errors.ArbiterRestarted):
            self._reattach()
        if self._lost is not None:
            raise _fresh(self._lost)

    # ---------------------------------------------------------------- an arbiter's loss, and reattaching

    def _record_loss(self, lost: errors.LibshareError) -> errors.LibshareError:
        """Record why the arbiter is gone, once; return the session's loss.

        A plain loss (the arbiter died or closed the connection) under a control daemon, which
        starts a new arbiter, becomes ArbiterRestarted, and so does a hand-over: the next call,
        or a wait, reattaches (:meth:`_reattach`), which settles every ticket in flight. Any
        other loss (terminated, a fault, a corrupt ring), or one with no control daemon, is
        sticky and fails the tickets in flight now."""
        if type(lost) is errors.ArbiterLost and self._may_reattach():
            lost = errors.ArbiterRestarted(f"{lost}; a new arbiter takes over: the work in flight may or may not "
                                           "have run, submit it again (this session reattaches by itself)")
        with self._gate:  # a dispatch numbers and records its ticket under the gate: none slips past
            if self._lost is not None:
                return self._lost
            self._lost = lost
        if not isinstance(lost, errors.ArbiterRestarted):
            self._fail_in_flight(lost)
        return lost

    def _fail_in_flight(self, error: errors.LibshareError, numbers=None) -> None:
        """Fail the tickets in flight (those of ``numbers``, or all) with ``error``: they leave the
        ticket book, and the failure waits in _failures for their Ticket (unless it was dropped)."""
        self._tell_forgotten()
        with self._gate:
            in_flight = self._book.in_flight()
            for number in in_flight if numbers is None else set(numbers) & in_flight.keys():
                self._book.drop(number)
                if not in_flight[number] & _ORPHAN:
                    self._failures[number] = error

    def _unrun_work(self) -> np.ndarray:
        """The descriptors of the tickets in flight that the lost arbiter never ran, to send to the
        new one under the same tickets; every other ticket in flight fails with ArbiterRestarted.

        Never run: those it answered LS_EMOVED (handing over), and those still waiting in the
        lanes (it never took them). After a hand-over the old arbiter still finishes what it took
        and answers it, so this waits for that while it lives (the session's timeout at most).
        Only the reattaching thread uses the region now (no other thread may enter it)."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                self._file()
                corrupt = False
            except errors.RingCorrupted:
                corrupt = True
            in_flight = self._book.in_flight()
            pending = set(in_flight)
            moved = {number for number, marks in in_flight.items() if marks & _MOVED}
            unconsumed = set() if corrupt else self._region.unconsumed_tickets()
            if (corrupt or pending - moved <= unconsumed or time.monotonic() >= deadline
                    or not self._region.peer_alive() or not isinstance(self._lost, _Moved)):
                break
            time.sleep(_MOVE_POLL)  # the old arbiter finishes what it took, then answers it
        not_run = (moved | unconsumed) & pending
        self._book.resent()
        self._fail_in_flight(errors.ArbiterRestarted(
            "the arbiter went away while this ticket's work was in flight: it may or may not have run, "
            "submit it again (the session reattached by itself)"), pending - not_run)
        return self._region.descriptors_of(not_run)

    def _may_reattach(self) -> bool:
        return not self.embedded and self._socket_path is not None and not self.closed and self._supervised()

    def _supervised(self) -> bool:
        """Whether a control daemon starts a new arbiter on this session's socket (see _adopt)."""
        return self._welcome_supervised if self._contained else _config.supervised(self._socket_path.parent)

    def _reattach(self, outside: bool = False) -> None:
        """Attach this session to the arbiter that replaced a lost one: a new ring, then every
        live buffer (by the memfd it kept: the same memory) and program (from its SPIR-V) under
        the ids they had. Device buffers come back lost (BufferLost), a program the new arbiter
        refuses comes back lost with its reason. Waits up to the session's timeout for the new
        arbiter; past it the loss becomes a sticky ArbiterLost. ``outside``: called by
        :meth:`_reattach_external` (the only caller for a session whose tickets live outside)."""
        with self._reattach_lock:
            if (not isinstance(self._lost, errors.ArbiterRestarted) or self.closed
                    or self._tickets_outside and not outside):
                return  # another thread reattached already (or gave up, or the session closed)
            with self._gate:
                self._moving = True  # nobody enters the old region from now on
                left = self._gone.wait_for(lambda: not self._users, timeout=_CLOSE_WAIT)
            try:
                resend = self._unrun_work() if left else None
                sock, welcome = self._dial_new_arbiter()
                try:
                    self._register_objects(sock)  # before anyone dispatches: the ids must exist there
                except BaseException:
                    welcome.close_fds()
                    sock.close()
                    raise
            except (errors.LibshareError, EOFError, OSError) as exc:
                if isinstance(exc, (errors.AccessDenied, errors.TooManyClients)):  # refused (Quarantined...): say why
                    self._lost = exc
                    self._fail_in_flight(self._lost)
                elif not isinstance(exc, errors.ArbiterLost):  # (that one went too: the next call tries again)
                    self._lost = errors.ArbiterLost(f"the arbiter went away and no new one took its place: {exc}")
                    self._fail_in_flight(self._lost)
                with self._gate:
                    self._moving = False
                    self._gone.notify_all()
                return
            if resend is None:  # a thread stayed inside the old ring: what it ran cannot be told
                self._fail_in_flight(errors.ArbiterRestarted("the arbiter went away while this ticket's work was "
                                                             "in flight: it may or may not have run, submit it again"))
            sock.settimeout(_REQUEST_TIMEOUT)
            old = (self._sock, self._region, self._wake_fd)
            with self._gate:
                self._sock = sock
                self._adopt(welcome)
                self._lanes = threading.local()  # each thread claims a lane on the new ring
                self._seen.clear()
                self._lost = None
                self.reattached += 1
            _close_quietly(old[0], old[1] if left else None, old[2])  # a region still in use is left mapped
            try:
                if resend is not None and len(resend):  # first on the new ring: the order stays
                    self._region.producer().push(resend, timeout=self._timeout)
            except errors.LibshareError as exc:
                self._fail_in_flight(errors.ArbiterRestarted(f"the new arbiter did not take this ticket's work "
                                                             f"({exc}): submit it again"), resend["ticket"].tolist())
            finally:
                with self._gate:
                    self._moving = False
                    self._gone.notify_all()

    def _reattach_external(self, tickets, moved=()) -> list[tuple[int, int | None, int, errors.LibshareError | None]]:
        """Reattach a session whose tickets are numbered and whose completion ring is read outside
        Python (the C API, bindings/c/capi.c, which stops using the old ring meanwhile).

        ``tickets``: its tickets in flight, after it read the old completion ring; ``moved``: those
        of them the old arbiter answered LS_EMOVED. Each stands in this session's ticket book for the
        reattach (a Ticket held here), which reads what the old ring still holds, resends what the old
        arbiter never ran, and fails the rest. Returns ``(ticket, status, device_ns, error)`` for
        each: the arbiter's status (its completion was read here: the caller never sees it), or
        the error it failed with (ArbiterRestarted), or neither: sent to the new arbiter, its
        completion comes on the new ring. Raises the session's loss when it cannot reattach
        (no control daemon, terminated, a fault): sticky then."""
        held = {int(number): Ticket(self, int(number)) for number in tickets}
        # The caller read the completion ring through a view of its own, and a view keeps its own
        # head: this session's lags behind. A view opened now starts where the caller stopped.
        fresh = Region.attach(self._region.fd)
        with contextlib.suppress(OSError):  # (gone for good: nothing left to wait for)
            fresh.watch_peer(self.arbiter_pid)
        with self._gate:
            for number in held:
                self._book.drop(number)  # (a record of an earlier reattach: the caller's now)
                self._book.add(number)
            stale, self._region = self._region, fresh
        for number in moved:
            self._book.settle(int(number), -C.EMOVED)  # marks it moved, as the completion did
        try:
            if self._lost is None:  # the caller saw the loss on the ring, this session did not
                with self._inside() as inside:
                    why = self._closed_by_arbiter() if inside else None
                self._record_loss(why or errors.ArbiterLost("the arbiter exited or closed this session"))
            for _ in range(_REATTACH_TRIES):  # (a new arbiter that dies at once: try the next)
                if not isinstance(self._lost, errors.ArbiterRestarted) or self.closed:
                    break
                self._reattach(outside=True)
            if self.closed:
                raise _closed_error()
            if self._lost is not None:
                raise _fresh(self._lost)
        finally:
            with self._gate:  # the resent tickets are the caller's again: their completions come to it
                for number, ticket in held.items():
                    self._fetch(ticket)  # (its outcome, when it was read here)
                    self._book.drop(number)
                    ticket.id = 0  # the number is the caller's: this Ticket must not forget it
            with self._gone:  # a thread that took the stale view is inside until it leaves
                self._gone.wait_for(lambda: not self._users, timeout=_CLOSE_WAIT)
            stale.close()
        return [(number, ticket._status, ticket.device_ns or 0, ticket._error) for number, ticket in held.items()]

    def _dial_new_arbiter(self) -> tuple[socket.socket, protocol.Frame]:
        """Say hello to the arbiter now serving the socket (waiting for it while a control daemon runs)."""
        deadline = time.monotonic() + self._timeout
        while True:
            sock = protocol.dial(self._socket_path, max(deadline - time.monotonic(), 0.1))
            if sock is not None:
                try:
                    welcome = _hello(sock, self._hello, self._timeout)
                    if welcome.fields["arbiter_pid"] != self.arbiter_pid:
                        return sock, welcome
                    welcome.close_fds()  # the old arbiter, still on its way out
                except errors.ArbiterUnavailable:  # (ServerNotReady too) starting, or on its way out
                    pass
                except BaseException:
                    sock.close()
                    raise
                sock.close()
            if time.monotonic() >= deadline:
                raise errors.ArbiterUnavailable(f"none answered at {self._socket_path} within {self._timeout:g} s")
            if not self._supervised():
                raise errors.ArbiterUnavailable("the control daemon stopped (quit)")
            time.sleep(_REDIAL_PAUSE)

    def _register_objects(self, sock: socket.socket) -> None:
        """Hand a new arbiter every live buffer and program, in id order (ids are kept); what it
        refuses is marked lost with the reason. EOFError or OSError when it goes away too."""
        for object_id, item in sorted(self._objects.items()):
            if isinstance(item, Program):
                reply = _exchange(sock, {"op": "load_program", "id": object_id}, item.spirv)
            elif item.memfd >= 0:
                reply = _exchange(sock, {"op": "import", "size": item.size, "id": object_id}, fds=(item.memfd,))
            else:
                item.lost = errors.BufferLost(f"device buffer {object_id} died with the arbiter that held it (a "
                                              "restart keeps shared buffers only): allocate it again")
            if item.lost is None and not reply.fields.get("ok"):
                refusal = errors.remote_error(reply.fields)
                item.lost = refusal if isinstance(item, Program) else errors.BufferLost(
                    f"buffer {object_id} could not be handed to the new arbiter: {refusal}")
            if item.lost is not None:  # the new arbiter may give its id to a new object
                del self._objects[object_id]
                if isinstance(item, Buffer):
                    item.close_memfd()

    def _closed_by_arbiter(self) -> errors.LibshareError | None:
        """The sticky error the arbiter left in the ring when it closed this session, if any.

        Reads the region: only between _enter and _leave."""
        reason = self._region.close_reason()
        if reason == C.ECANCELED:
            return errors.ClientTerminated("the operator terminated this client (terminate_client); "
                                           "its queued work was cancelled; reconnect to go on")
        if reason == C.EFAULT:
            return errors.ServerFault("the arbiter's device faulted while this session was connected; "
                                      "reconnect once the server is ACTIVE again")
        if reason == C.EMOVED:
            return _Moved("the arbiter handed over to a new one (restart); this session moves there")
        if reason == C.ECORRUPT:
            return errors.RingCorrupted("the arbiter dropped this session: its ring failed validation (an index "
                                        "in shared memory was overwritten); reconnect to go on")
        return None

    def load_program(self, spirv: bytes | str | os.PathLike) -> Program:
        """Load a compute program from SPIR-V bytes or a .spv path; its interface is reflected."""
        code = bytes(spirv) if isinstance(spirv, (bytes, bytearray)) else _read_module(Path(spirv))
        reply = self._request("load_program", code, reply_timeout=self._load_timeout)
        f = reply.fields
        program = Program(f["program_id"], f["bindings"], f["push_size"], tuple(f["local_size"]), code)
        self._objects[program.id] = program
        return program

    def alloc(self, nbytes: int, kind: str = "shared") -> Buffer:
        """Allocate a buffer of ``nbytes``: "shared" (zero-copy, mapped here) or "device"."""
        reply = self._request("alloc", size=int(nbytes), kind=kind, max_fds=1)
        fd = reply.fds[0] if reply.fds else None
        if (fd is None) != (kind == "device"):
            reply.close_fds()
            raise errors.ProtocolError(f"arbiter answered a {kind} alloc with {len(reply.fds)} descriptors")
        buffer = Buffer(self, reply.fields["buffer_id"], reply.fields["size"], kind, fd)
        if buffer.mapping is not None:
            self._by_mapping[id(buffer.mapping)] = buffer
        self._objects[buffer.id] = buffer
        return buffer

    def array(self, shape, dtype=np.float32) -> np.ndarray:
        """A zero-copy numpy array on a new shared buffer."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = max(int(math.prod(shape)) * np.dtype(dtype).itemsize, 1)
        return self.alloc(nbytes).array(shape, dtype)

    def free(self, obj: Buffer | np.ndarray | Program) -> None:
        """Release a buffer (or the buffer under an array) or a program.

        Work already submitted that uses it still completes: the arbiter destroys it
        after the device is done. Arrays on a freed buffer stay readable here.
        """
        if isinstance(obj, Program):
            if obj.lost is None:  # (a lost one is unknown to this arbiter, which may give its id to another)
                self._request("free", program_id=obj.id)
                self._objects.pop(obj.id, None)
            return
        buffer = obj if isinstance(obj, Buffer) else find_buffer(obj, self._by_mapping)[0]
        if buffer.lost is None:
            self._request("free", buffer_id=buffer.id)
            self._objects.pop(buffer.id, None)
        buffer.freed = True
        buffer.close_memfd()
        for key, (_, buffer_id, _) in list(self._seen.items()):  # its arrays bind nothing any more
            if buffer_id == buffer.id:
                self._seen.pop(key, None)
        if buffer.mapping is not None:
            self._by_mapping.pop(id(buffer.mapping), None)

    def stats(self) -> dict:
        """The arbiter's counters for this client (dispatches, device time, bytes, ...)."""
        fields = dict(self._request("stats").fields)
        fields.pop("ok", None)
        return fields

    # ---------------------------------------------------------------- submission

    def dispatch(self, program: Program, groups, buffers=(), push: bytes = b"") -> Ticket:
        """Queue ``program`` over ``groups`` workgroups on ``buffers``; returns a Ticket at once.

        ``buffers`` are arrays from :meth:`array` (a slice binds from its first element)
        or Buffer objects; ``push`` is the push-constant bytes (``struct.pack``).
        """
        if program.lost is not None:
            raise _fresh(program.lost)
        if groups.__class__ is int:
            gx, gy, gz = groups, 1, 1
        else:
            gx, gy, gz = _groups(groups)
        ids, offsets = [], []
        seen = self._seen
        for item in buffers:  # the hot path of _binding, inline
            known = seen.get(id(item))
            if known is None or known[0]() is not item:
                known = self._binding(item)
            ids.append(known[1])
            offsets.append(known[2])
        if push.__class__ is not bytes:
            push = bytes(push)
        return (self._push(_OP_DISPATCH, program.id, gx, gy, gz, ids, offsets, push)
                or self._submit(_OP_DISPATCH, program.id, gx, gy, gz, ids, offsets, push))

    def copy(self, src, dst, nbytes: int | None = None, src_offset: int = 0, dst_offset: int = 0) -> Ticket:
        """Queue a copy between two buffers (shared or device); returns a Ticket at once."""
        (_, src_id, src_base), (_, dst_id, dst_base) = self._binding(src), self._binding(dst)
        if nbytes is None:
            nbytes = min(_nbytes(src), _nbytes(dst))
        offsets = [src_base + src_offset, dst_base + dst_offset, int(nbytes)]
        return self._submit(_OP_COPY, 0, 0, 0, 0, [src_id, dst_id], offsets, b"")

    def _binding(self, item: Buffer | np.ndarray) -> tuple[weakref.ref, int, int]:
        """(a weak reference to ``item``, the buffer id it binds, the byte offset it binds from),
        remembered per live item until its buffer is freed (walking an array's ``.base`` chain is
        most of what binding costs)."""
        known = self._seen.get(id(item))
        if known is not None and known[0]() is item:
            return known
        if isinstance(item, Buffer):
            buffer, offset = item, 0
        else:
            buffer, offset = find_buffer(item, self._by_mapping)
        if buffer.lost is not None:
            raise _fresh(buffer.lost)
        if len(self._seen) >= _SEEN_ARRAYS:
            self._seen.clear()
        known = self._seen[id(item)] = (weakref.ref(item), buffer.id, offset)
        return known

    def _submit(self, opcode: int, program: int, gx: int, gy: int, gz: int, ids: list, offsets: list,
                push: bytes) -> Ticket:
        """Number the operation and hand it to the ring's C encoder (ls_push_op) on this thread's lane;
        after an arbiter restart, reattach first (twice at most, then the loss is raised). (dispatch()
        tries one push itself before it calls this.)"""
        for _ in range(_REATTACH_TRIES):
            ticket = self._push(opcode, program, gx, gy, gz, ids, offsets, push)
            if ticket is not None:
                return ticket
            self._reattach()
        raise _fresh(self._lost) if self._lost is not None else _closed_error()

    def _push(self, opcode: int, program: int, gx: int, gy: int, gz: int, ids: list, offsets: list,
              push: bytes) -> Ticket | None:
        """The ticket of the pushed operation, or None when a reattach must come first."""
        lanes = self._lanes
        try:
            push_op = lanes.push_op
        except AttributeError:
            push_op = self._claim_lane(lanes)
        # Made before the gate: an allocation may start a garbage collection, and a finalizer it
        # runs may close this session, which takes the gate (not re-entrant).
        ticket = Ticket(self, 0)
        gate = self._gate
        gate.acquire()  # the number, the check that the session is open and the push: one lock round trip
        try:
            if self.closed or self._lost is not None or lanes is not self._lanes:
                pushed = None
            else:
                number = self._next_ticket
                try:  # pushed and recorded in the ticket book in one C call (its completion may come at once)
                    pushed = push_op(number, opcode, program, gx, gy, gz, len(ids), ids, len(offsets), offsets,
                                     push, len(push))
                except OverflowError:  # cffi: a count, id or offset beyond its C type
                    pushed = -C.EBADSLOT
                if pushed >= 0:  # pushed, or the lane is full: the number is spent
                    self._next_ticket = number + 1
                    ticket.id = number
                    if pushed == 1:
                        return ticket
                self._users += 1  # the rest happens outside the gate, counted in (refused: the number is not spent)
        finally:
            gate.release()
        if pushed is None:
            if self.closed:
                raise _closed_error()
            if self._lost is None or isinstance(self._lost, errors.ArbiterRestarted):
                return None  # a new ring (a reattach under way or due): push there
            raise _fresh(self._lost)
        try:
            while pushed == 0:  # make room by reading completions
                if self._lost is not None:
                    raise _fresh(self._lost)
                self._collect(_WAIT_SLICE)  # raises SessionClosed once closed, or the loss
                pushed = push_op(number, opcode, program, gx, gy, gz, len(ids), ids, len(offsets), offsets, push,
                                 len(push))
            if pushed < 0:
                self._refused(pushed)
        except errors.ArbiterRestarted:  # not pushed, and a new arbiter is there: push it there
            ticket.id = 0
            return None
        except BaseException:
            ticket.id = 0  # never recorded: nothing for it to forget
            raise
        finally:
            self._leave()
        return ticket

    def _claim_lane(self, lanes: threading.local):
        """This thread's ``push_op``, on a lane claimed now (counted in: the region stays mapped)."""
        self._enter()
        try:
            push_op = lanes.push_op = self._book.pusher(self._region.producer())
        finally:
            self._leave()
        return push_op

    def _refused(self, code: int) -> None:
        """Raise what a push the ring refused stands for; a closed or corrupt ring is the sticky loss.

        Caller is counted in (the region stays mapped)."""
        if code == -C.EBADSLOT:
            raise errors.InvalidSubmission(_TOO_BIG)
        if code == -errno.ENOMEM:
            raise MemoryError("no memory left for the ticket book's record of this dispatch")
        if code == -C.EPEERDEAD:  # the arbiter closed this session's side of the ring
            raise _fresh(self._record_loss(self._closed_by_arbiter() or errors.ArbiterLost(
                "the arbiter shut down or closed this session; connect again")))
        try:
            self._region.producer().raise_for(code)
        except errors.RingCorrupted as exc:
            self._lost = self._lost or exc
            raise

    # ---------------------------------------------------------------- completion

    def _file(self) -> int:
        """Read every ready completion into the ticket book; return how many were read. A
        cancelled one means the arbiter shut down or ended this session: that is the loss.

        Caller holds _cq_lock and is counted in."""
        self._tell_forgotten()
        try:
            read = self._book.collect(self._region)
        except errors.RingCorrupted as exc:
            self._lost = self._lost or exc
            raise
        self._after_filing()
        return read

    def _after_filing(self) -> None:
        """A cancelled completion filed since the last look means the arbiter ended this session."""
        cancelled = self._book.cancelled()
        if cancelled != self._cancelled:
            self._cancelled = cancelled
            if self._lost is None:
                self._record_loss(self._closed_by_arbiter() or errors.ArbiterLost(
                    "the arbiter shut down or ended this session and cancelled its queued work; connect again"))

    def _tell_forgotten(self) -> None:
        """Tell the ticket book which tickets were dropped unread (Ticket.__del__ lists them)."""
        forgotten = self._forgotten
        if forgotten:
            numbers = []
            while forgotten:
                numbers.append(forgotten.popleft())
            self._book.forget(numbers)

    def _fetch(self, ticket: Ticket) -> bool:
        """Move ``ticket``'s outcome onto it once known (from the ticket book, or the failure a
        reattach or a loss left for it); True once it is settled."""
        if ticket._status is None and ticket._error is None and ticket.id:
            state, status, device_ns = self._book.take(ticket.id)
            if state == _DONE:
                ticket._status, ticket.device_ns = status, device_ns
            elif state == _NONE:
                ticket._error = self._failures.pop(ticket.id, None)
        return ticket._settled()

    def _lose(self, exc: errors.ArbiterLost) -> errors.LibshareError:
        """Record the arbiter's loss, seen by a ring wait, after reading what it posted before it went."""
        self._file()
        return self._record_loss(self._closed_by_arbiter() or errors.ArbiterLost(
            f"the arbiter exited or closed this session: {exc}"))

    def _collect(self, timeout: float, ticket: Ticket | None = None) -> None:
        """One wait step on the ring: read every ready completion and, while ``ticket`` (None: any
        ticket) is pending, wait up to ``timeout`` for the next one; a done ticket's outcome goes onto
        it in the same C call (the ticket book's, in which other threads run). Raises the loss or the
        close."""
        self._enter()
        try:
            lock = self._cq_lock
            if not lock.acquire(False):  # another thread is reading (and watching the arbiter) already
                if ticket is not None and self._fetch(ticket):
                    return  # it read this ticket's completion: no need to wait for its step to end
                if not lock.acquire(timeout=max(timeout, 0.001)):
                    return
            try:
                self._tell_forgotten()
                timeout_ns = int(max(timeout, 0) * 1e9)
                try:
                    if ticket is None:
                        self._book.wait(self._region, 0, timeout_ns)
                    else:
                        state, status, device_ns = self._book.wait_take(self._region, ticket.id, timeout_ns)
                        if state == _DONE:
                            ticket._status, ticket.device_ns = status, device_ns
                except errors.ArbiterLost as exc:
                    raise _fresh(self._lose(exc)) from exc
                except errors.RingCorrupted as exc:
                    self._lost = self._lost or exc
                    raise
                self._after_filing()
            finally:
                lock.release()
        finally:
            self._leave()

    def _poll(self, ticket: Ticket) -> None:
        """done()'s look: read ready completions and check that the arbiter lives, never blocking
        (but to reattach after an arbiter restart, which settles the ticket or resends it)."""
        if isinstance(self._lost, errors.ArbiterRestarted) and not self.closed:
            self._reattach()
        if self._lost is None and not self._fetch(ticket):
            with self._inside() as inside:
                try:
                    if inside and self._cq_lock.acquire(blocking=False):  # else the reader watches the arbiter
                        try:
                            self._file()
                            if not self._fetch(ticket):
                                self._probe(ticket)
                        finally:
                            self._cq_lock.release()
                    if inside and self._lost is None:
                        self._lost = self._closed_by_arbiter()
                except errors.LibshareError:
                    pass  # recorded as the loss: settled below
        self._fetch(ticket)
        self._settle(ticket)

    async def _completion_bell(self) -> None:
        """Wait until the arbiter rings this session's doorbell socket, or one wait slice: how an
        event loop, which must not block in a futex, waits for completions. Returns at once when
        completions are ready (or the session is closed): the caller reads them with done().

        The ring is armed first (LS_NEED_WAKEUP_FD, then a look), so a completion posted after
        the look sends a byte. Each waiting task polls a descriptor of its own (a dup): close()
        may close the session's meanwhile, and an event loop lets one task at a time wait on a
        descriptor. The bytes are read before the next arming, not after a wake-up, so that every
        task woken by one byte looks at the ring; a task that arms after another read the byte its
        completion sent finds the completion read already, or waits out its slice (50 ms)."""
        if isinstance(self._lost, errors.ArbiterRestarted) and not self.closed:
            await anyio.to_thread.run_sync(self._reattach)  # (it may wait for the new arbiter)
            return
        with self._inside() as inside:
            if not inside:
                return
            _read_bell(self._wake_fd)
            if self._region.arm_completions():
                return
            bell = os.dup(self._wake_fd)
        try:
            with anyio.move_on_after(_WAIT_SLICE):
                await anyio.wait_readable(bell)
        finally:
            os.close(bell)

    def _probe(self, ticket: Ticket) -> None:
        """A zero-length wait for ``ticket``: reads what is ready, and notices a dead or closed arbiter."""
        try:
            self._book.wait(self._region, ticket.id, 0, spin_ns=0)
            self._after_filing()
        except errors.ArbiterLost as exc:
            self._lose(exc)

    def _settle(self, ticket: Ticket) -> None:
        """Give an unfinished ticket its sticky failure once its outcome can no longer come."""
        restarting = isinstance(self._lost, errors.ArbiterRestarted) and not self.closed
        if ticket._settled() or restarting:
            return  # (a reattach settles the tickets in flight, or sends them again)
        if self._lost is not None and not isinstance(self._lost, errors.ArbiterRestarted):
            ticket._error = self._lost
        elif self.closed:
            ticket._error = _closed_error(f"ticket {ticket.id}: the session was closed before its completion "
                                          "was read (the work itself still completes at the arbiter)")

    def _wait_ticket(self, ticket: Ticket, deadline: float | None) -> None:
        while True:
            if self._lost is None and not self.closed:  # the common case: wait steps on the ring
                try:  # (a ticket read by another thread's wait is taken from the book by this step)
                    self._collect(_WAIT_SLICE if deadline is None
                                  else min(_WAIT_SLICE, max(deadline - time.monotonic(), 0)), ticket)
                    if ticket._status is None and not self._fetch(ticket):
                        self._check_usable()  # a reason the arbiter left in the ring
                except errors.LibshareError:
                    if self._lost is None and not self.closed:
                        raise
                    continue  # settled below
                if ticket._settled():
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise errors.Timeout(f"ticket {ticket.id} not done after the timeout")
                continue
            if isinstance(self._lost, errors.ArbiterRestarted) and not self.closed:
                self._reattach()  # settles the ticket, or sends it to the new arbiter
                if self._fetch(ticket):
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise errors.Timeout(f"ticket {ticket.id} not done after the timeout (reattaching)")
                continue
            self._fetch(ticket)
            self._settle(ticket)
            return

    def _status_error(self, ticket: Ticket) -> errors.LibshareError:
        """The error a failed ticket's status stands for (the session's sticky one for a fault or cancel)."""
        status = ticket._status
        if -status in (C.ECANCELED, C.EFAULT):
            with self._inside() as inside:
                sticky = self._closed_by_arbiter() if inside else None
            if sticky is not None:
                return sticky
        return _status_error(ticket.id, status)

    def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until every submitted ticket is done; errors stay with their tickets.

        Raises the arbiter's loss (within a wait slice of it, and at once once it is known,
        like every call on the session), SessionClosed or Timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._check_usable()
        while pending := self._book.pending():
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.Timeout(f"{pending} tickets still running after the timeout")
            try:
                self._collect(_WAIT_SLICE)
            except errors.ArbiterRestarted:
                pass  # _check_usable reattaches, which settles or resends what is in flight
            self._check_usable()

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Disconnect; idempotent. Submitted work still completes at the arbiter.

        Threads waiting on this session's tickets wake within a wait slice and raise
        SessionClosed; the ring is unmapped only once no thread is inside it."""
        with self._gate:
            if self.closed:
                return
            self.closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a control request blocked on the arbiter
        except OSError:
            pass
        with self._gone:  # each user leaves within one wait slice; one that does not (this very
            # thread, when close() runs in a finalizer inside a wait) unmaps it on its way out
            self._gone.wait_for(lambda: not self._users, timeout=_CLOSE_WAIT)
            now = not self._users and not self._torn_down
            if now:
                self._torn_down = True
        if now:
            self._tear_down()

    def _tear_down(self) -> None:
        for item in self._objects.values():
            if isinstance(item, Buffer):
                item.close_memfd()
        try:
            self._region.announce_client(alive=False)
        finally:
            with self._request_lock:
                self._sock.close()
            self._region.close()
            os.close(self._wake_fd)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _exchange(sock: socket.socket, fields: dict, payload: bytes = b"", max_fds: int = 0,
              fds: tuple[int, ...] = (), poll: bool = True) -> protocol.Frame:
    """Send one request and read its reply (EOFError or OSError when the arbiter went away); with
    ``poll`` (not for an embedded arbiter, which needs this process's GIL to answer), :func:`_await_reply`."""
    protocol.send(sock, fields, payload, fds)
    if poll:
        _await_reply(sock)
    return protocol.recv(sock, max_fds=max_fds)


def _await_reply(sock: socket.socket) -> None:
    """Poll for a reply for _REPLY_SPIN before ``recv`` sleeps (:func:`protocol.poll_briefly`; one
    thread of the process at a time, the others sleep at once): attach cycles in a loop went from
    0.83-0.90 to 0.75-0.83 ms (two sets of three runs, alternated), the arbiter polling too."""
    if not _polling.acquire(blocking=False):
        return
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        protocol.poll_briefly(poller, _REPLY_SPIN)
    finally:
        _polling.release()


def _read_module(path: Path) -> bytes:
    """The bytes of a .spv file; InvalidSubmission past the most a frame carries (a path such as
    /dev/zero would otherwise be read until this process ran out of memory)."""
    with open(path, "rb") as file:  # read what its size says: a read of the bound allocates the bound (4 MiB)
        size = os.fstat(file.fileno()).st_size  # 0 for a device such as /dev/zero
        code = file.read(min(size, protocol.MAX_FRAME) + 1)
        if len(code) > size:  # a device, or a file that grew: read on, up to the bound
            code += file.read(protocol.MAX_FRAME + 1 - len(code))
    if len(code) > protocol.MAX_FRAME:
        raise errors.InvalidSubmission(f"{path} holds more than {protocol.MAX_FRAME} bytes, more than any "
                                       "SPIR-V module the arbiter takes")
    return code


def _load_timeout(bound) -> float:
    """How long a load_program waits for its answer, given the ``load_timeout`` of a welcome."""
    if isinstance(bound, (int, float)) and not isinstance(bound, bool) and 0 < bound <= _MOST_LOAD_TIMEOUT:
        return max(_LOAD_TIMEOUT, bound + _LOAD_MARGIN)
    return _LOAD_TIMEOUT


def _hello(sock: socket.socket, hello: dict, timeout: float, embedded: bool = False) -> protocol.Frame:
    """Say hello on a connected socket; the welcome, with its ring and doorbell (the caller
    closes the socket when this raises)."""
    sock.settimeout(timeout)
    try:
        welcome = _exchange(sock, hello, max_fds=2, poll=not embedded)
    except (EOFError, OSError) as exc:
        raise errors.ArbiterUnavailable(f"the arbiter did not answer hello: {exc}") from exc
    if not welcome.fields.get("ok"):
        raise errors.remote_error(welcome.fields)
    if len(welcome.fds) != 2:
        welcome.close_fds()
        raise errors.ProtocolError("the arbiter's welcome did not carry the ring and doorbell")
    return welcome


def _close_quietly(sock: socket.socket, region: Region | None, wake_fd: int) -> None:
    """Let go of a lost arbiter's connection, ring and doorbell."""
    sock.close()
    if region is not None:
        try:
            region.announce_client(alive=False)
        finally:
            region.close()
    os.close(wake_fd)


def _read_bell(fd: int) -> None:
    """Read the bytes waiting on a doorbell socket (each datagram is one byte, its wake-up), without blocking."""
    try:
        for _ in range(256):
            os.read(fd, 8)  # non-blocking: set when the session took the socket
    except (BlockingIOError, InterruptedError):
        pass


def _closed_error(message: str = "session is closed: connect again") -> errors.SessionClosed:
    return errors.SessionClosed(message)


def _nbytes(item) -> int:
    return item.size if isinstance(item, Buffer) else item.nbytes


def _groups(groups) -> tuple[int, int, int]:
    """Workgroup counts x, y, z from one to three of them (the missing ones are 1)."""
    if isinstance(groups, int):
        return groups, 1, 1
    groups = tuple(groups)
    if not 1 <= len(groups) <= 3:
        raise errors.InvalidSubmission(f"{_TOO_BIG}: got {len(groups)} group counts")
    return groups + (1,) * (3 - len(groups))


# -------------------------------------------------------------------- connecting

_embedded_lock = threading.Lock()
_embedded_arbiter = None


def _embedded():
    global _embedded_arbiter
    with _embedded_lock:
        if _embedded_arbiter is None:
            from libshare.arbiter import Arbiter

            _embedded_arbiter = Arbiter()
            atexit.register(_embedded_arbiter.close)
        return _embedded_arbiter


def connect(name: str | None = None, priority: str | None = None, mode: str | None = None,
            pipe_directory: str | os.PathLike | None = None, timeout: float = 10.0,
            group: str | None = None, reattach: bool = True) -> Session:
    """Connect to the arbiter at the pipe directory, or run one in this process.

    ``mode``: "auto" (default, or LIBSHARE_MODE) uses a daemon when one answers and
    embeds one otherwise; "daemon" insists on a daemon (ArbiterUnavailable if none);
    "embedded" never looks for one. ``group`` (or LIBSHARE_GROUP) names a group of
    clients whose limits apply to them together. With ``reattach`` (the default) a session
    with a daemon started by the control daemon (``libshare-control -d``) survives that
    arbiter: when it dies or is restarted, the session waits up to ``timeout`` for the new
    one and carries on with the same arrays and programs (work in flight then fails with
    ArbiterRestarted). An embedded arbiter has no second process to fall back on.
    """
    mode = _config.connect_mode(mode)
    hello = {"op": "hello", "name": name or "", "version": protocol.VERSION,
             "priority": str(priority or os.environ.get("LIBSHARE_CLIENT_PRIORITY") or ""),  # "": the default
             "group": group or os.environ.get("LIBSHARE_GROUP") or "",
             "share": os.environ.get("LIBSHARE_ACTIVE_THREAD_PERCENTAGE") or ""}
    if os.environ.get("LIBSHARE_DEVICE_MEM_LIMIT", "").strip():  # may only lower the arbiter's limit
        from libshare.arbiter.policy.limits import parse_device_limits

        hello["mem_limit"] = parse_device_limits(os.environ["LIBSHARE_DEVICE_MEM_LIMIT"])
    sock, embedded, path = None, False, _config.socket_path(_config.pipe_directory(pipe_directory))
    if mode != "embedded":
        sock = protocol.dial(path, timeout)
        if sock is None and mode == "daemon":
            raise errors.ArbiterUnavailable(
                f"no arbiter answers at {path.parent}; start one with `python -m libshare.arbiter` or use "
                "mode='auto'")
    if sock is None:
        sock, far_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        _embedded().attach(far_end)
        embedded = True
    try:
        welcome = _hello(sock, hello, timeout, embedded)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(_REQUEST_TIMEOUT)
    return Session(sock, welcome, embedded, hello, None if embedded or not reattach else path, timeout)


