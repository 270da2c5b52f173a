"""Prometheus metrics of a running arbiter, read from :meth:`Arbiter.snapshot` at each scrape.

Nothing is counted twice: the collector keeps no state of its own and turns one
snapshot into metric families on each scrape, so the endpoint costs nothing between
scrapes. Per-client series carry only ``client_id``, ``pid``, ``name`` (cut to 32
characters) and ``group``, and exist only while the client is connected, so the
number of series is bounded by the arbiter's ``max_clients``.

Who sees what. A scrape shows clients as ``ps`` shows them: root and the arbiter's own uid see
every client in full; any other uid sees its own clients in full and another uid's client by
its ``client_id``, ``pid`` and whether it is active only (``libshare_client_active`` with
empty ``name`` and ``group``, and none of its usage series). The endpoint is TCP, so the
scraper's uid is read from the kernel's socket table (``/proc/net/tcp``, ``tcp6``): a peer on
this host, in this network namespace, is the owner of the connected socket at the other end.
A peer whose uid cannot be read (another host, another namespace, a half-closed socket) is
shown what a stranger is shown. ``LIBSHARE_METRICS_CLIENT_NAMES=1`` shows every client in full
to every scraper, for an operator whose endpoint only trusted hosts reach.

What a connection can cost. Any local user can connect, so the server is bounded: at most
``_MAX_SCRAPES`` connections are served at once, each has ``_REQUEST_DEADLINE`` seconds from
its accept to have sent its whole request (one deadline on the monotonic clock, not a timeout
per ``recv``: a peer sending a byte a second does not extend it), and writing the answer
takes ``_ANSWER_TIMEOUT`` at most (``sendall``'s timeout is for the whole send). When all
slots are taken, a new connection takes the slot of the oldest one still reading its request
(that connection is shut down), so connections that dribble their requests cannot keep a
scraper out; only a connection being answered keeps its slot. prometheus_client's own server
starts a thread per connection and waits on it for ever, hence this one.
"""

from __future__ import annotations

import io
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from libshare import settings as _settings
from libshare.errors import LibshareError
from libshare.protocol.wire import trusted_uid

__all__ = ["ArbiterCollector", "MetricsServer", "start_metrics", "SERVER_STATES"]

SERVER_STATES = ("INITIALIZING", "ACTIVE", "FAULT")
_CLIENT_LABELS = ["client_id", "pid", "name", "group"]
log = logging.getLogger("libshare.arbiter")

_NAME_CHARS = 32
_MAX_SCRAPES = 8  # connections served at once
_REQUEST_DEADLINE = 5.0  # seconds from a connection's accept to the end of its request
_ANSWER_TIMEOUT = 5.0  # seconds writing one answer may take
_ENVIRON_VIEWER = "libshare.viewer"  # the scraper's uid (None: unknown), in the WSGI environ

# (snapshot key, metric name, help); counters get their _total suffix from prometheus_client
_COUNTERS = [
    ("submitted", "dispatches_submitted", "Dispatch and copy descriptors accepted from the rings."),
    ("completed", "dispatches_completed", "Descriptors whose completion was posted."),
    ("errors", "dispatch_errors", "Descriptors completed with an error status."),
    ("cut", "dispatches_cut", "Dispatches run in pieces while a higher priority was active."),
    ("pieces", "dispatch_pieces", "The pieces those dispatches ran in."),
    ("listed", "list_commands", "Commands of command lists run (each list is one descriptor)."),
]
_GAUGES = [
    ("memory_bytes", "memory_bytes", "Device and shared buffer memory allocated now."),
    ("peak_memory_bytes", "memory_peak_bytes", "Most buffer memory allocated at once."),
]


class ArbiterCollector(Collector):
    """Turns ``arbiter.snapshot()`` into metric families on every scrape, as ``viewer`` may see
    them: the scraper's uid (root or the arbiter's: every client in full), or None when it is
    unknown (no client's name, group or usage)."""

    def __init__(self, arbiter, viewer: int | None = 0):
        self._arbiter = arbiter
        self._viewer = viewer

    def collect(self):
        """Yield the server's families, then the per-client ones."""
        snapshot = self._arbiter.snapshot()
        yield from _server_families(snapshot["server"])
        shown = _shown(self._arbiter, self._viewer, snapshot["clients"])
        yield from _client_families(snapshot["clients"], shown)


def _shown(arbiter, viewer: int | None, clients: list[dict]) -> set[int]:
    """The ids of the clients ``viewer`` sees in full (ps's rule: see the module's docstring)."""
    if viewer is not None and trusted_uid(viewer):
        return {c["client_id"] for c in clients}
    if viewer is None or not clients:
        return set()
    owners = _owners(arbiter)
    return {c["client_id"] for c in clients if c.get("uid", owners.get(c["client_id"])) == viewer}


def _owners(arbiter) -> dict[int, int]:
    """The uid of each client, by client id (read on the control thread, like the snapshot)."""
    drainer = arbiter.drainer
    try:
        return drainer.call(lambda: {c.id: c.uid for c in drainer.clients.values()})
    except LibshareError:  # stopped: no client is shown as the viewer's own
        return {}


def _server_families(server: dict):
    device = server["device"]
    info = InfoMetricFamily("libshare_server", "The arbiter process and the device it owns.")
    info.add_metric([], {"pid": str(server["pid"]), "device_index": str(device["index"]),
                         "device_uuid": str(device["uuid"]), "device_name": str(device["name"])})
    yield info
    state = GaugeMetricFamily("libshare_server_state", "1 for the arbiter's current state, else 0.",
                              labels=["state"])
    for name in SERVER_STATES:
        state.add_metric([name], 1.0 if server["state"] == name else 0.0)
    yield state
    yield GaugeMetricFamily("libshare_server_start_time_seconds", "When the arbiter started (Unix time).",
                            value=server["started"])
    yield GaugeMetricFamily("libshare_clients", "Clients connected now.", value=server["clients"])
    yield from _families("libshare_", [], [([], server)])


def _client_labels(client: dict, full: bool) -> list[str]:
    name, group = (str(client["name"])[:_NAME_CHARS], str(client["group"] or "")) if full else ("", "")
    return [str(client["client_id"]), str(client["pid"]), name, group]


def _client_families(clients: list[dict], shown: set[int]):
    """Every client's ``libshare_client_active``; the usage families of those in ``shown`` only."""
    active = GaugeMetricFamily("libshare_client_active", "1 while the client is ACTIVE, 0 once terminated or faulted (INACTIVE).",
                               labels=_CLIENT_LABELS)
    for client in clients:
        active.add_metric(_client_labels(client, client["client_id"] in shown), 1.0 if client["state"] == "ACTIVE" else 0.0)
    yield active
    rows = [(_client_labels(c, True), c) for c in clients if c["client_id"] in shown]
    yield from _families("libshare_client_", _CLIENT_LABELS, rows)


def _families(prefix: str, label_names: list[str], rows: list[tuple[list[str], dict]]):
    """The counters, device seconds and memory gauges of ``rows`` (label values, snapshot dict)."""
    for key, name, text in _COUNTERS:
        family = CounterMetricFamily(prefix + name, text, labels=label_names)
        for labels, row in rows:
            family.add_metric(labels, row[key])
        yield family
    seconds = CounterMetricFamily(prefix + "device_seconds", "Device time measured by timestamp queries.",
                                  labels=label_names)
    for labels, row in rows:
        seconds.add_metric(labels, row["device_ns"] / 1e9)
    yield seconds
    for key, name, text in _GAUGES:
        family = GaugeMetricFamily(prefix + name, text, labels=label_names)
        for labels, row in rows:
            family.add_metric(labels, row[key])
        yield family


# ------------------------------------------------------------------ the scraper's uid

_ESTABLISHED = "01"  # the st column of /proc/net/tcp


def _peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the other end of the TCP connection ``conn``, when that end is a socket of
    this host in this network namespace and still established; else None."""
    try:
        ours, theirs = _endpoint(conn.getsockname()), _endpoint(conn.getpeername())
    except (OSError, ValueError):
        return None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)  # the header
                for line in lines:
                    uid = _row_uid(line.split(), theirs, ours)
                    if uid is not None:
                        return uid
        except OSError:
            continue
    return None


def _row_uid(fields: list[str], local: tuple, remote: tuple) -> int | None:
    """The row's uid when it is the established socket from ``local`` to ``remote``."""
    if len(fields) < 8 or fields[3] != _ESTABLISHED:
        return None
    try:
        if _table_endpoint(fields[1]) != local or _table_endpoint(fields[2]) != remote:
            return None
        return int(fields[7])
    except ValueError:
        return None


def _endpoint(address: tuple) -> tuple:
    """(address, port) of a socket address, an IPv4-mapped IPv6 address as IPv4."""
    host = ipaddress.ip_address(address[0].split("%", 1)[0])
    if host.version == 6 and host.ipv4_mapped is not None:
        host = host.ipv4_mapped
    return host, address[1]


def _table_endpoint(text: str) -> tuple:
    """(address, port) of /proc/net/tcp's ``HEX:PORT`` (each 32-bit word of the address in host order)."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return _endpoint((str(ipaddress.ip_address(raw)), int(port, 16)))


# ------------------------------------------------------------------ the HTTP server

class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, each ``recv`` waiting only for what is left until ``deadline``
    (monotonic): TimeoutError once it has passed."""

    def __init__(self, conn: socket.socket, deadline: float):
        super().__init__()
        self._conn, self._deadline = conn, deadline

    def readable(self) -> bool:
        """Yes."""
        return True

    def readinto(self, buffer) -> int:
        """Receive into ``buffer`` before the deadline."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the metrics request was not read before its deadline")
        self._conn.settimeout(left)
        return self._conn.recv_into(buffer)


class _Handler(WSGIRequestHandler):
    """One scrape: its request read before the connection's deadline, its answer written within
    ``_ANSWER_TIMEOUT``, the scraper's uid in the environ; nothing is logged."""

    def setup(self):
        """Read the request through a reader bound by the connection's deadline."""
        super().setup()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self.server.deadline(self.connection)))

    def parse_request(self):
        """The request's line and headers; once read, the connection is being answered."""
        ok = super().parse_request()
        self.server.answering(self.connection)
        self.connection.settimeout(_ANSWER_TIMEOUT)
        return ok

    def get_environ(self):
        """wsgiref's environ and the scraper's uid."""
        environ = super().get_environ()
        environ[_ENVIRON_VIEWER] = _peer_uid(self.connection)
        return environ

    def log_message(self, format, *args):
        """Log nothing."""


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most _MAX_SCRAPES at once; when all are taken, a new connection
    takes the slot of the oldest one still reading its request, else it is closed unserved."""

    daemon_threads = True

    def __init__(self, *args, **kwargs):
        self._slots = threading.BoundedSemaphore(_MAX_SCRAPES)
        self._lock = threading.Lock()
        self._reading: dict[socket.socket, float] = {}  # connection: its deadline, oldest first
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        """Serve ``request`` on a thread of its own once it has a slot."""
        if not self._take_slot():
            self.shutdown_request(request)
            return
        with self._lock:
            self._reading[request] = time.monotonic() + _REQUEST_DEADLINE
        try:
            super().process_request(request, client_address)  # starts the thread that serves it
        except BaseException:
            self._forget(request)
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        """Serve, then close the connection and give its slot back."""
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._forget(request)
            self.shutdown_request(request)
            self._slots.release()

    def _take_slot(self) -> bool:
        """A free slot, else the slot of the oldest connection still reading (shut down: its
        thread ends at once); False when every slot is answering."""
        if self._slots.acquire(blocking=False):
            return True
        with self._lock:
            oldest = next(iter(self._reading), None)
            if oldest is None:
                return False
            del self._reading[oldest]
            try:
                oldest.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return self._slots.acquire(timeout=_ANSWER_TIMEOUT)

    def _forget(self, request) -> None:
        with self._lock:
            self._reading.pop(request, None)

    def deadline(self, request) -> float:
        """When ``request`` must have sent its whole request (monotonic)."""
        with self._lock:
            return self._reading.get(request, time.monotonic())

    def answering(self, request) -> None:
        """``request`` has sent its request: its slot is not taken from it any more."""
        self._forget(request)

    def handle_error(self, request, client_address):
        """A connection that timed out, was shut down or went away is closed quietly (socketserver
        would print a traceback per connection to stderr); anything else is logged."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            log.exception("metrics request from %s failed", client_address)


def _application(arbiter):
    """The WSGI application: each scrape's families as its scraper may see them."""
    everyone = _settings.value("metrics_client_names")

    def application(environ, start_response):
        viewer = os.getuid() if everyone else environ.get(_ENVIRON_VIEWER)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ArbiterCollector(arbiter, viewer))
        ProcessCollector(registry=registry)
        return make_wsgi_app(registry)(environ, start_response)

    return application


class MetricsServer:
    """A running metrics endpoint: ``http://address:port/metrics``."""

    def __init__(self, arbiter, address: str, port: int):
        server_class = type("_Server", (_BoundedServer,), {
            "address_family": socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]})
        self._server = make_server(address, port, _application(arbiter), server_class, handler_class=_Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="libshare-metrics", daemon=True)
        self._thread.start()
        self.address = address
        """The address it listens on."""
        self.port = self._server.server_port
        """The TCP port it listens on (the one the system chose when asked for 0)."""

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def start_metrics(arbiter, address: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Serve ``arbiter``'s metrics over HTTP at ``address:port`` (0: a free port) in a background thread."""
    return MetricsServer(arbiter, address, port)
