"""The control thread: the Python half of the arbiter's data path, beside the native engine.

Design
------
Every client has a ring region. The native engine (engine.c, through _engine.py) drains
them on its own thread, without the GIL: it pops each client's descriptors, checks each
against that client's object table, records the good ones into a command buffer, submits,
retires and answers (read engine.c's essay for the loop, the fences, the back-pressure
and the doorbell budget). This module is everything around it, on one Python thread,
the *control thread*:

* **Tasks** (``_tasks.py``). Control requests (register a program or buffer, free,
  disconnect, commands) come from connection threads as tasks, which run one at a time, in
  order, under the control lock (:meth:`Drainer.call`, :meth:`Drainer.post`): on the control
  thread, or on the caller's own thread when a call finds the control thread asleep (see
  ``_tasks.py``). Device-touching work (allocation, zero fills, pipeline destruction) and the
  clients' records change only under that lock. The device layer's own queue submissions
  (zero fills) go through the engine's queue lock.
* **Object tables.** A buffer or program a client may name is put into the engine's table
  for that client (:meth:`adopt`); a free drops it there first. The engine counts the
  commands that use each object, so a freed object still in use is destroyed only when the
  engine says the last of them retired (``RELEASED``).
* **Events.** The engine writes the same wake eventfd when it queues events: an object
  released, a closing client with nothing outstanding (``IDLE``: reclaim it), a ring that
  failed validation (``DROPPED``), the watchdog (``WATCHDOG`` and one ``SUSPECT`` per client
  of the submission), a failed Vulkan call (``DEVICE``), a muted doorbell (``MUTED``).
* **Containment** (``_containment.py``): terminating a client, faults, the watchdog's
  verdict, recovery of the device and giving it up.
* **Policy.** The engine drains every waiting client, all it has, when the clients are alike
  (one priority, no compute share, throughput mode): the common case never takes the GIL.
  Otherwise it calls :meth:`_plan` on its own thread before each pass, and the scheduler
  (``_scheduler.py``) sets that pass's turns from the device time the engine measured.
  The scheduler also sets how many submissions may be on the device at once.

Lifetime. A freed buffer or program that a submitted command still uses is
destroyed when the last such command retires. A client that disconnects (or
dies) is drained of nothing more; once its outstanding work has been answered,
its buffers, programs, engine slot and region are released.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading

from libshare.errors import RingCorrupted, ServerNotReady
from libshare.ring._binding import check as ring_check
from libshare.arbiter.serve.clients import BufferRecord, Client, Counters, ProgramRecord
from libshare.arbiter.drain.containment import Containment
from libshare.arbiter.engine.binding import BUFFER, EVENTS, POP, PROGRAM, Engine
from libshare.arbiter.policy.placement import place_device_threads
from libshare.arbiter.programs.loading import SharedPipelines
from libshare.arbiter.drain import emergency as _emergency
from libshare.arbiter.drain.quarantine import Quarantine
from libshare.arbiter.policy.scheduler import Scheduler
from libshare.arbiter.drain.tasks import Tasks
from libshare.arbiter.device import Device

log = logging.getLogger("libshare.arbiter")

_IDLE_SLICE_MS = 1000  # poll() timeout of the control thread: tasks and events write its eventfd anyway
_SPIN = 50e-6  # seconds the engine watches the rings after work before it sleeps
_SPIN_CLIENTS = 16  # with more clients than this, work arrives often enough without spinning
_STOP_SLACK = 5.0  # seconds past the shutdown timeout that stop() waits for the control thread's last pass
_ABANDONED: list = []  # work left running on a device given up, and the memory it may still write: kept mapped


class Drainer(Tasks, Containment):
    """Owns the device and the engine; runs control tasks and the engine's events."""

    def __init__(self, device_factory, wake_fd: int, timed: bool = True, max_clients: int = 4096):
        self._device_factory = device_factory
        self.cores: frozenset[int] = frozenset(os.sched_getaffinity(0))
        """The cores the arbiter was given (placing its threads narrows each thread's: _placement.py)."""
        self.max_slots = max_clients
        self.wake_fd = wake_fd
        self.device: Device = device_factory()
        self.state = "ACTIVE"
        """INITIALIZING, ACTIVE or FAULT."""
        self.scheduler = Scheduler()
        """Drain order and budgets (priorities, fair share, compute share)."""
        self.scheduling = threading.Lock()
        """Held while the scheduler plans (on the engine's thread) or its client list changes."""
        self.plans = 0
        """How many times the engine has asked the scheduler for a plan (each call takes the GIL)."""
        self.pipelines = SharedPipelines()
        """The device's pipelines, one per distinct SPIR-V module, shared by the clients that load it."""
        self.quarantine = Quarantine()
        """The journal of actions that could end the arbiter, and the strikes (off until it serves a
        pipe directory: see _quarantine.py)."""
        self.totals = Counters()
        """Counts of clients already reclaimed (add the live clients' for the server's)."""
        self.peak_memory_bytes = 0
        self._fault_waiting: set[int] = set()  # faulted clients whose connection is still open
        self._faulted_memory: list = []  # host memory imported into the faulted device
        self._watchdog: float | None = None
        self._timed = timed  # timestamp every command (per-client device time for the scheduler and ps)
        self._planned = False
        self.clients: dict[int, Client] = {}
        self._by_slot: dict[int, Client] = {}
        self._free_slots = list(reversed(range(max_clients)))
        self._reclaiming: set[int] = set()  # ids of the clients being reclaimed (see _maybe_reclaim)
        self._released: dict[tuple[int, int, int], tuple[Client, BufferRecord | ProgramRecord]] = {}  # by (slot, kind, id)
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.control = threading.Lock()
        """Held by whoever runs tasks (or handles the engine's events): the control thread while it is
        awake, or a caller of :meth:`call` that found it asleep (see _tasks.py)."""
        self.stopping = False
        self.abandoned = False
        """True once stop() left work running on the device (the device must then be left too)."""
        self.engine = self._new_engine()
        self.thread = threading.Thread(target=self._run, name="libshare-control", daemon=True)

    def _new_engine(self) -> Engine:
        engine = Engine(self.device, self.max_slots, self.wake_fd, planner=self._plan)
        engine.set_busy_word(_emergency.busy_word())  # a crash names the client being handled (_quarantine.py)
        self._apply_policy(engine)
        return engine

    # ---------------------------------------------------------------- settings

    @property
    def watchdog(self) -> float | None:
        """Seconds a submission may run before the server faults (None: no limit)."""
        return self._watchdog

    @watchdog.setter
    def watchdog(self, seconds: float | None) -> None:
        self._watchdog = seconds
        self._apply_policy()

    @property
    def timed(self) -> bool:
        """Timestamp every command (per-client device time for the scheduler and ps)."""
        return self._timed

    @timed.setter
    def timed(self, value: bool) -> None:
        self._timed = bool(value)
        self._apply_policy()

    def _apply_policy(self, engine: Engine | None = None) -> None:
        """Tell the engine whether the scheduler must plan each pass, and the rest of its policy
        (only when it changed: setting it wakes the engine and drops its current plan)."""
        fresh = engine is not None
        engine = engine or getattr(self, "engine", None)
        if engine is None:
            return
        with self.scheduling:
            self._planned = self.scheduler.arbitrates([c for c in self.clients.values() if not c.closing])
        policy = dict(planned=self._planned, timed=self._timed, watchdog=self._watchdog, spin=_SPIN,
                      spin_clients=_SPIN_CLIENTS, max_in_flight=self.scheduler.max_in_flight,
                      plan_for=self.scheduler.plan_for)
        if fresh or policy != self._policy:
            engine.set_policy(**policy)
            self._policy = policy

    _policy: dict | None = None  # the policy the engine has

    def _after_tasks(self) -> None:
        self._apply_policy()  # a task may have changed the clients or the scheduler's settings

    # ---------------------------------------------------------------- the loop

    def _run(self) -> None:
        while not self.stopping:
            with self._holding_control():  # a caller may run tasks meanwhile (see _tasks.py): wait for it
                busy = self._control_pass(events=True)
            if not busy:
                try:
                    self._sleep()
                except Exception:  # never die: log and keep answering
                    log.exception("control loop error")
        with self._holding_control():
            self._shutdown()

    @contextlib.contextmanager
    def _holding_control(self):
        """Hold ``control`` as the control thread: tasks and events are this thread's for the block."""
        with self.control, self._running():
            yield

    def _sleep(self) -> None:
        poller = select.poll()
        poller.register(self.wake_fd, select.POLLIN)
        if poller.poll(_IDLE_SLICE_MS):
            try:
                os.eventfd_read(self.wake_fd)
            except BlockingIOError:
                pass

    def handle_events(self) -> None:
        """Handle the engine's waiting events now (a task): a request of a client that the engine
        dropped a moment ago is answered as the drop says, not as if its ring were open."""
        self._handle_events()

    def _handle_events(self) -> bool:
        events = self.engine.events()
        for event in events:
            client = self._by_slot.get(event.client)
            if event.type == EVENTS["RELEASED"]:  # its owner may be reclaimed, its slot reused, already
                owner, record = self._released.pop((event.client, event.kind, event.a), (None, None))
                if record is not None:
                    owner.releasing[type(record)] -= 1
                    self._destroy(owner, record)
            elif event.type == EVENTS["IDLE"]:
                if client is not None:
                    self._maybe_reclaim(client)
            elif event.type == EVENTS["DROPPED"]:
                if client is not None:
                    self._drop(client, _ring_failure(event.code, client.region))
            elif event.type == EVENTS["WATCHDOG"]:
                suspects = [e for e in events if e.type == EVENTS["SUSPECT"] and e.client in self._by_slot]
                self._watchdog_fired(event, [(self._by_slot[e.client], e.a if e.kind == PROGRAM else 0)
                                             for e in suspects])
            elif event.type == EVENTS["DEVICE"]:
                self.enter_fault(f"the device was lost or failed (VkResult {event.code})")
            elif event.type == EVENTS["MUTED"] and client is not None:
                log.warning("%s: its doorbell woke the arbiter %d times without work; not listening to its "
                            "doorbell for 1 s (its ring is still drained, at least every 20 ms); muted %d times "
                            "so far", client.describe(), event.a, event.b)
        return bool(events)

    # ---------------------------------------------------------------- planning (engine thread)

    def _plan(self) -> None:
        """The turns of the engine's next pass, from the scheduler (called on the engine's thread).

        Should the scheduler fail, the pass drains every waiting client (logged): a policy bug must
        not starve anyone."""
        self.plans += 1
        try:
            self._plan_turns()
        except Exception:
            log.exception("the scheduler failed to plan a pass; this one drains every waiting client")
            self.engine.set_plan([(c.slot, POP, 0, 0) for c in list(self.clients.values()) if not c.closing])

    def _plan_turns(self) -> None:
        with self.scheduling:
            scheduler, engine = self.scheduler, self.engine
            clients, pending, busy = [], {}, {}
            for client in list(self.clients.values()):
                if client.closing:
                    continue
                usage = engine.take_usage(client.slot)
                if usage is None:
                    continue
                if usage.popped_since:
                    scheduler.submitted(client, usage.popped_since)
                if usage.charged_since:
                    scheduler.charge_many(client, usage.charged_ns_since, usage.charged_since)
                clients.append(client)
                pending[client.id] = usage.pending > 0
                busy[client.id] = usage.pending > 0 or usage.outstanding > 0
            plan = scheduler.plan(clients, pending, busy, engine.in_flight(), POP)
            engine.set_plan([(turn.client.slot, turn.budget, scheduler.rank(turn.client), turn.cut_ns // 1000)
                             for turn in plan if turn.budget > 0])

    # ---------------------------------------------------------------- clients (control thread)

    def add_client(self, client: Client) -> None:
        """Start draining a new client's ring."""
        if not self._free_slots:
            raise ServerNotReady(f"all {self.max_slots} client slots are taken (clients still closing); retry")
        client.slot = self._free_slots.pop()
        with self.scheduling:
            self.clients[client.id] = client
        self._by_slot[client.slot] = client
        client.region.set_wake_fd(client.doorbell.fd)  # a byte there wakes the client's async waiter
        self.quarantine.arm(client)  # before its first descriptor: a crash on it names this client
        self.engine.add_client(client.slot, client.region, client.doorbell.fd)
        self._apply_policy()

    def adopt(self, client: Client, record: BufferRecord | ProgramRecord) -> None:
        """Add a new buffer or program to the client's records and to the engine's table."""
        if isinstance(record, BufferRecord):
            client.buffers[record.id] = record
            self.engine.put_buffer(client.slot, record.id, record.device_buffer, record.size)
        else:
            client.programs[record.id] = record
            self.engine.put_program(client.slot, record.id, record.pipeline, record.bindings, record.push_size,
                                    record.cuttable)

    def refresh(self, client: Client) -> Counters:
        """The client's counters, with the engine's counts brought up to date."""
        stats = self.engine.stats(client.slot) if client.slot >= 0 else None
        if stats is not None:
            counters = client.counters
            counters.submitted, counters.completed = stats.submitted, stats.completed
            counters.errors, counters.device_ns = stats.errors, stats.device_ns
            counters.cut, counters.pieces = stats.cut, stats.pieces
        return client.counters

    def disconnect(self, client: Client, reclaimed: str = "reclaimed") -> bool:
        """Stop draining a client; reclaim everything once its outstanding work is answered. True
        when it was reclaimed at once (and ``reclaimed`` logged: the line says why)."""
        if client.closing:
            return False
        client.closing = True
        outstanding = self.engine.close_client(client.slot)
        for record in list(client.buffers.values()) + list(client.programs.values()):
            self.free(client, record)
        return outstanding == 0 and self._maybe_reclaim(client, reclaimed)

    def _maybe_reclaim(self, client: Client, reclaimed: str = "reclaimed") -> bool:
        """Release everything of a closing client once nothing of it is outstanding.

        Every LS_EV_RELEASED of its objects was queued before its last answer, so the queue is
        handled first: once its slot is given back, a new client's objects may carry the same
        (slot, kind, id), and an old event must not destroy one of them."""
        if not client.closing or client.id not in self.clients or client.id in self._reclaiming:
            return False
        stats = self.engine.stats(client.slot)
        if stats is not None and stats.outstanding:
            return False
        self._reclaiming.add(client.id)
        try:
            self._handle_events()
        finally:
            self._reclaiming.discard(client.id)
        if client.id not in self.clients:
            return False  # an event reclaimed it meanwhile
        for record in list(client.buffers.values()) + list(client.programs.values()):
            self.free(client, record)  # made by a request that was under way when it disconnected
        self.refresh(client)
        self.engine.remove_client(client.slot)
        self.quarantine.disarm(client)
        with self.scheduling:
            del self.clients[client.id]
            self.scheduler.forget(client)
        del self._by_slot[client.slot]
        self._free_slots.append(client.slot)
        client.region.close()
        client.doorbell.close()
        self.totals.add(client.counters)
        log.info("%s %s", client.describe(), reclaimed)
        return True

    def _drop(self, client: Client, why: str) -> None:
        """Drop a client whose ring failed validation (the engine closed it with LS_ECORRUPT): answer
        its control requests with RingCorrupted (sticky), reclaim it once its running work ends."""
        if client.closing:
            return
        log.warning("%s: %s; dropping it", client.describe(), why)
        if client.sticky is None:  # else it is being terminated or faulted, and already told why
            client.sticky = RingCorrupted(f"the arbiter dropped this session: {why}; reconnect to go on")
            client.state = "INACTIVE"
        self.disconnect(client)

    def note_memory(self) -> None:
        """Update the server's peak memory after an allocation."""
        in_use = sum(c.counters.memory_bytes for c in self.clients.values())
        self.peak_memory_bytes = max(self.peak_memory_bytes, in_use)

    def free(self, client: Client, record: BufferRecord | ProgramRecord) -> None:
        """Forget a buffer or program; destroy it now, or once the descriptors the client pushed before
        the free are popped and the last command that uses it retires (LS_EV_RELEASED)."""
        record.freed = True
        buffer = isinstance(record, BufferRecord)
        (client.buffers if buffer else client.programs).pop(record.id, None)
        kind = BUFFER if buffer else PROGRAM
        if self.engine.drop(client.slot, kind, record.id):
            self._released[(client.slot, kind, record.id)] = (client, record)
            client.releasing[type(record)] += 1
        else:
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
        """The client's control connection ended: disconnect it (one log line when it is reclaimed at
        once, where there were two: a line is on every attach's path); a fault may now recover."""
        self._fault_waiting.discard(client.id)
        if client.slot < 0 or not self.disconnect(client, "disconnected and reclaimed"):
            log.info("%s disconnected", client.describe())
        self._maybe_recover()

    def _shutdown(self) -> None:
        """Stop the engine (it cancels queued work, gives running work until the shutdown timeout, then
        answers and abandons what still runs), and disconnect everyone."""
        live = [c for c in self.clients.values() if not c.closing]
        running = [self._by_slot[s].describe() for s in self.engine.in_flight_clients() if s in self._by_slot]
        abandoned = self.engine.stop(self.shutdown_timeout)
        if abandoned:
            self.abandoned = True
            log.warning("%d submission(s) still ran when the arbiter stopped; abandoned on the device, answered %s: "
                        "%s", abandoned, "LS_EFAULT" if self.state == "FAULT" else "LS_ECANCELED",
                        ", ".join(running) or "clients gone")
            _ABANDONED.append((self.engine, self._faulted_memory, [r for _, r in self._released.values()]))
            self._faulted_memory = []
        for client in live:
            if not client.region.closed:
                client.region.close_consumer(0)
        self._handle_events()
        for client in list(self.clients.values()):
            self.disconnect(client)
        self._handle_events()
        if not abandoned:
            self.engine.destroy()

    # ---------------------------------------------------------------- control

    def start(self) -> None:
        """Start the engine and the control thread."""
        self.start_engine()
        self.thread.start()

    placement = False
    """Place the engine's and the driver's threads on a core of their own (a daemon sets it before
    :meth:`start`; see _placement.py)."""

    def start_engine(self) -> None:
        """Start the engine's thread, placed with the driver's threads when :attr:`placement` says so."""
        self.engine.start()
        if self.placement:
            place_device_threads(self.device, self.engine, self.cores)

    shutdown_timeout = 10.0
    recovery_timeout = 10.0
    """Seconds work still running after a fault may take to end before the device is given up."""
    unrecoverable: str | None = None
    """Why the device was given up (see _give_up); None while it serves or may recover."""
    on_unrecoverable = None
    """Called with that reason, on the control thread, when the device is given up (the daemon exits)."""
    _fault_since = 0.0  # time.monotonic() when the server entered FAULT
    _fault_watcher: threading.Thread | None = None

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancel queued work, let in-flight work end (at most ``timeout`` s), stop both threads.

        Returns within ``timeout`` s and a little more: True once the control thread has stopped.
        Work still running then is abandoned on the device (see _shutdown), never waited for.
        """
        self.shutdown_timeout = timeout
        self.stopping = True
        self.ring_doorbell()
        if self.thread.is_alive():
            self.thread.join(timeout + _STOP_SLACK)
        elif self.thread.ident is None:  # never started: stop the engine here
            with self._holding_control():
                self._shutdown()
        return not self.thread.is_alive()


def _ring_failure(code: int, region) -> str:
    """What the engine's ring operation that failed with ``code`` found (the ring's own words)."""
    try:
        ring_check(code, region._handle, "the engine's look at its ring")
    except Exception as exc:
        return str(exc)
    return f"its ring failed validation (code {code})"
