"""Python face of the ticket book (tickets.c): a session's tickets in flight and their outcomes.

The Python session and the C API keep their tickets in the same C structure, so one design
files completions and answers waits for both: a dispatch records its ticket in the same C call
that pushes it (:meth:`TicketBook.pusher`), a wait sleeps and files in C with the GIL released
(:meth:`TicketBook.wait`), and a waiter takes its outcome out (:meth:`TicketBook.take`).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING

from libshare.ring import _binding
from libshare.ring._binding import C

if TYPE_CHECKING:
    from libshare.ring._lanes import Producer
    from libshare.ring._region import Region

__all__ = ["TicketBook"]


class TicketBook:
    """One session's ticket book. Its memory lives as long as this object: a Ticket that is
    waited after its session closed still finds it (empty)."""

    NONE, PENDING, DONE = C.TICKET_NONE, C.TICKET_PENDING, C.TICKET_DONE
    """A ticket's states: no record (never pushed, taken, forgotten or dropped), in flight, done."""
    MOVED, ORPHAN = C.TICKET_MOVED, C.TICKET_ORPHAN
    """The marks of a pending ticket: the arbiter handed over without running it; forgotten."""

    def __init__(self):
        self._handle = _binding.tickets_new()
        self._cancelled = _binding.tickets_cancelled(self._handle)
        self._reader_out = _binding.outcome()  # wait_take's: only the ring's one reader calls it
        self._local = threading.local()  # .out: take's status and device time, per thread

    def pusher(self, producer: Producer):
        """``ls_tickets_push`` on ``producer``'s lane: called as ``push(ticket, opcode, program, gx, gy,
        gz, nbuffers, ids, noffsets, offsets, push, push_size)``, it encodes the operation (ring.h's
        ``ls_push_op``) and records the ticket pending once pushed; 1, 0 when the lane is full, or a
        negative code (``-ENOMEM``: no room for the record). The caller keeps the producer alive."""
        return functools.partial(_binding.tickets_push, self._handle, producer._handle)

    def add(self, ticket: int) -> None:
        """Record ``ticket`` pending (its descriptor was sent another way)."""
        _binding.tickets_add(self._handle, ticket)

    def collect(self, region: Region) -> int:
        """File every completion ready in ``region``; how many were read. The caller is its one reader."""
        return _binding.tickets_collect(self._handle, region._c())

    def wait(self, region: Region, ticket: int, timeout_ns: int, spin_ns: int = C.SPIN_NS) -> int:
        """One wait step for ``ticket`` (0: any pending ticket), GIL released: collect, then wait up to
        ``timeout_ns`` for the next completion and collect. Its state (PENDING after the timeout);
        raises ArbiterLost or RingCorrupted. The caller is the region's one reader."""
        return _binding.tickets_wait(self._handle, region._c(), ticket, spin_ns, timeout_ns)

    def wait_take(self, region: Region, ticket: int, timeout_ns: int) -> tuple[int, int, int]:
        """:meth:`wait` for ``ticket``, then :meth:`take` it if it is done, in one C call: ``(state,
        status, device_ns)``. The caller is the region's one reader (which this relies on too)."""
        return _binding.tickets_wait_take(self._handle, region._c(), ticket, C.SPIN_NS, timeout_ns,
                                          self._reader_out)

    def take(self, ticket: int) -> tuple[int, int, int]:
        """``(state, status, device_ns)`` of ``ticket``; once DONE its record goes (take it once)."""
        try:  # any thread may take: each has its own
            out = self._local.out
        except AttributeError:
            out = self._local.out = _binding.outcome()
        return _binding.tickets_take(self._handle, ticket, out)

    def forget(self, tickets: list[int]) -> None:
        """Nobody will ask for these tickets: their outcomes are dropped (now, or when they come)."""
        _binding.tickets_forget(self._handle, tickets)

    def settle(self, ticket: int, status: int, device_ns: int = 0) -> bool:
        """File a completion read elsewhere for ``ticket``; False when it was not pending."""
        return _binding.tickets_settle(self._handle, ticket, status, device_ns)

    def drop(self, ticket: int) -> None:
        """Remove ``ticket``'s record, whatever its state."""
        _binding.tickets_drop(self._handle, ticket)

    def in_flight(self) -> dict[int, int]:
        """Every pending ticket, with its marks (MOVED, ORPHAN)."""
        return _binding.tickets_list(self._handle)

    def resent(self) -> None:
        """Clear the MOVED marks: those tickets went to a new arbiter."""
        _binding.tickets_resent(self._handle)

    def pending(self) -> int:
        """How many tickets are pending (forgotten ones included: their completions are still due)."""
        return _binding.tickets_pending(self._handle)

    def cancelled(self) -> int:
        """How many completions came with ``-LS_ECANCELED`` so far (exact for the thread that just
        collected: the ring's one reader)."""
        return self._cancelled[0]

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            _binding.tickets_free(handle)
