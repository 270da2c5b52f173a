"""The completion ring of a region: the consumer posts, the client takes and waits.

One poster (the arbiter's engine, in C, or a test or the demo here) and one reader:
a client session's reader is its ticket book (_tickets.py), which files what it takes in
C; these methods are the ring's own, for a reader without a book (a benchmark, the
demo, a C-like client) and for the consumer's posts (see completions.c).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from libshare.ring import _binding
from libshare.ring._binding import C, CQE_DTYPE

if TYPE_CHECKING:
    from libshare.ring._region import Region

__all__ = ["Completions"]


class Completions:
    """The completion ring of ``region``: ``region.completions``."""

    def __init__(self, region: Region):
        self._region = region
        self._out = np.empty(region.cq_entries, CQE_DTYPE)  # what take() copies from
        self._out_ptr = _binding.pointer(self._out)

    def post(self, cqes) -> int:
        """Post completions (bytes or CQE_DTYPE array); return how many fitted."""
        handle = self._region._c()
        source, count = _binding.entries(cqes, CQE_DTYPE)
        return _binding.cq_post(handle, source, count)

    def space(self) -> int:
        """Free completion slots, as the poster sees them."""
        return _binding.cq_space(self._region._c())

    def take(self, max_count: int | None = None) -> np.ndarray:
        """Take the completions that are ready (at most ``max_count``), without waiting."""
        handle = self._region._c()
        limit = self._region.cq_entries if max_count is None else min(max_count, self._region.cq_entries)
        return self._out[:_binding.cq_pop(handle, self._out_ptr, limit)].copy()

    def take_into(self, out: np.ndarray, out_ptr=None) -> int:
        """Take ready completions into ``out`` (a CQE_DTYPE array); return how many, without waiting.
        Pass ``out_ptr`` (a C pointer to ``out``, made once) to skip making it on every call."""
        handle = self._region._c()
        return _binding.cq_pop(handle, out_ptr if out_ptr is not None else _binding.pointer(out), len(out))

    def arm(self) -> int:
        """Ask for a byte on the doorbell socket with the next completion (for a waiter that polls
        it, such as an event loop); how many completions are ready already."""
        return _binding.cq_arm(self._region._c())

    def wait(self, min_count: int = 1, timeout: float | None = None, spin: float = C.SPIN_NS / 1e9) -> int:
        """Block until ``min_count`` completions are ready; return how many are."""
        timeout_ns = -1 if timeout is None else max(0, int(timeout * 1e9))
        return _binding.cq_wait(self._region._c(), min_count, int(spin * 1e9), timeout_ns)

    def _release(self) -> None:
        """The region closes: give back the pointer to the take buffer."""
        _binding.release(self._out_ptr)
