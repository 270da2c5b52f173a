"""Tickets and waiting: a session's completions, from the ring to each Ticket.

A session keeps its tickets in flight in the ring's ticket book (ring/tickets.c, the one
bindings/c keeps for a C session): the push and the ticket's record are one C call
(``ls_tickets_push``, submit.py). Completions come back on the completion ring; whichever
thread waits pops them all into the book in C, and each ticket takes its outcome from there, so
tickets may be waited in any order, from any thread, or awaited under anyio. A thread waits in C
with the GIL released (a short spin, then the completion ring's futex); an ``await`` waits in its
event loop on the session's doorbell socket, on which the arbiter sends a byte when the ring was
armed for it (LS_NEED_WAKEUP_FD), so awaiting starts no thread. A failed ticket's status becomes
its exception through the error table (libshare/errors.py).

Tickets tell the truth. A ticket's outcome lives on the Ticket itself and is sticky: once known
(the arbiter's status, the arbiter's loss, or the session's close), every later ``wait``,
``done`` and ``await`` gives the same answer. The book keeps a ticket's record while its work is
in flight and then its outcome until the Ticket takes it; a Ticket dropped unread lists its
number (``Ticket.__del__``, a deque append), and the next read of the completion ring tells the
book to forget it, so a completion nobody will ask for is dropped and pipelining without waiting
holds no memory per dispatch. A reattach or a loss that fails tickets takes them out of the book
and leaves each failure in ``Completions.failures`` for its Ticket.

Every way of asking sees the arbiter's death within one wait slice (50 ms): a blocking wait
sleeps on the completion ring in slices and the ring checks the arbiter's pidfd (or, embedded,
its state word) between them; ``done()`` never blocks, so it takes a zero-length look that makes
the same check. Once the loss is known it is sticky for the session: every unfinished ticket
fails with it, and ``dispatch()`` raises it at once. A cancelled completion (the arbiter shut
down or terminated this client) counts as that loss too. Under a control daemon a plain loss is
an ArbiterRestarted instead, and the next wait reattaches (reattach.py), which settles every
ticket in flight or sends it to the new arbiter; the Completions reach the session's Reattacher
through ``restarts``, given to them by the session.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import TYPE_CHECKING

import anyio

from libshare import errors
from libshare.client.gate import WAIT_SLICE, Gate, closed_error, fresh
from libshare.ring import C, TicketBook
from libshare.ring._binding import code_error

if TYPE_CHECKING:
    from libshare.client.reattach import Reattacher

__all__ = ["Ticket", "Completions"]

_NONE, _DONE, _ORPHAN = TicketBook.NONE, TicketBook.DONE, TicketBook.ORPHAN


class Ticket:
    """A submitted dispatch or copy; ``wait()``, ``done()`` or ``await`` it.

    Its outcome is sticky: once known, every ``wait()`` returns or raises the same.
    """

    __slots__ = ("_completions", "id", "device_ns", "_status", "_error")

    def __init__(self, completions: Completions, ticket_id: int):
        self._completions = completions
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
            self._completions.poll(self)
        return self._settled()

    def wait(self, timeout: float | None = None) -> Ticket:
        """Block until done; raise Timeout past ``timeout`` seconds, or the work's error (every time)."""
        if not self._settled():
            deadline = None if timeout is None else time.monotonic() + timeout
            self._completions.wait_ticket(self, deadline)
        if self._status and self._error is None:
            self._error = self._completions.status_error(self)
        if self._error is not None:
            raise fresh(self._error)
        return self

    def __await__(self):
        return self._wait_async().__await__()

    async def _wait_async(self) -> Ticket:
        # done() reads what is ready and notices a lost arbiter or a closed session; between looks
        # the task waits on the session's doorbell socket, never in a thread (see Completions.bell).
        while not self.done():
            await self._completions.bell()
        return self.wait(0)

    def __repr__(self) -> str:
        return f"<libshare.Ticket {self.id}>"

    def __del__(self):
        # Nobody can ask for this outcome any more: the session's ticket book drops it (a list
        # append here; the book is told on the next read of the completion ring).
        if self._status is None and self._error is None and self.id:
            completions = self._completions
            completions.forgotten.append(self.id)
            completions.failures.pop(self.id, None)


class Completions:
    """A session's tickets in flight and the waits for them: the ticket book, read from the ring."""

    def __init__(self, gate: Gate):
        self.gate = gate
        self.book = TicketBook()
        """The tickets in flight and their outcomes, in C (ring/tickets.c)."""
        self.forgotten: collections.deque[int] = collections.deque()  # tickets dropped unread: for the book
        self.failures: dict[int, errors.LibshareError] = {}  # ticket -> what it failed with, off the book
        self.cancelled = 0  # the book's count of cancelled completions, as last seen
        self.lock = threading.Lock()  # held by the completion ring's one reader
        self.restarts: Reattacher | None = None
        """The session's Reattacher: records a loss, and reattaches after an arbiter restart."""

    # ---------------------------------------------------------------- reading the ring

    def file(self) -> int:
        """Read every ready completion into the ticket book; return how many were read. A
        cancelled one means the arbiter shut down or ended this session: that is the loss.

        Caller holds the lock (or is the only thread in the region) and is counted in."""
        self.tell_forgotten()
        try:
            read = self.book.collect(self.gate.attached.region)
        except errors.RingCorrupted as exc:
            self.gate.lost = self.gate.lost or exc
            raise
        self.after_filing()
        return read

    def after_filing(self) -> None:
        """A cancelled completion filed since the last look means the arbiter ended this session."""
        cancelled = self.book.cancelled()
        if cancelled != self.cancelled:
            self.cancelled = cancelled
            if self.gate.lost is None:
                self.restarts.record_loss(self.gate.attached.closed_by_arbiter() or errors.ArbiterLost(
                    "the arbiter shut down or ended this session and cancelled its queued work; connect again"))

    def tell_forgotten(self) -> None:
        """Tell the ticket book which tickets were dropped unread (Ticket.__del__ lists them)."""
        forgotten = self.forgotten
        if forgotten:
            numbers = []
            while forgotten:
                numbers.append(forgotten.popleft())
            self.book.forget(numbers)

    def fetch(self, ticket: Ticket) -> bool:
        """Move ``ticket``'s outcome onto it once known (from the ticket book, or the failure a
        reattach or a loss left for it); True once it is settled."""
        if ticket._status is None and ticket._error is None and ticket.id:
            state, status, device_ns = self.book.take(ticket.id)
            if state == _DONE:
                ticket._status, ticket.device_ns = status, device_ns
            elif state == _NONE:
                ticket._error = self.failures.pop(ticket.id, None)
        return ticket._settled()

    def fail_in_flight(self, error: errors.LibshareError, numbers=None) -> None:
        """Fail the tickets in flight (those of ``numbers``, or all) with ``error``: they leave the
        ticket book, and the failure waits in ``failures`` for their Ticket (unless it was dropped)."""
        self.tell_forgotten()
        with self.gate.lock:
            in_flight = self.book.in_flight()
            for number in in_flight if numbers is None else set(numbers) & in_flight.keys():
                self.book.drop(number)
                if not in_flight[number] & _ORPHAN:
                    self.failures[number] = error

    def lose(self, exc: errors.ArbiterLost) -> errors.LibshareError:
        """Record the arbiter's loss, seen by a ring wait, after reading what it posted before it went."""
        self.file()
        return self.restarts.record_loss(self.gate.attached.closed_by_arbiter() or errors.ArbiterLost(
            f"the arbiter exited or closed this session: {exc}"))

    # ---------------------------------------------------------------- waiting

    def collect(self, timeout: float, ticket: Ticket | None = None) -> None:
        """One wait step on the ring: read every ready completion and, while ``ticket`` (None: any
        ticket) is pending, wait up to ``timeout`` for the next one; a done ticket's outcome goes onto
        it in the same C call (the ticket book's, in which other threads run). Raises the loss or the
        close."""
        gate = self.gate
        gate.enter()
        try:
            lock = self.lock
            if not lock.acquire(False):  # another thread is reading (and watching the arbiter) already
                if ticket is not None and self.fetch(ticket):
                    return  # it read this ticket's completion: no need to wait for its step to end
                if not lock.acquire(timeout=max(timeout, 0.001)):
                    return
            try:
                self.tell_forgotten()
                timeout_ns = int(max(timeout, 0) * 1e9)
                region = gate.attached.region
                try:
                    if ticket is None:
                        self.book.wait(region, 0, timeout_ns)
                    else:
                        state, status, device_ns = self.book.wait_take(region, ticket.id, timeout_ns)
                        if state == _DONE:
                            ticket._status, ticket.device_ns = status, device_ns
                except errors.ArbiterLost as exc:
                    raise fresh(self.lose(exc)) from exc
                except errors.RingCorrupted as exc:
                    gate.lost = gate.lost or exc
                    raise
                self.after_filing()
            finally:
                lock.release()
        finally:
            gate.leave()

    def poll(self, ticket: Ticket) -> None:
        """done()'s look: read ready completions and check that the arbiter lives, never blocking
        (but to reattach after an arbiter restart, which settles the ticket or resends it)."""
        gate = self.gate
        if isinstance(gate.lost, errors.ArbiterRestarted) and not gate.closed:
            self.restarts.reattach()
        if gate.lost is None and not self.fetch(ticket):
            with gate.inside() as inside:
                try:
                    if inside and self.lock.acquire(blocking=False):  # else the reader watches the arbiter
                        try:
                            self.file()
                            if not self.fetch(ticket):
                                self.probe(ticket)
                        finally:
                            self.lock.release()
                    if inside and gate.lost is None:
                        gate.lost = gate.attached.closed_by_arbiter()
                except errors.LibshareError:
                    pass  # recorded as the loss: settled below
        self.fetch(ticket)
        self.settle(ticket)

    def probe(self, ticket: Ticket) -> None:
        """A zero-length wait for ``ticket``: reads what is ready, and notices a dead or closed arbiter."""
        try:
            self.book.wait(self.gate.attached.region, ticket.id, 0, spin_ns=0)
            self.after_filing()
        except errors.ArbiterLost as exc:
            self.lose(exc)

    async def bell(self) -> None:
        """Wait until the arbiter rings the session's doorbell socket, or one wait slice: how an
        event loop, which must not block in a futex, waits for completions. Returns at once when
        completions are ready (or the session is closed): the caller reads them with done().

        The ring is armed first (LS_NEED_WAKEUP_FD, then a look), so a completion posted after
        the look sends a byte. Each waiting task polls a descriptor of its own (a dup): close()
        may close the session's meanwhile, and an event loop lets one task at a time wait on a
        descriptor. The bytes are read before the next arming, not after a wake-up, so that every
        task woken by one byte looks at the ring; a task that arms after another read the byte its
        completion sent finds the completion read already, or waits out its slice (50 ms)."""
        gate = self.gate
        if isinstance(gate.lost, errors.ArbiterRestarted) and not gate.closed:
            await anyio.to_thread.run_sync(self.restarts.reattach)  # (it may wait for the new arbiter)
            return
        with gate.inside() as inside:
            if not inside:
                return
            _read_bell(gate.attached.wake_fd)
            if gate.attached.region.completions.arm():
                return
            bell = os.dup(gate.attached.wake_fd)
        try:
            with anyio.move_on_after(WAIT_SLICE):
                await anyio.wait_readable(bell)
        finally:
            os.close(bell)

    def settle(self, ticket: Ticket) -> None:
        """Give an unfinished ticket its sticky failure once its outcome can no longer come."""
        gate = self.gate
        restarting = isinstance(gate.lost, errors.ArbiterRestarted) and not gate.closed
        if ticket._settled() or restarting:
            return  # (a reattach settles the tickets in flight, or sends them again)
        if gate.lost is not None and not isinstance(gate.lost, errors.ArbiterRestarted):
            ticket._error = gate.lost
        elif gate.closed:
            ticket._error = closed_error(f"ticket {ticket.id}: the session was closed before its completion "
                                         "was read (the work itself still completes at the arbiter)")

    def wait_ticket(self, ticket: Ticket, deadline: float | None) -> None:
        """Wait until ``ticket`` is settled (Timeout past ``deadline``, a time.monotonic() value)."""
        gate = self.gate
        while True:
            if gate.lost is None and not gate.closed:  # the common case: wait steps on the ring
                try:  # (a ticket read by another thread's wait is taken from the book by this step)
                    self.collect(WAIT_SLICE if deadline is None
                                 else min(WAIT_SLICE, max(deadline - time.monotonic(), 0)), ticket)
                    if ticket._status is None and not self.fetch(ticket):
                        self.restarts.check_usable()  # a reason the arbiter left in the ring
                except errors.LibshareError:
                    if gate.lost is None and not gate.closed:
                        raise
                    continue  # settled below
                if ticket._settled():
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise errors.Timeout(f"ticket {ticket.id} not done after the timeout")
                continue
            if isinstance(gate.lost, errors.ArbiterRestarted) and not gate.closed:
                self.restarts.reattach()  # settles the ticket, or sends it to the new arbiter
                if self.fetch(ticket):
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise errors.Timeout(f"ticket {ticket.id} not done after the timeout (reattaching)")
                continue
            self.fetch(ticket)
            self.settle(ticket)
            return

    def status_error(self, ticket: Ticket) -> errors.LibshareError:
        """The error a failed ticket's status stands for (the session's sticky one for a fault or cancel)."""
        status = ticket._status
        if -status in (C.ECANCELED, C.EFAULT):
            with self.gate.inside() as inside:
                sticky = self.gate.attached.closed_by_arbiter() if inside else None
            if sticky is not None:
                return sticky
        return code_error(-status, f"ticket {ticket.id}", unknown=errors.InvalidSubmission)

    def wait_idle(self, timeout: float | None) -> None:
        """Wait until every ticket in flight is done (Session.wait_idle)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.restarts.check_usable()
        while pending := self.book.pending():
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.Timeout(f"{pending} tickets still running after the timeout")
            try:
                self.collect(WAIT_SLICE)
            except errors.ArbiterRestarted:
                pass  # check_usable reattaches, which settles or resends what is in flight
            self.restarts.check_usable()


def _read_bell(fd: int) -> None:
    """Read the bytes waiting on a doorbell socket (each datagram is one byte, its wake-up), without blocking."""
    try:
        for _ in range(256):
            os.read(fd, 8)  # non-blocking: set when the session took the socket
    except (BlockingIOError, InterruptedError):
        pass
