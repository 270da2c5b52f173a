"""Recordings: each distinct command is recorded once, cached, and afterwards only resubmitted.

* **Recordings keyed by content.** A :class:`Dispatch` is fully described by its
  pipeline, its ``(buffer, offset)`` bindings (a ``(DeviceView, 0)`` at a texel buffer), its group counts
  and its push-constant
  bytes; a :class:`Copy` by its buffers, offsets and size. That tuple is the command's
  ``key``. A command buffer may not be pending twice (we do not pay for
  ``SIMULTANEOUS_USE``), so a key keeps *lists* of idle recordings and a submission
  takes one per occurrence (64 identical dispatches in a batch use 64).
  :meth:`Submission.release` gives them back.
* **Two shapes of one recording.** A one-command submission sends the recording's own
  *primary* command buffer with a prebuilt ``VkSubmitInfo``: the hot path is a dict
  look-up and three raw cffi calls (``vkQueueSubmit``, ``vkWaitForFences``,
  ``vkResetFences``), the same calls a hand-written loop makes. A batch records one
  fresh primary (from a pool of them) that runs the recordings' *secondary* command
  buffers with ``vkCmdExecuteCommands``. Drivers pay a set-up cost per submitted primary
  (on lavapipe more than the tiny dispatch itself), which secondaries do not pay, so a
  batch costs far less per command than one submission per command. Each shape is
  recorded the first time it is needed.
* **Bounded cache, cheap misses.** Recordings live in an LRU (an ``OrderedDict`` of
  keys) bounded by ``cache_size`` recordings. A miss on a full cache takes an idle
  recording from the least recently used key and records the new command into the
  same command buffers (no free/allocate); recordings in flight are never taken and
  are freed on release if their key was dropped meanwhile. Commands that differ only
  in push constants or group counts (a step counter, say) miss every time, so a miss
  is kept cheap too: the checks and descriptor writes of each ``(pipeline, buffers)``
  binding are made once and cached. Before a buffer or pipeline is destroyed the Device
  asks the cache to let go of it (:meth:`Recordings.drop_users`): it scans the cache
  (destroys are rare, misses are not), refuses while a submission in flight names the
  object, and drops every key naming it, so no recording outlives the handles it was
  recorded with.
* **Ordering.** Every recording ends with the queue's barrier (see "Ordering" in
  ``_queue.py``), so each command sees the writes of all commands submitted before it.

:class:`Recordings` hands out recordings (:meth:`Recordings.acquire`) and takes them back
(:meth:`Recordings.give_back`); the submission part puts them on the queue.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Iterable

from libshare.errors import InvalidSubmission

from libshare.arbiter.device._binding import _check, _struct, _uses_binding
from libshare.arbiter.device._instance import Instance
from libshare.arbiter.device._memory import DeviceBuffer, DeviceView
from libshare.arbiter.device._pipelines import _DESCRIPTOR_TYPES, Pipeline
from libshare.arbiter.device._queue import Queue
from libshare.arbiter.device._timestamps import Timestamps

if TYPE_CHECKING:
    from libshare.arbiter.device._timestamps import _QueryPool

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding

_ANY = 2  # acquire kind: a batch's secondary, which is the same for timed and untimed


class Command:
    """Something ``Device.submit`` runs. Immutable once built; ``key`` names it.

    Two commands with equal keys are the same work, and share cached recordings.
    """

    __slots__ = ("key",)

    key: tuple


class Dispatch(Command):
    """Run ``pipeline`` over ``groups`` workgroups.

    ``buffers`` binds ``(buffer, offset)`` pairs to bindings 0, 1, ... of set 0 (each
    sees its buffer from ``offset`` to the end); ``push`` is the push-constant bytes
    (a multiple of 4, at most the pipeline's ``push_size``).
    """

    __slots__ = ("pipeline", "buffers", "groups", "push")

    def __init__(
        self,
        pipeline: Pipeline,
        buffers: Iterable[tuple[DeviceBuffer, int]],
        groups: tuple[int, int, int],
        push: bytes = b"",
    ):
        self.pipeline = pipeline
        self.buffers = tuple(map(tuple, buffers))
        self.groups = tuple(groups)
        self.push = bytes(push)
        self.key = (pipeline, self.buffers, self.groups, self.push)

    def __repr__(self) -> str:
        return f"Dispatch({self.pipeline!r}, {list(self.buffers)!r}, {self.groups!r}, {self.push!r})"


class Copy(Command):
    """Copy ``size`` bytes from ``src`` at ``src_offset`` to ``dst`` at ``dst_offset``."""

    __slots__ = ("src", "src_offset", "dst", "dst_offset", "size")

    def __init__(self, src: DeviceBuffer, src_offset: int, dst: DeviceBuffer, dst_offset: int, size: int):
        self.src = src
        self.src_offset = src_offset
        self.dst = dst
        self.dst_offset = dst_offset
        self.size = size
        self.key = ("copy", src, src_offset, dst, dst_offset, size)

    def __repr__(self) -> str:
        return f"Copy({self.src!r}, {self.src_offset}, {self.dst!r}, {self.dst_offset}, {self.size})"


class _Entry:
    """One cache key: its command, idle recordings (untimed, timed) and their total."""

    __slots__ = ("key", "command", "free", "count", "alive")

    def __init__(self, key: tuple, command: Command):
        self.key = key
        self.command = command
        self.free: tuple[list[_Recording], list[_Recording]] = ([], [])  # indexed by timed
        self.count = 0
        self.alive = True

    def busy(self) -> int:
        """How many of its recordings are in unreleased submissions."""
        return self.count - len(self.free[0]) - len(self.free[1])


class _Recording:
    """One command recorded as a primary and/or a secondary command buffer.

    ``submit_info`` (primary) and ``secondary`` are set while that shape holds the
    current entry's command, None before it is recorded. When the cache is full a
    recording moves to a new entry and keeps its command buffers, which are then
    recorded again. A timed recording's primary writes its start and end timestamps
    into its two query slots, ``query`` and ``query + 1``; the secondary is untimed.
    """

    __slots__ = (
        "entry", "timed", "query_pool", "query",
        "primary_array", "primary_info", "submit_info", "secondary_array", "secondary",
    )

    def __init__(self, timed: bool, query_pool: _QueryPool | None, query: int):
        self.entry: _Entry | None = None
        self.timed = timed
        self.query_pool = query_pool
        self.query = query
        self.primary_array: Any = None  # VkCommandBuffer[1], allocated on first single submit
        self.primary_info: Any = None  # VkSubmitInfo naming primary_array
        self.submit_info: Any = None  # primary_info while the primary is current
        self.secondary_array: Any = None  # VkCommandBuffer[1], allocated on first batch
        self.secondary: Any = None  # its handle while current

    def move_to(self, entry: _Entry) -> None:
        """Serve ``entry`` from now on; both shapes must be recorded again."""
        self.entry = entry
        self.submit_info = None
        self.secondary = None


class Recordings:
    """The recording cache of a Device: entries, recordings, bindings, recording (a part of a Device).

    ``len()`` is the number of recordings, cached or in flight: at most ``cache_size`` once
    those in flight are given back.
    """

    def __init__(self, instance: Instance, queue: Queue, timestamps: Timestamps, cache_size: int):
        self._instance = instance
        self._queue = queue
        self._timestamps = timestamps
        self._push_descriptor_set = instance.push_descriptor_set
        self._cache: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()
        self._bindings: dict[tuple, tuple[Any, Any]] = {}  # (pipeline, buffers) -> descriptor writes
        self._retired: set[_Entry] = set()  # dropped entries with recordings still in flight
        self._cache_size = max(int(cache_size), 1)
        self._recording_count = 0
        self._inheritance = _struct("VkCommandBufferInheritanceInfo", "COMMAND_BUFFER_INHERITANCE_INFO")
        self._begin_secondary = _struct(
            "VkCommandBufferBeginInfo", "COMMAND_BUFFER_BEGIN_INFO", pInheritanceInfo=self._inheritance
        )
        self._begin_primary = _struct("VkCommandBufferBeginInfo", "COMMAND_BUFFER_BEGIN_INFO")

    def __len__(self) -> int:
        return self._recording_count

    def acquire(self, command: Command, kind: int) -> _Recording:
        """An idle recording of ``command``: from the cache, or a new one.

        ``kind`` is 0 or 1 for a (timed) primary, ``_ANY`` for a batch's secondary.
        """
        try:
            key = command.key
            entry = self._cache.get(key)
        except (AttributeError, TypeError):
            raise InvalidSubmission(f"not a valid Command: {command!r}") from None
        if entry is None:
            entry = self._new_entry(key, command)
        else:
            self._cache.move_to_end(key)
            free = entry.free[kind] if kind != _ANY else entry.free[0] or entry.free[1]
            if free:
                return free.pop()
        recording = self._new_recording(entry, kind)
        if self._recording_count > self._cache_size:
            self._shrink()
        return recording

    def primary_info(self, recording: _Recording) -> Any:
        """Record a recording's primary shape; return its prebuilt VkSubmitInfo."""
        if recording.primary_array is None:
            recording.primary_array = array = self._queue.allocate(_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY)
            recording.primary_info = _struct("VkSubmitInfo", "SUBMIT_INFO", commandBufferCount=1, pCommandBuffers=array)
        self._record_body(recording.primary_array[0], recording, self._begin_primary, primary=True)
        recording.submit_info = recording.primary_info
        return recording.submit_info

    def record_secondary(self, recording: _Recording) -> None:
        """Record a recording's secondary shape, for batches."""
        if recording.secondary_array is None:
            recording.secondary_array = self._queue.allocate(_vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)
        self._record_body(recording.secondary_array[0], recording, self._begin_secondary, primary=False)
        recording.secondary = recording.secondary_array[0]

    def give_back(self, recordings: list[_Recording]) -> None:
        """Take back the recordings of a finished (or never submitted) submission: idle again, or
        freed when their key was dropped meanwhile."""
        for recording in recordings:
            entry = recording.entry
            if entry.alive:
                entry.free[recording.timed].append(recording)
            else:
                self._free_recording(recording)

    def _new_recording(self, entry: _Entry, kind: int) -> _Recording:
        """A recording for ``entry``: reclaimed from the LRU end when the cache is full."""
        recording = self._reclaim() if self._recording_count >= self._cache_size else None
        if recording is None:
            recording = _Recording(False, None, 0)
            self._recording_count += 1
        if kind != _ANY and recording.timed != kind:
            self._set_timed(recording, bool(kind))
        recording.move_to(entry)
        entry.count += 1
        return recording

    def _reclaim(self) -> _Recording | None:
        """Detach an idle recording from the least recently used entry that has one.

        Its command buffers (and query slots) are reused as they are, which saves a
        free/allocate pair; the entry is dropped when it has no recording left.
        """
        for entry in self._cache.values():
            free = entry.free[0] or entry.free[1]
            if free:
                recording = free.pop()
                entry.count -= 1
                if not entry.count:
                    self._drop_entry(entry)  # ends the iteration: we return at once
                return recording
        return None

    def _set_timed(self, recording: _Recording, timed: bool) -> None:
        """Give a recording query slots, or take them back."""
        if timed:
            recording.query_pool, recording.query = self._timestamps.take()
        else:
            self._timestamps.give_back(recording.query_pool, recording.query)
            recording.query_pool, recording.query = None, 0
        recording.timed = timed

    def _record_body(self, cb: Any, recording: _Recording, begin: Any, *, primary: bool) -> None:
        """The command and its barrier into ``cb``, between timestamps for a timed primary.

        Beginning an executable command buffer resets it (the pool allows that).
        """
        timed = primary and recording.timed
        queries, query = recording.query_pool, recording.query
        pool = queries.handle if timed else None
        try:
            _check(_lib.vkBeginCommandBuffer(cb, begin), "vkBeginCommandBuffer")
            if timed:
                _lib.vkCmdResetQueryPool(cb, pool, query, 2)
                _lib.vkCmdWriteTimestamp(cb, _vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, pool, query)
            command = recording.entry.command
            if isinstance(command, Dispatch):
                self._record_dispatch(cb, command)
            else:
                self._record_copy(cb, command)
            stages = self._queue.work_stages
            after = stages | _vk.VK_PIPELINE_STAGE_HOST_BIT
            _lib.vkCmdPipelineBarrier(cb, stages, after, 0, 1, self._queue.barrier, 0, _ffi.NULL, 0, _ffi.NULL)
            if timed:
                _lib.vkCmdWriteTimestamp(cb, _vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, query + 1)
                self._timestamps.copy_results(cb, queries, query, 2)
            _check(_lib.vkEndCommandBuffer(cb), "vkEndCommandBuffer")
        except BaseException:
            _lib.vkResetCommandBuffer(cb, 0)  # back to the initial state, ready for another try
            raise

    def _record_dispatch(self, cb: Any, d: Dispatch) -> None:
        """Bind, push descriptors and constants, dispatch."""
        bind_point = _vk.VK_PIPELINE_BIND_POINT_COMPUTE
        pipeline = d.pipeline
        _lib.vkCmdBindPipeline(cb, bind_point, pipeline._pipeline)
        if d.buffers:
            writes = self._bindings.get((pipeline, d.buffers)) or self._binding(pipeline, d.buffers)
            self._push_descriptor_set(cb, bind_point, pipeline._layout, 0, len(d.buffers), writes[0])
        if d.push:
            stage = _vk.VK_SHADER_STAGE_COMPUTE_BIT
            _lib.vkCmdPushConstants(cb, pipeline._layout, stage, 0, len(d.push), _ffi.from_buffer(d.push))
        _lib.vkCmdDispatch(cb, *d.groups)

    def _binding(self, pipeline: Pipeline, buffers: tuple[tuple[DeviceBuffer, int], ...]) -> tuple[Any, Any]:
        """Validate a (pipeline, buffers) binding and cache its descriptor writes.

        Many commands share a binding and differ only in groups or push constants, so
        the checks and the cffi arrays are made once per binding. The table is cleared
        when it grows past four times the cache size, and purged of a destroyed object.
        """
        if not isinstance(pipeline, Pipeline) or pipeline._device is not self._instance:
            raise InvalidSubmission(f"dispatch names a pipeline that is destroyed or not of this device: {pipeline!r}")
        if len(buffers) != pipeline.binding_count:
            raise InvalidSubmission(f"pipeline takes {pipeline.binding_count} buffers, dispatch binds {len(buffers)}")
        for i, pair in enumerate(buffers):
            if len(pair) != 2:
                raise InvalidSubmission(f"a binding is a (buffer, offset) pair, not {pair!r}")
            if i in pipeline.texel:
                if not isinstance(pair[0], DeviceView) or pair[0]._handle is None or pair[1] != 0:
                    raise InvalidSubmission(f"binding {i} is a texel buffer: it takes a live (DeviceView, 0)")
                continue
            self._check_range(pair[0], pair[1], 1, self._instance.storage_offset_alignment)
        if len(self._bindings) >= 4 * self._cache_size:
            self._bindings.clear()
        writes = self._bindings[(pipeline, buffers)] = self._descriptor_writes(pipeline, buffers)
        return writes

    def _descriptor_writes(self, pipeline: Pipeline, buffers: tuple[tuple[Any, int], ...]) -> tuple[Any, Any]:
        """VkWriteDescriptorSet[] for buffers 0..n-1, each of the pipeline's kind, and their infos (and views): a
        buffer that continues an array of buffers is the next element of its first buffer's binding."""
        physical = self._instance.physical
        infos = _ffi.new("VkDescriptorBufferInfo[]", len(buffers))
        views = _ffi.new("VkBufferView[]", len(buffers))
        writes = _ffi.new("VkWriteDescriptorSet[]", len(buffers))
        binding = element = -1
        for i, (item, offset) in enumerate(buffers):
            binding, element = (binding, element + 1) if i in pipeline.continued else (binding + 1, 0)
            w = writes[i]
            w.sType = _vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
            w.dstBinding = binding
            w.dstArrayElement = element
            w.descriptorCount = 1
            w.descriptorType = _DESCRIPTOR_TYPES[i in pipeline.texel, i in pipeline.uniform]
            if i in pipeline.texel:
                views[i] = item._handle
                w.pTexelBufferView = views + i
                continue
            limit = physical.max_uniform_range if i in pipeline.uniform else physical.max_storage_range
            infos[i] = {"buffer": item._handle, "offset": offset, "range": min(item.size - offset, limit)}
            w.pBufferInfo = infos + i
        return writes, (infos, views)

    def _record_copy(self, cb: Any, c: Copy) -> None:
        """vkCmdCopyBuffer of one region."""
        region = _ffi.new("VkBufferCopy*", {"srcOffset": c.src_offset, "dstOffset": c.dst_offset, "size": c.size})
        _lib.vkCmdCopyBuffer(cb, c.src._handle, c.dst._handle, 1, region)

    # ---------------------------------------------------------------- the cache

    def _new_entry(self, key: tuple, command: Command) -> _Entry:
        """Validate a command seen for the first time and give it a cache entry."""
        if isinstance(command, Dispatch):
            self._validate_dispatch(command)
        elif isinstance(command, Copy):
            self._validate_copy(command)
        else:
            raise InvalidSubmission(f"not a Dispatch or Copy: {command!r}")
        entry = self._cache[key] = _Entry(key, command)
        return entry

    def _validate_dispatch(self, d: Dispatch) -> None:
        """Check a dispatch against its pipeline and the device limits."""
        pipeline = d.pipeline
        if (pipeline, d.buffers) not in self._bindings:
            self._binding(pipeline, d.buffers)
        groups, limits = d.groups, self._instance.max_group_count
        if len(groups) != 3 or not all(type(g) is int and 0 <= g <= m for g, m in zip(groups, limits)):
            raise InvalidSubmission(f"groups {groups} outside 0..{limits}")
        if len(d.push) % 4 or len(d.push) > pipeline.push_size:
            raise InvalidSubmission(
                f"push constants must be a multiple of 4 up to {pipeline.push_size} bytes (got {len(d.push)})"
            )

    def _validate_copy(self, c: Copy) -> None:
        """Check a copy's ranges."""
        if not isinstance(c.size, int) or c.size <= 0:
            raise InvalidSubmission(f"copy size must be a positive int (got {c.size!r})")
        self._check_range(c.src, c.src_offset, c.size, 1)
        self._check_range(c.dst, c.dst_offset, c.size, 1)
        if c.src is c.dst and abs(c.src_offset - c.dst_offset) < c.size:
            raise InvalidSubmission("copy source and destination overlap")

    def _check_range(self, buf: Any, offset: Any, size: int, alignment: int) -> None:
        """``buf`` is a live buffer of this device holding ``size`` bytes at an aligned ``offset``."""
        if not isinstance(buf, DeviceBuffer) or buf._device is not self._instance:
            raise InvalidSubmission(f"command names a buffer that is destroyed or not of this device: {buf!r}")
        if not isinstance(offset, int) or offset < 0 or offset % alignment or offset + size > buf.size:
            raise InvalidSubmission(
                f"range at offset {offset!r} of {size} bytes does not fit {buf!r} (offsets align to {alignment})"
            )

    def _shrink(self) -> None:
        """Drop least recently used entries with idle recordings until within ``cache_size``."""
        excess = self._recording_count - self._cache_size
        if excess <= 0:
            return
        victims = []
        for entry in self._cache.values():
            if excess <= 0:
                break
            idle = len(entry.free[0]) + len(entry.free[1])
            if idle:
                victims.append(entry)
                excess -= idle
        for entry in victims:
            self._drop_entry(entry)

    def _drop_entry(self, entry: _Entry) -> None:
        """Forget a key: free its idle recordings now, in-flight ones on release."""
        entry.alive = False
        self._cache.pop(entry.key, None)
        for free in entry.free:
            for recording in free:
                self._free_recording(recording)
            free.clear()
        if entry.count:
            self._retired.add(entry)  # still in flight: destroy_* must see it

    def _free_recording(self, recording: _Recording) -> None:
        """Free a recording's command buffers and give back its query slots."""
        for array in (recording.primary_array, recording.secondary_array):
            if array is not None:
                self._queue.free(array)
        if recording.timed:
            self._timestamps.give_back(recording.query_pool, recording.query)
        entry = recording.entry
        entry.count -= 1
        self._recording_count -= 1
        if not entry.count:
            self._retired.discard(entry)

    def drop_users(self, obj: DeviceBuffer | Pipeline, what: str) -> None:
        """Drop every cache entry and binding naming ``obj`` (a ``what``, for the message), refusing
        while one is in flight: before ``obj`` is destroyed.

        Destroying is rare, so this scans the cache instead of keeping an index that
        every cache miss would pay for.
        """
        named = [e for e in (*self._cache.values(), *self._retired) if obj in _named_objects(e.command)]
        busy = sum(entry.busy() for entry in named)
        if busy:
            raise InvalidSubmission(f"{what} {obj!r} is used by {busy} command(s) of unreleased submissions")
        for entry in named:
            self._drop_entry(entry)
        stale = [key for key in self._bindings
                 if obj is key[0] or any(obj is buf or obj is getattr(buf, "buffer", None) for buf, _ in key[1])]
        for key in stale:
            del self._bindings[key]

    def close(self) -> None:
        """Forget every entry (Device.close: the command pool takes their command buffers)."""
        for entry in self._cache.values():
            entry.alive = False
        self._cache.clear()
        self._bindings.clear()
        self._retired.clear()


def _named_objects(command: Command) -> tuple[Any, ...]:
    """The pipeline and buffers a cached command names (a texel view names its buffer too)."""
    if isinstance(command, Dispatch):
        return (command.pipeline, *(buf for buf, _ in command.buffers),
                *(buf.buffer for buf, _ in command.buffers if isinstance(buf, DeviceView)))
    assert isinstance(command, Copy)
    return (command.src, command.dst)
