"""Memory: buffers over imported host memory or device memory, and how they are freed.

:class:`Memory` makes every :class:`DeviceBuffer` of a device and destroys it; it does not know
which commands name a buffer (the recording cache does: the Device asks it before a
destroy, see ``Device.destroy_buffer``).

**New device buffers read as zeros.** Device memory is recycled: on lavapipe a freed
buffer of up to a few hundred KiB comes back, contents and all, in the next allocation
of a similar size, and across clients that leaks one tenant's data to another (21 of
24 fresh buffers of 4-256 KiB held the previous client's pattern). On a CPU device with
host import a new "device" buffer is therefore fresh anonymous pages of this process,
which the kernel hands out zeroed (:attr:`Memory.anonymous`). Elsewhere
:meth:`Memory.alloc_device` queues a ``vkCmdFillBuffer`` of zeros and the queue's
barrier, and waits for nothing: every command that can name the buffer is submitted
later on the same queue and so runs after the fill. The fill's fence and command buffer
are taken back by later allocations and destroys; a buffer destroyed before its fill has
run is destroyed once it has, and counts until then (:attr:`Memory.clearing_bytes`, which
the arbiter's memory limits include). A fill touches every page, so an allocation costs
what its first use would have (on lavapipe about 0.6 s of queue time per fresh GiB), paid
at once.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from libshare.errors import InvalidSubmission, VulkanUnavailable

from libshare.arbiter.device._binding import (_UINT64_MAX, _address, _check, _create, _error, _struct, _uses_binding)
from libshare.arbiter.device._instance import Instance
from libshare.arbiter.device._queue import Queue, _Fence

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding


class DeviceBuffer:
    """A VkBuffer bound to its memory: imported host memory or device-local memory.

    ``kind`` is ``"host"`` (imported with VK_EXT_external_memory_host at ``address``)
    or ``"device"``. Buffers hash by identity; commands name them in their keys.
    """

    __slots__ = ("kind", "size", "address", "_device", "_handle", "_memory", "_backing")

    def __init__(self, device: Instance, kind: str, size: int, address: int, handle: Any, memory: Any):
        self.kind = kind
        self.size = size
        self.address = address
        self._device: Instance | None = device  # the device it lives on; None once destroyed
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
        return f"<DeviceBuffer {self.kind} size={self.size}{state}>"


class DeviceView:
    """A VkBufferView: ``nbytes`` bytes of ``buffer`` from ``offset``, as texels of Vulkan format ``vk_format``."""

    __slots__ = ("buffer", "vk_format", "offset", "nbytes", "_handle")

    def __init__(self, buffer: DeviceBuffer, vk_format: int, offset: int, nbytes: int, handle: Any):
        self.buffer, self.vk_format, self.offset, self.nbytes = buffer, vk_format, offset, nbytes
        self._handle = handle  # None once destroyed

    @property
    def native(self) -> int:
        """The VkBufferView handle as an integer, for a native engine."""
        return _address(self._handle)


class Memory:
    """Buffers of a Device: import, allocation, zero fills, destruction (a part of a Device)."""

    def __init__(self, instance: Instance, queue: Queue):
        self._instance = instance
        self._queue = queue
        self._device = instance.handle  # the VkDevice
        self.anonymous: bool = instance.cpu and bool(instance.host_import_alignment)
        """True when a new device buffer is fresh anonymous pages, imported (a CPU device with
        host import); False when it is device memory filled with zeros on the queue."""
        self._buffers: set[DeviceBuffer] = set()
        self._fills: list[tuple[DeviceBuffer, _Fence, Any]] = []  # zero fills queued: (buffer, fence, command buffer)
        self._doomed: set[DeviceBuffer] = set()  # destroyed by the caller while their zero fill runs
        self._views: set[DeviceView] = set()

    def import_host(self, address: int, size: int) -> DeviceBuffer:
        """Wrap ``size`` bytes of host memory at ``address`` in a storage buffer, zero-copy.

        Both must be multiples of the device's ``host_import_alignment`` (an mmap'd region is);
        the mapping must stay mapped until the buffer is destroyed.
        """
        self._instance.require_open()
        alignment = self._instance.host_import_alignment
        if not alignment:
            raise VulkanUnavailable(f"{self._instance.name} lacks VK_EXT_external_memory_host; host buffers cannot be imported")
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
            _lib.vkDestroyBuffer(self._device, buffer, _ffi.NULL)
            raise
        return self._track(DeviceBuffer(self._instance, "host", size, address, buffer, memory))

    def alloc_device(self, size: int) -> DeviceBuffer:
        """A device-local buffer of ``size`` bytes, filled and read with ``Copy``; it reads as zeros.

        When :attr:`anonymous` (lavapipe), the buffer is anonymous memory of this process
        imported like a shared buffer: the kernel hands out zeroed pages as they are first
        touched, so nothing has to be filled, memory never written costs nothing, and a
        destroyed buffer's memory goes back to the kernel at once (a driver's allocator would
        keep it and hand it, data and all, to the next buffer). Otherwise the buffer is filled
        with zeros on the queue before any command can read it (:meth:`_fill_zeros`).
        """
        self._instance.require_open()
        if size <= 0:
            raise InvalidSubmission(f"buffer size must be positive (got {size})")
        if self.anonymous:
            return self._alloc_anonymous(size)
        buffer = self._create_buffer(size, 0)
        try:
            requirements = self._requirements(buffer)
            device_local = _vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
            type_index = self._instance.physical.memory_type(requirements.memoryTypeBits, device_local)
            memory = self._allocate(requirements.size, type_index, _ffi.NULL, buffer)
        except BaseException:
            _lib.vkDestroyBuffer(self._device, buffer, _ffi.NULL)
            raise
        self._finish_fills()
        tracked = self._track(DeviceBuffer(self._instance, "device", size, 0, buffer, memory))
        try:
            self._fill_zeros(tracked)
        except BaseException:
            self.destroy(tracked)
            raise
        return tracked

    def _alloc_anonymous(self, size: int) -> DeviceBuffer:
        """A "device" buffer of a CPU device: fresh anonymous pages, imported."""
        alignment = self._instance.host_import_alignment
        rounded = -(-size // alignment) * alignment
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

    def _fill_zeros(self, buf: DeviceBuffer) -> None:
        """Queue a fill of zeros over a new device buffer: its memory may hold a freed buffer's data.

        Nothing waits for it: every later command on the queue runs after the fill and its
        barrier, so none can read what the memory held before. The fill's fence and command
        buffer come back in :meth:`_finish_fills`.
        """
        queue = self._queue
        array = queue.allocate(_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY)
        fence = queue.take_fence()
        try:
            cb = array[0]
            _check(_lib.vkBeginCommandBuffer(cb, queue.begin_once), "vkBeginCommandBuffer")
            _lib.vkCmdFillBuffer(cb, buf._handle, 0, _UINT64_MAX, 0)  # VK_WHOLE_SIZE
            stages = queue.work_stages
            _lib.vkCmdPipelineBarrier(cb, stages, stages, 0, 1, queue.barrier, 0, _ffi.NULL, 0, _ffi.NULL)
            _check(_lib.vkEndCommandBuffer(cb), "vkEndCommandBuffer")
            info = _struct("VkSubmitInfo", "SUBMIT_INFO", commandBufferCount=1, pCommandBuffers=array)
            _check(queue.submit(info, fence), "vkQueueSubmit")
        except BaseException:
            queue.put_back(fence)  # never submitted: still unsignalled
            queue.free(array)
            raise
        self._fills.append((buf, fence, array))

    def _finish_fills(self) -> None:
        """Take back the fence and command buffer of every fill that has run; destroy the buffers
        freed while theirs ran."""
        running, queue = [], self._queue
        for fill in self._fills:
            buf, fence, array = fill
            if queue.status(fence) != _vk.VK_SUCCESS:
                running.append(fill)  # not yet (or the device is lost: close() frees it all)
                continue
            queue.recycle(fence)
            queue.free(array)
            if buf in self._doomed:
                self._doomed.discard(buf)
                self._buffers.discard(buf)
                _destroy_buffer_handles(self._device, buf)
        self._fills = running

    def destroyable(self, buf: DeviceBuffer) -> bool:
        """Whether :meth:`destroy` would destroy ``buf``: it is alive, the device open, and it was
        not destroyed already while its zero fill runs."""
        return buf.alive and not self._instance.closed and buf not in self._doomed

    def destroy(self, buf: DeviceBuffer) -> None:
        """Destroy ``buf`` and free its memory (not the host mapping). Idempotent.

        The caller has made sure that no command names it (``Device.destroy_buffer`` asks the
        recording cache, which refuses while an unreleased submission uses it).
        """
        if not self.destroyable(buf):
            return
        self._finish_fills()
        if any(fill[0] is buf for fill in self._fills):  # its zero fill still runs: destroy it after
            self._doomed.add(buf)
            return
        self._buffers.discard(buf)
        _destroy_buffer_handles(self._device, buf)

    def create_view(self, buf: DeviceBuffer, vk_format: int, offset: int, nbytes: int) -> DeviceView:
        """A texel view of ``nbytes`` bytes of ``buf`` from ``offset``. The caller checked the format, the
        offset's alignment and the range (the arbiter's view request: serve/views.py); the view must be
        destroyed before its buffer, once no command names it."""
        self._instance.require_open()
        if not buf.alive or offset < 0 or nbytes <= 0 or offset + nbytes > buf.size:
            raise InvalidSubmission(f"a view of {nbytes} bytes from {offset} does not fit its buffer of {buf.size}")
        info = _struct("VkBufferViewCreateInfo", "BUFFER_VIEW_CREATE_INFO", buffer=buf._handle, format=vk_format,
                       offset=offset, range=nbytes)
        handle = _create(_lib.vkCreateBufferView, "VkBufferView", "vkCreateBufferView", self._device, info, _ffi.NULL)
        view = DeviceView(buf, vk_format, offset, nbytes, handle)
        self._views.add(view)
        return view

    def destroy_view(self, view: DeviceView) -> None:
        """Destroy ``view`` (no command names it any more). Idempotent."""
        if view._handle is None or self._instance.closed:  # (closing destroys every view left)
            return
        _lib.vkDestroyBufferView(self._device, view._handle, _ffi.NULL)
        view._handle = None
        self._views.discard(view)

    def _create_buffer(self, size: int, handle_types: int) -> Any:
        """A storage/transfer VkBuffer, external for ``handle_types`` when non-zero."""
        usage = (
            _vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
            | _vk.VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT  # a kernel may read any buffer as a uniform buffer
            | _vk.VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT  # ... or through a texel view (create_view)
            | _vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT
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
        return _create(_lib.vkCreateBuffer, "VkBuffer", "vkCreateBuffer", self._device, info, _ffi.NULL)

    def _requirements(self, buffer: Any) -> Any:
        """vkGetBufferMemoryRequirements."""
        out = _ffi.new("VkMemoryRequirements*")
        _lib.vkGetBufferMemoryRequirements(self._device, buffer, out)
        return out

    def _host_memory_type(self, buffer: Any, size: int, handle_type: int, pointer: Any) -> int:
        """A memory type allowed for both the buffer and the host pointer, coherent if possible."""
        requirements = self._requirements(buffer)
        if requirements.size > size:
            raise InvalidSubmission(f"the driver needs {requirements.size} bytes to back a {size}-byte buffer")
        props = _struct("VkMemoryHostPointerPropertiesEXT", "MEMORY_HOST_POINTER_PROPERTIES_EXT")
        result = self._instance.host_pointer_properties(self._device, handle_type, pointer, props)
        _check(result, "vkGetMemoryHostPointerPropertiesEXT")
        allowed = props.memoryTypeBits & requirements.memoryTypeBits
        if not allowed:
            raise InvalidSubmission("no memory type can import this host pointer for a storage buffer")
        return self._instance.physical.memory_type(allowed, _vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)

    def _allocate(self, size: int, type_index: int, next_struct: Any, buffer: Any) -> Any:
        """Allocate (or import) memory and bind ``buffer`` to it at offset 0."""
        info = _struct(
            "VkMemoryAllocateInfo", "MEMORY_ALLOCATE_INFO", pNext=next_struct, allocationSize=size,
            memoryTypeIndex=type_index,
        )
        memory = _create(_lib.vkAllocateMemory, "VkDeviceMemory", "vkAllocateMemory", self._device, info, _ffi.NULL)
        result = _lib.vkBindBufferMemory(self._device, buffer, memory, 0)
        if result < 0:
            _lib.vkFreeMemory(self._device, memory, _ffi.NULL)
            raise _error(result, "vkBindBufferMemory")
        return memory

    def _track(self, buf: DeviceBuffer) -> DeviceBuffer:
        """Remember a live buffer so close() can free it."""
        self._buffers.add(buf)
        return buf

    def mapped(self, size: int) -> tuple[DeviceBuffer, np.ndarray]:
        """A host-visible, coherent buffer of ``size`` bytes and its mapping (freeing the memory unmaps it)."""
        buffer = self._create_buffer(size, 0)
        try:
            requirements = self._requirements(buffer)
            wanted = _vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | _vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            type_index = self._instance.physical.memory_type(requirements.memoryTypeBits, wanted)
            memory = self._allocate(requirements.size, type_index, _ffi.NULL, buffer)
        except BaseException:
            _lib.vkDestroyBuffer(self._device, buffer, _ffi.NULL)
            raise
        tracked = self._track(DeviceBuffer(self._instance, "device", size, 0, buffer, memory))
        pointer = _ffi.new("void**")
        try:
            _check(_lib.vkMapMemory(self._device, memory, 0, size, 0, pointer), "vkMapMemory")
        except BaseException:
            self.destroy(tracked)
            raise
        return tracked, np.frombuffer(_ffi.buffer(pointer[0], size), np.uint8)

    def close(self) -> None:
        """Destroy every view and buffer (Device.close, on an idle device)."""
        for view in self._views:
            _lib.vkDestroyBufferView(self._device, view._handle, _ffi.NULL)
            view._handle = None
        self._views.clear()
        for buf in self._buffers:
            _destroy_buffer_handles(self._device, buf)
        self._buffers.clear()
        self._fills.clear()  # their fences and command buffers go with the device
        self._doomed.clear()


def _destroy_buffer_handles(device: Any, buf: DeviceBuffer) -> None:
    """vkDestroyBuffer + vkFreeMemory, and mark ``buf`` dead."""
    _lib.vkDestroyBuffer(device, buf._handle, _ffi.NULL)
    _lib.vkFreeMemory(device, buf._memory, _ffi.NULL)
    if buf._backing is not None:
        buf._backing.close()  # back to the kernel at once
    buf._device = None
