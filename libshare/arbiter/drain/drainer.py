"""The control thread: the Python half of the arbiter's data path, beside the native engine.

Design
------
Every client has a ring region. The native engine (``libshare/arbiter/engine/``, bound by
``engine/binding.py``) drains them on its own thread, without the GIL: it pops each client's
descriptors, checks each against that client's object table, records the good ones into a
command buffer, submits, retires and answers (read the engine's essay for the loop, the
fences, the back-pressure and the doorbell budget). This package is everything around it, on
one Python thread, the *control thread*. :class:`Drainer` owns the device, the engine and the
clients' records, and three objects, each of one concept, that it hands what they need:

* **Tasks** (``tasks.py``, ``Drainer.tasks``). Control requests (register a program or
  buffer, free, disconnect, commands) come from connection threads as tasks, which run one at
  a time, in order, under the control lock (:meth:`Drainer.call`, :meth:`Drainer.post`): on
  the control thread, or on the caller's own thread when a call finds the control thread
  asleep. Device-touching work (allocation, zero fills, pipeline destruction) and the clients'
  records change only under that lock. The device layer's own queue submissions (zero fills)
  go through the engine's queue lock. A pass of the control thread runs the queued tasks, then
  the engine's events; the queue calls back into the Drainer for the events
  (:meth:`Drainer.handle_events`), into the planner after a batch of tasks, and into
  containment when a task raises ServerFault.
* **The planner** (``planner.py``, ``Drainer.planner``): what the engine is told of the
  policy (whether the scheduler, ``libshare/arbiter/policy/scheduler.py``, plans each of its
  passes; timestamps; the watchdog's limit) and, when it is planned, each pass's plan, asked
  for on the engine's own thread. The Drainer hands it each engine it makes, its clients, and
  the ``scheduler`` and ``scheduling`` lock that it keeps as attributes of its own.
* **Containment** (``containment.py``, ``Drainer.containment``): the server's state
  (ACTIVE, FAULT, INITIALIZING), terminating a client, faults, the watchdog's verdict,
  recovery of the device and giving it up. It reaches back through the Drainer's ``engine``,
  ``device``, :meth:`Drainer.disconnect` and :meth:`Drainer.replace_device`.

What the Drainer does itself:

* **Object tables.** A buffer, program, command list or texel view a client may name is put
  into the engine's table for that client (:meth:`Drainer.adopt`); a free drops it there first.
  The engine counts the commands that use each object, so a freed object still in use is
  destroyed only when the engine says the last of them retired (``RELEASED``). A texel view
  holds its buffer in the engine; freeing a buffer frees its views first, so a buffer's
  ``RELEASED`` comes after its views' (engine/objects.c, "Views").
* **Events.** The engine writes the same wake eventfd when it queues events: an object
  released, a closing client with nothing outstanding (``IDLE``: reclaim it), a ring that
  failed validation (``DROPPED``), the watchdog (``WATCHDOG`` and one ``SUSPECT`` per client
  of the submission: containment's verdict), a failed Vulkan call (``DEVICE``: a fault), a
  muted doorbell (``MUTED``).
* **Lifetime.** A freed buffer or program that a submitted command still uses is destroyed
  when the last such command retires. A client that disconnects (or dies) is drained of
  nothing more; once its outstanding work has been answered, its buffers, programs, engine
  slot and region are released.
"""

from __future__ import annotations

import logging
import os
import threading

from libshare.errors import RingCorrupted, ServerNotReady
from libshare.ring._binding import check as ring_check
from libshare.arbiter.serve.clients import (BufferRecord, Client, Counters, GroupRecord, ListRecord, ProgramRecord,
                                           ViewRecord)
from libshare.arbiter.drain.containment import Containment
from libshare.arbiter.drain.planner import Planner
from libshare.arbiter.engine.binding import BUFFER, EVENTS, GROUP, LIST, PROGRAM, VIEW, Engine
from libshare.arbiter.policy.placement import place_device_threads
from libshare.arbiter.programs.loading import SharedPipelines
from libshare.arbiter.drain import emergency as _emergency
from libshare.arbiter.drain.quarantine import Quarantine
from libshare.arbiter.policy.scheduler import Scheduler
from libshare.arbiter.drain.tasks import CALL_TIMEOUT, Tasks
from libshare.arbiter.device import Device

log = logging.getLogger("libshare.arbiter")

_STOP_SLACK = 5.0  # seconds past the shutdown timeout that stop() waits for the control thread's last pass
_ABANDONED: list = []  # work left running on a device given up, and the memory it may still write: kept mapped


class Drainer:
    """Owns the device, the engine and the clients' records; runs control tasks and the engine's events."""

    placement = False
    """Place the engine's and the driver's threads on a core of their own (a daemon sets it before
    :meth:`start`; see ``libshare/arbiter/policy/placement.py``)."""
    shutdown_timeout = 10.0

    def __init__(self, device_factory, wake_fd: int, timed: bool = True, max_clients: int = 4096):
        self._device_factory = device_factory
        self.cores: frozenset[int] = frozenset(os.sched_getaffinity(0))
        """The cores the arbiter was given (placing its threads narrows each thread's: placement.py)."""
        self.max_slots = max_clients
        self.device: Device = device_factory()
        self.clients: dict[int, Client] = {}
        self.by_slot: dict[int, Client] = {}
        self._free_slots = list(reversed(range(max_clients)))
        self._reclaiming: set[int] = set()  # ids of the clients being reclaimed (see _maybe_reclaim)
        self.released: dict[tuple[int, int, int], tuple[Client, BufferRecord | ProgramRecord]] = {}
        """Freed objects that commands still use, by (slot, kind, id), until the engine's RELEASED."""
        self.scheduler = Scheduler()
        """Drain order and budgets (priorities, fair share, compute share)."""
        self.scheduling = threading.Lock()
        """Held while the scheduler plans (on the engine's thread) or its client list changes."""
        self.planner = Planner(self.scheduler, self.scheduling, self.clients, timed)
        """What the engine is told of the policy (the watchdog's limit included), and its plans (see planner.py)."""
        self.pipelines = SharedPipelines()
        """The device's pipelines, one per distinct SPIR-V module, shared by the clients that load it."""
        self.quarantine = Quarantine()
        """The journal of actions that could end the arbiter, and the strikes (off until it serves a
        pipe directory: see quarantine.py)."""
        self.totals = Counters()
        """Counts of clients already reclaimed (add the live clients' for the server's)."""
        self.peak_memory_bytes = 0
        self.abandoned = False
        """True once stop() left work running on the device (the device must then be left too)."""
        self.thread = threading.Thread(target=self._run, name="libshare-control", daemon=True)
        self.tasks = Tasks(wake_fd, self.thread, events=self._handle_events, after_batch=self.planner.update,
                           on_fault=lambda reason: self.containment.enter_fault(reason))
        """The control thread's task queue and the control lock (see tasks.py)."""
        self.containment = Containment(self, self.tasks, clients=self.clients, by_slot=self.by_slot,
                                       released=self.released, quarantine=self.quarantine,
                                       pipelines=self.pipelines)
        """The server's state, faults, terminations and the device's recovery (see containment.py)."""
        self.engine = self._new_engine()

    def call(self, fn, *args, timeout: float = CALL_TIMEOUT, policy: bool = True):
        """Run ``fn(*args)`` as a control task and return its result: :meth:`Tasks.call`."""
        return self.tasks.call(fn, *args, timeout=timeout, policy=policy)

    def post(self, fn, *args, policy: bool = True, wake: bool = True) -> None:
        """Queue ``fn(*args)`` as a control task without waiting: :meth:`Tasks.post`."""
        self.tasks.post(fn, *args, policy=policy, wake=wake)

    # ---------------------------------------------------------------- the device and the engine

    def _new_engine(self) -> Engine:
        engine = Engine(self.device, self.max_slots, self.tasks.wake_fd, planner=self.planner.plan)
        engine.set_busy_word(_emergency.busy_word())  # a crash names the client being handled (quarantine.py)
        self.planner.attach(engine)
        return engine

    def _start_engine(self) -> None:
        """Start the engine's thread, placed with the driver's threads when :attr:`placement` says so."""
        self.engine.start()
        if self.placement:
            place_device_threads(self.device, self.engine, self.cores)

    def replace_device(self) -> None:
        """A new device and a new engine on it, started, in place of closed ones (containment's recovery)."""
        self.device = self._device_factory()
        self.engine = self._new_engine()
        self._start_engine()

    def start(self) -> None:
        """Start the engine and the control thread."""
        self._start_engine()
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancel queued work, let in-flight work end (at most ``timeout`` s), stop both threads.

        Returns within ``timeout`` s and a little more: True once the control thread has stopped.
        Work still running then is abandoned on the device (see _shutdown), never waited for.
        """
        self.shutdown_timeout = timeout
        self.tasks.stopping = True
        self.tasks.ring_doorbell()
        if self.thread.is_alive():
            self.thread.join(timeout + _STOP_SLACK)
        elif self.thread.ident is None:  # never started: stop the engine here
            with self.tasks.holding():
                self._shutdown()
        return not self.thread.is_alive()

    # ---------------------------------------------------------------- the loop

    def _run(self) -> None:
        tasks = self.tasks
        while not tasks.stopping:
            with tasks.holding():  # a caller may run tasks meanwhile (see tasks.py): wait for it
                busy = tasks.run_pass(events=True)
            if not busy:
                try:
                    tasks.sleep()
                except Exception:  # never die: log and keep answering
                    log.exception("control loop error")
        with tasks.holding():
            self._shutdown()

    def _shutdown(self) -> None:
        """Stop the engine (it cancels queued work, gives running work until the shutdown timeout, then
        answers and abandons what still runs), and disconnect everyone."""
        live = [c for c in self.clients.values() if not c.closing]
        running = [self.by_slot[s].describe() for s in self.engine.in_flight_clients() if s in self.by_slot]
        abandoned = self.engine.stop(self.shutdown_timeout)
        if abandoned:
            self.abandoned = True
            log.warning("%d submission(s) still ran when the arbiter stopped; abandoned on the device, answered %s: "
                        "%s", abandoned, "LS_EFAULT" if self.containment.state == "FAULT" else "LS_ECANCELED",
                        ", ".join(running) or "clients gone")
            _ABANDONED.append((self.engine, self.containment.faulted_memory, [r for _, r in self.released.values()]))
            self.containment.faulted_memory = []
        for client in live:
            if not client.region.closed:
                client.region.peers.close_consumer(0)
        self._handle_events()
        for client in list(self.clients.values()):
            self.disconnect(client)
        self._handle_events()
        if not abandoned:
            self.engine.destroy()

    def handle_events(self) -> None:
        """Handle the engine's waiting events now (a task): a request of a client that the engine
        dropped a moment ago is answered as the drop says, not as if its ring were open."""
        self._handle_events()

    def _handle_events(self) -> bool:
        events = self.engine.events()
        for event in events:
            client = self.by_slot.get(event.client)
            if event.type == EVENTS["RELEASED"]:  # its owner may be reclaimed, its slot reused, already
                owner, record = self.released.pop((event.client, event.kind, event.a), (None, None))
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
                suspects = [e for e in events if e.type == EVENTS["SUSPECT"] and e.client in self.by_slot]
                self.containment.watchdog_fired(event, [(self.by_slot[e.client], e.a if e.kind == PROGRAM else 0)
                                                        for e in suspects])
            elif event.type == EVENTS["DEVICE"]:
                self.containment.device_failed(f"the device was lost or failed (VkResult {event.code})")
            elif event.type == EVENTS["MUTED"] and client is not None:
                log.warning("%s: its doorbell woke the arbiter %d times without work; not listening to its "
                            "doorbell for 1 s (its ring is still drained, at least every 20 ms); muted %d times "
                            "so far", client.describe(), event.a, event.b)
        return bool(events)

    # ---------------------------------------------------------------- clients (control thread)

    def add_client(self, client: Client) -> None:
        """Start draining a new client's ring."""
        if not self._free_slots:
            raise ServerNotReady(f"all {self.max_slots} client slots are taken (clients still closing); retry")
        client.slot = self._free_slots.pop()
        with self.scheduling:
            self.clients[client.id] = client
        self.by_slot[client.slot] = client
        client.region.peers.set_wake_fd(client.doorbell.fd)  # a byte there wakes the client's async waiter
        self.quarantine.arm(client)  # before its first descriptor: a crash on it names this client
        self.engine.add_client(client.slot, client.region, client.doorbell.fd)
        self.planner.update()

    def refresh(self, client: Client) -> Counters:
        """The client's counters, with the engine's counts brought up to date."""
        stats = self.engine.stats(client.slot) if client.slot >= 0 else None
        if stats is not None:
            counters = client.counters
            counters.submitted, counters.completed = stats.submitted, stats.completed
            counters.errors, counters.device_ns = stats.errors, stats.device_ns
            counters.cut, counters.pieces, counters.listed = stats.cut, stats.pieces, stats.listed
        return client.counters

    def note_memory(self) -> None:
        """Update the server's peak memory after an allocation."""
        in_use = sum(c.counters.memory_bytes for c in self.clients.values())
        self.peak_memory_bytes = max(self.peak_memory_bytes, in_use)

    def disconnect(self, client: Client, reclaimed: str = "reclaimed") -> bool:
        """Stop draining a client; reclaim everything once its outstanding work is answered. True
        when it was reclaimed at once (and ``reclaimed`` logged: the line says why)."""
        if client.closing:
            return False
        client.closing = True
        outstanding = self.engine.close_client(client.slot)
        for record in client.records():
            self.free(client, record)
        return outstanding == 0 and self._maybe_reclaim(client, reclaimed)

    def connection_closed(self, client: Client) -> None:
        """The client's control connection ended: disconnect it (one log line, which says whether it
        was reclaimed at once); a fault may now recover."""
        self.containment.fault_waiting.discard(client.id)
        if client.slot < 0 or not self.disconnect(client, "disconnected and reclaimed"):
            log.info("%s disconnected", client.describe())
        self.containment.maybe_recover()

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
        for record in client.records():
            self.free(client, record)  # made by a request that was under way when it disconnected
        self.refresh(client)
        self.engine.remove_client(client.slot)
        self.quarantine.disarm(client)
        with self.scheduling:
            del self.clients[client.id]
            self.scheduler.forget(client)
        del self.by_slot[client.slot]
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

    # ---------------------------------------------------------------- objects (control thread)

    def adopt(self, client: Client, record: BufferRecord | ProgramRecord, commands: bytes = b"") -> None:
        """Add a new buffer, program or command list (its ``commands``) to the client's records and to the
        engine's table (a list's commands refused there: the record is not added)."""
        if isinstance(record, ListRecord):
            self.engine.put_list(client.slot, record.id, commands)
            client.lists[record.id] = record
        elif isinstance(record, GroupRecord):  # its entries checked there: refused, nothing is added
            self.engine.put_group(client.slot, record.id, record.program, list(record.entries))
            client.groups[record.id] = record
        elif isinstance(record, BufferRecord):
            client.buffers[record.id] = record
            self.engine.put_buffer(client.slot, record.id, record.device_buffer, record.size)
        elif isinstance(record, ViewRecord):
            self.engine.put_buffer(client.slot, record.id, record.device_view, record.device_view.nbytes,
                                   (record.buffer_id, record.format, self.device.texel_formats[record.format]))
            client.views[record.id] = record
        else:
            client.programs[record.id] = record
            self.engine.put_program(client.slot, record.id, record.pipeline, record.bindings, record.push_size,
                                    record.cuttable)

    def free(self, client: Client, record: BufferRecord | ProgramRecord) -> None:
        """Forget a buffer or program; destroy it now, or once the descriptors the client pushed before
        the free are popped and the last command that uses it retires (LS_EV_RELEASED). A buffer's
        texel views are freed first."""
        if isinstance(record, BufferRecord):
            for view in [view for view in client.views.values() if view.buffer_id == record.id]:
                self.free(client, view)
        record.freed = True
        table, kind = {BufferRecord: (client.buffers, BUFFER), ProgramRecord: (client.programs, PROGRAM),
                       ListRecord: (client.lists, LIST), GroupRecord: (client.groups, GROUP),
                       ViewRecord: (client.views, VIEW)}[type(record)]
        table.pop(record.id, None)
        if self.engine.drop(client.slot, kind, record.id):
            self.released[(client.slot, kind, record.id)] = (client, record)
            client.releasing[type(record)] += 1
        else:
            self._destroy(client, record)

    def _destroy(self, client: Client, record: BufferRecord | ProgramRecord | ListRecord) -> None:
        if isinstance(record, ListRecord):
            client.list_commands -= record.commands
        if isinstance(record, (ListRecord, GroupRecord)):
            return  # the engine freed it with its commands or entries
        if isinstance(record, ViewRecord):
            if self.containment.state != "FAULT":  # (else recreating the device frees all)
                self.device.destroy_view(record.device_view)
            return
        buffer = isinstance(record, BufferRecord)
        if self.containment.state == "FAULT":  # the device may still hold unfinished work; recreating it frees all
            if buffer:  # its host memory stays mapped until the device is closed
                if record.memory is not None:
                    self.containment.faulted_memory.append(record.memory)
                client.counters.memory_bytes -= record.size
            return
        if buffer:
            self.device.destroy_buffer(record.device_buffer)
            if record.memory is not None:
                record.memory.close()
            client.counters.memory_bytes -= record.size
        else:
            self.pipelines.release(self.device, record.pipeline)


def _ring_failure(code: int, region) -> str:
    """What the engine's ring operation that failed with ``code`` found (the ring's own words)."""
    try:
        ring_check(code, region._handle, "the engine's look at its ring")
    except Exception as exc:
        return str(exc)
    return f"its ring failed validation (code {code})"
