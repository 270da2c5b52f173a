"""The drain loop: the one thread that owns the Vulkan device.

Design
------
Every client has a ring region. The drain thread, and only it, pops their
descriptors, checks each one against what that client owns, turns the good
ones into device commands and submits everything that is ready, from all
clients, in one ``vkQueueSubmit``. It then retires finished submissions in
order, posting one completion per descriptor on the owner's completion ring.
Because one thread both submits and posts, each completion ring has a single
producer, and the device layer (not thread-safe) has a single caller.

Order and overlap. Descriptors of one client are submitted in the order they
were popped, and the device layer puts a memory barrier after every command,
so each dispatch sees the writes of the one before it. Clients are not
ordered with respect to each other beyond that. An ``LS_OP_NOP`` descriptor is a
fence: it runs nothing and is answered (status 0) right after the client's last
command popped before it, in the same post, or at once when none of its commands
is unanswered. A refused descriptor is answered at once, ahead of earlier work.

Back-pressure. A client never has more descriptors outstanding (popped and not
yet answered) than its completion ring has slots, so posting never fails and a
client that stops reading its completions only stalls itself.

Control requests (load a program, allocate, free, disconnect) come from other
threads as tasks: a closure queued here plus a write to the wake eventfd; the
drain thread runs them between drains and hands the result back.

Sleeping. With nothing to pop and nothing in flight, the thread arms every
client's ring (NEED_WAKEUP, then a last look) and sleeps in poll() on its own
task eventfd (requests, stop) and on every client's doorbell, which the
client's producer rings only when it sees the flag. An idle arbiter therefore
makes no system call at all until work arrives (but for a look every 2 s).
With work in flight it waits on the oldest fence in short slices instead;
after a pass that popped work it first watches the rings for 50 us (with up
to 16 clients), since a client that waits on each completion pushes its next
descriptor right after.

Each client has a doorbell of its own, and a doorbell rings one way: it is a
datagram socket pair made at hello, of which the client gets one end, and
what it writes there arrives at the other end, which only the arbiter holds,
until the client is reclaimed. A client can ring nothing but its own bell,
and cannot read a ring at all: with one eventfd shared by everyone, a client
that read it in a loop swallowed the others' wake-ups, and each of their round
trips waited out the 2 s poll. Nor can it make the arbiter's read block
(O_NONBLOCK belongs to the open file, which an eventfd shares with the client).
A pipe would do as much, but a ring after the arbiter died would raise SIGPIPE
in the client (a C program embedding libshare dies of it); a socket refuses.
What a bell still costs the others is wake-ups, so they are budgeted. A wake-up
by a bell is charged to its client when its ring holds nothing and nothing was
popped from it since its last ring (a ring that raced a drain pass is not
charged, so an honest client, which rings only after a push, never is). A
client may cause 32 such wake-ups at once and 32 a second after that (a token
bucket); past that the arbiter stops listening to its bell for 1 s (a line in
the log the 1st, 2nd, 4th, 8th... time). Its work is still picked up, on the
slow path: by every wake-up something else brings, and at least every 20 ms
(the poll timeout while any bell is muted). A client ringing in a tight loop
thus costs the arbiter about 32 short wake-ups and 50 slow looks a second
instead of a core, and the others nothing they can measure; it waits up to
20 ms for its own work while it is not heard.

States. The server is ACTIVE, FAULT (the device was lost, a dispatch ran past the
watchdog, or a fault was injected for a test) or INITIALIZING (recreating the device
after a fault), as in Volta MPS. A fault closes every client's ring with LS_EFAULT (a
sticky ServerFault on the client's side, which its waiting tickets see too), answers
LS_EFAULT to the descriptors the device has finished or lost, and makes the clients
INACTIVE. Work the device still runs cannot be stopped: Vulkan has no call that aborts
a dispatch, and destroying a device under running work is undefined (lavapipe waits
for it, for ever if it never ends). So that work stays in flight, and nothing waits
for it unbounded: every wait is a fence wait with a timeout, and the device is closed
only once its fences say that nothing runs. Once the work has ended (by itself, or
because the driver reset the GPU and reported the device lost) and every faulted
client has disconnected, the device is recreated and the server is ACTIVE again. Work
that outlives the recovery timeout (the daemon's ``--shutdown-timeout``) means the
device cannot be recovered in this process: the arbiter says so in server.log and the
daemon exits with status 75, socket and lock file removed, for a supervisor to start
a new one. On lavapipe, which never aborts a running shader, a runaway dispatch always
ends that way. Stopping (SIGTERM, ``quit``) gives running work its timeout in the same
way, then answers what still runs (LS_ECANCELED) and leaves it, with the device, to
the process's exit. Terminating one client is the same containment for one client:
its queued descriptors are cancelled (LS_ECANCELED), its running ones end, and its
ring is closed with the reason the client reads as ClientTerminated.

The watchdog is there for each dispatch: a batch of tiny dispatches must not lend its
length to a runaway one in it (a limit of the watchdog times the batch's length let
one run 30 times the watchdog beside 29 tiny ones). But one fence completes a whole
``vkQueueSubmit``, and nothing tells how far into a batch the device is (timestamps
neither: lavapipe's vkGetQueryPoolResults waits for the queue to go idle first). So
the limit applies to a submission, counted from when the drain thread first finds it
at the head of the device's queue (within a fence wait of its getting there; the time
it spent queued behind another submission does not count), and does not grow with its
length: the watchdog for a single command, where it is exact, and twice the watchdog
for a batch. A runaway dispatch faults within twice the watchdog, whatever shares its
submission; the price is that an honest batch whose dispatches together run longer
than that faults too, which takes many long dispatches pipelined at once (with the
default 120 s, over four minutes of work in one submission). Exact per-dispatch
progress would need a marker written after each command of a batch for the host to
read; a limit that grew with a client's history could be trained by that client. The
client that tripped the watchdog is named in server.log and shown RUNAWAY in ``ps``
(SUSPECT for each of several clients that shared the submission: which of their
dispatches ran cannot be told) until its work ends or the arbiter exits.

Lifetime. A freed buffer or program that a submitted command still uses is
destroyed when the last such command retires. A client that disconnects (or
dies) is drained of nothing more; once its outstanding work has retired, its
buffers, programs and region are released.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

import numpy as np

from ..errors import ClientTerminated, InvalidSubmission, RingCorrupted, ServerFault, ServerNotReady, Timeout
from ..ring import C, CQE_DTYPE, DESC_DTYPE
from ..ring._binding import ffi
from ..ring._codec import BODY, decode, push_of
from ._clients import BufferRecord, Client, Counters, ProgramRecord
from ._programs import SharedPipelines
from ._scheduler import Scheduler
from .device import Copy, Device, Dispatch

log = logging.getLogger("libshare.arbiter")

_POP_BATCH = 1024  # descriptors popped per client per pass
_FENCE_SLICE = 0.0005  # seconds to wait on the oldest fence before looking at the rings again
_CALL_SLICE = 0.1  # seconds between checks that the drain thread still runs, while a task waits
_IDLE_SPIN = 50e-6  # seconds to look for the next descriptor before sleeping
_SPIN_REGIONS = 16  # with more clients than this, work arrives often enough without spinning
_MAX_IN_FLIGHT = 2  # submissions on the device at once; more work waits in the rings for a larger batch
_IDLE_SLICE_MS = 2000  # poll() timeout when idle; a stop, a task and every client ring the doorbell anyway
_MUTED_SLICE_MS = 20  # poll() timeout while a client's doorbell is muted: how often its ring is looked at
_BELL_CREDIT = 32  # wake-ups without work a client's doorbell may cause in a burst
_BELL_REFILL = 32.0  # ... and per second after that
_BELL_PENALTY = 1.0  # seconds a doorbell past its credit goes unheard
_FENCE = object()  # what an LS_OP_NOP descriptor builds: no command, an answer once the client's earlier work is
_FAULT_POLL = 0.1  # seconds between looks at faulted work that still runs
_STOP_SLACK = 5.0  # seconds past the shutdown timeout that stop() waits for the drain thread's last pass
_ABANDONED: list = []  # work left running on a device given up, and the memory it may still write: kept mapped


@dataclass
class _Entry:
    """One descriptor in a submission: whom to answer, and what it holds."""

    client: Client
    ticket: int
    users: tuple  # BufferRecord / ProgramRecord whose in_flight count it holds
    fences: list = field(default_factory=list)  # tickets of LS_OP_NOPs answered right after this one

    def answers(self, status: int, ns: int) -> list[tuple[int, int, int]]:
        """(ticket, status, device_ns) for this descriptor, then for the fences that wait on it."""
        return [(self.ticket, status, ns)] + [(fence, status, 0) for fence in self.fences]


@dataclass
class _InFlight:
    submission: object
    entries: list[_Entry]
    started: float = 0.0  # time.monotonic() at submit
    head_since: float | None = None  # when the watchdog first found it at the head of the device's queue


class Drainer:
    """Owns the device; drains rings, submits, retires, and runs control tasks."""

    def __init__(self, device_factory, wake_fd: int, timed: bool = True):
        self._device_factory = device_factory
        self.device: Device = device_factory()
        self.state = "ACTIVE"
        """INITIALIZING, ACTIVE or FAULT."""
        self.scheduler = Scheduler()
        """Drain order and budgets (priorities, fair share, compute share)."""
        self.pipelines = SharedPipelines()
        """The device's pipelines, one per distinct SPIR-V module, shared by the clients that load it."""
        self.watchdog: float | None = None
        """Seconds a submission may run before the server faults (None: no limit)."""
        self.totals = Counters()
        """Counts of clients already reclaimed (add the live clients' for the server's)."""
        self.peak_memory_bytes = 0
        self._fault_waiting: set[int] = set()  # faulted clients whose connection is still open
        self._faulted_memory: list = []  # host memory imported into the faulted device
        self.timed = timed  # timestamp every command (per-client device time for the scheduler and ps)
        self.wake_fd = wake_fd
        self.clients: dict[int, Client] = {}
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.in_flight: list[_InFlight] = []
        self.stopping = False
        self._out = np.empty(_POP_BATCH, DESC_DTYPE)
        self._out_ptr = ffi.from_buffer("char[]", self._out)
        self._out_bytes = memoryview(self._out.view(np.uint8))
        self._cqes = np.zeros(_POP_BATCH, CQE_DTYPE)
        self.thread = threading.Thread(target=self._run, name="libshare-drain", daemon=True)

    # ---------------------------------------------------------------- tasks

    def call(self, fn, *args, timeout: float = 30.0):
        """Run ``fn(*args)`` on the drain thread and return its result (or raise its error)."""
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
                raise Timeout(f"the drain thread did not run a request within {timeout:g} s")
        return future.result()

    def post(self, fn, *args) -> None:
        """Queue ``fn(*args)`` for the drain thread without waiting; it runs before any later task.

        An exception it raises is logged: only calls that cannot fail belong here.
        """
        if self.stopping:
            raise ServerNotReady("the arbiter is shutting down")
        future: Future = Future()
        future.add_done_callback(_log_failure)
        self.tasks.put((future, fn, args))
        self.ring_doorbell()

    def ring_doorbell(self) -> None:
        """Wake the drain thread if it sleeps."""
        try:
            os.eventfd_write(self.wake_fd, 1)
        except BlockingIOError:
            pass  # the counter is saturated: the thread is awake anyway

    def _run_tasks(self) -> bool:
        if self.tasks.empty():  # the common case, without raising queue.Empty
            return False
        ran = False
        while True:
            try:
                future, fn, args = self.tasks.get_nowait()
            except queue.Empty:
                return ran
            ran = True
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to the caller, who raises it
                    future.set_exception(exc)

    # ---------------------------------------------------------------- the loop

    def _run(self) -> None:
        while not self.stopping:
            try:
                busy = self._run_tasks()
                busy |= self._drain()
                busy |= self._retire()
                if not busy:
                    self._wait()
            except ServerFault as exc:
                self.enter_fault(str(exc))
            except Exception:  # never die: log and keep answering
                log.exception("drain loop error")
        self._shutdown()

    def _wait(self) -> None:
        if self.in_flight:
            oldest = self.in_flight[0]
            if not oldest.submission.wait(_FENCE_SLICE) and self.watchdog is not None:
                self._check_watchdog(oldest)
            return
        clients = [c for c in self.clients.values() if not c.closing]
        if self._spin([c.region for c in clients]):
            return
        armed = []
        for client in clients:  # ask every producer to ring, then a last look
            try:
                pending = client.region.arm()
            except Exception as exc:
                self._drop(client, exc)
                continue
            armed.append(client)
            if pending > 0:
                break
        else:
            if self.tasks.empty():
                self._sleep(armed)
        for client in armed:
            if not client.region.closed:
                client.region.disarm()

    def _sleep(self, clients: list[Client]) -> None:
        """Sleep in poll() on the task eventfd and the doorbell of each client that is heard."""
        now = time.monotonic()
        poller = select.poll()
        poller.register(self.wake_fd, select.POLLIN)
        bells, muted = {}, False
        for client in clients:
            if client.doorbell.muted(now):
                muted = True  # its ring is looked at on every wake-up, and at least every _MUTED_SLICE_MS
                continue
            poller.register(client.doorbell.fd, select.POLLIN)
            bells[client.doorbell.fd] = client
        for fd, _events in poller.poll(_MUTED_SLICE_MS if muted else _IDLE_SLICE_MS):
            if fd == self.wake_fd:
                try:
                    os.eventfd_read(self.wake_fd)
                except BlockingIOError:
                    pass
            else:
                self._rang(bells[fd])

    def _rang(self, client: Client) -> None:
        """``client``'s doorbell woke the drain thread: clear it, and charge a wake-up that found no work."""
        bell = client.doorbell
        bell.clear()
        try:
            pending = client.region.pending()
        except Exception as exc:
            self._drop(client, exc)
            return
        if pending or bell.popped:  # work, or work already taken (a ring that raced the drain pass)
            bell.popped = False
            return
        now = time.monotonic()
        bell.empty += 1
        if bell.refilled:
            bell.credit = min(_BELL_CREDIT, bell.credit + (now - bell.refilled) * _BELL_REFILL)
        else:
            bell.credit = _BELL_CREDIT
        bell.refilled = now
        bell.credit -= 1
        if bell.credit >= 0:
            return
        bell.muted_until = now + _BELL_PENALTY
        bell.mutes += 1
        if not bell.mutes & (bell.mutes - 1):  # the 1st, 2nd, 4th, 8th...: the log stays short
            log.warning("%s: its doorbell woke the arbiter %d times without work; not listening to its "
                        "doorbell for %g s (its ring is still drained, at least every %d ms); muted %d times so far",
                        client.describe(), bell.empty, _BELL_PENALTY, _MUTED_SLICE_MS, bell.mutes)

    def _spin(self, regions: list) -> bool:
        """Look at the rings for up to ``_IDLE_SPIN`` s before sleeping; True when work arrived.

        A client that waits for each completion pushes its next descriptor a few microseconds
        after it; catching that here saves both sides a sleep and a wake-up. Only after a pass
        that popped work: a wake-up that found none (a doorbell without work, the slow look at
        a muted client's ring) goes back to sleep at once.
        """
        if not self._popped or not regions or len(regions) > _SPIN_REGIONS:
            return False
        self._popped = False
        deadline = time.perf_counter() + _IDLE_SPIN
        try:
            while time.perf_counter() < deadline:
                if any(region.pending() for region in regions) or not self.tasks.empty():
                    return True
        except Exception:
            return True  # a corrupt ring: the drain pass drops its client
        return False

    _popped = False  # descriptors were popped since the last spin (set by _pop)

    # ---------------------------------------------------------------- drain

    def drain_client(self, client: Client) -> None:
        """Pop and submit what ``client``'s ring holds now, past the scheduler and the in-flight cap
        (a free request orders itself after the descriptors pushed before it this way).

        Only as many as its completion ring can answer are popped: a client that leaves more
        than that unread and then frees a buffer they name gets LS_ENOBUFFER for the rest.
        """
        if client.closing:
            return
        commands, entries = [], []
        self._take(client, _POP_BATCH, commands, entries)
        if commands:
            self._submit(commands, entries)

    def _drain(self) -> bool:
        if len(self.in_flight) >= _MAX_IN_FLIGHT:
            return False
        clients, pending = [], {}
        for client in list(self.clients.values()):  # a drop below may reclaim a client
            if client.closing:
                continue
            try:
                pending[client.id] = client.region.pending() > 0
            except Exception as exc:
                self._drop(client, exc)
                continue
            clients.append(client)
        if not any(pending.values()):
            return False
        busy = {c.id: pending[c.id] or c.outstanding > 0 for c in clients}
        plan = self.scheduler.plan(clients, pending, busy, len(self.in_flight), _POP_BATCH)
        batch_commands, batch_entries = [], []
        popped, batch_rank = False, None
        for client, limit in plan:
            rank = self.scheduler.rank(client)
            if batch_commands and rank != batch_rank:  # a higher priority's fence must not wait for lower work
                self._submit(batch_commands, batch_entries)
                batch_commands, batch_entries = [], []
            batch_rank = rank
            popped |= self._take(client, limit, batch_commands, batch_entries) > 0
        if batch_commands:
            self._submit(batch_commands, batch_entries)
        return popped

    def _take(self, client: Client, limit: int, commands: list, entries: list) -> int:
        """Pop up to ``limit`` of the client's descriptors and add the valid ones to ``commands``
        and ``entries`` (the invalid ones are answered at once); how many were popped."""
        try:
            count = self._pop(client, limit)
        except Exception as exc:
            self._drop(client, exc)
            return 0
        if count:
            self.scheduler.submitted(client, count)
            self._accept(client, count, commands, entries)
        return count

    def _pop(self, client: Client, limit: int) -> int:
        """Pop up to ``limit`` of the client's descriptors into ``self._out``; they are outstanding now.

        Completions the client has not read yet still hold their slots, so a client never has
        more outstanding than its completion ring can answer. Raises on a corrupt ring.
        """
        budget = min(limit, client.region.completion_space() - client.outstanding)
        if budget <= 0:
            return 0
        count = client.region.pop_into(self._out[:budget], self._out_ptr)
        if count:
            client.doorbell.popped = self._popped = True
        client.outstanding += count
        client.counters.submitted += count
        return count

    def _drop(self, client: Client, exc: Exception) -> None:
        """Drop a client whose ring failed validation: close its ring with LS_ECORRUPT (the client
        reads RingCorrupted there), answer its control requests with the same (sticky), and
        reclaim everything it holds once its running work ends. Nothing more is read from the ring."""
        if client.closing:
            return
        log.warning("%s: %s; dropping it", client.describe(), exc)
        if client.sticky is None:  # else it is being terminated or faulted, and already told why
            client.sticky = RingCorrupted(f"the arbiter dropped this session: {exc}; reconnect to go on")
            client.state = "INACTIVE"
            if not client.region.closed:
                client.region.close_consumer(C.ECORRUPT)
        self.disconnect(client)

    def _accept(self, client: Client, count: int, commands: list, entries: list) -> None:
        errors, fences = [], []
        for i in range(count):
            raw = self._out_bytes[i * C.DESC_SIZE : (i + 1) * C.DESC_SIZE]
            ticket = int(self._out["ticket"][i])
            result = self._command_for(client, raw)
            if result is _FENCE:
                if client.last_entry is not None:  # answered right after the client's last command
                    client.last_entry.fences.append(ticket)
                else:  # nothing of this client runs: every earlier descriptor is answered already
                    fences.append((ticket, 0, 0))
                continue
            if isinstance(result, int):
                errors.append((ticket, result))
                continue
            command, users = result
            for user in users:
                user.in_flight += 1
            commands.append(command)
            client.last_entry = _Entry(client, ticket, users)
            entries.append(client.last_entry)
        if errors:
            self._post(client, [(t, status, 0) for t, status in errors])
            client.counters.errors += len(errors)
        if fences:
            self._post(client, fences)
            client.counters.completed += len(fences)

    def _command_for(self, client: Client, raw: memoryview):
        """A (Command, users) pair for one descriptor, or a negative LS_E* status."""
        key = bytes(raw[BODY])
        cached = client.commands.get(key)
        if cached is not None:
            return cached
        result = _build_command(client, self.device, raw)
        if not isinstance(result, int):
            if len(client.commands) >= 4096:
                client.commands.clear()
            client.commands[key] = result
        return result

    def _submit(self, commands: list, entries: list[_Entry]) -> None:
        try:
            submission = self.device.submit(commands, timed=self.timed)
        except ServerFault:
            self._answer_failed(entries, -C.EFAULT)
            raise
        except InvalidSubmission as exc:
            log.error("submit of %d commands failed: %s", len(commands), exc)
            self._answer_failed(entries, -C.EFAULT)
            return
        self.in_flight.append(_InFlight(submission, entries, time.monotonic()))

    # ---------------------------------------------------------------- retire

    def _retire(self) -> bool:
        retired = False
        while self.in_flight and self.in_flight[0].submission.done():
            done = self.in_flight.pop(0)
            times = done.submission.device_ns or [0] * len(done.entries)
            done.submission.release()
            self._finish(done.entries, times, 0)
            retired = True
        return retired

    def _answer_failed(self, entries: list[_Entry], status: int) -> None:
        self._finish(entries, [0] * len(entries), status)

    def _finish(self, entries: list[_Entry], times: list[int], status: int) -> None:
        by_client: dict[int, list] = {}
        clients: dict[int, Client] = {}
        for entry, ns in zip(entries, times):
            clients[entry.client.id] = entry.client
            by_client.setdefault(entry.client.id, []).extend(entry.answers(status, ns))
            if entry.client.last_entry is entry:
                entry.client.last_entry = None
            entry.client.counters.device_ns += ns
            self.scheduler.charge(entry.client, ns)
            for user in entry.users:
                user.in_flight -= 1
                if user.freed and user.in_flight == 0:
                    self._destroy(entry.client, user)
        for client_id, answers in by_client.items():
            client = clients[client_id]
            self._post(client, answers)
            if status == 0:
                client.counters.completed += len(answers)

    def _post(self, client: Client, answers: list[tuple[int, int, int]]) -> None:
        """Post completions (ticket, status, device_ns) and release their outstanding slots."""
        client.outstanding -= len(answers)
        if not client.closing:
            cqes = self._cqes[: len(answers)]
            cqes["ticket"] = [a[0] for a in answers]
            cqes["status"] = [a[1] for a in answers]
            cqes["device_ns"] = [a[2] for a in answers]
            try:
                posted = client.region.post(cqes)
                if posted != len(answers):  # the budget in _drain makes this impossible
                    raise RuntimeError(f"completion ring overflow: {posted} of {len(answers)} posted")
            except Exception as exc:
                self._drop(client, exc)
        self._maybe_reclaim(client)

    # ---------------------------------------------------------------- resources (drain thread)

    def add_client(self, client: Client) -> None:
        """Start draining a new client's ring."""
        self.clients[client.id] = client

    def disconnect(self, client: Client) -> None:
        """Stop draining a client; reclaim everything once its outstanding work retires."""
        if client.closing:
            return
        client.closing = True
        for record in list(client.buffers.values()) + list(client.programs.values()):
            self.free(client, record)
        self._maybe_reclaim(client)

    def _maybe_reclaim(self, client: Client) -> None:
        if client.closing and client.outstanding == 0 and client.id in self.clients:
            for record in list(client.buffers.values()) + list(client.programs.values()):
                self.free(client, record)  # made by a request that was under way when it disconnected
            del self.clients[client.id]
            client.commands.clear()
            client.region.close()
            client.doorbell.close()
            self.totals.add(client.counters)
            self.scheduler.forget(client)
            log.info("%s reclaimed", client.describe())

    def note_memory(self) -> None:
        """Update the server's peak memory after an allocation."""
        in_use = sum(c.counters.memory_bytes for c in self.clients.values())
        self.peak_memory_bytes = max(self.peak_memory_bytes, in_use)

    # ---------------------------------------------------------------- containment (drain thread)

    def terminate(self, client: Client) -> None:
        """Cancel a client's queued work and reclaim it once its running work ends (sticky error)."""
        if client.closing:
            return
        log.info("%s: status is INACTIVE (terminated by the operator)", client.describe())
        self._contain(client, ClientTerminated("the operator terminated this client (terminate_client); "
                                               "reconnect to go on"), C.ECANCELED)

    def enter_fault(self, reason: str, offender: Client | None = None, runaway: tuple[Client, ...] = ()) -> None:
        """Put the server in FAULT: fail everything outstanding, make every client INACTIVE.

        Work the device has finished or lost is answered LS_EFAULT at once. Work it still runs
        stays in flight, its descriptors outstanding, for nothing can stop it: see "States" in
        the module's essay. ``runaway`` are the clients whose submission tripped the watchdog
        (ps shows them RUNAWAY, or SUSPECT when several shared it, until it ends).
        """
        self._settle_in_flight()
        if self.state == "FAULT":
            return
        self.state = "FAULT"
        self._fault_since = time.monotonic()
        log.error("server status is FAULT: %s%s", reason,
                  f"; raised by {offender.describe()}" if offender else
                  f"; raised by one of {', '.join(c.describe() for c in runaway)}" if runaway else "")
        affected = [c for c in self.clients.values() if not c.closing]
        log.error("clients affected by the fault: %s", ", ".join(f"pid {c.pid}" for c in affected) or "none")
        for client in affected:
            self._fault_waiting.add(client.id)
            self._contain(client, ServerFault(f"the arbiter's device faulted ({reason}); this session is "
                                              "lost, reconnect once the server is ACTIVE again"), C.EFAULT)
        for client in runaway:
            client.state = "RUNAWAY" if len(runaway) == 1 else "SUSPECT"
        if self.in_flight:
            log.error("%d submission(s) still run on the device and nothing can stop them; they get %g s to "
                      "end before the device is given up", len(self.in_flight), self.recovery_timeout)
            self._watch_fault()
        self._maybe_recover()

    def _settle_in_flight(self) -> None:
        """Answer LS_EFAULT for the in-flight submissions the device finished or lost; keep the rest."""
        running = []
        for flight in self.in_flight:
            try:
                if not flight.submission.done():
                    running.append(flight)
                    continue
                flight.submission.release()
            except ServerFault:
                pass  # a lost device: its work never finishes; closing the device frees it
            self._answer_failed(flight.entries, -C.EFAULT)
        self.in_flight[:] = running

    def _watch_fault(self) -> None:
        """Until the fault is over, have the drain thread look every _FAULT_POLL s whether the faulted
        work has ended or outlived ``recovery_timeout`` (nothing else wakes it once the clients are gone)."""
        if self._fault_watcher is not None and self._fault_watcher.is_alive():
            return

        def watch():
            while self.state == "FAULT" and self.unrecoverable is None and not self.stopping:
                time.sleep(_FAULT_POLL)
                try:
                    self.post(self._maybe_recover)
                except ServerNotReady:
                    return

        self._fault_watcher = threading.Thread(target=watch, name="libshare-fault-watch", daemon=True)
        self._fault_watcher.start()

    def _check_watchdog(self, oldest: _InFlight) -> None:
        """Fault the server once the submission at the head of the device's queue runs past its limit:
        the watchdog for a single command, twice the watchdog for a batch, whatever its length
        (see "States" in the module's essay)."""
        now = time.monotonic()
        if oldest.head_since is None:  # first seen there: it got there a loop pass ago at most, so never early
            oldest.head_since = now
        if self.state != "ACTIVE":
            return  # faulted already: _maybe_recover gives the running work its time to end
        limit = self.watchdog if len(oldest.entries) == 1 else 2 * self.watchdog
        running = now - oldest.head_since
        if running <= limit:
            return
        suspects = tuple({e.client.id: e.client for e in oldest.entries}.values())
        log.error("a submission of %d command(s) has run %.1f s at the head of the device's queue, past its "
                  "%.1f s limit (the %g s watchdog%s); its clients: %s", len(oldest.entries), running, limit,
                  self.watchdog, "" if len(oldest.entries) == 1 else ", twice over for a batch",
                  ", ".join(c.describe() for c in suspects))
        self.enter_fault(f"a dispatch ran past the {self.watchdog:g} s watchdog",
                         suspects[0] if len(suspects) == 1 else None, suspects)

    def _contain(self, client: Client, sticky: Exception, reason: int) -> None:
        client.sticky = sticky
        client.state = "INACTIVE"
        if not client.region.closed:
            client.region.close_consumer(reason)
            self._cancel_queued(client, -reason)
        self.disconnect(client)

    def _cancel_queued(self, client: Client, status: int = -C.ECANCELED) -> None:
        """Answer ``status`` to every descriptor still in the client's ring (as space allows)."""
        try:
            while count := self._pop(client, _POP_BATCH):
                self._post(client, [(int(t), status, 0) for t in self._out["ticket"][:count]])
        except Exception as exc:  # a corrupt ring: nothing more to cancel
            log.warning("%s: %s while cancelling its queue", client.describe(), exc)

    def _maybe_recover(self) -> None:
        """Recreate the device once the faulted work has ended and every faulted client has gone;
        give the device up once that work outlives ``recovery_timeout``. Never waits for the device."""
        if self.state != "FAULT" or self.unrecoverable is not None:
            return
        if self.in_flight:
            running = time.monotonic() - self._fault_since
            if running >= self.recovery_timeout:
                clients = {e.client.id: e.client.describe() for flight in self.in_flight for e in flight.entries}
                self._give_up(f"{len(self.in_flight)} submission(s) of {', '.join(clients.values())} still run "
                              f"{running:.1f} s after the fault")
            return
        if self._fault_waiting:
            return
        self.state = "INITIALIZING"
        log.info("server status is INITIALIZING: recreating the device")
        self.pipelines.forget()
        try:
            closed = self.device.close(self.recovery_timeout)  # nothing runs: the fences say so at once
        except Exception:
            log.exception("closing the faulted device")
            closed = True
        if not closed:
            self.state = "FAULT"
            self._give_up("the faulted device did not go idle (a compile or a zero fill still runs on it)")
            return
        for memory in self._faulted_memory:
            memory.close()
        self._faulted_memory.clear()
        try:
            self.device = self._device_factory()
        except Exception as exc:
            self.state = "FAULT"
            log.error("recreating the device failed: %s", exc)
            return
        self.state = "ACTIVE"
        log.info("server status is ACTIVE: %s recreated", self.device.name)

    def free(self, client: Client, record: BufferRecord | ProgramRecord) -> None:
        """Forget a buffer or program; destroy it now or when its last command retires."""
        record.freed = True
        client.buffers.pop(record.id, None) if isinstance(record, BufferRecord) else client.programs.pop(record.id, None)
        client.commands.clear()
        if record.in_flight == 0:
            self._destroy(client, record)

    def _destroy(self, client: Client, record: BufferRecord | ProgramRecord) -> None:
        if self.state == "FAULT":  # the device may still hold unfinished work; recreating it frees all
            if isinstance(record, BufferRecord):
                self._forget_buffer(client, record)
            return
        if isinstance(record, BufferRecord):
            self.device.destroy_buffer(record.device_buffer)
            if record.memory is not None:
                record.memory.close()
            client.counters.memory_bytes -= record.size
        else:
            self.pipelines.release(self.device, record.pipeline)

    def _forget_buffer(self, client: Client, record: BufferRecord) -> None:
        """Drop a buffer of a faulted device: its host memory stays mapped until the device is gone."""
        if record.memory is not None:
            self._faulted_memory.append(record.memory)
        client.counters.memory_bytes -= record.size

    def connection_closed(self, client: Client) -> None:
        """The client's control connection ended: disconnect it; a fault may now recover."""
        self._fault_waiting.discard(client.id)
        self.disconnect(client)
        self._maybe_recover()

    def _give_up(self, why: str) -> None:
        """The device cannot be recovered in this process: say so, and tell whoever runs the arbiter."""
        self.unrecoverable = why
        log.error("the device cannot be recovered in this process: %s (Vulkan cannot abort a dispatch, and the "
                  "driver of %s has not reset the device; lavapipe never does); the arbiter must be restarted",
                  why, self.device.name)
        if self.on_unrecoverable is not None:
            self.on_unrecoverable(why)

    def _shutdown(self) -> None:
        """Cancel queued work, give running work until the shutdown deadline, then answer and abandon
        what still runs (it stays on the device, which is abandoned too) and disconnect everyone."""
        deadline = time.monotonic() + self.shutdown_timeout
        live = [c for c in self.clients.values() if not c.closing]
        for client in live:
            self._cancel_queued(client)
        for flight in self.in_flight:
            try:
                if not flight.submission.wait(max(deadline - time.monotonic(), 0)):
                    break  # still running: what follows it waits behind it
            except ServerFault:
                break  # lost: it never ends
        try:
            self._retire()
        except ServerFault:
            pass  # a lost device: what is left is abandoned below
        if self.in_flight:
            self._abandon()
        for client in live:
            if not client.region.closed:
                client.region.close_consumer(0)
        for client in list(self.clients.values()):
            self.disconnect(client)

    def _abandon(self) -> None:
        """Answer the work still running at shutdown (LS_EFAULT in a fault, else LS_ECANCELED) and leave
        it to the device: its buffers and programs are not destroyed, and what it may still write
        stays mapped for the rest of the process."""
        running, self.in_flight = self.in_flight, []
        status = -C.EFAULT if self.state == "FAULT" else -C.ECANCELED
        answers: dict[int, tuple[Client, list]] = {}
        for flight in running:
            for entry in flight.entries:
                answers.setdefault(entry.client.id, (entry.client, []))[1].extend(entry.answers(status, 0))
                entry.client.last_entry = None
        log.warning("%d submission(s) still ran when the arbiter stopped; abandoned on the device, answered %s: %s",
                    len(running), "LS_EFAULT" if status == -C.EFAULT else "LS_ECANCELED",
                    ", ".join(client.describe() for client, _ in answers.values()))
        for client, tickets in answers.values():
            self._post(client, tickets)  # not _finish: what they use must outlive them
        _ABANDONED.append((running, self._faulted_memory))
        self._faulted_memory = []

    # ---------------------------------------------------------------- control

    def start(self) -> None:
        """Start the drain thread."""
        self.thread.start()

    shutdown_timeout = 10.0
    recovery_timeout = 10.0
    """Seconds work still running after a fault may take to end before the device is given up."""
    unrecoverable: str | None = None
    """Why the device was given up (see _give_up); None while it serves or may recover."""
    on_unrecoverable = None
    """Called with that reason, on the drain thread, when the device is given up (the daemon exits)."""
    _fault_since = 0.0  # time.monotonic() when the server entered FAULT
    _fault_watcher: threading.Thread | None = None

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancel queued work, let in-flight work end (at most ``timeout`` s), stop the thread.

        Returns within ``timeout`` s and a little more: True once the thread has stopped. Work still
        running then is abandoned on the device (see _shutdown), never waited for.
        """
        self.shutdown_timeout = timeout
        self.stopping = True
        self.ring_doorbell()
        if self.thread.is_alive():
            self.thread.join(timeout + _STOP_SLACK)
        return not self.thread.is_alive()


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("a posted drain task failed", exc_info=future.exception())


def _build_command(client: Client, device: Device, raw: memoryview):
    """Validate one descriptor (a private copy) against the client's objects."""
    d = decode(raw)
    if d.opcode == C.OP_BAD or d.flags:
        return -C.EBADSLOT
    if d.opcode == C.OP_NOP:  # a fence: names nothing, runs nothing
        return _FENCE
    buffers = []
    for buffer_id in d.buffers:
        record = client.buffers.get(buffer_id)
        if record is None:
            return -C.ENOBUFFER
        buffers.append(record)
    if d.opcode == C.OP_COPY:
        return _build_copy(buffers, d.offsets)
    if d.opcode != C.OP_DISPATCH:
        return -C.EBADSLOT
    program = client.programs.get(d.program)
    if program is None:
        return -C.ENOPROGRAM
    if d.nbuffers != program.bindings:
        return -C.EBINDINGS
    if d.push_size > program.push_size or d.push_size % 4:
        return -C.EPUSH
    alignment = device.storage_offset_alignment
    offsets = d.offsets[:len(buffers)]
    for record, offset in zip(buffers, offsets):
        if offset >= record.size or offset % alignment:
            return -C.ERANGE
    if any(not 1 <= g <= limit for g, limit in zip(d.groups, device.max_group_count)):
        return -C.EGROUPS
    command = Dispatch(
        program.pipeline,
        [(r.device_buffer, o) for r, o in zip(buffers, offsets)],
        d.groups,
        push_of(raw, d.push_size),
    )
    return command, (program, *buffers)


def _build_copy(buffers: list[BufferRecord], offsets: tuple):
    if len(buffers) != 2:
        return -C.EBINDINGS
    (src, dst), (src_offset, dst_offset, size) = buffers, offsets[:3]
    if size == 0 or src_offset + size > src.size or dst_offset + size > dst.size:
        return -C.ERANGE
    if src is dst and abs(src_offset - dst_offset) < size:
        return -C.ERANGE
    return Copy(src.device_buffer, src_offset, dst.device_buffer, dst_offset, size), (src, dst)
