"""What a session holds of the arbiter it is attached to: the control socket, and the ring and
doorbell its welcome carried, with the facts the welcome said.

A session takes one :class:`Attachment` when it connects and a new one each time it reattaches
(reattach.py); its gate (gate.py) holds the current one. Why the arbiter closed the ring (the
close reason it writes there when it ends a session) becomes an exception here,
:meth:`Attachment.closed_by_arbiter`, through the error table (libshare/errors.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from libshare import errors
from libshare.protocol import wire as protocol
from libshare.ring import C, Region

__all__ = ["Attachment", "Moved", "LOAD_TIMEOUT", "LOAD_MARGIN", "load_timeout"]

# How a session's waits spin before they sleep, by its priority (see ring_wait_for in ring/wake.c): a
# realtime one keeps its core (a yield could give it to a busy thread for a whole time slice) and
# spins only while its waits end within the spin; a low one sleeps at once (background work does
# not poll for the cores others need); the others spin longer, yielding the core at each look.
_SPIN_MODES = {"realtime": C.SPIN_KEEP, "low": C.SPIN_NONE}

LOAD_TIMEOUT = 300.0
"""Seconds a load_program waits for its answer, unless the arbiter's welcome names a longer bound (its
``load_timeout``, plus LOAD_MARGIN). A daemon vets a new module in a compiler process first: it may wait
for one to be free and to start, then for its time limit (LIBSHARE_COMPILE_TIMEOUT), twice if the first
process dies, which can take longer than any other request; a session that gave up at the request bound
would take a live arbiter for lost."""
LOAD_MARGIN = 30.0
_MOST_LOAD_TIMEOUT = 1e6  # a welcome's load_timeout past this (or not a number) is not believed

# Why an arbiter closes a session's ring (ring.h's close reasons), as the error table's codes, and
# what the message says first.
_CLOSE_REASONS = {
    C.ECANCELED: ("LS_ETERMINATED", ""),
    C.EFAULT: ("LS_ESERVER", ""),
    C.EMOVED: ("LS_EMOVED", ""),
    C.ECORRUPT: ("LS_ECORRUPT", "the arbiter dropped this session"),
}


class Moved(errors.ArbiterRestarted):
    """The arbiter handed this session over to a new one (``restart``): nothing failed, the work
    it did not run goes to the new arbiter (see Reattacher.unrun_work)."""


def load_timeout(bound) -> float:
    """How long a load_program waits for its answer, given the ``load_timeout`` of a welcome."""
    if isinstance(bound, (int, float)) and not isinstance(bound, bool) and 0 < bound <= _MOST_LOAD_TIMEOUT:
        return max(LOAD_TIMEOUT, bound + LOAD_MARGIN)
    return LOAD_TIMEOUT


class Attachment:
    """One arbiter's welcome, taken: its control socket, ring and doorbell, and what it said."""

    def __init__(self, sock: socket.socket, welcome: protocol.Frame):
        fields = welcome.fields
        self.sock = sock
        """The control socket."""
        self.client_id: int = fields["client_id"]
        self.device_name: str = fields["device"]
        self.arbiter_pid: int = fields["arbiter_pid"]
        self.priority: str = fields.get("priority", "normal")
        self.load_timeout = load_timeout(fields.get("load_timeout"))
        # Through a share socket (a container's pipe directory) the control daemon's lock is out of
        # sight: whether a new arbiter will come is what the welcome said.
        self.contained = isinstance(fields.get("share"), str)
        self.supervised = fields.get("supervised") is True
        region_fd, wake_fd = welcome.fds
        try:
            self.region = Region.attach(region_fd)
            """This process's view of the ring (replaced by a reattach of the C API's, reattach.py)."""
        finally:
            os.close(region_fd)
        self.wake_fd = wake_fd
        """The doorbell socket."""
        os.set_blocking(wake_fd, False)  # a ring never waits; nor does reading the arbiter's bytes
        self.region.peers.set_wake_fd(wake_fd)
        self.region.peers.set_spin_mode(_SPIN_MODES.get(self.priority, C.SPIN_YIELD))
        if self.arbiter_pid != os.getpid():
            self.region.peers.watch(self.arbiter_pid)
        self.region.peers.announce_client()

    def closed_by_arbiter(self) -> errors.LibshareError | None:
        """The sticky error the arbiter left in the ring when it closed this session, if any.

        Reads the region: only by a thread counted in at the gate."""
        reason = _CLOSE_REASONS.get(self.region.peers.close_reason())
        if reason is None:
            return None
        error = errors.error_for(*reason)
        return Moved(*error.args) if reason[0] == "LS_EMOVED" else error

    def close(self, region: bool = True, lock: threading.RLock | None = None) -> None:
        """Let go of the socket (under ``lock``), the doorbell and, with ``region``, the ring (told
        first that this client is gone); without it the ring stays mapped for a thread still inside."""
        try:
            if region:
                self.region.peers.announce_client(alive=False)
        finally:
            with lock if lock is not None else contextlib.nullcontext():
                self.sock.close()
            if region:
                self.region.close()
            os.close(self.wake_fd)
