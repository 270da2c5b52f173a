"""The arbiter's file descriptors against its open-file limit.

Every client slot not yet taken keeps room for the descriptors a client costs (its
socket, pidfd and doorbell), the gate keeps room for the connections it may hold
(gate.py), and some slack serves the rest (logs, control commands, a compile). What is
left serves shared buffers, each of which may cost a few descriptors: past that an
alloc is refused with QuotaExceeded (:meth:`FdBudget.reserve_buffer`), so that the
last client to come can still connect.
"""

from __future__ import annotations

import os
import resource
import threading

from libshare.errors import QuotaExceeded


class FdBudget:
    """The arbiter's file descriptors against its limit: room kept for every client slot.

    Each client slot not yet taken keeps ``per_client`` descriptors (its socket,
    pidfd and doorbell), the gate keeps ``waiting``, and ``slack`` serves the rest (logs,
    control commands, a compile). What is left serves shared buffers, at most
    ``per_buffer`` descriptors each (a bound: what one costs depends on how it is mapped
    and on the driver's import). Counting
    open descriptors means listing /proc/self/fd, which costs a millisecond per few
    hundred; so the count is an upper bound kept up to date (the last count, plus
    ``per_buffer`` for every buffer since), and counted again only when that bound comes
    near the limit.
    """

    def __init__(self, per_client: int, per_buffer: int, waiting: int, slack: int):
        self.per_client, self.per_buffer, self.waiting, self.slack = per_client, per_buffer, waiting, slack
        self._lock = threading.Lock()
        self._bound = open_fds()

    def reserve_buffer(self, free_slots: int) -> None:
        """Count one more shared buffer, or raise QuotaExceeded when its descriptors would eat into
        the room kept for the ``free_slots`` client slots not yet taken."""
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return
        kept = free_slots * self.per_client + self.waiting + self.slack
        with self._lock:
            if self._bound + self.per_buffer + kept > limit:
                self._bound = open_fds()
                if self._bound + self.per_buffer + kept > limit:
                    raise QuotaExceeded(
                        f"the arbiter's file descriptors are spent: {self._bound} of {limit} are open and "
                        f"{kept} are kept for the clients still to come ({free_slots} places) and connections "
                        "waiting; free shared buffers, use device buffers, or raise the arbiter's open-file "
                        "limit (LimitNOFILE=, ulimit -n)")
            self._bound += self.per_buffer

    def client_joined(self) -> None:
        """A client took a slot: its descriptors are open now."""
        with self._lock:
            self._bound += self.per_client


def open_fds() -> int:
    """How many file descriptors this process has open."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own
    except OSError:
        return 0
