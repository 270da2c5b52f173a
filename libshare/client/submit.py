"""Submission: numbering a dispatch or copy and writing it into this thread's lane of the ring.

``dispatch`` and ``copy`` (session.py) hand their operation to the ring's C encoder
(``ls_push_op``, the one bindings/c calls too) through the ticket book (``ls_tickets_push``),
which checks it, writes it straight into the calling thread's lane and records its ticket in
one C call; the Ticket comes back at once. Ticket numbers come from one counter under the
gate's lock, so threads never share one, and an operation the encoder refuses spends none (its
Ticket, numbered 0, forgets nothing). A refusal becomes its exception through the error table;
the encoder's refusal to push into a ring whose arbiter side is closed is the session's loss
(a dispatch notices a shutdown, a termination or a fault by itself). After an arbiter restart a
push waits for the reattach and is made on the new ring.

Binding an array to a buffer walks its ``.base`` chain; the :class:`Submitter` remembers each
live array's buffer id and offset (``seen``) until its buffer is freed or the session reattaches.
"""

from __future__ import annotations

import errno
import threading
import weakref

import numpy as np

from libshare import errors
from libshare.client.buffers import TOO_BIG, Buffer, TexelView, find_buffer
from libshare.client.completions import Completions, Ticket
from libshare.client.gate import WAIT_SLICE, Gate, closed_error, fresh
from libshare.client.reattach import TRIES, Reattacher
from libshare.ring import C
from libshare.ring._binding import code_error

__all__ = ["Submitter"]

SEEN_ARRAYS = 1024
"""Arrays whose binding a session remembers."""


class Submitter:
    """A session's pushes: numbering, the lanes, and the bindings of arrays to buffers."""

    def __init__(self, gate: Gate, completions: Completions, restarts: Reattacher, seen: dict,
                 by_mapping: dict[int, Buffer]):
        self.gate, self.completions, self.restarts = gate, completions, restarts
        self.seen: dict[int, tuple[weakref.ref, int, int]] = seen  # id(item) -> (the item, buffer id, offset)
        self.by_mapping = by_mapping  # id(mapping) -> its shared Buffer

    def binding(self, item: Buffer | np.ndarray | TexelView) -> tuple[weakref.ref, int, int]:
        """(a weak reference to ``item``, the buffer or view id it binds, the byte offset it binds from: 0 for a
        view, which has its own range),
        remembered per live item until its buffer is freed (walking an array's ``.base`` chain is
        most of what binding costs)."""
        known = self.seen.get(id(item))
        if known is not None and known[0]() is item:
            return known
        if isinstance(item, (Buffer, TexelView)):
            buffer, offset = item, 0
        else:
            buffer, offset = find_buffer(item, self.by_mapping)
        if buffer.lost is not None:
            raise fresh(buffer.lost)
        if len(self.seen) >= SEEN_ARRAYS:
            self.seen.clear()
        known = self.seen[id(item)] = (weakref.ref(item), buffer.id, offset)
        return known

    def submit(self, opcode: int, program: int, gx: int, gy: int, gz: int, ids: list, offsets: list,
               push: bytes) -> Ticket:
        """Number the operation and hand it to the ring's C encoder (ls_push_op) on this thread's lane;
        after an arbiter restart, reattach first (twice at most, then the loss is raised). (dispatch()
        tries one :meth:`push` itself before it calls this.)"""
        for _ in range(TRIES):
            ticket = self.push(opcode, program, gx, gy, gz, ids, offsets, push)
            if ticket is not None:
                return ticket
            self.restarts.reattach()
        raise fresh(self.gate.lost) if self.gate.lost is not None else closed_error()

    def push(self, opcode: int, program: int, gx: int, gy: int, gz: int, ids: list, offsets: list,
             push: bytes) -> Ticket | None:
        """The ticket of the pushed operation, or None when a reattach must come first."""
        gate = self.gate
        lanes = gate.lanes
        try:
            push_op = lanes.push_op
        except AttributeError:
            push_op = self.claim_lane(lanes)
        # Made before the lock: an allocation may start a garbage collection, and a finalizer it
        # runs may close this session, which takes the lock (not re-entrant).
        ticket = Ticket(self.completions, 0)
        lock = gate.lock
        lock.acquire()  # the number, the check that the session is open and the push: one lock round trip
        try:
            if gate.closed or gate.lost is not None or lanes is not gate.lanes:
                pushed = None
            else:
                number = gate.next_ticket
                try:  # pushed and recorded in the ticket book in one C call (its completion may come at once)
                    pushed = push_op(number, opcode, program, gx, gy, gz, len(ids), ids, len(offsets), offsets,
                                     push, len(push))
                except OverflowError:  # cffi: a count, id or offset beyond its C type
                    pushed = -C.EBADSLOT
                if pushed >= 0:  # pushed, or the lane is full: the number is spent
                    gate.next_ticket = number + 1
                    ticket.id = number
                    if pushed == 1:
                        return ticket
                gate.users += 1  # the rest happens outside the lock, counted in (refused: the number is not spent)
        finally:
            lock.release()
        if pushed is None:
            if gate.closed:
                raise closed_error()
            if gate.lost is None or isinstance(gate.lost, errors.ArbiterRestarted):
                return None  # a new ring (a reattach under way or due): push there
            raise fresh(gate.lost)
        try:
            while pushed == 0:  # make room by reading completions
                if gate.lost is not None:
                    raise fresh(gate.lost)
                self.completions.collect(WAIT_SLICE)  # raises SessionClosed once closed, or the loss
                pushed = push_op(number, opcode, program, gx, gy, gz, len(ids), ids, len(offsets), offsets, push,
                                 len(push))
            if pushed < 0:
                self.refused(pushed)
        except errors.ArbiterRestarted:  # not pushed, and a new arbiter is there: push it there
            ticket.id = 0
            return None
        except BaseException:
            ticket.id = 0  # never recorded: nothing for it to forget
            raise
        finally:
            gate.leave()
        return ticket

    def claim_lane(self, lanes: threading.local):
        """This thread's ``push_op``, on a lane claimed now (counted in: the region stays mapped)."""
        gate = self.gate
        gate.enter()
        try:
            push_op = lanes.push_op = self.completions.book.pusher(gate.attached.region.lanes.producer())
        finally:
            gate.leave()
        return push_op

    def refused(self, code: int) -> None:
        """Raise what a push the ring refused stands for; a closed or corrupt ring is the sticky loss.

        Caller is counted in (the region stays mapped)."""
        gate = self.gate
        if code == -C.EBADSLOT:
            raise code_error(C.EBADSLOT, "operation refused", TOO_BIG)
        if code == -errno.ENOMEM:
            raise MemoryError("no memory left for the ticket book's record of this dispatch")
        if code == -C.EPEERDEAD:  # the arbiter closed this session's side of the ring
            raise fresh(self.restarts.record_loss(gate.attached.closed_by_arbiter() or code_error(
                C.EPEERDEAD, "push")))
        try:
            gate.attached.region.lanes.producer().raise_for(code)
        except errors.RingCorrupted as exc:
            gate.lost = gate.lost or exc
            raise
