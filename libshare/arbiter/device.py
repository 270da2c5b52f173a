"""The arbiter's Vulkan device layer: one VkDevice, one compute queue, cached commands.

Design
------
The arbiter drains small dispatch descriptors from many clients and must put them on
the device faster than the clients could themselves. The ``vulkan`` package's keyword
wrappers build fresh cffi structs on every call, so recording a command buffer from
Python costs tens of microseconds, more than a tiny dispatch takes on a GPU. This module
therefore records each distinct command once and afterwards only *resubmits* it:

* **Recordings keyed by content.** A :class:`Dispatch` is fully described by its
  pipeline, its ``(buffer, offset)`` bindings, its group counts and its push-constant
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
  binding are made once and cached. Destroying a buffer or pipeline scans the cache
  (destroys are rare, misses are not) and drops every key naming it, so no recording
  outlives the handles it was recorded with.
* **Ordering.** Every recording ends with one memory barrier from compute/transfer
  writes to compute/transfer reads and writes *and* host reads. A barrier covers all
  earlier work in queue submission order, across command buffers and submissions, and
  every command on this queue carries one, so each command sees the writes of all
  commands submitted before it (the "barrier before each command" of the brief, placed
  after instead so one barrier also serves the host), and the host sees the device's
  writes once the fence has signalled. Host writes to imported host-coherent memory are
  visible to the device at ``vkQueueSubmit``.
* **New device buffers read as zeros.** Device memory is recycled: on lavapipe a freed
  buffer of up to a few hundred KiB comes back, contents and all, in the next allocation
  of a similar size, and across clients that leaks one tenant's data to another (21 of
  24 fresh buffers of 4-256 KiB held the previous client's pattern). :meth:`alloc_device`
  therefore queues a ``vkCmdFillBuffer`` of zeros and its barrier, and waits for nothing:
  every command that can name the buffer is submitted later on the same queue and so
  runs after the fill. The fill's fence and command buffer are taken back by later
  allocations and destroys; a buffer destroyed before its fill has run is destroyed
  once it has, and counts until then (:attr:`clearing_bytes`, which the arbiter's memory
  limits include). A fill touches every page, so an allocation costs what its first use
  would have (on lavapipe about 0.6 s of queue time per fresh GiB), paid at once.
* **Timing** (``timed=True``, the default). Timestamps are written with
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

Rules for the caller (the arbiter)
----------------------------------
* A :class:`Device` is not thread-safe: call ``submit``, ``release`` and every
  create/destroy method from one thread. Two exceptions: :meth:`Submission.wait` and
  :meth:`Submission.done` may run in another thread (cffi drops the GIL while waiting),
  and so may :meth:`create_pipeline`, so that a long compile never holds up the thread
  that submits (Vulkan lets pipeline creation run beside anything but the destruction of
  the device; :meth:`close` waits for compiles under way and refuses new ones).
* A buffer or pipeline must not be destroyed while a submission that uses it is
  unreleased; ``destroy_buffer``/``destroy_pipeline`` check this and raise
  :class:`~libshare.errors.InvalidSubmission` rather than free memory the device reads.
* An imported host mapping must stay mapped until its buffer is destroyed.
* Read ``device_ns`` before ``release()``: the query slots are reused afterwards.

Only this module touches the ``vulkan`` package's ``ffi`` and ``lib``; every public
object holds its handles privately.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import time
import uuid as _uuid
from typing import Any, Iterable, Sequence

import numpy as np

from libshare.errors import (
    InvalidSubmission,
    LibshareError,
    QuotaExceeded,
    ServerFault,
    VulkanUnavailable,
)

__all__ = ["Buffer", "Command", "Copy", "Device", "Dispatch", "Pipeline", "Submission"]

_INSTALL_HINT = (
    "install a Vulkan loader and driver, e.g. `apt-get install libvulkan1 "
    "mesa-vulkan-drivers` (Mesa's lavapipe runs Vulkan on the CPU)"
)
_UINT64_MAX = (1 << 64) - 1
_QUERY_CHUNK = 256  # timed recordings per timestamp query pool (two queries each)
_ANY = 2  # _acquire kind: a batch's secondary, which is the same for timed and untimed

# The binding, loaded by the first Device (importing `vulkan` dlopens the loader and
# raises OSError when there is none, so it cannot happen at import time).
_vk: Any = None
_ffi: Any = None
_lib: Any = None


def _load_binding() -> None:
    """Import the ``vulkan`` package, or raise VulkanUnavailable with a hint."""
    global _vk, _ffi, _lib
    if _vk is not None:
        return
    try:
        import vulkan
    except (OSError, ImportError) as exc:
        raise VulkanUnavailable(f"cannot load Vulkan ({exc}); {_INSTALL_HINT}") from None
    _vk, _ffi, _lib = vulkan, vulkan.ffi, vulkan.lib


# --------------------------------------------------------------------------- errors


def _result_name(result: int) -> str:
    """The VK_* name of a VkResult, for messages."""
    for name, value in vars(_vk).items():
        if isinstance(value, int) and value == result and name.startswith("VK_ERROR_"):
            return name
    return f"VkResult {result}"


def _error(result: int, what: str) -> LibshareError:
    """Map a failing VkResult to the libshare exception that says what it means."""
    message = f"{what} failed with {_result_name(result)}"
    if result == _vk.VK_ERROR_DEVICE_LOST:
        return ServerFault(f"{message}: the Vulkan device was lost; restart the arbiter")
    if result in (_vk.VK_ERROR_OUT_OF_HOST_MEMORY, _vk.VK_ERROR_OUT_OF_DEVICE_MEMORY):
        return QuotaExceeded(f"{message}: the device or host is out of memory")
    if result == _vk.VK_ERROR_INVALID_EXTERNAL_HANDLE:
        return InvalidSubmission(f"{message}: the driver refused the host memory")
    if result in (
        _vk.VK_ERROR_INITIALIZATION_FAILED,
        _vk.VK_ERROR_INCOMPATIBLE_DRIVER,
        _vk.VK_ERROR_EXTENSION_NOT_PRESENT,
        _vk.VK_ERROR_FEATURE_NOT_PRESENT,
        _vk.VK_ERROR_LAYER_NOT_PRESENT,
    ):
        return VulkanUnavailable(f"{message}; {_INSTALL_HINT}")
    return LibshareError(message)


def _check(result: Any, what: str) -> None:
    """Raise the mapped exception when a Vulkan call returned an error code."""
    if result is not None and result < 0:
        raise _error(result, what)


# ----------------------------------------------------------------- small ffi helpers


def _struct(ctype: str, stype: str, **fields: Any) -> Any:
    """A zeroed ``ctype*`` with ``sType`` set from ``VK_STRUCTURE_TYPE_<stype>``."""
    return _ffi.new(ctype + "*", dict(fields, sType=getattr(_vk, "VK_STRUCTURE_TYPE_" + stype)))


def _create(fn: Any, ctype: str, what: str, *args: Any) -> Any:
    """Call a vkCreate*/vkAllocate*-style function and return the handle it wrote."""
    out = _ffi.new(ctype + "*")
    _check(fn(*args, out), what)
    return out[0]


def _enumerate(fn: Any, ctype: str, *args: Any) -> Any:
    """The two-call idiom: ask for the count, then fill and return a ``ctype`` array.

    Keep the array itself: indexing it yields views that do not keep it alive.
    """
    count = _ffi.new("uint32_t*")
    _check(fn(*args, count, _ffi.NULL), "vkEnumerate*/vkGet*")
    items = _ffi.new(ctype + "[]", count[0])
    _check(fn(*args, count, items), "vkEnumerate*/vkGet*")
    return items


def _text(chars: Any) -> str:
    """A Python string from a fixed-size C char array."""
    return _ffi.string(chars).decode("utf-8", "replace")


def _address(handle: Any) -> int:
    """A Vulkan handle or struct pointer of the ``vulkan`` package as an integer (0 for NULL)."""
    return int(_ffi.cast("uintptr_t", handle))


def _timeout_ns(timeout: float | None) -> int:
    """Seconds (None: forever) as the uint64 nanoseconds vkWaitForFences takes."""
    if timeout is None:
        return _UINT64_MAX
    if 0 <= timeout < 1e10:
        return int(timeout * 1e9)
    return 0 if timeout < 0 else _UINT64_MAX


def _memory_barrier(src_access: int, dst_access: int) -> Any:
    """A prebuilt VkMemoryBarrier."""
    return _struct("VkMemoryBarrier", "MEMORY_BARRIER", srcAccessMask=src_access, dstAccessMask=dst_access)


# ------------------------------------------------------------------- public objects


class Buffer:
    """A VkBuffer bound to its memory: imported host memory or device-local memory.

    ``kind`` is ``"host"`` (imported with VK_EXT_external_memory_host at ``address``)
    or ``"device"``. Buffers hash by identity; commands name them in their keys.
    """

    __slots__ = ("kind", "size", "address", "_device", "_handle", "_memory", "_backing")

    def __init__(self, device: Device, kind: str, size: int, address: int, handle: Any, memory: Any):
        self.kind = kind
        self.size = size
        self.address = address
        self._device: Device | None = device
        self._handle = handle
        self._memory = memory
        self._backing: mmap.mmap | None = None  # anonymous memory a CPU device's "device" buffer lives in

    @property
    def alive(self) -> bool:
        """False once destroyed (or once its device closed)."""
        return self._device is not None

    @property
    def native(self) -> int:
        """The VkBuffer handle as an integer, for a native engine."""
        return _address(self._handle)

    def __repr__(self) -> str:
        state = "" if self.alive else ", destroyed"
        return f"<Buffer {self.kind} size={self.size}{state}>"


class Pipeline:
    """A compute pipeline: SPIR-V, ``binding_count`` storage buffers in set 0, push size."""

    __slots__ = ("binding_count", "push_size", "_device", "_pipeline", "_layout", "_set_layout")

    def __init__(self, device: Device, binding_count: int, push_size: int, pipeline: Any, layout: Any, set_layout: Any):
        self.binding_count = binding_count
        self.push_size = push_size
        self._device: Device | None = device
        self._pipeline = pipeline
        self._layout = layout
        self._set_layout = set_layout

    @property
    def alive(self) -> bool:
        """False once destroyed (or once its device closed)."""
        return self._device is not None

    @property
    def native(self) -> tuple[int, int]:
        """The (VkPipeline, VkPipelineLayout) handles as integers, for a native engine."""
        return _address(self._pipeline), _address(self._layout)

    def __repr__(self) -> str:
        return f"<Pipeline bindings={self.binding_count} push={self.push_size}{'' if self.alive else ', destroyed'}>"


class Command:
    """Something :meth:`Device.submit` runs. Immutable once built; ``key`` names it.

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
        buffers: Iterable[tuple[Buffer, int]],
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

    def __init__(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, size: int):
        self.src = src
        self.src_offset = src_offset
        self.dst = dst
        self.dst_offset = dst_offset
        self.size = size
        self.key = ("copy", src, src_offset, dst, dst_offset, size)

    def __repr__(self) -> str:
        return f"Copy({self.src!r}, {self.src_offset}, {self.dst!r}, {self.dst_offset}, {self.size})"


# ---------------------------------------------------------------- cache internals


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


# --------------------------------------------------------------------- submission


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
        if self._complete or (self._device._closed and not self._device._abandoned):
            return True
        result = self._device._get_fence_status(self._device._handle, self._fence.handle)
        if result == 0:
            self._complete = True
            return True
        if result < 0:
            raise _error(result, "vkGetFenceStatus")
        return False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done or ``timeout`` seconds passed (None: no limit); True if done.

        A dispatch may never end: the arbiter always passes a timeout.
        """
        if self._complete or (self._device._closed and not self._device._abandoned):
            return True
        device = self._device
        result = device._wait_for_fences(device._handle, 1, self._fence.array, 1, _timeout_ns(timeout))
        if result == 0:
            self._complete = True
            return True
        if result < 0:
            raise _error(result, "vkWaitForFences")
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


# ------------------------------------------------------------------------- device


class Device:
    """Owns the instance, physical device, device, one compute queue, a command pool
    and the timestamp query pools, and runs :class:`Command` lists on them.

    ``selector`` picks the physical device: None or "" the first, a decimal string an
    index, anything else a device UUID (dashes and case ignored). ``cache_size`` bounds
    the number of recorded commands kept for reuse.
    """

    def __init__(self, selector: str | None = None, *, cache_size: int = 1024):
        _load_binding()
        self._closed = True  # until everything exists, close() has nothing to do
        self._compiles = 0  # create_pipeline calls under way, on any thread
        self._compile_guard = threading.Condition()
        self._handle: Any = None
        self._command_pool: Any = None
        self._instance = _create_instance()
        try:
            self._open(selector, cache_size)
        except BaseException:
            self._destroy_device()
            raise
        self._closed = False

    # -------------------------------------------------------------- construction

    def _open(self, selector: str | None, cache_size: int) -> None:
        """Pick the physical device, read its properties, create device and pools."""
        handles = _enumerate(_lib.vkEnumeratePhysicalDevices, "VkPhysicalDevice", self._instance)
        devices = [_PhysicalInfo(handle) for handle in handles]
        info = _select(devices, selector)
        self._physical = info
        self.index: int = devices.index(info)
        self.name: str = info.name
        self.uuid: str = info.uuid
        self.max_group_count: tuple[int, int, int] = info.max_group_count
        self.max_push_constants_size: int = info.max_push_constants_size
        self.host_import_alignment: int = info.host_import_alignment
        self.storage_offset_alignment: int = info.storage_offset_alignment
        self.max_workgroup_size: tuple[int, int, int] = info.max_workgroup_size
        self.max_workgroup_invocations: int = info.max_workgroup_invocations
        self.max_shared_memory: int = info.max_shared_memory
        self.timestamp_period_ns: float = info.timestamp_period
        self.cpu: bool = info.cpu
        """True for a device that runs on the host's CPU (lavapipe): its memory is the host's."""
        self.local_heap_size: int = info.local_heap_size()
        """Bytes in the device's largest device-local memory heap."""
        self._family, valid_bits = info.compute_family()
        self._timestamp_mask = (1 << valid_bits) - 1 if valid_bits else 0
        self._handle = _create_device(info, self._family)
        queue = _ffi.new("VkQueue*")
        _lib.vkGetDeviceQueue(self._handle, self._family, 0, queue)
        self._queue = queue[0]
        self._load_functions()
        self._create_pools(cache_size)

    def _load_functions(self) -> None:
        """Bind the hot-path and extension entry points once."""
        self._queue_submit = _lib.vkQueueSubmit
        self._wait_for_fences = _lib.vkWaitForFences
        self._reset_fences = _lib.vkResetFences
        self._get_fence_status = _lib.vkGetFenceStatus
        self._push_descriptor_set = self._device_function("vkCmdPushDescriptorSetKHR")
        self._host_pointer_properties = (
            self._device_function("vkGetMemoryHostPointerPropertiesEXT") if self.host_import_alignment else None
        )

    def _device_function(self, name: str) -> Any:
        """An extension function of this device, cast to its PFN type."""
        pointer = _lib.vkGetDeviceProcAddr(self._handle, name.encode())
        if pointer == _ffi.NULL:
            raise VulkanUnavailable(f"{self.name} does not provide {name}")
        return _ffi.cast("PFN_" + name, pointer)

    def _create_pools(self, cache_size: int) -> None:
        """The command pool, the free lists, the cache and the prebuilt structs."""
        info = _struct(
            "VkCommandPoolCreateInfo", "COMMAND_POOL_CREATE_INFO",
            flags=_vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self._family,
        )
        self._command_pool = _create(
            _lib.vkCreateCommandPool, "VkCommandPool", "vkCreateCommandPool", self._handle, info, _ffi.NULL
        )
        self._fences: list[_Fence] = []
        self._all_fences: list[_Fence] = []
        self._batches: list[_Batch] = []  # idle ones
        self._all_batches: list[_Batch] = []
        self._query_pools: list[_QueryPool] = []
        self._free_queries: list[tuple[_QueryPool, int]] = []
        self._cache: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()
        self._bindings: dict[tuple, tuple[Any, Any]] = {}  # (pipeline, buffers) -> descriptor writes
        self._retired: set[_Entry] = set()  # dropped entries with recordings still in flight
        self._cache_size = max(int(cache_size), 1)
        self._recording_count = 0
        self._buffers: set[Buffer] = set()
        self._fills: list[tuple[Buffer, _Fence, Any]] = []  # zero fills queued: (buffer, fence, command buffer)
        self._doomed: set[Buffer] = set()  # destroyed by the caller while their zero fill runs
        self._pipelines: set[Pipeline] = set()
        self._build_prebuilt()

    def _build_prebuilt(self) -> None:
        """Structs every recording or submission reuses."""
        write = _vk.VK_ACCESS_SHADER_WRITE_BIT | _vk.VK_ACCESS_TRANSFER_WRITE_BIT
        access = write | _vk.VK_ACCESS_SHADER_READ_BIT | _vk.VK_ACCESS_TRANSFER_READ_BIT | _vk.VK_ACCESS_HOST_READ_BIT
        self._work_stages = _vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | _vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        self._barrier = _memory_barrier(write, access)
        self._results_barrier = _memory_barrier(_vk.VK_ACCESS_TRANSFER_WRITE_BIT, _vk.VK_ACCESS_HOST_READ_BIT)
        self._inheritance = _struct("VkCommandBufferInheritanceInfo", "COMMAND_BUFFER_INHERITANCE_INFO")
        self._begin_secondary = _struct(
            "VkCommandBufferBeginInfo", "COMMAND_BUFFER_BEGIN_INFO", pInheritanceInfo=self._inheritance
        )
        self._begin_primary = _struct("VkCommandBufferBeginInfo", "COMMAND_BUFFER_BEGIN_INFO")
        self._begin_batch = _struct(
            "VkCommandBufferBeginInfo", "COMMAND_BUFFER_BEGIN_INFO",
            flags=_vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
        )
        self._empty_info = _struct("VkSubmitInfo", "SUBMIT_INFO")
        self._allocate_infos = {
            level: _struct(
                "VkCommandBufferAllocateInfo", "COMMAND_BUFFER_ALLOCATE_INFO", commandPool=self._command_pool,
                level=level, commandBufferCount=1,
            )
            for level in (_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, _vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)
        }

    def _destroy_device(self) -> None:
        """Destroy the command pool, device and instance (what the constructor made first)."""
        if self._handle is not None:
            if self._command_pool is not None:
                _lib.vkDestroyCommandPool(self._handle, self._command_pool, _ffi.NULL)
            _lib.vkDestroyDevice(self._handle, _ffi.NULL)
            self._handle = None
        _lib.vkDestroyInstance(self._instance, _ffi.NULL)

    # --------------------------------------------------------------------- memory

    def import_host(self, address: int, size: int) -> Buffer:
        """Wrap ``size`` bytes of host memory at ``address`` in a storage buffer, zero-copy.

        Both must be multiples of :attr:`host_import_alignment` (an mmap'd region is);
        the mapping must stay mapped until the buffer is destroyed.
        """
        self._require_open()
        alignment = self.host_import_alignment
        if not alignment:
            raise VulkanUnavailable(f"{self.name} lacks VK_EXT_external_memory_host; host buffers cannot be imported")
        if size <= 0 or address <= 0 or address % alignment or size % alignment:
            raise InvalidSubmission(
                f"host import needs a non-empty region whose address and size are multiples of "
                f"{alignment} bytes (got address {address:#x}, size {size})"
            )
        handle_type = _vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
        pointer = _ffi.cast("void*", address)
        buffer = self._create_buffer(size, handle_type)
        try:
            type_index = self._host_memory_type(buffer, size, handle_type, pointer)
            imported = _struct(
                "VkImportMemoryHostPointerInfoEXT", "IMPORT_MEMORY_HOST_POINTER_INFO_EXT",
                handleType=handle_type, pHostPointer=pointer,
            )
            memory = self._allocate(size, type_index, imported, buffer)
        except BaseException:
            _lib.vkDestroyBuffer(self._handle, buffer, _ffi.NULL)
            raise
        return self._track(Buffer(self, "host", size, address, buffer, memory))

    def alloc_device(self, size: int) -> Buffer:
        """A device-local buffer of ``size`` bytes, filled and read with :class:`Copy`; it reads as zeros.

        On a CPU device (lavapipe) with host import, the buffer is anonymous memory of this
        process imported like a shared buffer: the kernel hands out zeroed pages as they are
        first touched, so nothing has to be filled, memory never written costs nothing, and
        a destroyed buffer's memory goes back to the kernel at once (a driver's allocator
        would keep it and hand it, data and all, to the next buffer). Elsewhere the buffer is
        filled with zeros on the queue before any command can read it (:meth:`_fill_zeros`).
        """
        self._require_open()
        if size <= 0:
            raise InvalidSubmission(f"buffer size must be positive (got {size})")
        if self.cpu and self.host_import_alignment:
            return self._alloc_anonymous(size)
        buffer = self._create_buffer(size, 0)
        try:
            requirements = self._requirements(buffer)
            device_local = _vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
            type_index = self._physical.memory_type(requirements.memoryTypeBits, device_local)
            memory = self._allocate(requirements.size, type_index, _ffi.NULL, buffer)
        except BaseException:
            _lib.vkDestroyBuffer(self._handle, buffer, _ffi.NULL)
            raise
        self._finish_fills()
        tracked = self._track(Buffer(self, "device", size, 0, buffer, memory))
        try:
            self._fill_zeros(tracked)
        except BaseException:
            self.destroy_buffer(tracked)
            raise
        return tracked

    def _alloc_anonymous(self, size: int) -> Buffer:
        """A "device" buffer of a CPU device: fresh anonymous pages, imported."""
        rounded = -(-size // self.host_import_alignment) * self.host_import_alignment
        backing = mmap.mmap(-1, rounded, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        address = np.frombuffer(backing, np.uint8, count=1).ctypes.data  # the view goes at once: close() works
        try:
            buf = self.import_host(address, rounded)
        except BaseException:
            backing.close()
            raise
        buf.kind, buf.size, buf._backing = "device", size, backing
        return buf

    @property
    def clearing_bytes(self) -> int:
        """Bytes of destroyed device buffers whose zero fill has not run yet (freed once it has)."""
        self._finish_fills()
        return sum(buf.size for buf in self._doomed)

    def _fill_zeros(self, buf: Buffer) -> None:
        """Queue a fill of zeros over a new device buffer: its memory may hold a freed buffer's data.

        Nothing waits for it: every later command on the queue runs after the fill and its
        barrier, so none can read what the memory held before. The fill's fence and command
        buffer come back in :meth:`_finish_fills`.
        """
        array = self._allocate_command_buffer(_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY)
        fence = self._fences.pop() if self._fences else self._new_fence()
        try:
            cb = array[0]
            _check(_lib.vkBeginCommandBuffer(cb, self._begin_batch), "vkBeginCommandBuffer")
            _lib.vkCmdFillBuffer(cb, buf._handle, 0, _UINT64_MAX, 0)  # VK_WHOLE_SIZE
            stages = self._work_stages
            _lib.vkCmdPipelineBarrier(cb, stages, stages, 0, 1, self._barrier, 0, _ffi.NULL, 0, _ffi.NULL)
            _check(_lib.vkEndCommandBuffer(cb), "vkEndCommandBuffer")
            info = _struct("VkSubmitInfo", "SUBMIT_INFO", commandBufferCount=1, pCommandBuffers=array)
            _check(self._queue_submit(self._queue, 1, info, fence.handle), "vkQueueSubmit")
        except BaseException:
            self._fences.append(fence)  # never submitted: still unsignalled
            _lib.vkFreeCommandBuffers(self._handle, self._command_pool, 1, array)
            raise
        self._fills.append((buf, fence, array))

    def _finish_fills(self) -> None:
        """Take back the fence and command buffer of every fill that has run; destroy the buffers
        freed while theirs ran."""
        running = []
        for fill in self._fills:
            buf, fence, array = fill
            if self._get_fence_status(self._handle, fence.handle) != _vk.VK_SUCCESS:
                running.append(fill)  # not yet (or the device is lost: close() frees it all)
                continue
            self._recycle(fence, None, [])
            _lib.vkFreeCommandBuffers(self._handle, self._command_pool, 1, array)
            if buf in self._doomed:
                self._doomed.discard(buf)
                self._buffers.discard(buf)
                _destroy_buffer_handles(self._handle, buf)
        self._fills = running

    def destroy_buffer(self, buf: Buffer) -> None:
        """Destroy ``buf`` and free its memory (not the host mapping). Idempotent.

        Raises InvalidSubmission while an unreleased submission uses it.
        """
        if not buf.alive or self._closed or buf in self._doomed:
            return
        self._drop_users(buf, "buffer")
        self._finish_fills()
        if any(fill[0] is buf for fill in self._fills):  # its zero fill still runs: destroy it after
            self._doomed.add(buf)
            return
        self._buffers.discard(buf)
        _destroy_buffer_handles(self._handle, buf)

    def _create_buffer(self, size: int, handle_types: int) -> Any:
        """A storage/transfer VkBuffer, external for ``handle_types`` when non-zero."""
        usage = (
            _vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
            | _vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | _vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        )
        external = _ffi.NULL
        if handle_types:
            external = _struct(
                "VkExternalMemoryBufferCreateInfo", "EXTERNAL_MEMORY_BUFFER_CREATE_INFO", handleTypes=handle_types
            )
        info = _struct(
            "VkBufferCreateInfo", "BUFFER_CREATE_INFO", pNext=external, size=size, usage=usage,
            sharingMode=_vk.VK_SHARING_MODE_EXCLUSIVE,
        )
        return _create(_lib.vkCreateBuffer, "VkBuffer", "vkCreateBuffer", self._handle, info, _ffi.NULL)

    def _requirements(self, buffer: Any) -> Any:
        """vkGetBufferMemoryRequirements."""
        out = _ffi.new("VkMemoryRequirements*")
        _lib.vkGetBufferMemoryRequirements(self._handle, buffer, out)
        return out

    def _host_memory_type(self, buffer: Any, size: int, handle_type: int, pointer: Any) -> int:
        """A memory type allowed for both the buffer and the host pointer, coherent if possible."""
        requirements = self._requirements(buffer)
        if requirements.size > size:
            raise InvalidSubmission(f"the driver needs {requirements.size} bytes to back a {size}-byte buffer")
        props = _struct("VkMemoryHostPointerPropertiesEXT", "MEMORY_HOST_POINTER_PROPERTIES_EXT")
        result = self._host_pointer_properties(self._handle, handle_type, pointer, props)
        _check(result, "vkGetMemoryHostPointerPropertiesEXT")
        allowed = props.memoryTypeBits & requirements.memoryTypeBits
        if not allowed:
            raise InvalidSubmission("no memory type can import this host pointer for a storage buffer")
        return self._physical.memory_type(allowed, _vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)

    def _allocate(self, size: int, type_index: int, next_struct: Any, buffer: Any) -> Any:
        """Allocate (or import) memory and bind ``buffer`` to it at offset 0."""
        info = _struct(
            "VkMemoryAllocateInfo", "MEMORY_ALLOCATE_INFO", pNext=next_struct, allocationSize=size,
            memoryTypeIndex=type_index,
        )
        memory = _create(_lib.vkAllocateMemory, "VkDeviceMemory", "vkAllocateMemory", self._handle, info, _ffi.NULL)
        result = _lib.vkBindBufferMemory(self._handle, buffer, memory, 0)
        if result < 0:
            _lib.vkFreeMemory(self._handle, memory, _ffi.NULL)
            raise _error(result, "vkBindBufferMemory")
        return memory

    def _track(self, buf: Buffer) -> Buffer:
        """Remember a live buffer so close() can free it."""
        self._buffers.add(buf)
        return buf

    # ------------------------------------------------------------------ pipelines

    def create_pipeline(self, spirv: bytes, binding_count: int, push_size: int, entry: str = "main") -> Pipeline:
        """A compute pipeline whose bindings 0..binding_count-1 of set 0 are storage
        buffers (pushed per dispatch with VK_KHR_push_descriptor, no descriptor pools)
        and whose push-constant block is ``push_size`` bytes.
        """
        self._check_pipeline_args(spirv, binding_count, push_size)
        with self._compile_guard:
            self._require_open()
            self._compiles += 1
        result = None
        try:
            result = self._build_pipeline(spirv, binding_count, push_size, entry)
        finally:
            with self._compile_guard:  # close() waits for this, so it destroys the new pipeline too
                if result is not None:
                    self._pipelines.add(result)
                self._compiles -= 1
                self._compile_guard.notify_all()
        return result

    def _build_pipeline(self, spirv: bytes, binding_count: int, push_size: int, entry: str) -> Pipeline:
        """Create the set layout, layout, module and pipeline; destroy the parts on failure."""
        set_layout = self._create_set_layout(binding_count)
        layout = module = None
        try:
            layout = self._create_layout(set_layout, push_size)
            module = self._create_module(spirv)
            pipeline = self._create_compute(module, layout, entry)
        except BaseException:
            if layout is not None:
                _lib.vkDestroyPipelineLayout(self._handle, layout, _ffi.NULL)
            _lib.vkDestroyDescriptorSetLayout(self._handle, set_layout, _ffi.NULL)
            raise
        finally:
            if module is not None:
                _lib.vkDestroyShaderModule(self._handle, module, _ffi.NULL)
        return Pipeline(self, binding_count, push_size, pipeline, layout, set_layout)

    def destroy_pipeline(self, p: Pipeline) -> None:
        """Destroy ``p``. Idempotent; raises InvalidSubmission while work using it is unreleased."""
        if not p.alive or self._closed:
            return
        self._drop_users(p, "pipeline")
        self._pipelines.discard(p)
        _destroy_pipeline_handles(self._handle, p)

    def _check_pipeline_args(self, spirv: bytes, binding_count: int, push_size: int) -> None:
        """Reject what the driver would otherwise trip over."""
        if len(spirv) < 20 or len(spirv) % 4 or int.from_bytes(spirv[:4], "little") != 0x07230203:
            raise InvalidSubmission("not a SPIR-V module (bad length or magic number)")
        limit = self._physical.max_push_descriptors
        if not 0 <= binding_count <= limit:
            raise InvalidSubmission(f"binding_count must be 0..{limit} (got {binding_count})")
        if push_size < 0 or push_size % 4 or push_size > self.max_push_constants_size:
            raise InvalidSubmission(
                f"push_size must be a multiple of 4 up to {self.max_push_constants_size} bytes (got {push_size})"
            )

    def _create_set_layout(self, binding_count: int) -> Any:
        """A push-descriptor set layout of ``binding_count`` storage buffers."""
        bindings = _ffi.new("VkDescriptorSetLayoutBinding[]", max(binding_count, 1))
        for i in range(binding_count):
            bindings[i].binding = i
            bindings[i].descriptorType = _vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            bindings[i].descriptorCount = 1
            bindings[i].stageFlags = _vk.VK_SHADER_STAGE_COMPUTE_BIT
        info = _struct(
            "VkDescriptorSetLayoutCreateInfo", "DESCRIPTOR_SET_LAYOUT_CREATE_INFO",
            flags=_vk.VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
            bindingCount=binding_count, pBindings=bindings,
        )
        return _create(
            _lib.vkCreateDescriptorSetLayout, "VkDescriptorSetLayout", "vkCreateDescriptorSetLayout",
            self._handle, info, _ffi.NULL,
        )

    def _create_layout(self, set_layout: Any, push_size: int) -> Any:
        """The pipeline layout: one set, one compute push-constant range."""
        ranges = _ffi.new("VkPushConstantRange*", {"stageFlags": _vk.VK_SHADER_STAGE_COMPUTE_BIT, "size": push_size})
        set_layouts = _ffi.new("VkDescriptorSetLayout[1]", [set_layout])
        info = _struct(
            "VkPipelineLayoutCreateInfo", "PIPELINE_LAYOUT_CREATE_INFO",
            setLayoutCount=1, pSetLayouts=set_layouts,
            pushConstantRangeCount=1 if push_size else 0, pPushConstantRanges=ranges,
        )
        return _create(
            _lib.vkCreatePipelineLayout, "VkPipelineLayout", "vkCreatePipelineLayout", self._handle, info, _ffi.NULL
        )

    def _create_module(self, spirv: bytes) -> Any:
        """A shader module from SPIR-V bytes."""
        code = _ffi.new("uint32_t[]", len(spirv) // 4)
        _ffi.memmove(code, spirv, len(spirv))
        info = _struct("VkShaderModuleCreateInfo", "SHADER_MODULE_CREATE_INFO", codeSize=len(spirv), pCode=code)
        return _create(
            _lib.vkCreateShaderModule, "VkShaderModule", "vkCreateShaderModule", self._handle, info, _ffi.NULL
        )

    def _create_compute(self, module: Any, layout: Any, entry: str) -> Any:
        """vkCreateComputePipelines for one stage."""
        name = _ffi.new("char[]", entry.encode())
        stage = {
            "sType": _vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
            "stage": _vk.VK_SHADER_STAGE_COMPUTE_BIT, "module": module, "pName": name,
        }
        info = _struct("VkComputePipelineCreateInfo", "COMPUTE_PIPELINE_CREATE_INFO", stage=stage, layout=layout)
        out = _ffi.new("VkPipeline*")
        result = _lib.vkCreateComputePipelines(self._handle, _ffi.NULL, 1, info, _ffi.NULL, out)
        _check(result, "vkCreateComputePipelines")
        return out[0]

    # ------------------------------------------------------------------ submission

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

    def native_handles(self) -> dict:
        """The raw handles and limits a native engine records and submits with, as integers.

        Keys: ``device`` (VkDevice), ``queue`` (VkQueue), ``family`` (its queue family),
        ``timestamp_mask`` (0: no timestamps), ``timestamp_period_ns``, ``max_storage_range``,
        ``offset_alignment``, ``max_group_count`` (three counts), ``host_memory_type`` (the first
        host-visible, coherent memory type: where timestamps are copied for the host to read).
        """
        self._require_open()
        return {
            "device": _address(self._handle), "queue": _address(self._queue), "family": self._family,
            "timestamp_mask": self._timestamp_mask, "timestamp_period_ns": self.timestamp_period_ns,
            "max_storage_range": self._physical.max_storage_range,
            "offset_alignment": self.storage_offset_alignment, "max_group_count": self.max_group_count,
            "host_memory_type": self._physical.memory_type(
                (1 << 32) - 1, _vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | _vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT),
        }

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

    def _acquire(self, command: Command, kind: int) -> _Recording:
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

    def _primary_info(self, recording: _Recording) -> Any:
        """Record a recording's primary shape; return its prebuilt VkSubmitInfo."""
        if recording.primary_array is None:
            recording.primary_array = array = self._allocate_command_buffer(_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY)
            recording.primary_info = _struct("VkSubmitInfo", "SUBMIT_INFO", commandBufferCount=1, pCommandBuffers=array)
        self._record_body(recording.primary_array[0], recording, self._begin_primary, primary=True)
        recording.submit_info = recording.primary_info
        return recording.submit_info

    def _record_secondary(self, recording: _Recording) -> None:
        """Record a recording's secondary shape, for batches."""
        if recording.secondary_array is None:
            recording.secondary_array = self._allocate_command_buffer(_vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)
        self._record_body(recording.secondary_array[0], recording, self._begin_secondary, primary=False)
        recording.secondary = recording.secondary_array[0]

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

    def _mapped_buffer(self, size: int) -> tuple[Buffer, np.ndarray]:
        """A host-visible, coherent buffer of ``size`` bytes and its mapping (freeing the memory unmaps it)."""
        buffer = self._create_buffer(size, 0)
        try:
            requirements = self._requirements(buffer)
            wanted = _vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | _vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            type_index = self._physical.memory_type(requirements.memoryTypeBits, wanted)
            memory = self._allocate(requirements.size, type_index, _ffi.NULL, buffer)
        except BaseException:
            _lib.vkDestroyBuffer(self._handle, buffer, _ffi.NULL)
            raise
        tracked = self._track(Buffer(self, "device", size, 0, buffer, memory))
        pointer = _ffi.new("void**")
        try:
            _check(_lib.vkMapMemory(self._handle, memory, 0, size, 0, pointer), "vkMapMemory")
        except BaseException:
            self.destroy_buffer(tracked)
            raise
        return tracked, np.frombuffer(_ffi.buffer(pointer[0], size), np.uint8)

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

    # ------------------------------------------------------------------- recording

    def _allocate_command_buffer(self, level: int) -> Any:
        """A VkCommandBuffer[1] holding one new command buffer of ``level``."""
        array = _ffi.new("VkCommandBuffer[1]")
        info = self._allocate_infos[level]
        _check(_lib.vkAllocateCommandBuffers(self._handle, info, array), "vkAllocateCommandBuffers")
        return array

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
            recording.query_pool, recording.query = self._take_queries()
        else:
            self._free_queries.append((recording.query_pool, recording.query))
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
            stages = self._work_stages
            after = stages | _vk.VK_PIPELINE_STAGE_HOST_BIT
            _lib.vkCmdPipelineBarrier(cb, stages, after, 0, 1, self._barrier, 0, _ffi.NULL, 0, _ffi.NULL)
            if timed:
                _lib.vkCmdWriteTimestamp(cb, _vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, query + 1)
                self._copy_results(cb, queries, query, 2)
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

    def _binding(self, pipeline: Pipeline, buffers: tuple[tuple[Buffer, int], ...]) -> tuple[Any, Any]:
        """Validate a (pipeline, buffers) binding and cache its descriptor writes.

        Many commands share a binding and differ only in groups or push constants, so
        the checks and the cffi arrays are made once per binding. The table is cleared
        when it grows past four times the cache size, and purged of a destroyed object.
        """
        if not isinstance(pipeline, Pipeline) or pipeline._device is not self:
            raise InvalidSubmission(f"dispatch names a pipeline that is destroyed or not of this device: {pipeline!r}")
        if len(buffers) != pipeline.binding_count:
            raise InvalidSubmission(f"pipeline takes {pipeline.binding_count} buffers, dispatch binds {len(buffers)}")
        for pair in buffers:
            if len(pair) != 2:
                raise InvalidSubmission(f"a binding is a (buffer, offset) pair, not {pair!r}")
            self._check_range(pair[0], pair[1], 1, self.storage_offset_alignment)
        if len(self._bindings) >= 4 * self._cache_size:
            self._bindings.clear()
        writes = self._bindings[(pipeline, buffers)] = self._descriptor_writes(buffers)
        return writes

    def _descriptor_writes(self, buffers: tuple[tuple[Buffer, int], ...]) -> tuple[Any, Any]:
        """VkWriteDescriptorSet[] for storage buffers at bindings 0..n-1, and their infos."""
        limit = self._physical.max_storage_range
        infos = _ffi.new("VkDescriptorBufferInfo[]", [
            {"buffer": buf._handle, "offset": offset, "range": min(buf.size - offset, limit)} for buf, offset in buffers
        ])
        writes = _ffi.new("VkWriteDescriptorSet[]", len(buffers))
        for i in range(len(buffers)):
            w = writes[i]
            w.sType = _vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
            w.dstBinding = i
            w.descriptorCount = 1
            w.descriptorType = _vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            w.pBufferInfo = infos + i
        return writes, infos

    def _record_copy(self, cb: Any, c: Copy) -> None:
        """vkCmdCopyBuffer of one region."""
        region = _ffi.new("VkBufferCopy*", {"srcOffset": c.src_offset, "dstOffset": c.dst_offset, "size": c.size})
        _lib.vkCmdCopyBuffer(cb, c.src._handle, c.dst._handle, 1, region)

    def _take_queries(self) -> tuple[_QueryPool, int]:
        """A free (pool, first query) pair, growing by one query pool when none is free."""
        if not self._free_queries:
            pool = self._create_query_pool(2 * _QUERY_CHUNK)
            self._query_pools.append(pool)
            self._free_queries.extend((pool, 2 * i) for i in reversed(range(_QUERY_CHUNK)))
        return self._free_queries.pop()

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
        groups, limits = d.groups, self.max_group_count
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
        if not isinstance(buf, Buffer) or buf._device is not self:
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
                _lib.vkFreeCommandBuffers(self._handle, self._command_pool, 1, array)
        if recording.timed:
            self._free_queries.append((recording.query_pool, recording.query))
        entry = recording.entry
        entry.count -= 1
        self._recording_count -= 1
        if not entry.count:
            self._retired.discard(entry)

    def _drop_users(self, obj: Buffer | Pipeline, what: str) -> None:
        """Drop every cache entry and binding naming ``obj``, refusing while one is in flight.

        Destroying is rare, so this scans the cache instead of keeping an index that
        every cache miss would pay for.
        """
        named = [e for e in (*self._cache.values(), *self._retired) if obj in _named_objects(e.command)]
        busy = sum(entry.busy() for entry in named)
        if busy:
            raise InvalidSubmission(f"{what} {obj!r} is used by {busy} command(s) of unreleased submissions")
        for entry in named:
            self._drop_entry(entry)
        stale = [key for key in self._bindings if obj is key[0] or any(obj is buf for buf, _ in key[1])]
        for key in stale:
            del self._bindings[key]

    # --------------------------------------------------------------- lifetime

    _abandoned = False  # close() gave up on work that did not end (see close)

    def close(self, timeout: float | None = None) -> bool:
        """Wait for submitted work to end, then destroy everything; True once destroyed. Idempotent.

        ``timeout`` bounds the wait, in seconds (None: no bound). Vulkan cannot abort a
        dispatch that never ends, and destroying a device under running work is undefined
        (lavapipe would wait for it for ever), so work that has not ended by then leaves the
        device *abandoned*: closed to every use, its handles, memory and driver threads left
        alive for the rest of the process, and close() returns False. The fences say when work
        ends (a lost device fails them at once), so the final vkDeviceWaitIdle never waits.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._compile_guard:
            if self._closed:
                return not self._abandoned
            self._closed = True  # no compile starts from now on; wait for those under way
            if not self._compile_guard.wait_for(lambda: self._compiles == 0, timeout):
                self._abandoned = True
                return False
        free = set(map(id, self._fences))  # reset fences: unsignalled, and nothing will signal them
        pending = [fence.handle for fence in self._all_fences if id(fence) not in free]
        if pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            result = self._wait_for_fences(self._handle, len(pending), _ffi.new("VkFence[]", pending), 1,
                                           _timeout_ns(left))
            if result > 0:  # VK_TIMEOUT: something still runs
                self._abandoned = True
                return False
        _lib.vkDeviceWaitIdle(self._handle)  # idle, or lost (a lost device still gets torn down)
        for buf in self._buffers:
            _destroy_buffer_handles(self._handle, buf)
        for pipeline in self._pipelines:
            _destroy_pipeline_handles(self._handle, pipeline)
        for fence in self._all_fences:
            _lib.vkDestroyFence(self._handle, fence.handle, _ffi.NULL)
        for queries in self._query_pools:
            _lib.vkDestroyQueryPool(self._handle, queries.handle, _ffi.NULL)  # its buffer went with _buffers
        for batch in self._all_batches:
            if batch.query_pool is not None:
                _lib.vkDestroyQueryPool(self._handle, batch.query_pool.handle, _ffi.NULL)
        for entry in self._cache.values():
            entry.alive = False
        self._buffers.clear()
        self._fills.clear()  # their fences and command buffers go with the device
        self._doomed.clear()
        self._pipelines.clear()
        self._cache.clear()
        self._bindings.clear()
        self._retired.clear()
        self._destroy_device()  # the command pool takes every command buffer with it
        return True

    def _require_open(self) -> None:
        """Raise when the device is closed."""
        if self._closed:
            raise InvalidSubmission("the device is closed")

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Device {self.name!r} uuid={self.uuid}{' closed' if self._closed else ''}>"


def _named_objects(command: Command) -> tuple[Any, ...]:
    """The pipeline and buffers a cached command names."""
    if isinstance(command, Dispatch):
        return (command.pipeline, *(buf for buf, _ in command.buffers))
    assert isinstance(command, Copy)
    return (command.src, command.dst)


def _destroy_buffer_handles(device: Any, buf: Buffer) -> None:
    """vkDestroyBuffer + vkFreeMemory, and mark ``buf`` dead."""
    _lib.vkDestroyBuffer(device, buf._handle, _ffi.NULL)
    _lib.vkFreeMemory(device, buf._memory, _ffi.NULL)
    if buf._backing is not None:
        buf._backing.close()  # back to the kernel at once
    buf._device = None


def _destroy_pipeline_handles(device: Any, p: Pipeline) -> None:
    """Destroy a pipeline with its layouts, and mark it dead."""
    _lib.vkDestroyPipeline(device, p._pipeline, _ffi.NULL)
    _lib.vkDestroyPipelineLayout(device, p._layout, _ffi.NULL)
    _lib.vkDestroyDescriptorSetLayout(device, p._set_layout, _ffi.NULL)
    p._device = None


# ------------------------------------------------------ instance and physical devices


def _create_instance() -> Any:
    """A Vulkan 1.1 instance, or VulkanUnavailable when no driver answers."""
    # lavapipe hands every dispatch to a thread pool and waits for it: for the small
    # dispatches an arbiter batches, that handoff costs more than the work (about 20 us
    # against 4 us a command on 2 cores). Inline unless the user chose a pool size;
    # other drivers ignore the variable. It must be set before the driver loads.
    os.environ.setdefault("LP_NUM_THREADS", "0")
    app = _struct(
        "VkApplicationInfo", "APPLICATION_INFO", pApplicationName=_ffi.new("char[]", b"libshare-arbiter"),
        pEngineName=_ffi.new("char[]", b"libshare"), apiVersion=_vk.VK_MAKE_VERSION(1, 1, 0),
    )
    info = _struct("VkInstanceCreateInfo", "INSTANCE_CREATE_INFO", pApplicationInfo=app)
    out = _ffi.new("VkInstance*")
    result = _lib.vkCreateInstance(info, _ffi.NULL, out)
    if result < 0:
        raise VulkanUnavailable(f"vkCreateInstance failed with {_result_name(result)}; {_INSTALL_HINT}")
    return out[0]


class _PhysicalInfo:
    """What the device layer needs to know about one physical device."""

    def __init__(self, handle: Any):
        self.handle = handle
        found = _enumerate(_lib.vkEnumerateDeviceExtensionProperties, "VkExtensionProperties", handle, _ffi.NULL)
        self.extensions = {_text(e.extensionName) for e in found}
        self._read_properties()
        self.families = _enumerate(_lib.vkGetPhysicalDeviceQueueFamilyProperties, "VkQueueFamilyProperties", handle)
        self.memory = _ffi.new("VkPhysicalDeviceMemoryProperties*")
        _lib.vkGetPhysicalDeviceMemoryProperties(handle, self.memory)

    def _read_properties(self) -> None:
        """Name, UUID, limits, push-descriptor and host-import properties."""
        push = _struct("VkPhysicalDevicePushDescriptorPropertiesKHR", "PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR")
        ids = _struct("VkPhysicalDeviceIDProperties", "PHYSICAL_DEVICE_ID_PROPERTIES", pNext=push)
        host = _struct(
            "VkPhysicalDeviceExternalMemoryHostPropertiesEXT", "PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT",
            pNext=ids,
        )
        has_host = "VK_EXT_external_memory_host" in self.extensions
        props = _struct("VkPhysicalDeviceProperties2", "PHYSICAL_DEVICE_PROPERTIES_2", pNext=host if has_host else ids)
        if "VK_KHR_push_descriptor" not in self.extensions:
            ids.pNext = _ffi.NULL
        _lib.vkGetPhysicalDeviceProperties2(self.handle, props)
        p, limits = props.properties, props.properties.limits
        self.name = _text(p.deviceName)
        self.cpu = p.deviceType == _vk.VK_PHYSICAL_DEVICE_TYPE_CPU
        self.api_version = p.apiVersion
        self.uuid = str(_uuid.UUID(bytes=bytes(_ffi.buffer(ids.deviceUUID, 16))))
        self.max_group_count = tuple(limits.maxComputeWorkGroupCount)
        self.max_push_constants_size = limits.maxPushConstantsSize
        self.storage_offset_alignment = limits.minStorageBufferOffsetAlignment
        self.max_storage_range = limits.maxStorageBufferRange
        self.timestamp_period = float(limits.timestampPeriod)
        self.max_push_descriptors = push.maxPushDescriptors if ids.pNext != _ffi.NULL else 0
        self.host_import_alignment = host.minImportedHostPointerAlignment if has_host else 0
        self.max_workgroup_size = tuple(limits.maxComputeWorkGroupSize)
        self.max_workgroup_invocations = limits.maxComputeWorkGroupInvocations
        self.max_shared_memory = limits.maxComputeSharedMemorySize
        features = _ffi.new("VkPhysicalDeviceFeatures*")
        _lib.vkGetPhysicalDeviceFeatures(self.handle, features)
        self.robust_buffer_access = bool(features.robustBufferAccess)

    def local_heap_size(self) -> int:
        """Bytes in the largest device-local memory heap (0 if none is marked device-local)."""
        heaps = self.memory.memoryHeaps
        return max((heaps[i].size for i in range(self.memory.memoryHeapCount)
                    if heaps[i].flags & _vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT), default=0)

    def compute_family(self) -> tuple[int, int]:
        """(index, timestampValidBits) of the best compute queue family.

        Prefers families with timestamps, then compute-only ones (async compute).
        """
        compute, graphics = _vk.VK_QUEUE_COMPUTE_BIT, _vk.VK_QUEUE_GRAPHICS_BIT
        candidates = [
            (f.timestampValidBits > 0, not f.queueFlags & graphics, -i, i)
            for i, f in enumerate(self.families)
            if f.queueFlags & compute and f.queueCount > 0
        ]
        if not candidates:
            raise VulkanUnavailable(f"{self.name} has no compute queue")
        index = max(candidates)[3]
        return index, self.families[index].timestampValidBits

    def memory_type(self, allowed_bits: int, preferred: int) -> int:
        """The first allowed memory type with all ``preferred`` flags, else the first allowed."""
        allowed = [i for i in range(self.memory.memoryTypeCount) if allowed_bits >> i & 1]
        if not allowed:
            raise QuotaExceeded("no memory type of the device fits this buffer")
        for i in allowed:
            if self.memory.memoryTypes[i].propertyFlags & preferred == preferred:
                return i
        return allowed[0]

    def describe(self, index: int) -> str:
        """One line for error messages."""
        return f"{index}: {self.name} (uuid {self.uuid})"


def _select(devices: list[_PhysicalInfo], selector: str | None) -> _PhysicalInfo:
    """Pick by selector, and check the pick can run libshare."""
    if not devices:
        raise VulkanUnavailable(f"the Vulkan loader found no device; {_INSTALL_HINT}")
    chosen = _match(devices, (selector or "").strip())
    if chosen is None:
        found = "; ".join(d.describe(i) for i, d in enumerate(devices))
        raise VulkanUnavailable(f"no Vulkan device matches {selector!r}; found: {found}")
    if chosen.api_version < _vk.VK_MAKE_VERSION(1, 1, 0):
        raise VulkanUnavailable(f"{chosen.name} supports only Vulkan 1.0; libshare needs 1.1")
    if "VK_KHR_push_descriptor" not in chosen.extensions:
        raise VulkanUnavailable(f"{chosen.name} lacks VK_KHR_push_descriptor, which libshare needs")
    if not chosen.robust_buffer_access:
        raise VulkanUnavailable(f"{chosen.name} lacks robustBufferAccess, which bounds client kernels")
    return chosen


def _match(devices: list[_PhysicalInfo], selector: str) -> _PhysicalInfo | None:
    """The device named by index or UUID, or None."""
    if not selector:
        return devices[0]
    if selector.isdecimal():
        index = int(selector)
        return devices[index] if index < len(devices) else None
    wanted = selector.replace("-", "").lower()
    for d in devices:
        if d.uuid.replace("-", "") == wanted:
            return d
    return None


def _create_device(info: _PhysicalInfo, family: int) -> Any:
    """A VkDevice with one queue of ``family``, the extensions libshare uses and bounds checking.

    ``robustBufferAccess`` (and ``robustBufferAccess2`` where the device has
    VK_EXT_robustness2) is enabled so that a client's kernel cannot read or write past the
    buffers bound to it; no other feature is, ``bufferDeviceAddress`` above all: with it a
    kernel could turn any integer into a pointer.
    """
    names = ["VK_KHR_push_descriptor"]
    for optional in ("VK_EXT_external_memory_host", "VK_KHR_portability_subset"):
        if optional in info.extensions:
            names.append(optional)
    features = _ffi.new("VkPhysicalDeviceFeatures*")
    features.robustBufferAccess = 1
    robustness2 = _robustness2(info)
    if robustness2 != _ffi.NULL:
        names.append("VK_EXT_robustness2")
    c_names = [_ffi.new("char[]", n.encode()) for n in names]
    name_array = _ffi.new("char*[]", c_names)
    priority = _ffi.new("float[1]", [1.0])
    queue = _struct(
        "VkDeviceQueueCreateInfo", "DEVICE_QUEUE_CREATE_INFO", queueFamilyIndex=family, queueCount=1,
        pQueuePriorities=priority,
    )
    create = _struct(
        "VkDeviceCreateInfo", "DEVICE_CREATE_INFO", queueCreateInfoCount=1, pQueueCreateInfos=queue,
        enabledExtensionCount=len(names), ppEnabledExtensionNames=name_array, pEnabledFeatures=features,
        pNext=robustness2,
    )
    return _create(_lib.vkCreateDevice, "VkDevice", "vkCreateDevice", info.handle, create, _ffi.NULL)


def _robustness2(info: _PhysicalInfo) -> Any:
    """A feature struct enabling robustBufferAccess2 when the device has it, else NULL."""
    if "VK_EXT_robustness2" not in info.extensions:
        return _ffi.NULL
    wanted = _struct("VkPhysicalDeviceRobustness2FeaturesEXT", "PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT")
    query = _struct("VkPhysicalDeviceFeatures2", "PHYSICAL_DEVICE_FEATURES_2", pNext=wanted)
    _lib.vkGetPhysicalDeviceFeatures2(info.handle, query)
    if not wanted.robustBufferAccess2:
        return _ffi.NULL
    return _struct("VkPhysicalDeviceRobustness2FeaturesEXT", "PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT",
                   robustBufferAccess2=1)
