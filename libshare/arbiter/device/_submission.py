"""Submission: one vkQueueSubmit per command list, its fence, batches, and its device time.

:meth:`Submissions.submit` takes a recording per command from the cache: one command goes
to the queue as its recording's own primary command buffer, several as a pooled batch
primary that runs their secondaries (see "Two shapes of one recording" in
``_recordings.py``), none as an empty marker. The :class:`Submission` it returns is done
when its fence has signalled; :meth:`Submission.release` gives the fence, the batch
primary and the recordings back for reuse. With ``timed=True`` (the default, on a queue
with timestamps) a single command's recording is a timed one and a batch writes a
timestamp before its first command and after each (see ``_timestamps.py``), which
:attr:`Submission.device_ns` turns into each command's device time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from libshare.errors import InvalidSubmission

from libshare.arbiter.device._binding import _check, _error, _struct, _uses_binding
from libshare.arbiter.device._instance import Instance
from libshare.arbiter.device._queue import Queue, _Fence
from libshare.arbiter.device._recordings import _ANY, Recordings
from libshare.arbiter.device._timestamps import Timestamps

if TYPE_CHECKING:
    from libshare.arbiter.device._recordings import Command, _Recording
    from libshare.arbiter.device._timestamps import _QueryPool

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding


class _Batch:
    """A reusable primary command buffer that runs a batch of secondaries, with the
    timestamp query pool of its timed use, grown on demand."""

    __slots__ = ("handle", "array", "submit_info", "query_pool")

    def __init__(self, array: Any):
        self.array = array
        self.handle = array[0]
        self.submit_info = _struct("VkSubmitInfo", "SUBMIT_INFO", commandBufferCount=1, pCommandBuffers=array)
        self.query_pool: _QueryPool | None = None


class Submission:
    """One ``vkQueueSubmit`` of a list of commands, completed by one fence.

    Poll :meth:`done` or block in :meth:`wait`; then read :attr:`device_ns` and call
    :meth:`release` so the fence, command buffers and query slots can be reused.
    """

    __slots__ = ("_owner", "_fence", "_recordings", "_batch", "_timed", "_complete", "_released", "_device_ns")

    def __init__(self, owner: Submissions, fence: _Fence, recordings: list[_Recording], batch: _Batch | None,
                 timed: bool):
        self._owner = owner
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
        return self._settle(self._owner._queue.status(self._fence), "vkGetFenceStatus")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done or ``timeout`` seconds passed (None: no limit); True if done.

        A dispatch may never end: the arbiter always passes a timeout.
        """
        if self._known_done():
            return True
        return self._settle(self._owner._queue.wait(self._fence, timeout), "vkWaitForFences")

    def _known_done(self) -> bool:
        """Done without asking the fence: seen done before, or its device closed (not abandoned)."""
        if self._complete:
            return True
        instance = self._owner._instance
        return instance.closed and not instance.abandoned

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
            if self._released or self._owner._instance.closed:
                raise InvalidSubmission("device_ns read after release (its query slots were reused)")
            if not self.done():
                raise InvalidSubmission("device_ns read before the submission completed")
            self._device_ns = self._owner.durations(self._recordings, self._batch)
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
        self._owner.recycle(self._fence, self._batch, self._recordings)

    def __repr__(self) -> str:
        state = "released" if self._released else ("done" if self._complete else "pending")
        return f"<Submission commands={len(self._recordings)} {state}>"


class Submissions:
    """Submissions of a Device: one vkQueueSubmit per command list, batch primaries, and what
    comes back when a submission is released (a part of a Device)."""

    def __init__(self, instance: Instance, queue: Queue, recordings: Recordings, timestamps: Timestamps):
        self._instance = instance
        self._queue = queue
        self._recordings = recordings
        self._timestamps = timestamps
        self._batches: list[_Batch] = []  # idle ones
        self._empty_info = _struct("VkSubmitInfo", "SUBMIT_INFO")

    def submit(self, commands: Sequence[Command], *, timed: bool = True) -> Submission:
        """Run ``commands`` in order with one vkQueueSubmit and one fence.

        Each command sees the memory writes of the commands before it, in this and in
        earlier submissions. ``timed`` records per-command device time (see
        :attr:`Submission.device_ns`). An empty list makes a marker that completes when
        all earlier work has.
        """
        if self._instance.closed:
            raise InvalidSubmission("submit on a closed device")
        timed = bool(timed and self._timestamps.mask)
        cache = self._recordings
        recordings: list[_Recording] = []
        batch = None
        try:
            if len(commands) == 1:
                recordings.append(cache.acquire(commands[0], int(timed)))
                info = recordings[0].submit_info or cache.primary_info(recordings[0])
            elif commands:
                for command in commands:
                    recordings.append(cache.acquire(command, _ANY))
                batch = self._record_batch(recordings, timed)
                info = batch.submit_info
            else:
                info = self._empty_info
            fence = self._queue.take_fence()
        except BaseException:
            self.recycle(None, batch, recordings)
            raise
        result = self._queue.submit(info, fence)
        if result:
            self._queue.put_back(fence)
            self.recycle(None, batch, recordings)
            raise _error(result, "vkQueueSubmit")
        return Submission(self, fence, recordings, batch, timed)

    def recycle(self, fence: _Fence | None, batch: _Batch | None, recordings: list[_Recording]) -> None:
        """Take back a finished (or never submitted) submission's resources (nothing once the
        device is closed)."""
        if self._instance.closed:
            return
        if fence is not None:
            self._queue.recycle(fence)
        if batch is not None:
            self._batches.append(batch)
        self._recordings.give_back(recordings)

    def durations(self, recordings: list[_Recording], batch: _Batch | None) -> list[int]:
        """Device time of each command of a finished submission, from its timestamps."""
        if not recordings:
            return []
        if batch is None:
            queries, first = recordings[0].query_pool, recordings[0].query
        else:
            queries, first = batch.query_pool, 0
        return self._timestamps.durations(queries, first, len(recordings))

    def _record_batch(self, recordings: list[_Recording], timed: bool) -> _Batch:
        """Record a pooled primary that runs the secondaries (timing each, if ``timed``)."""
        for recording in recordings:
            if recording.secondary is None:
                self._recordings.record_secondary(recording)
        if self._batches:
            batch = self._batches.pop()
        else:
            batch = _Batch(self._queue.allocate(_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY))
        try:
            cb = batch.handle
            _check(_lib.vkBeginCommandBuffer(cb, self._queue.begin_once), "vkBeginCommandBuffer")
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
        self._timestamps.copy_results(cb, queries, 0, len(recordings) + 1)

    def _batch_queries(self, batch: _Batch, count: int) -> _QueryPool:
        """The batch's query pool, replaced by a larger one when it has fewer than ``count``."""
        old = batch.query_pool
        if old is None or old.count < count:
            batch.query_pool = self._timestamps.pool(max(count, 2 * old.count if old else 0, 64))
            if old is not None:
                self._timestamps.destroy_pool(old)  # idle: the batch is not pending
        return batch.query_pool
