"""The arbiter: the control server in front of the drain loop, composed of a few objects.

:class:`Arbiter` owns one Vulkan device (through the drainer, drain/) and serves clients over
Unix sockets. The same class runs as a daemon (:meth:`Arbiter.serve`) and embedded inside a
client process (:meth:`Arbiter.attach`, on one end of a socketpair). It is made from the
settings table (libshare/settings.py: each argument, else the arbiter's ``LIBSHARE_*``
environment, else the default) and composes:

* the gate (gate.py): the selector thread that accepts and reads first frames;
* :class:`~.hello.Hellos` (hello.py): routes a first frame, admits a hello into a client slot
  and welcomes the client, with ring regions made ahead (:class:`~.hello.SpareRegions`);
* :class:`~.sessions.Sessions` (sessions.py): a welcomed client's thread, its requests read
  one after another, the end of its connection;
* :class:`~.requests.Requests` (requests.py): the request schemas and handlers;
* :class:`~.commands.Commands` (commands.py): the operator's control commands;
* :class:`~.config.Config` (config.py): the operator's configuration file, applied.

Users, share sockets and the client slots are hello.py's essay; connections and threads
sessions.py's; requests, reattaching and the memory a client receives requests.py's.

Descriptors. A daemon arbiter raises its open-file soft limit to the hard limit, and no
arbiter starts when the hard limit cannot hold --max-clients clients. Every client slot keeps
_FDS_PER_CLIENT descriptors free until it is taken, the gate keeps room for the connections it
may hold, and shared buffers (none once the reply has carried the memfd to the client: the
arbiter's mapping keeps no descriptor) get what is left, counted with a bound of
_FDS_PER_BUFFER each: past that an alloc is refused with QuotaExceeded (fd_budget.py), so the
last client can always connect. A hello that runs out all the same (a limit lowered under a
running arbiter) is refused with TooManyClients.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import threading
import time
from pathlib import Path

from libshare import settings as _settings
from libshare.errors import AccessDenied, InvalidSubmission, ServerNotReady
from libshare.ring import C
from libshare.arbiter.serve.clients import Client, Counters
from libshare.arbiter.serve.commands import Commands
from libshare.arbiter.serve.config import Config
from libshare.arbiter.serve.fd_budget import FdBudget, open_fds
from libshare.arbiter.serve.gate import MAX_WAITING, MIN_WAITING, Gate
from libshare.arbiter.serve.hello import Hellos, SpareRegions
from libshare.arbiter.serve.requests import Requests
from libshare.arbiter.serve.sessions import Sessions
from libshare.arbiter.serve.share_sockets import ShareSockets, bind_listener
from libshare.arbiter.drain.drainer import Drainer
from libshare.arbiter.drain.tasks import CALL_TIMEOUT
from libshare.arbiter.engine.binding import MOST_PIECES as _MOST_PIECES
from libshare.arbiter.policy.limits import (MemoryLimits, buffer_ceiling, device_limit, fitting_total_limit,
                                            total_limit)
from libshare.arbiter.programs.admission import validator_path
from libshare.arbiter.programs.compiler import Compilers
from libshare.arbiter.programs.loading import Interfaces
from libshare.arbiter.device import Device

__all__ = ["Arbiter"]

log = logging.getLogger("libshare.arbiter")

# Kept for each client slot: its socket, pidfd and doorbell (the arbiter's end). Its ring is a
# mapping that keeps no descriptor (ring/_region.py, SharedMapping). A welcome being sent holds two
# more (the client's end of the doorbell, the ring's memfd): the slack covers a few at once, and a
# hello that finds none left is refused with TooManyClients.
_FDS_PER_CLIENT = 3
_FDS_PER_BUFFER = 1  # a shared buffer's memfd, until the reply carries it; its mapping keeps none
_FD_SLACK = 64  # for the rest: logs, control commands, a vetting compile, /proc reads
_MOVED_WORK_POLL = 0.05  # seconds between looks at the moved clients' outstanding work


class Arbiter:
    """Owns one Vulkan device and serves clients over Unix sockets.

    Every setting comes from the settings table (libshare/settings.py): the argument when given,
    else the arbiter's environment, else the table's default. ``device`` is an index or UUID
    (``LIBSHARE_DEVICE``); ``max_clients`` bounds how many may be connected at once;
    ``timed=False`` skips the per-command timestamps (device-time accounting) for the last few
    microseconds. ``multi_user`` (root only) serves clients of every uid; otherwise only the
    arbiter's own uid may connect. ``test_hooks`` (LIBSHARE_TEST_HOOKS) enables the test-only
    control commands. ``mem_limit`` (LIBSHARE_DEVICE_MEM_LIMIT, "2G" or "0=2G,1=1G") is the
    default device memory limit of each client; ``mem_total`` (LIBSHARE_DEVICE_MEM_TOTAL, a size
    or "unlimited") caps all clients' memory together, by default what the device fits (see
    policy/limits.py). ``max_programs`` (LIBSHARE_MAX_PROGRAMS) bounds the programs one client may
    hold, ``max_buffers`` (LIBSHARE_MAX_BUFFERS) its buffers; ``compile_timeout``
    (LIBSHARE_COMPILE_TIMEOUT, CPU seconds) bounds the vetting compile of a new module when the
    arbiter serves other processes (see programs/). ``scheduling`` and ``watchdog`` are the
    scheduling mode and the watchdog's seconds (LIBSHARE_SCHEDULING, LIBSHARE_WATCHDOG_SECONDS).
    ``place_threads`` (a daemon, whose process is the arbiter's alone) puts the engine and the
    driver's threads on a core of their own (see policy/placement.py).
    """

    def __init__(self, device: str | None = None, *, max_clients: int | None = None,
                 lanes: int = 4, lane_entries: int = 256, cq_entries: int = 1024, timed: bool = True,
                 multi_user: bool = False, test_hooks: bool | None = None, scheduling: str | None = None,
                 watchdog: float | None = None, mem_limit: str | None = None, max_programs: int | None = None,
                 compile_timeout: float | None = None, mem_total: str | None = None,
                 place_threads: bool = False, max_buffers: int | None = None):
        if multi_user and os.getuid() != 0:
            raise AccessDenied("multi-user mode needs the arbiter to run as root")
        setting = _settings.value
        selector = setting("device", device)
        self.max_clients = setting("max_clients", max_clients)
        self.max_programs = setting("max_programs", max_programs)
        self.compile_timeout = setting("compile_timeout", compile_timeout)
        self.hello_timeout = setting("hello_timeout")
        self.request_timeout = setting("request_timeout")
        self.test_hooks = setting("test_hooks", test_hooks)
        default_limits = setting("device_mem_limit", mem_limit)
        total = setting("device_mem_total", mem_total)
        policy = (setting("scheduling", scheduling), setting("active_thread_percentage"), setting("priority"),
                  setting("watchdog_seconds", watchdog))
        max_buffers = setting("max_buffers", max_buffers)
        validator_path()  # no client module may run unvalidated: refuse to start without spirv-val
        self._selector = selector or ""
        self.compilers: Compilers | None = None
        """The vetting compilers (set by :meth:`serve`: embedded arbiters compile unvetted)."""
        _raise_fd_limit(self.max_clients)
        self.multi_user = multi_user
        self.group_owners: dict[str, int] = {}
        """The uid that owns each group (set_group_owner): see hello.check_group_allowed."""
        self.started = time.time()
        self.limits = MemoryLimits(max_buffers=max_buffers)
        """Device memory limits: default, server, groups, total (the per-client ones are on each Client)."""
        if total is not _settings.FITS:
            self.limits.total = total_limit(total)
        self.client_oom_score_adj: int | None = None
        """The oom_score_adj each client is raised to at least when it connects (None: left alone).
        Set by a daemon that could not lower its own (see service.py)."""
        self.quit_requested = threading.Event()
        """Set by the ``quit`` control command; the daemon then calls :meth:`close`."""
        self.quit_timeout = 10.0
        self.on_restart = None
        """Called by the ``restart`` command: set by a daemon that a control daemon supervises."""
        self.on_hand_over = None
        """Called by the ``hand_over`` command (a control daemon adopting this arbiter): set by a
        daemon arbiter (service.py); it hands over on a thread of its own."""
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.drainer = Drainer(lambda: Device(selector), self._wake_fd, timed, max_clients=2 * self.max_clients + 64)
        self.limits.buffer_ceiling = buffer_ceiling(self.drainer.max_slots)
        _configure_scheduling(self.drainer, *policy)
        self.commands = Commands(self)
        self.interfaces = Interfaces()
        """Reflected SPIR-V modules by content (a program another client loaded is not reflected again)."""
        self._lock = threading.Lock()  # closed, the gate's making, and the client slots and connections
        self.closed = False
        self._gate: Gate | None = None  # made by the first serve or attach
        self.shares: ShareSockets | None = None  # a daemon's share sockets (serve makes it)
        self.fd_budget: FdBudget | None = None
        """The descriptors shared buffers may take (made with the gate)."""
        self.socket_path: Path | None = None
        self._spares = SpareRegions((lanes, lane_entries, cq_entries))
        self.hellos = Hellos(self, self._lock, self._spares)
        self.requests = Requests(self, lambda: len(self.hellos))
        self.sessions = Sessions(self, self._lock, self.hellos, self.requests, self._spares)
        self.drainer.placement = place_threads
        self.drainer.start()
        self.limits.default = device_limit(default_limits, self.device.index, self.device.uuid)
        if total is _settings.FITS:
            self.limits.total = fitting_total_limit(self.device)
        log.info("memory of all clients together: %s", self.limits.total.describe() if self.limits.total
                 else "unlimited (LIBSHARE_DEVICE_MEM_TOTAL)")
        log.info("arbiter pid %d on device %d: %s (%s); server status is ACTIVE", os.getpid(),
                 self.device.index, self.device.name, self.device.uuid)
        self.config = Config(self)
        """The operator's configuration file (a daemon's --config) and where each setting comes from."""

    @property
    def device(self) -> Device:
        """The device (a new one after recovery from a fault)."""
        return self.drainer.device

    @property
    def state(self) -> str:
        """The server's state: INITIALIZING, ACTIVE or FAULT."""
        return self.drainer.containment.state

    # ---------------------------------------------------------------- accepting

    def serve(self, path: Path) -> None:
        """Listen on the Unix socket ``path``: mode 0600, or 0666 in multi-user mode, where the
        arbiter checks each peer's uid itself. The gate's thread accepts (see gate.py)."""
        self.drainer.quarantine.open(path.parent)  # strikes for what a dead arbiter left, before anyone connects
        self._vet_compiles()
        self.compilers.remember_passed(path.parent / "vetted")
        _raise_fd_limit(self.max_clients, to_hard=True)
        gate = self._start_gate()
        listener = bind_listener(path, self.multi_user)
        self.socket_path = path
        gate.listen(listener)
        self.shares = ShareSockets(path.parent, self.multi_user, gate.listen, gate.unlisten)

    supervised = False
    """A control daemon supervises this arbiter (the daemon sets it): a session may wait for the next
    one when it dies, which the welcome says (a container cannot see the control daemon's lock)."""

    @property
    def share_clients(self) -> int:
        """The most clients one share socket may serve at once: a quarter of ``max_clients``."""
        return max(1, self.max_clients // 4)

    @property
    def user_clients(self) -> int:
        """The most clients one uid other than root's and the arbiter's may have at once: all but a
        quarter of ``max_clients``, which stays for the other users (one user that opened every
        slot locked every other user out). A job of many ranks on one device keeps most slots."""
        return max(1, self.max_clients - self.share_clients)

    def prepare_to_serve(self) -> None:
        """Start what :meth:`serve` needs before it listens (the vetting compilers): a standby does
        this while it waits, so that it serves at once when it takes over."""
        self._vet_compiles()

    def stop_accepting(self) -> None:
        """Hand-over, first step: close the listener and every connection not yet a client, and
        remove the socket (a new arbiter binds its own). Clients keep being served."""
        if self._gate is not None:
            self._gate.close()
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
            self.socket_path = None

    def move_clients(self) -> None:
        """Hand-over, second step: close every client's ring with LS_EMOVED. The engine answers
        what it had not started with LS_EMOVED and finishes what runs; the session sends the
        work that did not run to the new arbiter, under the same tickets (see libshare/client/reattach.py)."""
        drainer = self.drainer
        drainer.call(lambda: [drainer.engine.close_client(c.slot, C.EMOVED)
                              for c in list(drainer.clients.values()) if not c.closing])

    def finish_moved_work(self, timeout: float) -> bool:
        """Hand-over, last step: wait until the engine has answered all the work the moved clients'
        sessions wait for (a dispatch in pieces goes on piece by piece, each under the watchdog),
        at most ``timeout`` s. True once nothing of theirs is outstanding."""
        drainer = self.drainer

        def outstanding() -> int:
            return sum(drainer.engine.stats(c.slot).outstanding for c in drainer.clients.values() if c.slot >= 0)

        deadline = time.monotonic() + timeout
        while (left := drainer.call(outstanding)) and time.monotonic() < deadline:
            time.sleep(_MOVED_WORK_POLL)
        return not left

    def moved_work_bound(self) -> float:
        """The longest the moved clients' work may legally take: each piece of a cut dispatch (and
        each whole dispatch) runs within the watchdog, and a dispatch is cut in 64 pieces at most."""
        return self.drainer.planner.watchdog * (_MOST_PIECES + 1)

    def load_bound(self) -> float:
        """The most seconds a load_program takes to be answered: the vetting compile (its wait for a
        vetting process included), then the arbiter's own compile, bounded by what the vetting one
        was allowed, and the control task that registers the program. A client waits this long."""
        if self.compilers is None:
            return self.compile_timeout + CALL_TIMEOUT
        return self.compilers.answer_bound + self.compilers.wall_limit + CALL_TIMEOUT

    def _vet_compiles(self) -> None:
        """Other processes will connect: compile each new module in a vetting child first."""
        if self.compilers is None:
            self.compilers = Compilers(self._selector, self.compile_timeout, self.drainer.cores)
            self.compilers.prestart()

    def attach(self, conn: socket.socket) -> None:
        """Serve one connected socket (a socketpair end in embedded mode); it says hello to the gate."""
        self._start_gate().add(conn)

    def _start_gate(self) -> Gate:
        with self._lock:
            if self._gate is None:
                if self.closed:
                    raise ServerNotReady("the arbiter is shutting down")
                limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                room = (MAX_WAITING if limit == resource.RLIM_INFINITY else
                        limit - open_fds() - _FD_SLACK - _FDS_PER_CLIENT * self.max_clients)
                waiting = max(MIN_WAITING, min(MAX_WAITING, room // 4))  # the rest serves shared buffers
                self.fd_budget = FdBudget(_FDS_PER_CLIENT, _FDS_PER_BUFFER, waiting, _FD_SLACK)
                self._gate = Gate(self.hellos.route, self.sessions.start, self.commands.answer, max_waiting=waiting,
                                  hello_timeout=self.hello_timeout, request_timeout=self.request_timeout)
            return self._gate

    # ---------------------------------------------------------------- accounting

    def snapshot(self) -> dict:
        """The server's and every connected client's state and counters (for ps and metrics)."""
        try:  # on the control thread, which moves a reclaimed client's counts into the totals
            return self.drainer.call(self._snapshot)
        except ServerNotReady:  # the control thread has stopped: nothing moves any more
            return self._snapshot()

    def _snapshot(self) -> dict:
        # Every client the control thread still holds is listed: one that disconnected while its
        # in-flight work holds memory shows as CLOSING (or INACTIVE) until it is reclaimed, when
        # its counts move into the totals. "clients" counts the connected ones.
        everyone = list(self.drainer.clients.values())
        for client in everyone:
            self.drainer.refresh(client)
        totals = Counters()
        totals.add(self.drainer.totals)
        for client in everyone:
            totals.add(client.counters)
        device = self.device
        server = {"pid": os.getpid(), "state": self.state, "started": self.started,
                  "clients": sum(not c.closing for c in everyone),
                  "device": {"index": device.index, "uuid": device.uuid, "name": device.name},
                  **totals.as_dict(),
                  "memory_bytes": sum(c.counters.memory_bytes for c in everyone),
                  "peak_memory_bytes": self.drainer.peak_memory_bytes}
        return {"server": server, "clients": [_client_row(c, self.limits) for c in everyone]}

    # ---------------------------------------------------------------- shutdown

    def close(self, timeout: float = 10.0) -> bool:
        """Stop accepting, cancel queued work, let in-flight work end (at most ``timeout`` s),
        tell clients, release the device, unlink the socket. Idempotent.

        Returns within about ``timeout`` s whatever the device does: True once the device is
        released, False when work that never ended kept it (it is abandoned to the process's
        exit; see "States" in drain/drainer.py).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            if self.closed:
                return not self.device.instance.abandoned
            self.closed = True
        self.sessions.stop()  # the idle session threads end
        self._spares.close()
        if self._gate is not None:
            self._gate.close()  # the listener, and every connection that has not said hello
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
        log.info("shutting down: %d clients connected", len(self.drainer.clients))
        if self.compilers is not None:
            self.compilers.close()
        self.drainer.quarantine.close()  # a compile still running did not end the arbiter
        stopped = self.drainer.stop(timeout)
        self.sessions.disconnect()
        if not stopped:  # the control thread still uses the device: leave both
            log.error("the control thread did not stop within %.1f s; the device is abandoned", timeout)
            return False
        if self.drainer.abandoned:  # the engine's work still runs on the device: leave it
            log.warning("work still ran on the device at the shutdown timeout: it is abandoned, not destroyed")
            return False
        released = self.device.close(max(deadline - time.monotonic(), 0.0))
        if not released:
            log.warning("work still ran on the device at the shutdown timeout: it is abandoned, not destroyed")
        os.close(self._wake_fd)
        return released


def _raise_fd_limit(max_clients: int, to_hard: bool = False) -> None:
    """Lift the soft open-file limit: to the hard one for a daemon (``to_hard``), else as far as
    ``max_clients`` clients need (an embedded arbiter shares its client's process).

    InvalidSubmission when even the hard limit cannot hold ``max_clients`` clients.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = _nr_open() if hard == resource.RLIM_INFINITY else hard
    base = open_fds() + _FD_SLACK + _FDS_PER_CLIENT * max_clients
    if ceiling < base + MIN_WAITING:
        raise InvalidSubmission(f"{max_clients} clients need about {base + MIN_WAITING} open files and the "
                                f"hard limit is {ceiling}: raise it (ulimit -Hn, LimitNOFILE= in a systemd "
                                "unit) or lower --max-clients")
    target = ceiling if to_hard else min(ceiling, base + MAX_WAITING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)


def _nr_open() -> int:
    """The most descriptors a process may be allowed (fs.nr_open)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def _configure_scheduling(drainer: Drainer, mode: str, share: int, priority: str, watchdog: float) -> None:
    """The scheduling mode, the default compute share and priority, and the watchdog (0: off), read
    from the settings table."""
    drainer.scheduler.mode = mode
    drainer.scheduler.default_share = share
    drainer.scheduler.default_priority = priority
    drainer.planner.watchdog = watchdog if watchdog > 0 else None


def _client_row(client: Client, limits: MemoryLimits) -> dict:
    limit = limits.client_limit(client)
    # CLOSING: disconnected, its in-flight work still running (and holding its memory).
    state = "CLOSING" if client.closing and client.state == "ACTIVE" else client.state
    return {"pid": client.pid, "client_id": client.id, "name": client.name, "group": client.group,
            "state": state, "priority": client.priority, "connected": client.connected,
            "cmdline": client.cmdline, "mem_limit": None if limit is None else limit.value,
            **client.counters.as_dict()}
