"""Timestamps: the query pools that time commands on the device, and how the host reads them.

Timestamps are written with ``ALL_COMMANDS``/``BOTTOM_OF_PIPE`` stages, i.e. once all
earlier work is complete: one when a submission starts and one after each command, N+1
for N commands, so ``device_ns[k]`` runs from the end of command k-1 to the end of command
k and the list sums to the submission's device time. A timed recording's primary carries
its own two timestamps, in a pair of slots of a shared pool (:meth:`Timestamps.take`); a
batch primary writes its N+1 into a pool of its own (:meth:`Timestamps.pool`), so
secondaries know nothing of timing. The command buffer that writes the timestamps also
copies them (``vkCmdCopyQueryPoolResults``, :meth:`Timestamps.copy_results`) into
host-visible memory mapped once per query pool, so reading them is a memory load:
``vkGetQueryPoolResults`` costs about 20 us on lavapipe and, worse, waits for whatever the
queue runs at the time, which held a realtime completion behind the low-priority work
submitted after it. Slots are reset by the command buffer that writes them, and read only
when ``device_ns`` is. Timestamps are normally cheap on GPUs; on lavapipe they add about
13 us to a one-command round trip (88 us against 75 us), so ``timed=False`` exists for
throughput runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from libshare.arbiter.device._binding import _create, _memory_barrier, _struct, _uses_binding
from libshare.arbiter.device._instance import Instance
from libshare.arbiter.device._memory import DeviceBuffer, Memory

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding

_QUERY_CHUNK = 256  # timed recordings per shared timestamp query pool (two queries each)


class _QueryPool:
    """A timestamp query pool and the host-visible buffer its results are copied into."""

    __slots__ = ("handle", "count", "buffer", "values")

    def __init__(self, handle: Any, count: int, buffer: DeviceBuffer, values: np.ndarray):
        self.handle = handle
        self.count = count
        self.buffer = buffer
        self.values = values  # uint64[count], the mapped buffer: query k's result lands in values[k]


class Timestamps:
    """The timestamp query pools of a Device: slot pairs for timed recordings, pools for batches,
    the copy of results to the host, and durations (a part of a Device)."""

    def __init__(self, instance: Instance, memory: Memory):
        self._device = instance.handle  # the VkDevice
        self._memory = memory
        self.mask = instance.timestamp_mask
        """The valid bits of a timestamp (0: the queue writes none, and nothing is timed)."""
        self._period_ns = instance.timestamp_period_ns
        self._pools: set[_QueryPool] = set()  # every live pool, shared and batches'
        self._free: list[tuple[_QueryPool, int]] = []  # free slot pairs of the shared pools
        self._results_barrier = _memory_barrier(_vk.VK_ACCESS_TRANSFER_WRITE_BIT, _vk.VK_ACCESS_HOST_READ_BIT)

    def take(self) -> tuple[_QueryPool, int]:
        """A free pair of slots (pool, first query) for a timed recording, growing by one shared
        pool when none is free."""
        if not self._free:
            pool = self.pool(2 * _QUERY_CHUNK)
            self._free.extend((pool, 2 * i) for i in reversed(range(_QUERY_CHUNK)))
        return self._free.pop()

    def give_back(self, pool: _QueryPool, query: int) -> None:
        """Free a pair of slots from :meth:`take`."""
        self._free.append((pool, query))

    def pool(self, size: int) -> _QueryPool:
        """A timestamp query pool of ``size`` queries, with a mapped buffer for their results."""
        info = _struct(
            "VkQueryPoolCreateInfo", "QUERY_POOL_CREATE_INFO", queryType=_vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=size
        )
        handle = _create(_lib.vkCreateQueryPool, "VkQueryPool", "vkCreateQueryPool", self._device, info, _ffi.NULL)
        try:
            buffer, values = self._memory.mapped(8 * size)
        except BaseException:
            _lib.vkDestroyQueryPool(self._device, handle, _ffi.NULL)
            raise
        pool = _QueryPool(handle, size, buffer, values.view(np.uint64))
        self._pools.add(pool)
        return pool

    def destroy_pool(self, pool: _QueryPool) -> None:
        """Destroy an idle pool from :meth:`pool` and its buffer."""
        self._pools.discard(pool)
        self._memory.destroy(pool.buffer)
        _lib.vkDestroyQueryPool(self._device, pool.handle, _ffi.NULL)

    def copy_results(self, cb: Any, pool: _QueryPool, first: int, count: int) -> None:
        """Record into ``cb`` the copy of ``count`` timestamps from ``first`` on into the pool's
        mapped buffer, and the barrier that makes them visible to the host."""
        flags = _vk.VK_QUERY_RESULT_64_BIT | _vk.VK_QUERY_RESULT_WAIT_BIT
        _lib.vkCmdCopyQueryPoolResults(cb, pool.handle, first, count, pool.buffer._handle, 8 * first, 8, flags)
        transfer, host = _vk.VK_PIPELINE_STAGE_TRANSFER_BIT, _vk.VK_PIPELINE_STAGE_HOST_BIT
        _lib.vkCmdPipelineBarrier(cb, transfer, host, 0, 1, self._results_barrier, 0, _ffi.NULL, 0, _ffi.NULL)

    def durations(self, pool: _QueryPool, first: int, count: int) -> list[int]:
        """Nanoseconds between consecutive timestamps of the ``count + 1`` from ``first`` on
        (their commands have finished)."""
        stamps = pool.values[first : first + count + 1].tolist()
        mask, period = self.mask, self._period_ns
        return [int(((later - earlier) & mask) * period) for earlier, later in zip(stamps, stamps[1:])]

    def close(self) -> None:
        """Destroy every query pool (Device.close, on an idle device, after Memory.close took their buffers)."""
        for pool in self._pools:
            _lib.vkDestroyQueryPool(self._device, pool.handle, _ffi.NULL)
        self._pools.clear()
        self._free.clear()
