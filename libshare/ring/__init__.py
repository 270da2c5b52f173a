"""libshare.ring: the lock-free shared-memory rings between clients and the arbiter.

A :class:`Region` holds a many-producer submission ring (one lane per
producing thread: ``region.lanes``, each thread's :class:`Producer`) and a
single-producer completion ring (``region.completions``), in one anonymous
memfd; ``region.peers`` says who is on each side and how each wakes the
other. Descriptors are :data:`DESC_DTYPE` records (256 bytes), completions
:data:`CQE_DTYPE` records (32 bytes). The atomics live in the C core (ring.c,
lanes.c, completions.c, wake.c); see their opening comments for the design. A
client's :class:`TicketBook` (tickets.c) records its tickets in flight and
files their completions, for the Python session and the C API alike.
"""

from libshare.ring._binding import C
from libshare.ring._binding import CQE_DTYPE
from libshare.ring._binding import DESC_DTYPE
from libshare.ring._lanes import Producer
from libshare.ring._region import Region
from libshare.ring._tickets import TicketBook

__all__ = ["C", "CQE_DTYPE", "DESC_DTYPE", "Producer", "Region", "TicketBook"]
