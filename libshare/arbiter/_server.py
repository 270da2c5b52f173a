"""The arbiter: the control server in front of the drain loop.

Each connection gets a thread that reads length-bounded frames and answers
them; a client that sends garbage, stalls, or dies affects only its own
thread. The peer's pid and uid come from SO_PEERCRED, never from a message.
Requests that touch the device (program load, alloc, free) run on the drain
thread as tasks. The same class runs as a daemon (``serve``) and embedded
inside a client process (``attach`` on one end of a socketpair).

A connection whose first frame is a control command (``op: control``) is an
operator's: it gets the commands of _commands.py instead of a session.
"""

from __future__ import annotations

import logging
import mmap
import os
import resource
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np

from .. import _protocol as protocol
from ..errors import (AccessDenied, InvalidSubmission, LibshareError, ProtocolError, QuotaExceeded,
                      ServerNotReady, TooManyClients)
from ..ring import Region
from ._clients import BufferRecord, Client, Counters, ProgramRecord, SharedMemory
from ._commands import Commands
from ._scheduler import MODES, UNSCHEDULED, percentage, priority_name
from ._drain import Drainer
from ._limits import MemoryLimits, device_limit, parse_device_limits
from ._admission import validator_path
from ._compiler import Compilers
from ._programs import MAX_PROGRAMS, Interfaces, check_program_quota
from .device import Device

log = logging.getLogger("libshare.arbiter")

_PAGE = mmap.PAGESIZE
_MAX_BUFFER = 1 << 40
_MAX_CLIENTS = 4096
_FDS_PER_CLIENT = 4  # socket, pidfd, buffers come and go: a margin
_WATCHDOG = 120.0  # default seconds one submission may run before the server faults
_REQUEST_TIMEOUT = 30.0  # a client that starts a frame must finish it within this
_SPARE_REGIONS = 2  # ring regions made ahead of the hellos that will take them
_COMPILE_TIMEOUT = 10.0  # default seconds a vetting compile may take


class Arbiter:
    """Owns one Vulkan device and serves clients over Unix sockets.

    ``device`` is an index or UUID (``LIBSHARE_DEVICE``); ``max_clients`` bounds
    how many may be connected at once; ``timed=False`` skips the per-command
    timestamps (device-time accounting) for the last few microseconds.
    ``multi_user`` (root only) serves clients of every uid; otherwise only the
    arbiter's own uid may connect. ``test_hooks`` (or LIBSHARE_TEST_HOOKS=1)
    enables the ``inject_fault`` control command. ``mem_limit`` (or LIBSHARE_DEVICE_MEM_LIMIT,
    "2G" or "0=2G,1=1G") is the default device memory limit of each client (see _limits.py).
    ``max_programs`` (LIBSHARE_MAX_PROGRAMS) bounds the programs one client may hold;
    ``compile_timeout`` (LIBSHARE_COMPILE_TIMEOUT, seconds) bounds the vetting compile of a
    new module when the arbiter serves other processes (see _programs.py and _compiler.py).
    """

    def __init__(self, device: str | None = None, *, max_clients: int = 48,
                 lanes: int = 4, lane_entries: int = 256, cq_entries: int = 1024, timed: bool = True,
                 multi_user: bool = False, test_hooks: bool | None = None, scheduling: str | None = None,
                 watchdog: float | None = None, mem_limit: str | None = None, max_programs: int | None = None,
                 compile_timeout: float | None = None):
        if multi_user and os.getuid() != 0:
            raise AccessDenied("multi-user mode needs the arbiter to run as root")
        selector = device if device is not None else os.environ.get("LIBSHARE_DEVICE")
        if not 1 <= max_clients <= _MAX_CLIENTS:
            raise InvalidSubmission(f"max_clients must be in 1..{_MAX_CLIENTS} (got {max_clients})")
        self.max_clients = max_clients
        validator_path()  # no client module may run unvalidated: refuse to start without spirv-val
        self.max_programs = _setting(max_programs, "LIBSHARE_MAX_PROGRAMS", int, MAX_PROGRAMS)
        self.compile_timeout = _setting(compile_timeout, "LIBSHARE_COMPILE_TIMEOUT", float, _COMPILE_TIMEOUT)
        self._selector = selector or ""
        self.compilers: Compilers | None = None
        """The vetting compilers (set by :meth:`serve`: embedded arbiters compile unvetted)."""
        _raise_fd_limit(max_clients)
        self.multi_user = multi_user
        self.test_hooks = test_hooks if test_hooks is not None else os.environ.get("LIBSHARE_TEST_HOOKS") == "1"
        self.started = time.time()
        mem_limit = mem_limit if mem_limit is not None else os.environ.get("LIBSHARE_DEVICE_MEM_LIMIT", "")
        default_limits = parse_device_limits(mem_limit) if mem_limit.strip() else {}
        self.limits = MemoryLimits()
        """Device memory limits: default, server, groups (the per-client ones are on each Client)."""
        self.quit_requested = threading.Event()
        """Set by the ``quit`` control command; the daemon then calls :meth:`close`."""
        self.quit_timeout = 10.0
        self._geometry = (lanes, lane_entries, cq_entries)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.drainer = Drainer(lambda: Device(selector), self._wake_fd, timed)
        _configure_scheduling(self.drainer, scheduling, watchdog)
        self.commands = Commands(self)
        self.interfaces = Interfaces()
        """Reflected SPIR-V modules by content (a program another client loaded is not reflected again)."""
        self._lock = threading.Lock()
        self._next_client = 1
        self._connections: set[socket.socket] = set()
        self._attached: set[int] = set()  # ids of the clients whose connection is open (the client limit)
        self._listener: socket.socket | None = None
        self.socket_path: Path | None = None
        self.closed = False
        self._spare_regions: list[Region] = []
        for _ in range(_SPARE_REGIONS):  # made now, so that the arbiter's fd count stays level afterwards
            self._make_spare_region()
        self.drainer.start()
        self.limits.default = device_limit(default_limits, self.device.index, self.device.uuid)
        log.info("arbiter pid %d on device %d: %s (%s); server status is ACTIVE", os.getpid(),
                 self.device.index, self.device.name, self.device.uuid)

    @property
    def device(self) -> Device:
        """The device (a new one after recovery from a fault)."""
        return self.drainer.device

    @property
    def state(self) -> str:
        """The server's state: INITIALIZING, ACTIVE or FAULT."""
        return self.drainer.state

    # ---------------------------------------------------------------- accepting

    def serve(self, path: Path) -> None:
        """Listen on the Unix socket ``path`` (mode 0600) in a background thread."""
        self._vet_compiles()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old_umask)
        listener.listen(socket.SOMAXCONN)  # the kernel caps it (net.core.somaxconn)
        self._listener, self.socket_path = listener, path
        threading.Thread(target=self._accept_loop, name="libshare-accept", daemon=True).start()

    def _vet_compiles(self) -> None:
        """Other processes will connect: compile each new module in a vetting child first."""
        if self.compilers is None:
            self.compilers = Compilers(self._selector, self.compile_timeout)
            self.compilers.prestart()

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.attach(conn)

    def attach(self, conn: socket.socket) -> None:
        """Serve one connected socket (from accept, or a socketpair end in embedded mode)."""
        with self._lock:
            self._connections.add(conn)
        threading.Thread(target=self._serve_connection, args=(conn,), name="libshare-client",
                         daemon=True).start()

    # ---------------------------------------------------------------- one connection

    def _serve_connection(self, conn: socket.socket) -> None:
        client = None
        try:
            pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            frame = protocol.recv(conn)
            if frame.fields.get("op") == "control":
                self.commands.serve(conn, frame, pid, uid)
                return
            client = self._hello(conn, frame.fields, pid, uid)
            while True:
                frame = protocol.recv(conn)
                client.counters.control_bytes += len(frame.payload) + 64
                self._answer(conn, client, frame)
        except LibshareError as exc:  # before OSError: some libshare errors are OSErrors too
            self._reply_error(conn, exc)
        except (EOFError, OSError):
            pass  # the client went away
        except Exception:
            log.exception("connection handler error")
        finally:
            if client is not None:
                log.info("%s disconnected", client.describe())
                with self._lock:
                    self._attached.discard(client.id)
                try:
                    self._call(self.drainer.connection_closed, client)
                except LibshareError:
                    pass  # the arbiter is shutting down, and its shutdown reclaims every client
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _reply_error(self, conn: socket.socket, exc: Exception) -> None:
        try:
            protocol.send(conn, {"ok": False, "error": type(exc).__name__, "message": str(exc)})
        except (LibshareError, OSError):
            pass

    def _answer(self, conn: socket.socket, client: Client, frame: protocol.Frame) -> None:
        handler = self._HANDLERS.get(frame.fields.get("op"))
        try:
            if client.sticky is not None:
                raise client.sticky
            if handler is None:
                raise ProtocolError(f"unknown request {frame.fields.get('op')!r}")
            fields, fds = handler(self, client, frame)
        except LibshareError as exc:
            self._reply_error(conn, exc)
            return
        protocol.send(conn, {"ok": True, **fields}, fds=fds)

    def _call(self, fn, *args):
        return self.drainer.call(fn, *args)

    # ---------------------------------------------------------------- requests

    def _hello(self, conn: socket.socket, fields: dict, pid: int, uid: int) -> Client:
        if fields.get("op") != "hello":
            raise ProtocolError("the first message must be hello")
        if uid != os.getuid() and not self.multi_user:
            log.warning("refused pid %d: uid %d is not the arbiter's uid %d", pid, uid, os.getuid())
            raise AccessDenied(f"uid {uid} may not use this arbiter: it runs as uid {os.getuid()} "
                               "and was not started in multi-user mode")
        priority, share = _requested_priority_and_share(fields, self.drainer.scheduler.default_priority)
        name = str(fields.get("name") or f"pid{pid}")[:64]
        group = str(fields.get("group") or "")[:64]
        env_limit = fields.get("mem_limit")
        if env_limit is not None:
            env_limit = device_limit(env_limit, self.device.index, self.device.uuid)
        with self._lock:
            if self.closed:
                raise ServerNotReady("the arbiter is shutting down")
            if self.state != "ACTIVE":
                raise ServerNotReady(f"server not ready: its state is {self.state}; retry once it is ACTIVE")
            if len(self._attached) >= self.max_clients:
                raise TooManyClients(f"the arbiter already serves {len(self._attached)} clients (its limit is "
                                     f"{self.max_clients}); wait for one to leave or raise --max-clients")
            client_id = self._next_client
            self._next_client += 1
            self._attached.add(client_id)
            region = self._spare_regions.pop() if self._spare_regions else None
        try:
            region = region or Region.create(*self._geometry)
            region.announce_consumer()
            if pid != os.getpid():  # an embedded client is this process: nothing to watch
                region.watch_peer(pid)
        except BaseException:
            if region is not None:
                region.close()
            with self._lock:
                self._attached.discard(client_id)
            raise
        client = Client(client_id, pid, uid, name, priority, region, group=group, cmdline=_cmdline(pid),
                        requested_share=share, env_mem_limit=env_limit)
        self.drainer.post(self.drainer.add_client, client)  # ahead of every later task of this client
        try:
            protocol.send(conn, {"ok": True, "client_id": client_id, "arbiter_pid": os.getpid(),
                                 "device": self.device.name},
                          fds=(region.fd, self._wake_fd))
        except BaseException:  # gone before the welcome: reclaim what was made for it
            self.drainer.post(self.drainer.connection_closed, client)
            with self._lock:
                self._attached.discard(client_id)
            raise
        log.info("%s connected (uid %d%s)", client.describe(), uid, f", group {group}" if group else "")
        self._make_spare_region()
        return client

    def _make_spare_region(self) -> None:
        """Keep a ring region or two made ahead, so that the next hello does not wait for one."""
        with self._lock:
            if self.closed or len(self._spare_regions) >= _SPARE_REGIONS:
                return
        region = Region.create(*self._geometry)
        with self._lock:
            if not self.closed and len(self._spare_regions) < _SPARE_REGIONS:
                self._spare_regions.append(region)
                return
        region.close()

    def _load_program(self, client: Client, frame: protocol.Frame):
        check_program_quota(client, list(self.drainer.clients.values()), self.max_programs)  # before any work
        digest, interface = self.interfaces.of(frame.payload, self.device)
        push_size = -(-interface.push_constant_size // 4) * 4  # Vulkan ranges are whole words
        if self.compilers is not None and not self.drainer.pipelines.has(digest):
            try:
                self.compilers.vet(frame.payload, len(interface.bindings), push_size, interface.entry_point)
            except InvalidSubmission as exc:  # it crashed or outran the time limit: refuse it for everyone
                self.interfaces.refuse(digest, exc)
                log.warning("%s: program %s refused: %s", client.describe(), digest.hex()[:16], exc)
                raise
        pipeline = self.drainer.pipelines.acquire(self.device, digest, frame.payload, interface, push_size)

        def register():
            self.drainer.pipelines.collect(self.device)
            try:
                check_program_quota(client, self.drainer.clients.values(), self.max_programs)
            except QuotaExceeded:
                self.drainer.pipelines.release(self.device, pipeline)
                raise
            record = ProgramRecord(client.new_id(), pipeline, len(interface.bindings), push_size)
            client.programs[record.id] = record
            return record.id

        program_id = self._call(register)
        return {"program_id": program_id, "bindings": len(interface.bindings),
                "push_size": push_size, "local_size": list(interface.local_size)}, ()

    def _alloc(self, client: Client, frame: protocol.Frame):
        size, kind = frame.fields.get("size"), frame.fields.get("kind", "shared")
        if not isinstance(size, int) or not 0 < size <= _MAX_BUFFER:
            raise InvalidSubmission(f"buffer size must be an integer in 1..{_MAX_BUFFER} (got {size!r})")
        if kind not in ("shared", "device"):
            raise InvalidSubmission(f"buffer kind must be 'shared' or 'device' (got {kind!r})")
        rounded = -(-size // _PAGE) * _PAGE
        self.limits.check(client, list(self.drainer.clients.values()), rounded)  # before any memory exists
        memory = _shared_memory(rounded) if kind == "shared" else None

        def create():
            self.limits.check(client, self.drainer.clients.values(), rounded)  # again, one alloc at a time
            if memory is not None:
                device_buffer = self.device.import_host(memory.address, rounded)
            else:
                device_buffer = self.device.alloc_device(rounded)
            record = BufferRecord(client.new_id(), kind, rounded, device_buffer, memory)
            client.buffers[record.id] = record
            client.counters.memory_bytes += rounded
            client.counters.peak_memory_bytes = max(client.counters.peak_memory_bytes,
                                                    client.counters.memory_bytes)
            self.drainer.note_memory()
            return record.id

        try:
            buffer_id = self._call(create)
        except BaseException:
            if memory is not None:
                memory.close()
            raise
        return {"buffer_id": buffer_id, "size": rounded}, ((memory.fd,) if memory else ())

    def _free(self, client: Client, frame: protocol.Frame):
        def free():
            self.drainer.drain_client(client)  # descriptors pushed before this request still see the buffer
            record = (client.buffers.get(frame.fields.get("buffer_id"))
                      if "buffer_id" in frame.fields else client.programs.get(frame.fields.get("program_id")))
            if record is None:
                raise InvalidSubmission(f"no such buffer or program: {frame.fields}")
            self.drainer.free(client, record)

        self._call(free)
        return {}, ()

    def _stats(self, client: Client, frame: protocol.Frame):
        c = client.counters
        return {"client_id": client.id, "submitted": c.submitted, "completed": c.completed,
                "errors": c.errors, "device_ns": c.device_ns, "control_bytes": c.control_bytes,
                "memory_bytes": c.memory_bytes,
                "clients": len(self.drainer.clients)}, ()

    _HANDLERS = {"load_program": _load_program, "alloc": _alloc, "free": _free, "stats": _stats}

    # ---------------------------------------------------------------- shutdown

    # ---------------------------------------------------------------- accounting

    def snapshot(self) -> dict:
        """The server's and every connected client's state and counters (for ps and metrics)."""
        try:  # on the drain thread, which moves a reclaimed client's counts into the totals
            return self.drainer.call(self._snapshot)
        except ServerNotReady:  # the drain thread has stopped: nothing moves any more
            return self._snapshot()

    def _snapshot(self) -> dict:
        everyone = list(self.drainer.clients.values())
        clients = [c for c in everyone if not c.closing]
        totals = Counters()
        totals.add(self.drainer.totals)
        for client in everyone:  # a closing client is in neither list nor totals until reclaimed
            totals.add(client.counters)
        device = self.device
        server = {"pid": os.getpid(), "state": self.state, "started": self.started, "clients": len(clients),
                  "device": {"index": device.index, "uuid": device.uuid, "name": device.name},
                  **totals.as_dict(),
                  "memory_bytes": sum(c.counters.memory_bytes for c in clients),
                  "peak_memory_bytes": self.drainer.peak_memory_bytes}
        return {"server": server, "clients": [_client_row(c, self.limits) for c in clients]}

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting, cancel queued work, let in-flight work end (at most ``timeout`` s),
        tell clients, release the device, unlink the socket. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            connections = list(self._connections)
            spares, self._spare_regions = self._spare_regions, []
        for region in spares:
            region.close()
        if self._listener is not None:
            self._listener.close()
            if self.socket_path is not None:
                self.socket_path.unlink(missing_ok=True)
        log.info("shutting down: %d clients connected", len(self.drainer.clients))
        if self.compilers is not None:
            self.compilers.close()
        self.drainer.stop(timeout)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.device.close()
        os.close(self._wake_fd)


def _setting(value, variable: str, kind, default):
    """An arbiter setting: the argument, else the environment variable, else the default; positive."""
    if value is None:
        text = os.environ.get(variable, "").strip()
        try:
            value = kind(text) if text else default
        except ValueError:
            raise InvalidSubmission(f"bad arbiter setting {variable}={text!r}: not a number") from None
    if not value > 0:
        raise InvalidSubmission(f"bad arbiter setting {variable}: {value!r} must be positive")
    return value


def _raise_fd_limit(max_clients: int) -> None:
    """Lift the soft open-file limit towards the hard one so ``max_clients`` clients fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 256 + _FDS_PER_CLIENT * max_clients
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))


def _configure_scheduling(drainer: Drainer, mode: str | None, watchdog: float | None) -> None:
    """Scheduling mode, default compute share and priority, and watchdog, from arguments or LIBSHARE_*."""
    env = os.environ
    try:
        mode = mode or env.get("LIBSHARE_SCHEDULING") or "throughput"
        if mode not in (*MODES, UNSCHEDULED):
            raise ValueError(f"scheduling must be one of {', '.join(MODES)}, got {mode!r}")
        drainer.scheduler.mode = mode
        drainer.scheduler.default_share = percentage(env.get("LIBSHARE_ACTIVE_THREAD_PERCENTAGE") or 100)
        drainer.scheduler.default_priority = priority_name(env.get("LIBSHARE_DEFAULT_CLIENT_PRIORITY") or "normal")
        seconds = watchdog if watchdog is not None else float(env.get("LIBSHARE_WATCHDOG_SECONDS") or _WATCHDOG)
    except ValueError as exc:
        drainer.device.close()
        raise InvalidSubmission(f"bad arbiter setting: {exc}") from None
    drainer.watchdog = seconds if seconds > 0 else None


def _requested_priority_and_share(fields: dict, default_priority: str) -> tuple[str, int]:
    """The priority and compute share a hello asks for (the share may only lower the arbiter's)."""
    try:
        priority = priority_name(fields.get("priority") or default_priority)
        share = percentage(fields.get("share") or 100)
    except ValueError as exc:
        raise InvalidSubmission(str(exc)) from None
    return priority, share


def _client_row(client: Client, limits: MemoryLimits) -> dict:
    limit = limits.client_limit(client)
    return {"pid": client.pid, "client_id": client.id, "name": client.name, "group": client.group,
            "state": client.state, "priority": client.priority, "connected": client.connected,
            "cmdline": client.cmdline, "mem_limit": None if limit is None else limit.value,
            **client.counters.as_dict()}


def _cmdline(pid: int) -> str:
    """The command line of process ``pid`` (from /proc), or "" if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _shared_memory(size: int) -> SharedMemory:
    """A new memfd of ``size`` bytes, mapped here (page-aligned, so it can be imported)."""
    fd = os.memfd_create("libshare-buffer", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        os.close(fd)
        raise
    address = np.frombuffer(mapping, np.uint8, count=1).ctypes.data
    return SharedMemory(fd, mapping, address)
