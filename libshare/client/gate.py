"""A session's gate: who is inside its ring now, and whether the session is closed, lost or moving.

The :class:`Gate` is the state a session's parts share (completions.py, reattach.py, submit.py
and the Session itself): the current attachment (attachment.py), the count of threads using
its mapped ring, whether the session is closed, the sticky loss, whether a reattach is moving
it to a new ring, the ticket counter and each thread's lane. Its lock guards them.

Closing never pulls the ring from under a thread. A dispatch pushes while it holds the gate's
lock (one lock round trip: its number, the check that the session is open, the push); every
other use of the mapped region (a wait, a dispatch waiting for room in a full lane) counts
itself in and out under that lock (:meth:`Gate.enter`, :meth:`Gate.leave`); :meth:`Gate.close`
marks the session closed, shuts the socket (waking a control request), then waits for the count
to drop to zero before the session is torn down. Whichever thread brings it to zero tears down,
so a close from inside a wait (a finalizer, say) cannot deadlock: after CLOSE_WAIT it returns and
leaves the tear-down to that thread, on its way out. A thread asleep on the ring wakes within
one wait slice, sees the close, and fails its ticket with ``SessionClosed``. A reattach stops
entries the same way (:meth:`Gate.stop_entries`): threads wait at ``enter`` until it resumes them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Callable

from libshare import errors
from libshare.client.attachment import Attachment

__all__ = ["Gate", "CLOSE_WAIT", "WAIT_SLICE", "fresh", "closed_error"]

CLOSE_WAIT = 2.0
"""Seconds close() (and a reattach) waits for threads inside the ring before leaving the unmap to them."""
WAIT_SLICE = 0.05
"""Seconds per completion wait, between checks that the arbiter lives and the session is open."""


def fresh(error: errors.LibshareError) -> errors.LibshareError:
    """A new instance of a sticky error, so that raising it again does not grow one traceback for ever."""
    return type(error)(*error.args)


def closed_error(message: str = "session is closed: connect again") -> errors.SessionClosed:
    """What a call on a closed session raises."""
    return errors.SessionClosed(message)


class Gate:
    """The state a session's parts share, and the count of threads inside its ring."""

    __slots__ = ("lock", "gone", "users", "torn_down", "moving", "closed", "lost", "attached", "lanes",
                 "next_ticket", "_tear_down")

    def __init__(self, attached: Attachment, tear_down: Callable[[], None]):
        self.lock = threading.Lock()
        """Guards every field; a dispatch numbers, checks and pushes under it."""
        self.gone = threading.Condition(self.lock)  # close() and a reattach wait on it for the users to leave
        self.users = 0  # threads inside the mapped region now: it is unmapped only when none is
        self.torn_down = False
        self.moving = False  # a reattach swaps the region: nobody enters meanwhile
        self.closed = False
        self.lost: errors.LibshareError | None = None
        """Sticky (until a reattach): the arbiter is gone or ended this session."""
        self.attached = attached
        """The arbiter's socket, ring and doorbell: replaced by a reattach while nobody is inside."""
        self.lanes = threading.local()  # .push_op: ls_push_op on this thread's lane, claimed on its first push
        self.next_ticket = 1
        self._tear_down = tear_down  # run once, by the last thread out of a closed session

    # enter and leave run on every wait step: the lock is taken with acquire and release, not with
    # ``with`` (whose two method lookups and calls cost 170 ns of a step's 2 us).

    def enter(self) -> None:
        """Count this thread in as a user of the mapped region; SessionClosed once closed."""
        lock = self.lock
        lock.acquire()
        try:
            while self.moving and not self.closed:
                self.gone.wait()
            if self.closed:
                raise closed_error()
            self.users += 1
        finally:
            lock.release()

    def leave(self) -> None:
        """Count this thread out; the last one out of a closed session tears it down."""
        lock = self.lock
        lock.acquire()
        try:
            self.users -= 1
            if not (self.closed or self.moving):
                return  # the common case
            last = self.closed and not self.users and not self.torn_down
            if last:
                self.torn_down = True
            self.gone.notify_all()
        finally:
            lock.release()
        if last:
            self._tear_down()

    @contextlib.contextmanager
    def inside(self):
        """Counted in for the block, which is told True; told False (and not counted) once closed."""
        try:
            self.enter()
        except errors.SessionClosed:
            yield False
            return
        try:
            yield True
        finally:
            self.leave()

    def wait_out(self) -> bool:
        """Wait up to CLOSE_WAIT for the threads inside to leave; True once none is."""
        with self.gone:
            return self.gone.wait_for(lambda: not self.users, timeout=CLOSE_WAIT)

    def stop_entries(self) -> bool:
        """Let nobody enter from now on (a reattach); True once the threads inside left (CLOSE_WAIT at most)."""
        with self.lock:
            self.moving = True
            return self.gone.wait_for(lambda: not self.users, timeout=CLOSE_WAIT)

    def resume(self) -> None:
        """Let threads enter again, after :meth:`stop_entries`."""
        with self.lock:
            self.moving = False
            self.gone.notify_all()

    def close(self) -> None:
        """Mark the session closed and wake its threads; tear it down once none is inside. Idempotent."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        try:
            self.attached.sock.shutdown(socket.SHUT_RDWR)  # wakes a control request blocked on the arbiter
        except OSError:
            pass
        with self.gone:  # each user leaves within one wait slice; one that does not (this very
            # thread, when close() runs in a finalizer inside a wait) tears down on its way out
            self.gone.wait_for(lambda: not self.users, timeout=CLOSE_WAIT)
            now = not self.users and not self.torn_down
            if now:
                self.torn_down = True
        if now:
            self._tear_down()
