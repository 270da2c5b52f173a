"""Device memory limits: the MPS hierarchy, per-client live limits, groups, and the total.

The arbiter allocates every buffer itself, so it is the only place a limit has to be
enforced and a client cannot escape one (deleting an environment variable changes
nothing). The limit of one client resolves like this:

* The operator's levels, the most specific one set wins: the **default**
  (``set_default_device_pinned_mem_limit``, or LIBSHARE_DEVICE_MEM_LIMIT in the
  arbiter's own environment), overridden by the **server** limit
  (``set_device_pinned_mem_limit SERVER_PID``; as in MPS it may be above the default),
  overridden by a **client** limit (``set_device_pinned_mem_limit CLIENT_PID``, beyond
  MPS: a running client's limit changes live).
* The client's own LIBSHARE_DEVICE_MEM_LIMIT, sent in its hello, only lowers that.
* A **group** limit (``set_group_mem_limit``) caps the sum of every member's memory,
  on top of each member's own limit.
* The **total** limit caps the sum of every client's memory, shared and device buffers
  alike, whatever the other levels say: without it, clients that each stay under their
  own limit (unlimited by default, as in MPS) could still together take the machine's
  memory, and the kernel's OOM killer would pick the arbiter, which holds it. Its
  default fits the device, measured when the arbiter starts: on a CPU device (lavapipe)
  every buffer is host memory, so 3/4 of the host's ``MemAvailable``; on a GPU the
  smaller of that and the largest device-local heap (shared buffers are host memory,
  device buffers the GPU's, and one sum counts both). LIBSHARE_DEVICE_MEM_TOTAL in the
  arbiter's environment replaces the default (a size, or ``unlimited``).

Of the limits that apply, the lowest wins. A limit is checked when memory is
allocated: changing it affects the allocations not yet made, and a limit lowered
below what a client holds frees nothing but refuses its next allocation.

**Buffer counts.** Bytes are not all a buffer costs: the arbiter maps each one (shared and,
on a CPU device, device buffers alike), and the kernel allows a process ``vm.max_map_count``
maps (65,530 by default). One client holding 64,977 buffers of 4 KiB, 254 MiB in all,
took the arbiter to that bound: it could start no thread for a new client, and every
other client's allocations failed. So a client holds at most ``LIBSHARE_MAX_BUFFERS``
buffers (4096), and all clients together at most what ``vm.max_map_count`` leaves once
the arbiter's own maps at start, a few per client slot and a slack are kept, at two maps
per buffer (one measured on lavapipe; a driver's import may add one). A buffer freed while
work still uses it, or while descriptors pushed before the free still wait, counts until it
is destroyed (Client.held), as its bytes do.

Values are sizes like ``900M`` or ``2G`` (binary units: 1K = 1024 bytes, an optional
``B`` or ``iB`` after the unit), or plain bytes. ``unlimited`` (or ``none``) removes a
limit. LIBSHARE_DEVICE_MEM_LIMIT also takes the per-device MPS form ``0=1G,UUID=512M``. The parsers
of sizes live in libshare/settings.py, with every setting: clients and the Kubernetes plugin read
sizes too, without the arbiter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from libshare import settings as _settings
from libshare.errors import InvalidSubmission, QuotaExceeded
from libshare.arbiter.serve.clients import BufferRecord
from libshare.settings import (UNLIMITED, format_size, parse_device_limits, parse_limit,  # noqa: F401 - the size
                               parse_size)  # parsers live in libshare/settings.py (read by every process)

MAX_BUFFERS = _settings.default("max_buffers")  # buffers one client may hold (LIBSHARE_MAX_BUFFERS)
_MAPS_PER_BUFFER = 2  # maps a buffer may cost the arbiter (see "Buffer counts")
_MAPS_PER_CLIENT = 4  # a client slot's ring mapping, its connection thread's stack and guard, one to spare
_MAP_SLACK = 4096  # maps kept for the rest: threads, vetting compilers, the driver, Python


def device_limit(limits: dict, index: int, uuid: str) -> int | None:
    """The entry of ``limits`` (from :func:`parse_device_limits`, or a peer's hello) for this device.

    A peer's mapping is untrusted: anything but string keys and non-negative integer
    values raises InvalidSubmission.
    """
    if not isinstance(limits, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _settings.MAX_SIZE
            for k, v in limits.items()):
        raise InvalidSubmission(f"a memory limit must map device names to byte counts (got {limits!r})")
    names = ("", str(index), uuid.lower().replace("-", ""))
    found = [limits[k] for k in names if k in limits]
    return min(found) if found else None


def same_device(text: str, index: int, uuid: str) -> None:
    """Check that ``text`` (a device index or UUID) names this arbiter's device."""
    wanted = text.strip().lower().replace("-", "")
    if wanted not in (str(index), uuid.lower().replace("-", "")):
        raise InvalidSubmission(f"no device {text!r} here: this arbiter serves device {index} (uuid {uuid})")


@dataclass(frozen=True)
class Limit:
    """One limit that applies, and where it comes from."""

    value: int
    level: str  # "default", "server", "client", "group" or "total"
    source: str  # how it was set, for messages

    def describe(self) -> str:
        """ "the server limit of 8M (set_device_pinned_mem_limit)" """
        return f"the {self.level} limit of {format_size(self.value)} ({self.source})"


def total_limit(value: int | None) -> Limit | None:
    """The total limit of ``value`` bytes that LIBSHARE_DEVICE_MEM_TOTAL set (None: unlimited)."""
    return None if value is None else Limit(value, "total", "LIBSHARE_DEVICE_MEM_TOTAL")


def fitting_total_limit(device, meminfo: str = "/proc/meminfo") -> Limit:
    """The default total limit for ``device`` (a :class:`~.device.Device`), whole MiB (see above)."""
    with open(meminfo) as f:
        available = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    host = available * 3 // 4
    if device.cpu or not device.local_heap_size:
        value, source = host, "3/4 of the host memory available at start"
    else:
        value, source = min(host, device.local_heap_size), "the device-local heap, at most 3/4 of the host memory"
    return Limit(value >> 20 << 20, "total", f"{source}; LIBSHARE_DEVICE_MEM_TOTAL sets it")


@dataclass
class MemoryLimits:
    """The operator's memory limits of one arbiter (default, server, per group).

    The per-client values live on the Client (``mem_limit`` from the operator,
    ``env_mem_limit`` from its hello). Written by control threads, read on the drain
    thread: each write replaces one value, so a reader sees the old or the new one.
    """

    default: int | None = None
    server: int | None = None
    groups: dict[str, int] = field(default_factory=dict)
    total: Limit | None = None
    """The cap on every client's memory together (see the module's opening)."""
    max_buffers: int = MAX_BUFFERS
    """The most buffers one client may hold."""
    buffer_ceiling: int | None = None
    """The most buffers all clients together may hold (:func:`buffer_ceiling`), or None: no bound."""

    def client_limit(self, client) -> Limit | None:
        """The limit that binds ``client`` alone (the lowest that applies), or None."""
        if client.mem_limit is not None:
            operator = Limit(client.mem_limit, "client", "set_device_pinned_mem_limit CLIENT_PID")
        elif self.server is not None:
            operator = Limit(self.server, "server", "set_device_pinned_mem_limit SERVER_PID")
        elif self.default is not None:
            operator = Limit(self.default, "default", "set_default_device_pinned_mem_limit "
                                                      "or the arbiter's LIBSHARE_DEVICE_MEM_LIMIT")
        else:
            operator = None
        own = (Limit(client.env_mem_limit, "client", "the client's LIBSHARE_DEVICE_MEM_LIMIT")
               if client.env_mem_limit is not None else None)
        candidates = [limit for limit in (operator, own) if limit is not None]
        return min(candidates, key=lambda limit: limit.value) if candidates else None

    def group_limit(self, group: str) -> Limit | None:
        """The limit on the sum of ``group``'s memory, or None (always None for no group)."""
        value = self.groups.get(group) if group else None
        return None if value is None else Limit(value, "group", f"set_group_mem_limit {group}")

    def check(self, client, clients, size: int, released: int = 0) -> None:
        """Raise QuotaExceeded if one more buffer of ``size`` bytes would take ``client`` or its group
        past a limit, or the buffer counts past theirs.

        ``clients`` are all of the arbiter's clients (those still reclaiming count: their
        memory is still held); ``released`` is memory freed by clients that the device
        has not given back yet, which counts towards the total.
        """
        self._check_count(client, clients)
        limit = self.client_limit(client)
        used = client.counters.memory_bytes
        if limit is not None and used + size > limit.value:
            raise QuotaExceeded(f"allocating {format_size(size)} would take {client.describe()} past "
                                f"{limit.describe()}: it uses {format_size(used)} now; free buffers "
                                "or ask the operator to raise the limit")
        limit = self.group_limit(client.group)
        if limit is not None:
            used = group_usage(clients, client.group)
            if used + size > limit.value:
                raise QuotaExceeded(f"allocating {format_size(size)} would take group {client.group!r} past "
                                    f"{limit.describe()}: its clients use {format_size(used)} now; free "
                                    "buffers or ask the operator to raise the limit")
        if self.total is not None:
            used = sum(c.counters.memory_bytes for c in clients) + released
            if used + size > self.total.value:
                raise QuotaExceeded(f"allocating {format_size(size)} would take the arbiter's clients past "
                                    f"{self.total.describe()}: together they use {format_size(used)} now; "
                                    "free buffers or ask the operator to raise the limit")


    def _check_count(self, client, clients) -> None:
        held = client.held(BufferRecord)
        if held >= self.max_buffers:
            raise QuotaExceeded(f"{client.describe()} holds {held} buffers, the most one client may (the arbiter's "
                                "LIBSHARE_MAX_BUFFERS); free some, or place several arrays in one bigger buffer")
        if self.buffer_ceiling is not None:
            held = sum(c.held(BufferRecord) for c in clients)
            if held >= self.buffer_ceiling:
                raise QuotaExceeded(f"the arbiter's clients hold {held} buffers together, the most it can map "
                                    "(what the kernel's vm.max_map_count leaves it); free buffers, or ask the "
                                    "operator to raise vm.max_map_count")


def buffer_ceiling(client_slots: int) -> int | None:
    """How many buffers all clients together may hold: what the kernel's ``vm.max_map_count`` leaves
    once this process's maps now, ``client_slots`` slots' and a slack are kept (None: unreadable)."""
    try:
        most = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as maps:
            now = sum(1 for _ in maps)
    except (OSError, ValueError):
        return None
    return max(most - now - _MAPS_PER_CLIENT * client_slots - _MAP_SLACK, 0) // _MAPS_PER_BUFFER


def group_usage(clients, group: str) -> int:
    """Bytes of memory held by the members of ``group`` among ``clients``."""
    return sum(c.counters.memory_bytes for c in clients if c.group == group)
