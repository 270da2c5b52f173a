"""Control tasks: work that connection threads hand to the control thread, and its results.

A task is a closure queued here plus a write to the control thread's eventfd; the control
thread runs the queued tasks one at a time, in order, between the engine's events, and hands
each result (or exception) back on the task itself. :meth:`Tasks.call` waits for it;
:meth:`Tasks.post` does not (for calls that cannot fail, logged if they do). Everything that
touches the device or a client's records goes through here, so that only one thread at a
time changes them, in the order the tasks were queued.

That one thread is whoever holds ``control``, the control lock: the control thread holds it
from the moment it wakes until it goes back to sleep. A :meth:`Tasks.call` that finds the lock
free (the control thread asleep, the common case for a client's request) takes it and runs the
queue itself, its own task last, instead of waking the control thread and sleeping until it
answers (two thread wake-ups per call). Queued tasks still run one at a time and in order, and
a task run on a connection thread sees exactly what it would have seen on the control thread;
the control thread handles the engine's events when the engine wakes it, and a task handles
them only when it must see them at once (a reclaim; a request of a client that the engine has
just dropped, see ``libshare/arbiter/serve/requests.py``). A task that calls :meth:`Tasks.call`
itself runs that call at once, wherever it runs. :meth:`Tasks.flush` runs what was posted
without waking anyone, the same way, when the control thread sleeps.

After a batch of tasks the owner's ``after_batch`` brings the engine's policy up to date (the
scheduler looks at every client: ``planner.py``). A task that can change only a client's
objects (register a program or buffer, free one) says so with ``policy=False``: a batch of only
such tasks skips that step, whose cost grows with the number of clients.

The hand-back is one lock per waited task, held from its creation until the control thread
has stored the outcome: the caller sleeps in one ``acquire`` (a single futex wait, in slices
of ``_CALL_SLICE`` so that it notices a control thread that stopped), and the control thread's
``release`` wakes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time

from libshare.errors import ServerFault, ServerNotReady, Timeout

log = logging.getLogger("libshare.arbiter")

_CALL_SLICE = 0.1  # seconds between checks that the control thread still runs, while a task waits
_IDLE_SLICE_MS = 1000  # poll() timeout of the control thread: tasks and events write its eventfd anyway
CALL_TIMEOUT = 30.0  # seconds a task waits for the control thread by default


class _Task:
    """One queued call and, once the control thread ran it, its result or exception.

    ``done`` (a waited task's only) is held until the outcome is stored."""

    __slots__ = ("fn", "args", "policy", "done", "result", "error")

    def __init__(self, fn, args: tuple, waited: bool, policy: bool = True):
        self.fn, self.args, self.policy = fn, args, policy
        self.result = self.error = None
        self.done = threading.Lock() if waited else None
        if self.done is not None:
            self.done.acquire()

    def run(self) -> bool:
        """Run it (on the control thread) and hand the outcome back; True when it raised."""
        try:
            self.result = self.fn(*self.args)
            return False
        except BaseException as exc:  # handed to the caller, who raises it
            self.error = exc
            if self.done is None:
                log.error("a posted control task failed", exc_info=exc)
            return True
        finally:
            self.fn = self.args = None  # nothing the task closed over outlives it here
            if self.done is not None:
                self.done.release()


class Tasks:
    """The task queue of the control thread, and the control lock (owned by Drainer).

    The owner passes the eventfd that wakes the control thread (``wake_fd``), the control thread
    itself (``thread``: a waiting call gives up once it has ended), and what a pass runs besides the
    tasks: ``events`` (handle the engine's events; True when there were some), ``after_batch`` (after
    a batch of tasks that may have changed the engine's policy) and ``on_fault`` (a task raised
    ServerFault: enter FAULT with its message). The owner sets ``stopping`` when the arbiter stops."""

    def __init__(self, wake_fd: int, thread: threading.Thread, *, events, after_batch, on_fault):
        self.wake_fd = wake_fd
        self.thread = thread
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.control = threading.Lock()
        """Held by whoever runs tasks (or handles the engine's events): the control thread while it is
        awake, or a caller of :meth:`call` that found it asleep."""
        self.stopping = False
        """Set once the arbiter stops: no task is taken any more."""
        self._events, self._after_batch, self._on_fault = events, after_batch, on_fault
        self._runner = 0  # the thread id of whoever holds ``control`` and runs tasks now (0: nobody)

    def call(self, fn, *args, timeout: float = CALL_TIMEOUT, policy: bool = True):
        """Run ``fn(*args)`` under the control lock, after every task queued before it, and return
        its result (or raise its error): here when the control thread sleeps, else on that thread.

        ``policy=False``: ``fn`` changes nothing the engine's policy depends on (the clients,
        their states, the scheduler's settings), only a client's objects; see the module's opening."""
        if self._runner == threading.get_ident():  # from a task: the queue is this thread's already
            return fn(*args)
        if self.stopping:
            raise ServerNotReady("the arbiter is shutting down")
        task = _Task(fn, args, True, policy)
        self.queue.put(task)
        self._run_here()
        if task.done.acquire(blocking=False):  # it ran here (or on the control thread meanwhile)
            return self._outcome(task)
        self.ring_doorbell()
        deadline = time.monotonic() + timeout
        while not task.done.acquire(timeout=min(_CALL_SLICE, max(deadline - time.monotonic(), 0))):
            if not self.thread.is_alive():  # stopped before it reached the task: it never will
                raise ServerNotReady("the arbiter shut down before it ran the request")
            if time.monotonic() >= deadline:
                raise Timeout(f"the control thread did not run a request within {timeout:g} s")
        return self._outcome(task)

    @staticmethod
    def _outcome(task: _Task):
        """A waited task's result, or its exception raised."""
        if task.error is not None:
            try:
                raise task.error
            finally:
                task.error = None  # no cycle through the traceback
        return task.result

    def post(self, fn, *args, policy: bool = True, wake: bool = True) -> None:
        """Queue ``fn(*args)`` for the control thread without waiting; it runs before any later task.

        An exception it raises is logged: only calls that cannot fail belong here. ``policy`` as
        for :meth:`call` (False also for a task that brings the policy up to date itself).
        ``wake=False`` leaves the control thread asleep: the caller rings :meth:`ring_doorbell` soon
        (the task runs before any later one either way: the next one rings).
        """
        if self.stopping:
            raise ServerNotReady("the arbiter is shutting down")
        self.queue.put(_Task(fn, args, False, policy))
        if wake:
            self.ring_doorbell()

    def flush(self) -> None:
        """Have the queued tasks run now: here when the control thread sleeps (nothing to wake; the
        hello runs its client's add_client so while the client maps its ring), else on that thread."""
        if self._runner != threading.get_ident() and not self._run_here():
            self.ring_doorbell()

    def _run_here(self) -> bool:
        """Run the queued tasks on this thread if ``control`` is free; False when it is not (or the
        arbiter stops: the control thread's shutdown answers what is left)."""
        if not self.control.acquire(blocking=False):
            return False
        try:
            if self.stopping:
                return False
            with self._running():
                self.run_pass(events=False)
            return True
        finally:
            self.control.release()

    @contextlib.contextmanager
    def holding(self):
        """Hold ``control`` as the control thread: tasks and events are this thread's for the block
        (a caller that runs tasks meanwhile is waited for)."""
        with self.control, self._running():
            yield

    @contextlib.contextmanager
    def _running(self):
        """Mark this thread, which holds ``control``, as the one that runs tasks for the block."""
        self._runner = threading.get_ident()
        try:
            yield
        finally:
            self._runner = 0

    def ring_doorbell(self) -> None:
        """Wake the control thread if it sleeps."""
        try:
            os.eventfd_write(self.wake_fd, 1)
        except BlockingIOError:
            pass  # the counter is saturated: the thread is awake anyway

    def sleep(self) -> None:
        """Sleep until the doorbell rings (a task, or the engine's events), at most _IDLE_SLICE_MS."""
        poller = select.poll()
        poller.register(self.wake_fd, select.POLLIN)
        if poller.poll(_IDLE_SLICE_MS):
            try:
                os.eventfd_read(self.wake_fd)
            except BlockingIOError:
                pass

    def run_pass(self, events: bool) -> bool:
        """Run the queued tasks, then (``events``: on the control thread) the engine's events, with
        ``control`` held; True when there was something to do. Never raises: a fault enters FAULT,
        anything else is logged, and the caller goes on."""
        try:
            busy = self._run_tasks()
            if events:
                busy |= self._events()
            return busy
        except ServerFault as exc:
            self._on_fault(str(exc))
        except Exception:  # never die: log and keep answering
            log.exception("control loop error")
        return True

    def _run_tasks(self) -> bool:
        if self.queue.empty():  # the common case, without raising queue.Empty
            return False
        policy = False
        while True:
            try:
                task = self.queue.get_nowait()
            except queue.Empty:
                break
            failed = task.run()
            policy = policy or task.policy or failed  # a task that failed half-way may have changed anything
        if policy:
            self._after_batch()
        return True
