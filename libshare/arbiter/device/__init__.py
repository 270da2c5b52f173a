"""The arbiter's Vulkan device layer: one VkDevice, one compute queue, cached commands.

Design
------
The arbiter drains small dispatch descriptors from many clients and must put them on
the device faster than the clients could themselves. The ``vulkan`` package's keyword
wrappers build fresh cffi structs on every call, so recording a command buffer from
Python costs tens of microseconds, more than a tiny dispatch takes on a GPU. This package
therefore records each distinct command once and afterwards only *resubmits* it.

Its modules each hold one concept, and the part of the design about it:

* ``_binding.py``: loading the ``vulkan`` package, VkResult errors, small cffi helpers.
* ``_instance.py``: the instance, physical device information and selection, the VkDevice,
  its queue and command pool.
* ``_memory.py``: :class:`Buffer`: imported host memory and device memory, which reads as zeros.
* ``_pipelines.py``: :class:`Pipeline`: compute pipelines, created on any thread.
* ``_recordings.py``: the :class:`Command` kinds and the cache of their recordings: keys,
  the two shapes of a recording, the bound, the barrier that orders commands.
* ``_submission.py``: :class:`Submission`: one vkQueueSubmit, its fence, batches, timing.
* ``_device.py``: :class:`Device`, one class made of one part per module above (a mixin
  each), and its lifetime: construction and :meth:`~Device.close`.

Rules for the caller (the arbiter)
----------------------------------
* A :class:`Device` is not thread-safe: call ``submit``, ``release`` and every
  create/destroy method from one thread at a time (the arbiter: under its control lock,
  ``arbiter/_tasks.py``). Two exceptions: :meth:`Submission.wait` and
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
loads them); every public object holds its handles privately.
"""

from libshare.arbiter.device._device import Device
from libshare.arbiter.device._memory import Buffer
from libshare.arbiter.device._pipelines import Pipeline
from libshare.arbiter.device._recordings import Command, Copy, Dispatch
from libshare.arbiter.device._submission import Submission

__all__ = ["Buffer", "Command", "Copy", "Device", "Dispatch", "Pipeline", "Submission"]
