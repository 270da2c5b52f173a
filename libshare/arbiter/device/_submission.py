"""Submission and timing: one vkQueueSubmit per command list, its fence, batches, timestamps.

**Timing** (``timed=True``, the default). Timestamps are written with
``ALL_COMMANDS``/``BOTTOM_OF_PIPE`` stages, i.e. once all earlier work is complete: one
when the submission starts and one after each command, N+1 for N commands, so
``device_ns[k]`` runs from the end of command k-1 to the end of command k and the
list sums to the submission's device time. A timed recording's primary carries its
own two timestamps; a batch primary writes its N+1 between ``vkCmdExecuteCommands``
calls into a query pool of its own, so secondaries know nothing of timing. The
command buffer that writes the timestamps also copies them
(``vkCmdCopyQueryPoolResults``) into host-visible memory mapped once per query pool,
so reading them is a memory load: ``vkGetQueryPoolResults`` costs about 20 us on
lavapipe and, worse, waits for whatever the queue runs at the time, which held a
realtime completion behind the low-priority work submitted after it. Slots are reset
by the command buffer that writes them, and read only when ``device_ns`` is.
Timestamps are normally cheap on GPUs; on lavapipe they add about 13 us to a
one-command round trip (88 us against 75 us), so ``timed=False`` exists for
throughput runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from libshare.errors import InvalidSubmission

from libshare.arbiter.device._binding import (_address, _check, _create, _error, _memory_barrier, _struct, _timeout_ns, _uses_binding)
from libshare.arbiter.device._recordings import _ANY

if TYPE_CHECKING:
    from libshare.arbiter.device._device import Device
    from libshare.arbiter.device._memory import Buffer
    from libshare.arbiter.device._recordings import Command, _Recording

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding

_QUERY_CHUNK = 256  # timed recordings per timestamp query pool (two queries each)


class _Batch:
    """A reusable primary command buffer that runs a batch of secondaries, with the
    timestamp query pool of its timed use, grown on demand."""

    __slots__ = ("handle", "array", "submit_info", "query_pool")

    def __init__(self, array: Any):
        self.array = array
        self.handle = array[0]
        self.submit_info = _struct("VkSubmitInfo", "SUBMIT_INFO", commandBufferCount=1, pCommandBuffers=array)
        self.query_pool: _QueryPool | None = None


class _QueryPool:
    """A timestamp query pool and the host-visible buffer its results are copied into."""

    __slots__ = ("handle", "count", "buffer", "values")

    def __init__(self, handle: Any, count: int, buffer: Buffer, values: np.ndarray):
        self.handle = handle
        self.count = count
        self.buffer = buffer
        self.values = values  # uint64[count], the mapped buffer: query k's result lands in values[k]


class _Fence:
    """A pooled VkFence and the one-element array the wait/reset calls take."""

    __slots__ = ("handle", "array")

    def __init__(self, handle: Any):
        self.handle = handle
        self.array = _ffi.new("VkFence[1]", [handle])


class Submission:
    """One ``vkQueueSubmit`` of a list of commands, completed by one fence.

    Poll :meth:`done` or block in :meth:`wait`; then read :attr:`device_ns` and call
    :meth:`release` so the fence, command buffers and query slots can be reused.
    """

    __slots__ = ("_device", "_fence", "_recordings", "_batch", "_timed", "_complete", "_released", "_device_ns")

    def __init__(self, device: Device, fence: _Fence, recordings: list[_Recording], batch: _Batch | None, timed: bool):
        self._device = device
        self._fence = fence
        self._recordings = recordings
        self._batch = batch
        self._timed = timed
        self._complete = False
        self._released = False
        self._device_ns: list[int] | None = None

    def done(self) -> bool:
        """True once the device has finished every command (never blocks).

        A closed device finished everything, unless close() abandoned it under running work:
        then the fence, still alive, says.
        """
        if self._known_done():
            return True
        return self._settle(self._device._get_fence_status(self._device._handle, self._fence.handle),
                            "vkGetFenceStatus")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done or ``timeout`` seconds passed (None: no limit); True if done.

        A dispatch may never end: the arbiter always passes a timeout.
        """
        if self._known_done():
            return True
        device = self._device
        return self._settle(device._wait_for_fences(device._handle, 1, self._fence.array, 1, _timeout_ns(timeout)),
                            "vkWaitForFences")

    def _known_done(self) -> bool:
        """Done without asking the fence: seen done before, or its device closed (not abandoned)."""
        return self._complete or (self._device._closed and not self._device._abandoned)

    def _settle(self, result: int, what: str) -> bool:
        """A fence call's VkResult: True (and remembered) when signalled, False when not yet; raises on an error."""
        if result == 0:
            self._complete = True
            return True
        if result < 0:
            raise _error(result, what)
        return False

    @property
    def device_ns(self) -> list[int] | None:
        """Device time of each command in nanoseconds, in submission order.

        ``device_ns[k]`` runs from the end of command k-1 (for k = 0, from the start of
        the submission) to the end of command k, so the list sums to the submission's
        device time. None for ``timed=False`` submissions and on queues without
        timestamps. Read it after completion and before :meth:`release` (the query
        slots are reused afterwards).
        """
        if self._device_ns is None and self._timed:
            if self._released or self._device._closed:
                raise InvalidSubmission("device_ns read after release (its query slots were reused)")
            if not self.done():
                raise InvalidSubmission("device_ns read before the submission completed")
            self._device_ns = self._device._read_timestamps(self._recordings, self._batch)
        return self._device_ns

    def release(self) -> None:
        """Return the fence, command buffers and query slots for reuse. Idempotent.

        The submission must be complete: releasing pending work raises
        InvalidSubmission (its command buffers would be reused while in flight).
        """
        if self._released:
            return
        if not (self._complete or self.done()):
            raise InvalidSubmission("release of a submission the device has not finished")
        self._released = True
        self._device._recycle(self._fence, self._batch, self._recordings)

    def __repr__(self) -> str:
        state = "released" if self._released else ("done" if self._complete else "pending")
        return f"<Submission commands={len(self._recordings)} {state}>"


class _Submissions:
    """Submissions of a Device: fences, batch primaries, query pools and timestamps (one of its parts)."""

    def _init_submissions(self) -> None:
        """The free lists of fences, batches and query slots, and the structs submissions reuse."""
        self._fences: list[_Fence] = []
        self._all_fences: list[_Fence] = []
        self._batches: list[_Batch] = []  # idle ones
        self._all_batches: list[_Batch] = []
        self._query_pools: list[_QueryPool] = []
        self._free_queries: list[tuple[_QueryPool, int]] = []
        self._results_barrier = _memory_barrier(_vk.VK_ACCESS_TRANSFER_WRITE_BIT, _vk.VK_ACCESS_HOST_READ_BIT)
        self._begin_batch = _struct(
            "VkCommandBufferBeginInfo", "COMMAND_BUFFER_BEGIN_INFO",
            flags=_vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
        )
        self._empty_info = _struct("VkSubmitInfo", "SUBMIT_INFO")

    def submit(self, commands: Sequence[Command], *, timed: bool = True) -> Submission:
        """Run ``commands`` in order with one vkQueueSubmit and one fence.

        Each command sees the memory writes of the commands before it, in this and in
        earlier submissions. ``timed`` records per-command device time (see
        :attr:`Submission.device_ns`). An empty list makes a marker that completes when
        all earlier work has.
        """
        if self._closed:
            raise InvalidSubmission("submit on a closed device")
        timed = bool(timed and self._timestamp_mask)
        recordings: list[_Recording] = []
        batch = None
        try:
            if len(commands) == 1:
                recordings.append(self._acquire(commands[0], int(timed)))
                info = recordings[0].submit_info or self._primary_info(recordings[0])
            elif commands:
                for command in commands:
                    recordings.append(self._acquire(command, _ANY))
                batch = self._record_batch(recordings, timed)
                info = batch.submit_info
            else:
                info = self._empty_info
            fence = self._fences.pop() if self._fences else self._new_fence()
        except BaseException:
            self._recycle(None, batch, recordings)
            raise
        result = self._queue_submit(self._queue, 1, info, fence.handle)
        if result:
            self._fences.append(fence)
            self._recycle(None, batch, recordings)
            raise _error(result, "vkQueueSubmit")
        return Submission(self, fence, recordings, batch, timed)

    def route_submissions(self, submit) -> None:
        """Send this device's own queue submissions through ``submit(info_address, fence) -> VkResult``.

        A VkQueue must not be used by two threads at once; a native engine that submits on
        this queue from its own thread passes its locked submit here.
        """
        def queue_submit(queue: Any, count: int, info: Any, fence: Any) -> int:
            return submit(_address(info), _address(fence))

        self._queue_submit = queue_submit

    def wait_idle(self) -> None:
        """Block until the device has finished all submitted work."""
        self._require_open()
        _check(_lib.vkDeviceWaitIdle(self._handle), "vkDeviceWaitIdle")

    def _record_batch(self, recordings: list[_Recording], timed: bool) -> _Batch:
        """Record a pooled primary that runs the secondaries (timing each, if ``timed``)."""
        for recording in recordings:
            if recording.secondary is None:
                self._record_secondary(recording)
        if self._batches:
            batch = self._batches.pop()
        else:
            batch = _Batch(self._allocate_command_buffer(_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY))
            self._all_batches.append(batch)
        try:
            cb = batch.handle
            _check(_lib.vkBeginCommandBuffer(cb, self._begin_batch), "vkBeginCommandBuffer")
            if timed:
                self._execute_timed(cb, batch, recordings)
            else:
                secondaries = _ffi.new("VkCommandBuffer[]", [r.secondary for r in recordings])
                _lib.vkCmdExecuteCommands(cb, len(recordings), secondaries)
            _check(_lib.vkEndCommandBuffer(cb), "vkEndCommandBuffer")
        except BaseException:
            _lib.vkResetCommandBuffer(batch.handle, 0)
            self._batches.append(batch)
            raise
        return batch

    def _execute_timed(self, cb: Any, batch: _Batch, recordings: list[_Recording]) -> None:
        """Run the secondaries one by one with a timestamp before the first and after each."""
        queries = self._batch_queries(batch, len(recordings) + 1)
        pool, write, execute = queries.handle, _lib.vkCmdWriteTimestamp, _lib.vkCmdExecuteCommands
        after = _vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT
        _lib.vkCmdResetQueryPool(cb, pool, 0, len(recordings) + 1)
        write(cb, _vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, pool, 0)
        for slot, recording in enumerate(recordings, 1):
            execute(cb, 1, recording.secondary_array)
            write(cb, after, pool, slot)
        self._copy_results(cb, queries, 0, len(recordings) + 1)

    def _copy_results(self, cb: Any, queries: _QueryPool, first: int, count: int) -> None:
        """Copy ``count`` timestamps from ``first`` on into the pool's mapped buffer, for the host."""
        flags = _vk.VK_QUERY_RESULT_64_BIT | _vk.VK_QUERY_RESULT_WAIT_BIT
        _lib.vkCmdCopyQueryPoolResults(cb, queries.handle, first, count, queries.buffer._handle, 8 * first, 8, flags)
        transfer, host = _vk.VK_PIPELINE_STAGE_TRANSFER_BIT, _vk.VK_PIPELINE_STAGE_HOST_BIT
        _lib.vkCmdPipelineBarrier(cb, transfer, host, 0, 1, self._results_barrier, 0, _ffi.NULL, 0, _ffi.NULL)

    def _batch_queries(self, batch: _Batch, count: int) -> _QueryPool:
        """The batch's query pool, replaced by a larger one when it has fewer than ``count``."""
        old = batch.query_pool
        if old is None or old.count < count:
            batch.query_pool = self._create_query_pool(max(count, 2 * old.count if old else 0, 64))
            if old is not None:
                self._destroy_query_pool(old)  # idle: the batch is not pending
        return batch.query_pool

    def _create_query_pool(self, size: int) -> _QueryPool:
        """A timestamp query pool of ``size`` queries, with a mapped buffer for their results."""
        info = _struct(
            "VkQueryPoolCreateInfo", "QUERY_POOL_CREATE_INFO", queryType=_vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=size
        )
        handle = _create(_lib.vkCreateQueryPool, "VkQueryPool", "vkCreateQueryPool", self._handle, info, _ffi.NULL)
        try:
            buffer, values = self._mapped_buffer(8 * size)
        except BaseException:
            _lib.vkDestroyQueryPool(self._handle, handle, _ffi.NULL)
            raise
        return _QueryPool(handle, size, buffer, values.view(np.uint64))

    def _destroy_query_pool(self, queries: _QueryPool) -> None:
        self.destroy_buffer(queries.buffer)
        _lib.vkDestroyQueryPool(self._handle, queries.handle, _ffi.NULL)

    def _take_queries(self) -> tuple[_QueryPool, int]:
        """A free (pool, first query) pair, growing by one query pool when none is free."""
        if not self._free_queries:
            pool = self._create_query_pool(2 * _QUERY_CHUNK)
            self._query_pools.append(pool)
            self._free_queries.extend((pool, 2 * i) for i in reversed(range(_QUERY_CHUNK)))
        return self._free_queries.pop()

    def _new_fence(self) -> _Fence:
        """A fresh unsignalled fence (the free list was empty)."""
        info = _struct("VkFenceCreateInfo", "FENCE_CREATE_INFO")
        fence = _Fence(_create(_lib.vkCreateFence, "VkFence", "vkCreateFence", self._handle, info, _ffi.NULL))
        self._all_fences.append(fence)
        return fence

    def _recycle(self, fence: _Fence | None, batch: _Batch | None, recordings: list[_Recording]) -> None:
        """Take back a finished (or never submitted) submission's resources."""
        if self._closed:
            return
        if fence is not None:
            result = self._reset_fences(self._handle, 1, fence.array)
            if result < 0:
                raise _error(result, "vkResetFences")
            self._fences.append(fence)
        if batch is not None:
            self._batches.append(batch)
        for recording in recordings:
            entry = recording.entry
            if entry.alive:
                entry.free[recording.timed].append(recording)
            else:
                self._free_recording(recording)

    def _read_timestamps(self, recordings: list[_Recording], batch: _Batch | None) -> list[int]:
        """Durations between consecutive timestamps of a finished submission, one call."""
        if not recordings:
            return []
        if batch is None:
            queries, first = recordings[0].query_pool, recordings[0].query
        else:
            queries, first = batch.query_pool, 0
        stamps = queries.values[first : first + len(recordings) + 1].tolist()
        mask, period = self._timestamp_mask, self.timestamp_period_ns
        return [int(((later - earlier) & mask) * period) for earlier, later in zip(stamps, stamps[1:])]

    def _close_submissions(self) -> None:
        """Destroy the fences and query pools (close(), on an idle device)."""
        for fence in self._all_fences:
            _lib.vkDestroyFence(self._handle, fence.handle, _ffi.NULL)
        for queries in self._query_pools:
            _lib.vkDestroyQueryPool(self._handle, queries.handle, _ffi.NULL)  # its buffer went in _close_memory
        for batch in self._all_batches:
            if batch.query_pool is not None:
                _lib.vkDestroyQueryPool(self._handle, batch.query_pool.handle, _ffi.NULL)
