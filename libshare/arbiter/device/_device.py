"""The Device: the parts of one VkDevice, composed, and its lifetime.

A :class:`Device` builds one object per concept, each over the ones below it:
:class:`~._instance.Instance` (the VkDevice and its facts), :class:`~._queue.Queue` (command
buffers, fences, the barrier), :class:`~._memory.Memory` (buffers),
:class:`~._pipelines.Pipelines`, :class:`~._timestamps.Timestamps` (query pools),
:class:`~._recordings.Recordings` (the cache of recorded commands) and
:class:`~._submission.Submissions`. It is what the rest of the arbiter calls: its methods
pass each call to the part that does the work, except where two parts take a turn
(destroying a buffer or pipeline asks the recording cache to let go of it first) and in
:meth:`Device.close`, which stops compiles, waits for the queue, and tears the parts down
from the top. Its attributes ``index``, ``name``, ``uuid``, ``cpu``, the limits, ``api_version``
and ``features`` (what admission checks a module's capabilities against) are copies of the
instance's facts (see :class:`~._instance.Instance`), for its callers.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from libshare import shaders
from libshare.arbiter.device._binding import _load_binding
from libshare.arbiter.device._instance import Instance
from libshare.arbiter.device._memory import DeviceBuffer, DeviceView, Memory
from libshare.arbiter.device._pipelines import Pipeline, Pipelines
from libshare.arbiter.device._queue import Queue
from libshare.arbiter.device._recordings import Command, Recordings
from libshare.arbiter.device._submission import Submission, Submissions
from libshare.arbiter.device._timestamps import Timestamps


class Device:
    """Owns the instance, physical device, device, one compute queue, a command pool
    and the timestamp query pools, and runs :class:`Command` lists on them.

    ``selector`` picks the physical device: None or "" the first, a decimal string an
    index, anything else a device UUID (dashes and case ignored). ``cache_size`` bounds
    the number of recorded commands kept for reuse.
    """

    def __init__(self, selector: str | None = None, *, cache_size: int = 1024):
        _load_binding()
        self.instance = instance = Instance(selector)
        queue = None
        try:
            self.queue = queue = Queue(instance)
            self.memory = Memory(instance, queue)
            self.pipelines = Pipelines(instance)
            self.timestamps = Timestamps(instance, self.memory)
            self.recordings = Recordings(instance, queue, self.timestamps, cache_size)
            self.submissions = Submissions(instance, queue, self.recordings, self.timestamps)
        except BaseException:
            if queue is not None:
                queue.close()
            instance.destroy()
            raise
        self.index: int = instance.index
        self.name: str = instance.name
        self.uuid: str = instance.uuid
        self.cpu: bool = instance.cpu
        self.local_heap_size: int = instance.local_heap_size
        self.driver_threads: frozenset[int] = instance.driver_threads
        self.zero_workgroup_memory: bool = instance.zero_workgroup_memory
        self.texel_formats: dict[str, int] = instance.texel_formats
        self.texel_offset_alignment: int = instance.texel_offset_alignment
        self.max_texel_elements: int = instance.max_texel_elements
        self.features: frozenset[str] = instance.features
        self.api_version: tuple[int, int] = instance.api_version
        self.max_group_count: tuple[int, int, int] = instance.max_group_count
        self.max_push_constants_size: int = instance.max_push_constants_size
        self.host_import_alignment: int = instance.host_import_alignment
        self.storage_offset_alignment: int = instance.storage_offset_alignment
        self.max_workgroup_size: tuple[int, int, int] = instance.max_workgroup_size
        self.max_workgroup_invocations: int = instance.max_workgroup_invocations
        self.max_shared_memory: int = instance.max_shared_memory
        self.binding_limits: dict[str, int] = instance.binding_limits
        self.timestamp_period_ns: float = instance.timestamp_period_ns
        self._clamp: Pipeline | None = None  # the engine's clamp program for indirect dispatches (native_handles)

    def submit(self, commands: Sequence[Command], *, timed: bool = True) -> Submission:
        """Run ``commands`` in order with one vkQueueSubmit and one fence (see :meth:`Submissions.submit`)."""
        return self.submissions.submit(commands, timed=timed)

    def import_host(self, address: int, size: int) -> DeviceBuffer:
        """A storage buffer over ``size`` bytes of host memory at ``address``, zero-copy
        (see :meth:`Memory.import_host`)."""
        return self.memory.import_host(address, size)

    def alloc_device(self, size: int) -> DeviceBuffer:
        """A device-local buffer of ``size`` bytes that reads as zeros (see :meth:`Memory.alloc_device`)."""
        return self.memory.alloc_device(size)

    @property
    def clearing_bytes(self) -> int:
        """Bytes of destroyed device buffers whose zero fill has not run yet (see :class:`Memory`)."""
        return self.memory.clearing_bytes

    def destroy_buffer(self, buf: DeviceBuffer) -> None:
        """Destroy ``buf`` and free its memory (not the host mapping). Idempotent.

        Raises InvalidSubmission while an unreleased submission uses it.
        """
        if self.memory.destroyable(buf):
            self.recordings.drop_users(buf, "buffer")
            self.memory.destroy(buf)

    def create_view(self, buf: DeviceBuffer, vk_format: int, offset: int, nbytes: int) -> DeviceView:
        """A texel view of part of ``buf`` (see :meth:`Memory.create_view`)."""
        return self.memory.create_view(buf, vk_format, offset, nbytes)

    def destroy_view(self, view: DeviceView) -> None:
        """Destroy a texel view that no command names (see :meth:`Memory.destroy_view`)."""
        self.memory.destroy_view(view)

    def create_pipeline(self, spirv: bytes, binding_count: int, push_size: int, entry: str = "main") -> Pipeline:
        """A compute pipeline of ``binding_count`` storage buffers and ``push_size`` bytes of push
        constants; may run on any thread (see :meth:`Pipelines.create`)."""
        return self.pipelines.create(spirv, binding_count, push_size, entry)

    def destroy_pipeline(self, p: Pipeline) -> None:
        """Destroy ``p``. Idempotent; raises InvalidSubmission while work using it is unreleased."""
        if self.pipelines.destroyable(p):
            self.recordings.drop_users(p, "pipeline")
            self.pipelines.destroy(p)

    def wait_idle(self) -> None:
        """Block until the device has finished all submitted work."""
        self.queue.wait_idle()

    def native_handles(self) -> dict:
        """The raw handles and limits a native engine records and submits with (see
        :meth:`Instance.native_handles`), and ``clamp``: the (VkPipeline, VkPipelineLayout) of the
        engine's own program that clamps an indirect dispatch's group counts on the device
        (``shaders/indirect_clamp.comp``; the engine's recordings.c, "Indirect dispatches"), made
        at the first call and destroyed with the other pipelines."""
        handles = self.instance.native_handles()
        if self._clamp is None:
            self._clamp = self.pipelines.create(shaders.path("indirect_clamp").read_bytes(), 2, 20)
        handles["clamp"] = self._clamp.native
        return handles

    def route_submissions(self, submit: Callable[[int, int], int]) -> None:
        """Send this device's own queue submissions through ``submit(info_address, fence) -> VkResult``
        (see :meth:`Queue.route`): a native engine that submits on the queue from its own thread
        passes its locked submit here."""
        self.queue.route(submit)

    def close(self, timeout: float | None = None) -> bool:
        """Wait for submitted work to end, then destroy everything; True once destroyed. Idempotent.

        ``timeout`` bounds the wait, in seconds (None: no bound). Vulkan cannot abort a
        dispatch that never ends, and destroying a device under running work is undefined
        (lavapipe would wait for it for ever), so work that has not ended by then leaves the
        device *abandoned* (``instance.abandoned``): closed to every use, its handles, memory
        and driver threads left alive for the rest of the process, and close() returns False.
        The fences say when work ends (a lost device fails them at once), so the final
        vkDeviceWaitIdle never waits.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        stopped = self.pipelines.stop_compiles(timeout)  # marks the device closed
        if stopped is None:  # closed before
            return not self.instance.abandoned
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not stopped or not self.queue.finish(left):
            self.instance.abandoned = True
            return False
        self.memory.close()
        self.pipelines.close()
        self.timestamps.close()
        self.recordings.close()
        self.queue.close()  # the command pool takes every command buffer with it
        self.instance.destroy()
        return True

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Device {self.name!r} uuid={self.uuid}{' closed' if self.instance.closed else ''}>"
