"""The queue: where command buffers come from and go, the fences that say when work ends,
and the barrier that orders commands.

* **Command buffers** are all allocated from one command pool, each resettable on its own
  (a recording is re-recorded into the same command buffers); destroying the pool at
  close takes every one with it.
* **Fences are pooled.** A submission takes an unsignalled fence and gives it back reset
  once the work is done and released; fences are never destroyed before close, which
  waits for every fence in use (:meth:`Queue.finish`): the fences say when work ends, and
  a lost device fails them at once.
* **Ordering.** Every command on this queue ends with one memory barrier
  (:attr:`Queue.barrier`) from compute/transfer writes to compute/transfer reads and
  writes *and* host reads. A barrier covers all earlier work in queue submission order,
  across command buffers and submissions, and every command on this queue carries one, so
  each command sees the writes of all commands submitted before it (the "barrier before
  each command" of the brief, placed after instead so one barrier also serves the host),
  and the host sees the device's writes once the fence has signalled. Host writes to
  imported host-coherent memory are visible to the device at ``vkQueueSubmit``.
* **One thread at a time.** A VkQueue must not be used by two threads at once: a native
  engine that submits on this queue from its own thread has this package's own
  submissions go through its locked submit (:meth:`Queue.route`).
"""

from __future__ import annotations

from typing import Any

from libshare.arbiter.device._binding import (_address, _check, _create, _error, _memory_barrier, _struct, _timeout_ns, _uses_binding)
from libshare.arbiter.device._instance import Instance

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding


class _Fence:
    """A pooled VkFence and the one-element array the wait/reset calls take."""

    __slots__ = ("handle", "array")

    def __init__(self, handle: Any):
        self.handle = handle
        self.array = _ffi.new("VkFence[1]", [handle])


class Queue:
    """The compute queue of a Device: submission, its command pool, its fences, and the
    barrier and begin info its commands share (a part of a Device)."""

    def __init__(self, instance: Instance):
        self._instance = instance
        self._device = instance.handle
        self.handle = instance.queue
        self._submit = _lib.vkQueueSubmit  # the hot-path entry points, bound once; route() replaces this one
        self._wait_for_fences = _lib.vkWaitForFences
        self._reset_fences = _lib.vkResetFences
        self._get_fence_status = _lib.vkGetFenceStatus
        self._fences: list[_Fence] = []  # free ones: unsignalled
        self._all_fences: list[_Fence] = []
        write = _vk.VK_ACCESS_SHADER_WRITE_BIT | _vk.VK_ACCESS_TRANSFER_WRITE_BIT
        access = write | _vk.VK_ACCESS_SHADER_READ_BIT | _vk.VK_ACCESS_TRANSFER_READ_BIT | _vk.VK_ACCESS_HOST_READ_BIT
        self.work_stages = _vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | _vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        """The stages commands run in: the barrier's source stages."""
        self.barrier = _memory_barrier(write, access)
        """The VkMemoryBarrier every command ends with (see "Ordering" above)."""
        self.begin_once = _struct(
            "VkCommandBufferBeginInfo", "COMMAND_BUFFER_BEGIN_INFO",
            flags=_vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
        )
        """Begin info of a command buffer recorded for one submission."""
        info = _struct(
            "VkCommandPoolCreateInfo", "COMMAND_POOL_CREATE_INFO",
            flags=_vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=instance.family,
        )
        self._command_pool = _create(
            _lib.vkCreateCommandPool, "VkCommandPool", "vkCreateCommandPool", self._device, info, _ffi.NULL
        )
        self._allocate_infos = {
            level: _struct(
                "VkCommandBufferAllocateInfo", "COMMAND_BUFFER_ALLOCATE_INFO", commandPool=self._command_pool,
                level=level, commandBufferCount=1,
            )
            for level in (_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, _vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)
        }

    def submit(self, info: Any, fence: _Fence) -> int:
        """vkQueueSubmit of one VkSubmitInfo, signalling ``fence``; the VkResult."""
        return self._submit(self.handle, 1, info, fence.handle)

    def route(self, submit) -> None:
        """Send this queue's submissions through ``submit(info_address, fence) -> VkResult``.

        A native engine that submits on this queue from its own thread passes its locked submit here.
        """
        def queue_submit(queue: Any, count: int, info: Any, fence: Any) -> int:
            return submit(_address(info), _address(fence))

        self._submit = queue_submit

    def allocate(self, level: int) -> Any:
        """A VkCommandBuffer[1] holding one new command buffer of ``level``."""
        array = _ffi.new("VkCommandBuffer[1]")
        info = self._allocate_infos[level]
        _check(_lib.vkAllocateCommandBuffers(self._device, info, array), "vkAllocateCommandBuffers")
        return array

    def free(self, array: Any) -> None:
        """Free the command buffer of a VkCommandBuffer[1] from :meth:`allocate`."""
        _lib.vkFreeCommandBuffers(self._device, self._command_pool, 1, array)

    def take_fence(self) -> _Fence:
        """An unsignalled fence: a free one, or a new one."""
        if self._fences:
            return self._fences.pop()
        info = _struct("VkFenceCreateInfo", "FENCE_CREATE_INFO")
        fence = _Fence(_create(_lib.vkCreateFence, "VkFence", "vkCreateFence", self._device, info, _ffi.NULL))
        self._all_fences.append(fence)
        return fence

    def put_back(self, fence: _Fence) -> None:
        """Give back a fence that was never submitted (still unsignalled)."""
        self._fences.append(fence)

    def recycle(self, fence: _Fence) -> None:
        """Reset a signalled fence and give it back (nothing once the device is closed)."""
        if self._instance.closed:
            return
        result = self._reset_fences(self._device, 1, fence.array)
        if result < 0:
            raise _error(result, "vkResetFences")
        self._fences.append(fence)

    def status(self, fence: _Fence) -> int:
        """vkGetFenceStatus: 0 once signalled, VK_NOT_READY before, negative on an error (never blocks)."""
        return self._get_fence_status(self._device, fence.handle)

    def wait(self, fence: _Fence, timeout: float | None) -> int:
        """vkWaitForFences on one fence for ``timeout`` seconds (None: no limit): 0 once signalled,
        VK_TIMEOUT when not yet, negative on an error. May run on any thread."""
        return self._wait_for_fences(self._device, 1, fence.array, 1, _timeout_ns(timeout))

    def wait_idle(self) -> None:
        """Block until the device has finished all submitted work."""
        self._instance.require_open()
        _check(_lib.vkDeviceWaitIdle(self._device), "vkDeviceWaitIdle")

    def finish(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for every fence in use, then for the
        device to idle; False when work was still running at the timeout (the device was not
        waited for). Closing calls it: the fences say when work ends (a lost device fails them
        at once), so the final vkDeviceWaitIdle never waits."""
        free = set(map(id, self._fences))  # reset fences: unsignalled, and nothing will signal them
        pending = [fence.handle for fence in self._all_fences if id(fence) not in free]
        if pending:
            result = self._wait_for_fences(self._device, len(pending), _ffi.new("VkFence[]", pending), 1,
                                           _timeout_ns(timeout))
            if result > 0:  # VK_TIMEOUT: something still runs
                return False
        _lib.vkDeviceWaitIdle(self._device)  # idle, or lost (a lost device still gets torn down)
        return True

    def close(self) -> None:
        """Destroy the fences and the command pool, which takes every command buffer with it
        (close, on an idle device)."""
        for fence in self._all_fences:
            _lib.vkDestroyFence(self._device, fence.handle, _ffi.NULL)
        self._all_fences.clear()
        self._fences.clear()
        _lib.vkDestroyCommandPool(self._device, self._command_pool, _ffi.NULL)
