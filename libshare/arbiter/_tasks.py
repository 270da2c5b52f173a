"""Control tasks: work that connection threads hand to the control thread, and its results.

A task is a closure queued here plus a write to the control thread's eventfd; the control
thread runs the queued tasks one at a time, in order, between the engine's events, and hands
each result (or exception) back through a Future. :meth:`Tasks.call` waits for it;
:meth:`Tasks.post` does not (for calls that cannot fail, logged if they do). Everything that
touches the device or a client's records goes through here, so that only the control
thread changes them.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future, wait

from ..errors import ServerNotReady, Timeout

log = logging.getLogger("libshare.arbiter")

_CALL_SLICE = 0.1  # seconds between checks that the control thread still runs, while a task waits


class Tasks:
    """The task queue of the control thread (a part of Drainer: it sets ``thread``, ``stopping``,
    ``wake_fd`` and ``tasks``, and ``_after_tasks`` runs after each batch of tasks)."""

    def call(self, fn, *args, timeout: float = 30.0):
        """Run ``fn(*args)`` on the control thread and return its result (or raise its error)."""
        if threading.current_thread() is self.thread:
            return fn(*args)
        if self.stopping:
            raise ServerNotReady("the arbiter is shutting down")
        future: Future = Future()
        self.tasks.put((future, fn, args))
        self.ring_doorbell()
        deadline = time.monotonic() + timeout
        while not wait([future], min(_CALL_SLICE, max(deadline - time.monotonic(), 0))).done:
            if not self.thread.is_alive():  # stopped before it reached the task: it never will
                raise ServerNotReady("the arbiter shut down before it ran the request")
            if time.monotonic() >= deadline:
                raise Timeout(f"the control thread did not run a request within {timeout:g} s")
        return future.result()

    def post(self, fn, *args) -> None:
        """Queue ``fn(*args)`` for the control thread without waiting; it runs before any later task.

        An exception it raises is logged: only calls that cannot fail belong here.
        """
        if self.stopping:
            raise ServerNotReady("the arbiter is shutting down")
        future: Future = Future()
        future.add_done_callback(_log_failure)
        self.tasks.put((future, fn, args))
        self.ring_doorbell()

    def ring_doorbell(self) -> None:
        """Wake the control thread if it sleeps."""
        try:
            os.eventfd_write(self.wake_fd, 1)
        except BlockingIOError:
            pass  # the counter is saturated: the thread is awake anyway

    def _run_tasks(self) -> bool:
        if self.tasks.empty():  # the common case, without raising queue.Empty
            return False
        while True:
            try:
                future, fn, args = self.tasks.get_nowait()
            except queue.Empty:
                break
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to the caller, who raises it
                    future.set_exception(exc)
        self._after_tasks()
        return True

    def _after_tasks(self) -> None:
        """Called after each batch of tasks (a task may have changed what the engine must know)."""


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("a posted control task failed", exc_info=future.exception())
