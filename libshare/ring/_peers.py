"""The two sides of a region and how each wakes the other.

Each side announces itself in the region's bells (its pid, alive or closed); the
consumer closes its side for a reason the client reads (terminated, faulted,
handed over). This view's waits check the other side's pidfd between their
slices, spin in the mode its session's priority chose, and ring a doorbell
socket instead of a futex where one is given (see wake.c).
"""

from __future__ import annotations

import os
import select
from typing import TYPE_CHECKING

from libshare.ring import _binding
from libshare.ring._binding import C

if TYPE_CHECKING:
    from libshare.ring._region import Region

__all__ = ["Peers"]


class Peers:
    """The consumer and the client of ``region``, as this view sees them: ``region.peers``."""

    def __init__(self, region: Region):
        self._region = region
        self._pidfd = -1
        self.spin_mode: int = C.SPIN_YIELD
        """How this view's waits spin (:meth:`set_spin_mode`)."""

    # ---------------------------------------------------------------- liveness

    def watch(self, pid: int) -> None:
        """Make waits raise :class:`ArbiterLost` soon after process ``pid`` exits."""
        handle = self._region._c()
        if self._pidfd >= 0:
            os.close(self._pidfd)
        self._pidfd = os.pidfd_open(pid)
        _binding.set_peer_pidfd(handle, self._pidfd)

    def alive(self) -> bool:
        """False once the process given to :meth:`watch` has exited (True when none was)."""
        if self._pidfd < 0:
            return True
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return not poller.poll(0)

    def announce_consumer(self, alive: bool = True) -> None:
        """Record this process as the consumer, alive or closed (a close wakes waiting clients)."""
        _binding.set_consumer(self._region._c(), os.getpid(), alive)

    def close_consumer(self, reason: int = 0) -> None:
        """Close the consumer side, saying why (0, C.ECANCELED or C.EFAULT); wakes waiting clients."""
        _binding.close_consumer(self._region._c(), reason)

    def close_reason(self) -> int:
        """Why the consumer closed (0 while it is open or after a plain shutdown)."""
        return _binding.close_reason(self._region._c())

    def announce_client(self, alive: bool = True) -> None:
        """Record this process as the client, alive or closed."""
        _binding.set_client(self._region._c(), os.getpid(), alive)

    # ---------------------------------------------------------------- how this view's waits wake

    def set_spin_mode(self, mode: int) -> None:
        """How this view's waits spin before they sleep: C.SPIN_YIELD (the default: yield the core at
        each look), C.SPIN_KEEP (keep it: a realtime session's) or C.SPIN_NONE (sleep at once: a
        low-priority session's); see ring_wait_for in wake.c."""
        _binding.set_spin_mode(self._region._c(), mode)
        self.spin_mode = mode

    def set_wake_fd(self, doorbell_fd: int) -> None:
        """The doorbell: a client wakes the consumer by writing 8 bytes to ``doorbell_fd`` (the socket
        the arbiter gave it, or an eventfd) instead of a futex, for a consumer that sleeps in poll();
        the arbiter, given its own end, sends a byte there for a client's async waiter."""
        _binding.set_wake_fd(self._region._c(), doorbell_fd)

    def _release(self) -> None:
        """The region closes: close the watched process's pidfd."""
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
