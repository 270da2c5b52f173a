"""Containment: terminating a client, faults, the watchdog, and the device's recovery.

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

**Handing over at once.** Under the control daemon a warm standby arbiter waits beside this
one (libshare/daemon/supervisor.py), and that changes what a fault should cost: waiting in
FAULT for work that cannot be aborted, every session failed meanwhile, would make one
tenant's runaway dispatch every tenant's lost session. So a supervised arbiter never enters
FAULT. On a dispatch past the watchdog or a lost device it journals the runaway (below),
says why in server.log and control.log, removes its socket and ends its process at once
(``on_stuck``, set by libshare/arbiter/service.py; exit status 75). The kernel ends the
dispatch with the process, and the standby serves a few milliseconds later. Every session
reattaches as after any arbiter death (libshare/client/reattach.py): its tickets in flight
fail once with ArbiterRestarted (such work may have partly run), the work still in its ring
runs on the new arbiter, its arrays and programs stay. The new arbiter reads the journal,
counts the strike, and refuses the runaway's client its reattach with ClientTerminated,
which names the dispatch (quarantine.py, ``runaway_of``): only that client loses its
session. An arbiter with nobody to take over (embedded, or a daemon without the control
daemon) enters FAULT as above.

The watchdog (the engine measures, this thread decides) is there for each dispatch: a batch
of tiny dispatches must not lend its length to a runaway one in it, and a batch of honest
long dispatches must not fault the server. One fence completes a whole ``vkQueueSubmit``,
and timestamps do not tell how far into a batch the device is (lavapipe's
vkGetQueryPoolResults waits for the queue to go idle first). So the engine has the device
write a progress marker after each command of a batch (vkCmdFillBuffer into a mapped word,
``mark_progress`` in ``libshare/arbiter/engine/flights.c``), and a submission's clock starts
when it reaches the head of the device's queue (the time it spent queued behind another
does not count) and starts again each time the marker moves. A single command faults at the
watchdog, exactly; a command in a batch within twice the watchdog (it may have started up
to one watchdog before the marker was last seen to move); a batch of legal commands runs as
long as they take. A batch whose marker could not be made has twice the watchdog in all.
The client that tripped the watchdog is named in server.log and shown RUNAWAY in ``ps``
until its work ends or the arbiter exits: in a batch, the client of the command the progress
marker says runs (the marker counts the commands that ended); only a batch without the
marker names each client of the submission (SUSPECT: which of their dispatches ran cannot be
told). A RUNAWAY client is
also journaled (``quarantine.py``) until its work ends: should the arbiter exit first, the
next one on the pipe directory counts a strike against that process and its program.
"""

from __future__ import annotations

import logging
import threading
import time

from libshare.errors import ClientTerminated, ServerFault, ServerNotReady
from libshare.ring import C
from libshare.arbiter.serve.clients import Client
from libshare.arbiter.engine.binding import PROGRAM
from libshare.arbiter.drain.quarantine import RUNAWAY

log = logging.getLogger("libshare.arbiter")

_FAULT_POLL = 0.1  # seconds between looks at faulted work that still runs


class Containment:
    """How the control thread contains a client or a fault, and the server's state (owned by Drainer).

    It reaches its owner through ``owner.engine`` and ``owner.device`` (new ones after a recovery),
    ``owner.disconnect(client)``, ``owner.replace_device()`` and ``owner.planner.watchdog``; the owner
    passes the task queue (``tasks``: the fault watcher posts to it), its clients by id and by slot,
    the freed objects still in use (``released``), the quarantine and the shared pipelines."""

    def __init__(self, owner, tasks, *, clients: dict, by_slot: dict, released: dict, quarantine, pipelines):
        self._owner, self._tasks = owner, tasks
        self._clients, self._by_slot, self._released = clients, by_slot, released
        self._quarantine, self._pipelines = quarantine, pipelines
        self.state = "ACTIVE"
        """INITIALIZING, ACTIVE or FAULT."""
        self.fault_waiting: set[int] = set()
        """Ids of the faulted clients whose connection is still open (the device is recreated without them)."""
        self.faulted_memory: list = []
        """Host memory imported into the faulted device, closed once that device is closed."""
        self.recovery_timeout = 10.0
        """Seconds work still running after a fault may take to end before the device is given up."""
        self.unrecoverable: str | None = None
        """Why the device was given up (see _give_up); None while it serves or may recover."""
        self.on_unrecoverable = None
        """Called with that reason, on the control thread, when the device is given up (the daemon exits)."""
        self.on_stuck = None
        """Set when a standby arbiter waits to take over (a daemon arbiter under the control daemon):
        called with the reason, on the control thread, instead of entering FAULT when the device
        cannot serve on (a dispatch past the watchdog, a lost device). It ends this process at once
        and does not return (see "Handing over at once" in the module's essay)."""
        self._fault_since = 0.0  # time.monotonic() when the server entered FAULT
        self._fault_watcher: threading.Thread | None = None
        self._runaway_record = None  # the quarantine's record of the runaway that faulted the server, until it ends

    def terminate(self, client: Client) -> None:
        """Cancel a client's queued work and reclaim it once its running work ends (sticky error)."""
        if client.closing:
            return
        log.info("%s: status is INACTIVE (terminated by the operator)", client.describe())
        self._contain(client, ClientTerminated("the operator terminated this client (terminate_client); "
                                               "reconnect to go on"), C.ECANCELED)

    def _contain(self, client: Client, sticky: Exception, reason: int) -> None:
        client.sticky = sticky
        client.state = "INACTIVE"
        if not client.closing:
            self._owner.engine.close_client(client.slot, reason)  # closes its ring, answers what it still holds
        self._owner.disconnect(client)

    def enter_fault(self, reason: str, offender: Client | None = None, runaway: tuple[Client, ...] = ()) -> None:
        """Put the server in FAULT: fail everything outstanding, make every client INACTIVE.

        Work the device has finished or lost is answered LS_EFAULT at once. Work it still runs
        stays in flight, its descriptors outstanding, for nothing can stop it: see "States" in
        the module's essay. ``runaway`` are the clients whose submission tripped the watchdog
        (ps shows them RUNAWAY, or SUSPECT when several shared it, until it ends).
        """
        engine = self._owner.engine
        engine.set_fault(True)
        if self.state == "FAULT":
            return
        self.state = "FAULT"
        self._fault_since = time.monotonic()
        log.error("server status is FAULT: %s%s", reason,
                  f"; raised by {offender.describe()}" if offender else
                  f"; raised by one of {', '.join(c.describe() for c in runaway)}" if runaway else "")
        affected = [c for c in self._clients.values() if not c.closing]
        log.error("clients affected by the fault: %s", ", ".join(f"pid {c.pid}" for c in affected) or "none")
        for client in affected:
            self.fault_waiting.add(client.id)
            self._contain(client, ServerFault(f"the arbiter's device faulted ({reason}); this session is "
                                              "lost, reconnect once the server is ACTIVE again"), C.EFAULT)
        for client in runaway:
            client.state = "RUNAWAY" if len(runaway) == 1 else "SUSPECT"
        if engine.in_flight():
            log.error("%d submission(s) still run on the device and nothing can stop them; they get %g s to "
                      "end before the device is given up", engine.in_flight(), self.recovery_timeout)
            self._watch_fault()
        self.maybe_recover()

    def device_failed(self, reason: str) -> None:
        """The device reported itself lost or failed: hand over to a standby, or enter FAULT."""
        if self.on_stuck is not None and self.state == "ACTIVE":
            self.on_stuck(reason)
        self.enter_fault(reason)

    def watchdog_fired(self, event, suspects: list[tuple[Client, int]]) -> None:
        """The engine's head submission ran past its limit: the watchdog for a single command, for a
        command of a marked batch since the marker last moved, twice the watchdog for an unmarked
        batch (see the module's essay). ``suspects``: each client of the submission, with the one
        program its dispatches there ran (0: none, or several)."""
        if self.state != "ACTIVE":
            return  # faulted already: maybe_recover gives the running work its time to end
        watchdog = self._owner.planner.watchdog
        programs = [program for _, program in suspects]
        suspects = [client for client, _ in suspects]
        count, running, marked = event.a, event.b / 1e9, bool(event.kind)
        limit = watchdog if count == 1 or marked else 2 * watchdog
        where = (f"since its last command ended (its command {event.code + 1} running)" if marked
                 else "at the head of the device's queue")
        log.error("a submission of %d command(s) has run %.1f s %s, past its %.1f s limit (the %g s watchdog%s); "
                  "its clients: %s", count, running, where, limit,
                  watchdog, "" if count == 1 or marked else ", twice over for an unmarked batch",
                  ", ".join(c.describe() for c in suspects))
        if len(suspects) == 1:  # journaled until that work ends (several: which one ran cannot be told)
            digest = self._program_digest(suspects[0], programs[0])
            self._runaway_record = self._quarantine.begin(RUNAWAY, suspects[0], digest, ends_with_close=False)
        reason = f"a dispatch ran past the {watchdog:g} s watchdog"
        if self.on_stuck is not None:
            self.on_stuck(f"{reason}; its client{'s' if len(suspects) > 1 else ''}: "
                          f"{', '.join(c.describe() for c in suspects)}")
        self.enter_fault(reason, suspects[0] if len(suspects) == 1 else None, tuple(suspects))

    def _program_digest(self, client: Client, program_id: int) -> bytes | None:
        """The module of a client's program (one it freed may still run: it waits in ``released``)."""
        record = client.programs.get(program_id) or self._released.get((client.slot, PROGRAM, program_id),
                                                                         (None, None))[1]
        return self._pipelines.digest_of(record.pipeline) if record is not None else None

    def _watch_fault(self) -> None:
        """Until the fault is over, have the control thread look every _FAULT_POLL s whether the faulted
        work has ended or outlived ``recovery_timeout`` (nothing else wakes it once the clients are gone)."""
        if self._fault_watcher is not None and self._fault_watcher.is_alive():
            return

        def watch():
            while self.state == "FAULT" and self.unrecoverable is None and not self._tasks.stopping:
                time.sleep(_FAULT_POLL)
                try:
                    self._tasks.post(self.maybe_recover)
                except ServerNotReady:
                    return

        self._fault_watcher = threading.Thread(target=watch, name="libshare-fault-watch", daemon=True)
        self._fault_watcher.start()

    def maybe_recover(self) -> None:
        """Recreate the device once the faulted work has ended and every faulted client has gone;
        give the device up once that work outlives ``recovery_timeout``. Never waits for the device."""
        if self.state != "FAULT" or self.unrecoverable is not None:
            return
        owner = self._owner
        if owner.engine.in_flight():
            running = time.monotonic() - self._fault_since
            if running >= self.recovery_timeout:
                clients = [self._by_slot[s].describe() for s in owner.engine.in_flight_clients()
                           if s in self._by_slot]
                self._give_up(f"{owner.engine.in_flight()} submission(s) of {', '.join(clients) or 'gone clients'} "
                              f"still run {running:.1f} s after the fault")
            return
        self._quarantine.end(self._runaway_record)  # the runaway ended: it did not end the arbiter
        self._runaway_record = None
        if self.fault_waiting or self._clients:
            return
        self.state = "INITIALIZING"
        log.info("server status is INITIALIZING: recreating the device")
        owner.engine.stop(0)
        owner.engine.destroy()
        self._pipelines.forget()
        try:
            closed = owner.device.close(self.recovery_timeout)  # nothing runs: the fences say so at once
        except Exception:
            log.exception("closing the faulted device")
            closed = True
        if not closed:
            self.state = "FAULT"
            self._give_up("the faulted device did not go idle (a compile or a zero fill still runs on it)")
            return
        for memory in self.faulted_memory:
            memory.close()
        self.faulted_memory.clear()
        try:
            owner.replace_device()
        except Exception as exc:
            self.state = "FAULT"
            log.error("recreating the device failed: %s", exc)
            return
        self.state = "ACTIVE"
        log.info("server status is ACTIVE: %s recreated", owner.device.name)

    def _give_up(self, why: str) -> None:
        """The device cannot be recovered in this process: say so, and tell whoever runs the arbiter."""
        self.unrecoverable = why
        log.error("the device cannot be recovered in this process: %s (Vulkan cannot abort a dispatch, and the "
                  "driver of %s has not reset the device; lavapipe never does); the arbiter must be restarted",
                  why, self._owner.device.name)
        if self.on_unrecoverable is not None:
            self.on_unrecoverable(why)
