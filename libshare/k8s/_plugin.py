"""The device plugin: the kubelet's DevicePlugin service for one arbiter's shares, and its upkeep.

:class:`DevicePlugin` serves ``DevicePlugin`` (v1beta1) on a Unix socket in the kubelet's
device-plugin directory and registers it with the kubelet's ``Registration`` service. One
upkeep thread then, every ``period`` seconds:

* asks the arbiter ``get_server_status`` (and ``get_server_list``, its pid) through a
  :class:`~libshare.protocol.control.ControlConnection`; every share is ``Healthy`` while the arbiter
  answers ACTIVE and ``Unhealthy`` otherwise (INITIALIZING, FAULT, or no answer), and each
  change is streamed to every ListAndWatch caller. When an arbiter becomes ACTIVE (a new one
  after a crash or ``restart`` too, told apart by its pid, and the one found by a plugin that
  just started), the group limits of the current allocations are set on it again and their
  share sockets opened: an arbiter does not inherit them.
* looks at the kubelet's socket: when it was created anew (the kubelet restarted, and removed
  every other socket in the directory, this plugin's too) or this plugin's socket is gone, the
  plugin serves on a fresh socket and registers again. Until the kubelet answers, it retries.

Allocate refuses a request for an Unhealthy device (FAILED_PRECONDITION: the kubelet only
allocates devices it was told are Healthy, and an allocation the arbiter cannot take at once
would run without its limits), records the allocation in the plugin's ledger (_ledger.py: a
state file, so that a plugin restart forgets no running pod's group; UNAVAILABLE when it cannot
be written), answers each container request with a mount and the LIBSHARE_* environment of
:class:`~._shares.Allocation`, sets the allocation's group limits on the arbiter at once
(``set_group_active_thread_percentage``, ``set_group_mem_limit``) and opens the group's share
socket (``open_share``). The mount puts the group's share directory, ``PIPE/shares/GROUP``
(read-only: a client only connects to the socket), at the container's pipe directory: the
container reaches the arbiter only through its share socket, which holds every process that
connects to the group, its limits and the default priority whatever the environment says, and
takes no control command (arbiter/_share_sockets.py; the environment is the container's own,
and a container that dropped LIBSHARE_GROUP once left its group's limits). The limits of a
group whose devices have since been allocated to another container are lifted, and its share
socket closed.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from libshare.protocol import paths as _config
from libshare.protocol.control import ControlConnection
from libshare.protocol.paths import share_directory
from libshare.settings import format_size
from libshare.errors import LibshareError
from libshare.k8s._ledger import Ledger, state_path
from libshare.k8s._shares import DEFAULT_RESOURCE, Allocation, Share, allocate, check_memory
from libshare.k8s._stubs import api_pb2, api_pb2_grpc

__all__ = ["DevicePlugin", "Options", "HEALTHY", "UNHEALTHY", "API_VERSION", "KUBELET_SOCKET"]

log = logging.getLogger("libshare.k8s")

# From the API's constants.go (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1).
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
API_VERSION = "v1beta1"
KUBELET_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")

_MAX_STREAMS = 8  # ListAndWatch streams at once (the kubelet keeps one); more are refused
_WORKERS = _MAX_STREAMS + 8  # so that a full set of streams never starves Allocate
_CONTROL_TIMEOUT = 5.0  # a control command's bound; also how long a dial waits for a supervised restart
_REGISTER_TIMEOUT = 10.0


@dataclass
class Options:
    """How the plugin is set up; ``python -m libshare.k8s --help`` describes each."""

    shares: list[Share]
    pipe_directory: Path = field(default_factory=_config.pipe_directory)
    host_pipe_directory: Path | None = None  # the pipe directory's path on the node (default: pipe_directory)
    kubelet_socket: Path = KUBELET_SOCKET
    resource_name: str = DEFAULT_RESOURCE
    socket_name: str | None = None  # default: from the resource name
    period: float = 1.0

    def __post_init__(self):
        if not self.shares:
            raise ValueError("the plugin needs at least one share to advertise")
        check_memory(self.shares)
        domain, slash, name = self.resource_name.partition("/")
        if not (domain and slash and name) or "/" in name:
            raise ValueError(f"a resource name is DOMAIN/NAME, like {DEFAULT_RESOURCE} (got {self.resource_name!r})")
        if self.period <= 0:
            raise ValueError(f"the health period must be positive (got {self.period})")
        self.pipe_directory = Path(self.pipe_directory)
        self.host_pipe_directory = Path(self.host_pipe_directory or self.pipe_directory)
        self.kubelet_socket = Path(self.kubelet_socket)
        if self.socket_name is None:
            self.socket_name = "libshare-" + name.replace(".", "-") + ".sock"
        if "/" in self.socket_name or self.socket_name in ("", ".", "..", self.kubelet_socket.name):
            raise ValueError(f"the plugin's socket name must be a file name other than the kubelet's "
                             f"(got {self.socket_name!r})")

    @property
    def endpoint(self) -> Path:
        """The plugin's socket: in the kubelet socket's directory, where the kubelet looks for it."""
        return self.kubelet_socket.parent / self.socket_name

    @property
    def state_file(self) -> Path:
        """The plugin's ledger of allocations (_ledger.py), in a directory beside the kubelet's checkpoint."""
        return state_path(self.kubelet_socket, self.socket_name)


class _Devices:
    """The advertised shares and their health; ListAndWatch streams wait on :attr:`changed`."""

    def __init__(self, shares: list[Share]):
        self.shares = {share.id: share for share in shares}
        self.changed = threading.Condition()
        self.generation = 0  # counts changes; a stream sends a list whenever it moved
        self.healthy = False  # until the arbiter has said ACTIVE
        self.closed = False

    def set_healthy(self, healthy: bool) -> bool:
        """Record the arbiter's health; True when that changed it (the streams are woken)."""
        with self.changed:
            if healthy == self.healthy:
                return False
            self.healthy = healthy
            self.generation += 1
            self.changed.notify_all()
            return True

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def listing(self) -> api_pb2.ListAndWatchResponse:
        """The current list (call with :attr:`changed` held)."""
        health = HEALTHY if self.healthy else UNHEALTHY
        return api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=i, health=health) for i in self.shares])


class _Arbiter:
    """The plugin's control connection to the arbiter, and the group limits it owes each arbiter
    (those of the ledger's allocations)."""

    def __init__(self, pipe_directory: Path, ledger: Ledger):
        self.pipe_directory = pipe_directory
        self._connection: ControlConnection | None = None
        self._lock = threading.Lock()  # one command at a time on the connection, and the ledger
        self._ledger = ledger
        self._served_pid: int | None = None  # the arbiter that has every group limit of the ledger

    def _run(self, command: str, *args: str) -> str:
        if self._connection is None:
            self._connection = ControlConnection(self.pipe_directory, timeout=_CONTROL_TIMEOUT)
        try:
            return self._connection.run(command, *args)
        except (LibshareError, OSError, EOFError):
            self._drop()
            raise

    def _drop(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            connection.close()

    def status(self) -> tuple[str, int | None]:
        """The arbiter's state and pid: ("ACTIVE", 123), or ("UNREACHABLE: why", None).
        An ACTIVE arbiter not yet given the group limits gets them first."""
        with self._lock:
            try:
                state = self._run("get_server_status").strip()
                pid = int(self._run("get_server_list").split()[0]) if state == "ACTIVE" else None
            except (LibshareError, OSError, EOFError, ValueError, IndexError) as exc:
                self._drop()
                self._served_pid = None
                return f"UNREACHABLE: {exc}", None
            if state == "ACTIVE" and pid != self._served_pid and self._send(self._ledger.allocations()):
                self._served_pid = pid
            return state, pid

    def add(self, allocations: list[Allocation]) -> None:
        """Record new allocations in the ledger (superseding the groups their devices were in) and set
        their limits; OSError, with nothing recorded or set, when the ledger cannot be written."""
        with self._lock:
            self._ledger.add(allocations)
            if self._served_pid is None:
                log.warning("the arbiter at %s has not answered ACTIVE yet: the group limits of %s will be set "
                            "once it does", self.pipe_directory, ", ".join(a.group for a in allocations))
            elif not self._send(allocations):
                self._served_pid = None  # the upkeep thread sends them all to the next ACTIVE arbiter

    def _send(self, allocations) -> bool:
        """Lift superseded groups' limits and close their share sockets (on any arbiter: a new one has
        none, and says so); set the limits of ``allocations`` and open their share sockets (after
        the limits: a process may connect at once). False when the arbiter did not take it."""
        try:
            lifted = sorted(self._ledger.lifted)
            for group in lifted:
                self._run("close_share", group)
                self._run("set_group_mem_limit", group, "unlimited")
                self._run("set_group_active_thread_percentage", group, "100")
            self._ledger.told(lifted)
            for allocation in allocations:
                self._run("set_group_active_thread_percentage", allocation.group, str(allocation.percent))
                self._run("set_group_mem_limit", allocation.group,
                          "unlimited" if allocation.memory is None else format_size(allocation.memory))
                self._run("open_share", allocation.group)
            return True
        except (LibshareError, OSError, EOFError) as exc:
            log.warning("group limits not set on the arbiter at %s: %s", self.pipe_directory, exc)
            return False

    def close(self) -> None:
        """Close the control connection."""
        with self._lock:
            self._drop()


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    """The kubelet-facing service. Every request is checked; a bad one is refused with INVALID_ARGUMENT."""

    def __init__(self, options: Options, devices: _Devices, arbiter: _Arbiter):
        self._options = options
        self._devices = devices
        self._arbiter = arbiter
        self._streams = threading.BoundedSemaphore(_MAX_STREAMS)

    def GetDevicePluginOptions(self, request, context):
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request, context):
        if not self._streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{_MAX_STREAMS} ListAndWatch streams are open already; close one first")
        try:
            yield from self._watch(context)
        finally:
            self._streams.release()

    def _watch(self, context):
        devices = self._devices

        def wake():
            with devices.changed:
                devices.changed.notify_all()

        context.add_callback(wake)  # a cancelled stream (kubelet gone, server stopped) ends at once
        sent = None
        while True:
            with devices.changed:
                while devices.generation == sent and not devices.closed and context.is_active():
                    devices.changed.wait()
                if devices.closed or not context.is_active():
                    return
                sent, listing = devices.generation, devices.listing()
            yield listing

    def Allocate(self, request, context):
        if not request.container_requests:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the AllocateRequest has no container request")
        allocations, seen = [], set()
        for number, container in enumerate(request.container_requests):
            try:
                allocation = allocate(self._devices.shares, container.devices_ids)
            except ValueError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container request {number}: {exc}")
            if seen & set(allocation.devices):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"container request {number}: a device is requested by two containers")
            seen.update(allocation.devices)
            allocations.append(allocation)
        if not self._devices.healthy:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{', '.join(sorted(seen)[:5])} {'is' if len(seen) == 1 else 'are'} {UNHEALTHY}: the arbiter "
                          f"at {self._options.pipe_directory} is not ACTIVE, and a container would run without "
                          "its group's limits; ask again once the shares are Healthy")
        for allocation in allocations:  # what the mount names exists before the arbiter opens the socket
            directory = share_directory(self._options.pipe_directory, allocation.group)
            try:  # (in the arbiter's pipe directory once there is one: it must be the arbiter's to make)
                if directory.parent.parent.is_dir():
                    directory.parent.mkdir(mode=0o755, exist_ok=True)
                    directory.mkdir(mode=0o755, exist_ok=True)
            except OSError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot make the share directory {directory}: {exc}")
        try:
            self._arbiter.add(allocations)
        except OSError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"the allocation cannot be recorded in {self._options.state_file}: {exc}")
        pipe = self._options.host_pipe_directory  # the container sees its share directory at this path
        responses = []
        for allocation in allocations:
            log.info("allocated %s: group %s, %d %% of compute, memory %s", ",".join(allocation.devices),
                     allocation.group, allocation.percent, format_size(allocation.memory))
            responses.append(api_pb2.ContainerAllocateResponse(
                envs=allocation.environment(pipe),
                mounts=[api_pb2.Mount(container_path=str(pipe),
                                      host_path=str(share_directory(pipe, allocation.group)), read_only=True)]))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request, context):
        # Not asked for (pre_start_required is false); answered, after the same check, if called anyway.
        unknown = [d for d in request.devices_ids if d not in self._devices.shares]
        if unknown:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device id(s): {unknown[:5]!r}")
        return api_pb2.PreStartContainerResponse()

    def GetPreferredAllocation(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "libshare shares are interchangeable: this plugin has no "
                      "preferred allocation (get_preferred_allocation_available is false)")


def _identity(path: Path) -> tuple | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_ctime_ns


class DevicePlugin:
    """A running device plugin: :meth:`start` it, :meth:`stop` it (or use it as a context manager)."""

    def __init__(self, options: Options):
        self.options = options
        self._devices = _Devices(options.shares)
        ledger = Ledger(options.state_file, options.resource_name, self._devices.shares)
        self._arbiter = _Arbiter(options.pipe_directory, ledger)
        self._server: grpc.Server | None = None
        self._served: tuple | None = None  # identity of the socket file this plugin's server made
        self._registered: tuple | None = None  # identity of the kubelet socket it registered with
        self._state = "unknown"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> DevicePlugin:
        """Serve on the endpoint and start the upkeep thread (which registers with the kubelet)."""
        self._serve()
        self._thread = threading.Thread(target=self._upkeep, name="libshare-k8s-upkeep", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (open streams end), remove the socket, close the arbiter connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._devices.close()
        self._shutdown_server()
        self._arbiter.close()

    def __enter__(self) -> DevicePlugin:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def healthy(self) -> bool:
        """Whether the shares are advertised Healthy (the arbiter answered ACTIVE at the last poll)."""
        return self._devices.healthy

    def _serve(self) -> None:
        endpoint = self.options.endpoint
        self._shutdown_server()
        try:
            endpoint.unlink()  # a socket left by an earlier run
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="libshare-k8s"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self.options, self._devices, self._arbiter), server)
        try:
            server.add_insecure_port(f"unix:{endpoint}")
        except RuntimeError as exc:
            raise OSError(f"cannot serve the device plugin on {endpoint}: {exc}") from None
        server.start()
        self._server, self._served = server, _identity(endpoint)
        log.info("serving %s (%d shares) on %s", self.options.resource_name, len(self._devices.shares), endpoint)

    def _shutdown_server(self) -> None:
        if self._server is None:
            return
        self._server.stop(grace=None).wait()
        self._server = None
        if self._served is not None and _identity(self.options.endpoint) == self._served:
            self.options.endpoint.unlink(missing_ok=True)
        self._served = None

    def _upkeep(self) -> None:
        while True:
            try:
                self._check_arbiter()
                self._check_kubelet()
            except Exception:  # the plugin must outlive any one bad round; say what happened
                log.exception("device plugin upkeep failed; trying again in %g s", self.options.period)
            if self._stop.wait(self.options.period):
                return

    def _check_arbiter(self) -> None:
        state, pid = self._arbiter.status()
        if state != self._state:
            log.info("arbiter at %s: %s%s", self.options.pipe_directory, state, f" (pid {pid})" if pid else "")
            self._state = state
        if self._devices.set_healthy(state == "ACTIVE"):
            log.info("shares are now %s", HEALTHY if state == "ACTIVE" else UNHEALTHY)

    def _check_kubelet(self) -> None:
        kubelet = _identity(self.options.kubelet_socket)
        if kubelet is None:
            if self._registered is not None:
                log.info("the kubelet socket %s is gone; waiting for it", self.options.kubelet_socket)
            self._registered = None
            return
        ours = _identity(self.options.endpoint)
        if kubelet == self._registered and ours == self._served:
            return
        if ours != self._served or self._registered is not None:
            self._serve()  # the kubelet restarted (it removes the plugins' sockets), or ours went
        self._registered = None
        options = self.options
        request = api_pb2.RegisterRequest(
            version=API_VERSION, endpoint=options.socket_name, resource_name=options.resource_name,
            options=api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False))
        try:
            with grpc.insecure_channel(f"unix:{options.kubelet_socket}") as channel:
                api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=_REGISTER_TIMEOUT)
        except grpc.RpcError as exc:
            log.warning("registration with the kubelet at %s failed (%s: %s); trying again",
                        options.kubelet_socket, exc.code().name, exc.details())
            return
        self._registered = kubelet
        log.info("registered %s with the kubelet at %s", options.resource_name, options.kubelet_socket)
