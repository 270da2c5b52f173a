"""The submission lanes of a region: one :class:`Producer` per pushing thread, one consumer.

A client thread claims a lane once (:meth:`Lanes.producer`) and pushes through it
without a lock; the consumer (the arbiter's engine, in C, or a test or the demo
here) pops what every lane published, each slot copied out and range-checked
(see lanes.c). After a hand-over the client reads its own lanes back
(:meth:`Lanes.unconsumed_tickets`, :meth:`Lanes.descriptors_of`) to send the
work the old consumer never took to the new one.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from libshare import errors
from libshare.ring import _binding
from libshare.ring._binding import C, DESC_DTYPE, check

if TYPE_CHECKING:
    from libshare.ring._region import Region

__all__ = ["Lanes", "Producer"]


def _ns(seconds: float | None) -> int:
    return -1 if seconds is None else max(0, int(seconds * 1e9))


class Lanes:
    """The submission lanes of ``region``: ``region.lanes``."""

    def __init__(self, region: Region):
        self._region = region
        self._local = threading.local()  # .producer: this thread's

    # ---------------------------------------------------------------- producers (client threads)

    def producer(self) -> Producer:
        """This thread's producer: claims a lane on first use and keeps it for the thread's life."""
        producer = getattr(self._local, "producer", None)
        if producer is None or producer.lane is None:
            producer = Producer(self._region)
            self._local.producer = producer
        return producer

    def push(self, descs, timeout: float | None = None) -> None:
        """Push every descriptor (bytes or DESC_DTYPE array) from this thread's lane."""
        self.producer().push(descs, timeout)

    # ---------------------------------------------------------------- the consumer

    def pending(self) -> int:
        """Descriptors published and not yet popped, over all lanes."""
        return _binding.sq_pending(self._region._c())

    def pop_into(self, out: np.ndarray, out_ptr=None) -> int:
        """Pop up to ``len(out)`` descriptors into ``out`` (a DESC_DTYPE array); return how many.

        A slot whose fields failed the ring's range checks arrives with opcode
        ``OP_BAD``. Pass ``out_ptr`` (a C pointer to ``out``, made once) to skip
        making it on every call.
        """
        handle = self._region._c()
        return _binding.sq_pop(handle, out_ptr if out_ptr is not None else _binding.pointer(out), len(out))

    def pop(self, max_count: int = 256) -> np.ndarray:
        """Pop up to ``max_count`` descriptors into a new DESC_DTYPE array."""
        out = np.empty(max_count, DESC_DTYPE)
        return out[: self.pop_into(out)]

    def wait(self, timeout: float | None = None, spin: float = C.SPIN_NS / 1e9) -> int:
        """Block until descriptors are pending; return how many. Raises Timeout or ArbiterLost."""
        return _binding.sq_wait(self._region._c(), int(spin * 1e9), _ns(timeout))

    def arm(self) -> int:
        """Ask producers to ring before the caller sleeps elsewhere (epoll); return pending count.

        A positive result means entries arrived meanwhile: call :meth:`disarm` and drain
        instead of sleeping.
        """
        return _binding.sq_arm(self._region._c())

    def disarm(self) -> None:
        """Clear the wake-up request set by :meth:`arm` (the consumer is awake again)."""
        _binding.sq_disarm(self._region._c())

    # ---------------------------------------------------------------- after a hand-over (client side)

    def _slots(self):
        """(tail, head, the lane's slots as a DESC_DTYPE view) for each lane."""
        region = self._region
        view = region._map
        for tail_at, head_at, slots_at in _binding.lane_offsets(region._c(), region.lane_count):
            tail, = np.frombuffer(view, np.uint32, 1, tail_at)
            head, = np.frombuffer(view, np.uint32, 1, head_at)
            yield int(tail), int(head), np.frombuffer(view, DESC_DTYPE, region.lane_entries, slots_at)

    def unconsumed_tickets(self) -> set[int]:
        """The tickets of the descriptors published in the lanes that the consumer has not taken."""
        tickets = set()
        entries = self._region.lane_entries
        mask = entries - 1
        for tail, head, slots in self._slots():
            waiting = (tail - head) & 0xFFFFFFFF
            for position in range(head, head + min(waiting, entries)):
                tickets.add(int(slots[position & mask]["ticket"]))
        return tickets

    def descriptors_of(self, tickets: set[int]) -> np.ndarray:
        """Copies of the descriptors in the lanes whose ticket is in ``tickets``, in ticket order:
        the producer's own writes, read back to send them to a new consumer after a hand-over
        (they stay in their slots until this producer reuses them)."""
        wanted = np.fromiter(tickets, np.uint64, len(tickets))
        found = [slots[np.isin(slots["ticket"], wanted)] for _, _, slots in self._slots()]
        descs = np.concatenate(found) if found else np.empty(0, DESC_DTYPE)
        _, first = np.unique(descs["ticket"], return_index=True)  # one copy each, in ticket order
        return descs[first].copy()


class Producer:
    """One thread's lane in a region's submission ring (single producer, lock-free)."""

    def __init__(self, region: Region):
        self._region = region
        self._handle = _binding.producer_open(region._c(), threading.get_native_id(), os.getpid())
        self._push = _binding.push
        self.lane: int | None = _binding.producer_lane(self._handle)
        """The lane index this producer owns, None after release."""
        self.push_op = functools.partial(_binding.push_op, self._handle)
        """ring.h's ``ls_push_op`` on this lane, the client's one descriptor encoder: called as
        ``push_op(ticket, opcode, program, gx, gy, gz, nbuffers, ids, noffsets, offsets, push,
        push_size)`` (``ids`` and ``offsets`` sequences of ints, ``push`` bytes), it writes the slot
        in C and returns 1, 0 when the lane is full, or a negative code for :meth:`raise_for`.
        The caller keeps this producer (and its region) alive and unreleased while it calls it."""

    def try_push(self, descs) -> int:
        """Push as many descriptors as fit without waiting; return how many were pushed.

        ``descs`` is bytes (a multiple of 256) or a C-contiguous DESC_DTYPE array.
        """
        if type(descs) is bytes and not len(descs) & 255:
            n = self._push(self._handle, descs, len(descs) >> 8)
        else:
            source, count = _binding.entries(descs, DESC_DTYPE)
            n = self._push(self._handle, source, count)
        return n if n >= 0 else check(n, self._region._c(), "push")

    def push(self, descs, timeout: float | None = None) -> None:
        """Push every descriptor, waiting for space up to ``timeout`` seconds (None: forever)."""
        source, count = _binding.entries(descs, DESC_DTYPE)
        pushed = check(self._push(self._handle, source, count), self._region._c(), "push")
        if pushed < count:
            self._push_rest(source, count, pushed, timeout)

    def _push_rest(self, source, count: int, pushed: int, timeout: float | None) -> None:
        view = _binding.pointer(source) if isinstance(source, bytes) else source
        deadline = None if timeout is None else time.monotonic() + timeout
        while pushed < count:
            if deadline is not None and time.monotonic() > deadline:
                raise errors.RingFull(f"push: lane {self.lane} stayed full for {timeout} s "
                                      f"({pushed} of {count} descriptors pushed)")
            os.sched_yield()
            rest = view + pushed * C.DESC_SIZE
            pushed += check(self._push(self._handle, rest, count - pushed), self._region._c(), "push")

    def raise_for(self, rc: int) -> None:
        """Raise the error a negative :attr:`push_op` result stands for."""
        check(rc, self._region._c(), "push")

    def space(self) -> int:
        """Free slots in this lane."""
        return _binding.lane_space(self._handle, self._region._c())

    def release(self) -> None:
        """Give the lane back so another thread may claim it. Idempotent."""
        if self.lane is not None and not self._region.closed:
            _binding.producer_close(self._handle)
        self.lane = None

    def __del__(self):
        if getattr(self, "lane", None) is not None:
            self.release()
