"""The Device: one class made of one part per concept, and its lifetime.

Each part is a mixin from the module of its concept (``_instance.py``, ``_memory.py``,
``_pipelines.py``, ``_recordings.py``, ``_submission.py``). The constructor sets up each
part's state (its ``_init_*`` method) and then opens the device (``_open``);
:meth:`Device.close` waits for work and compiles, tears the parts down (their ``_close_*``
methods) and then destroys the device (``_destroy_device``).
"""

from __future__ import annotations

import time
from typing import Any

from libshare.errors import InvalidSubmission

from libshare.arbiter.device._binding import _load_binding, _timeout_ns, _uses_binding
from libshare.arbiter.device._instance import _create_instance, _Instance
from libshare.arbiter.device._memory import _Memory
from libshare.arbiter.device._pipelines import _Pipelines
from libshare.arbiter.device._recordings import _Recordings
from libshare.arbiter.device._submission import _Submissions

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding


class Device(_Instance, _Memory, _Pipelines, _Recordings, _Submissions):
    """Owns the instance, physical device, device, one compute queue, a command pool
    and the timestamp query pools, and runs :class:`Command` lists on them.

    ``selector`` picks the physical device: None or "" the first, a decimal string an
    index, anything else a device UUID (dashes and case ignored). ``cache_size`` bounds
    the number of recorded commands kept for reuse.
    """

    def __init__(self, selector: str | None = None, *, cache_size: int = 1024):
        _load_binding()
        self._closed = True  # until everything exists, close() has nothing to do
        self._init_pipelines()
        self._init_memory()
        self._init_recordings(cache_size)
        self._init_submissions()
        self._handle: Any = None
        self._command_pool: Any = None
        self._instance = _create_instance()
        try:
            self._open(selector)
        except BaseException:
            self._destroy_device()
            raise
        self._closed = False

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
        self._close_memory()
        self._close_pipelines()
        self._close_submissions()
        self._close_recordings()
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
