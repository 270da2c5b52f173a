"""The arbiter's Vulkan device layer: one VkDevice, one compute queue, cached commands.

Design
------
The arbiter drains small dispatch descriptors from many clients and must put them on
the device faster than the clients could themselves. The ``vulkan`` package's keyword
wrappers build fresh cffi structs on every call, so recording a command buffer from
Python costs tens of microseconds, more than a tiny dispatch takes on a GPU. This package
therefore records each distinct command once and afterwards only *resubmits* it.

Each concept is an object that owns its state, in a module of its own with its part of
the design; a module imports only the modules above it in this list:

* ``_binding.py``: loading the ``vulkan`` package, VkResult errors, small cffi helpers.
* ``_instance.py``: :class:`~._instance.Instance`: the instance, physical device information
  and selection, the VkDevice and its queue; the device's facts (name, UUID, limits) and
  its lifetime (closed, abandoned).
* ``_queue.py``: :class:`~._queue.Queue`: submission to the queue (routed through a native
  engine's lock), the command pool, pooled fences, the barrier every command ends with.
* ``_memory.py``: :class:`DeviceBuffer` and :class:`~._memory.Memory`: imported host memory and
  device memory, which reads as zeros; :class:`DeviceView`, a texel view of part of a buffer.
* ``_pipelines.py``: :class:`Pipeline` and :class:`~._pipelines.Pipelines`: compute
  pipelines, created on any thread under the compile guard.
* ``_timestamps.py``: :class:`~._timestamps.Timestamps`: query pools, and timestamps the
  host reads from mapped memory.
* ``_recordings.py``: the :class:`Command` kinds and :class:`~._recordings.Recordings`, the
  cache of their recordings: keys, the two shapes of a recording, the bound.
* ``_submission.py``: :class:`Submission` and :class:`~._submission.Submissions`: one
  vkQueueSubmit, its fence, batches, device time.
* ``_device.py``: :class:`Device`, which builds the parts (``device.instance``, ``.queue``,
  ``.memory``, ``.pipelines``, ``.timestamps``, ``.recordings``, ``.submissions``), passes
  its callers' calls to them, and closes them: :meth:`~Device.close`.

Rules for the caller (the arbiter)
----------------------------------
* A :class:`Device` is not thread-safe: call ``submit``, ``release`` and every
  create/destroy method from one thread at a time (the arbiter: under its control lock,
  ``arbiter/drain/tasks.py``). Two exceptions: :meth:`Submission.wait` and
  :meth:`Submission.done` may run in another thread (cffi drops the GIL while waiting),
  and so may :meth:`create_pipeline`, so that a long compile never holds up the thread
  that submits (Vulkan lets pipeline creation run beside anything but the destruction of
  the device; :meth:`close` waits for compiles under way and refuses new ones).
* A buffer or pipeline must not be destroyed while a submission that uses it is
  unreleased; ``destroy_buffer``/``destroy_pipeline`` check this and raise
  :class:`~libshare.errors.InvalidSubmission` rather than free memory the device reads.
* An imported host mapping must stay mapped until its buffer is destroyed.
* Read ``device_ns`` before ``release()``: the query slots are reused afterwards.

Only this package touches the ``vulkan`` package's ``ffi`` and ``lib`` (``_binding.py``
loads them); the objects it exports hold their handles privately. Callers use the
Device's methods; a part is reached through the Device only for what it does not pass on
(``device.instance.abandoned``, ``len(device.recordings)``).
"""

from libshare.arbiter.device._device import Device
from libshare.arbiter.device._memory import DeviceBuffer, DeviceView
from libshare.arbiter.device._pipelines import Pipeline
from libshare.arbiter.device._recordings import Command, Copy, Dispatch
from libshare.arbiter.device._submission import Submission

__all__ = ["DeviceBuffer", "DeviceView", "Command", "Copy", "Device", "Dispatch", "Pipeline", "Submission"]
