"""Prometheus metrics of a running arbiter, read from :meth:`Arbiter.snapshot` at each scrape.

Nothing is counted twice: the collector keeps no state of its own and turns one
snapshot into metric families on each scrape, so the endpoint costs nothing between
scrapes. Per-client series carry only ``client_id``, ``pid``, ``name`` (cut to 32
characters) and ``group``, and exist only while the client is connected, so the
number of series is bounded by the arbiter's ``max_clients``.

The endpoint listens on TCP, where any local user (not only the arbiter's uid) can reach
it, so what a connection can cost is bounded: at most ``_MAX_SCRAPES`` are served at once
(more are closed at once; a scraper retries), and each socket operation of one waits
``_SCRAPE_TIMEOUT`` at most. prometheus_client's own server starts a thread per connection
and waits on it for ever, so connections that never finish a request held a thread each.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

__all__ = ["ArbiterCollector", "MetricsServer", "start_metrics", "SERVER_STATES"]

SERVER_STATES = ("INITIALIZING", "ACTIVE", "FAULT")
_CLIENT_LABELS = ["client_id", "pid", "name", "group"]
log = logging.getLogger("libshare.arbiter")

_NAME_CHARS = 32
_MAX_SCRAPES = 8  # connections served at once
_SCRAPE_TIMEOUT = 5.0  # seconds one socket operation of a connection may wait

# (snapshot key, metric name, help); counters get their _total suffix from prometheus_client
_COUNTERS = [
    ("submitted", "dispatches_submitted", "Dispatch and copy descriptors accepted from the rings."),
    ("completed", "dispatches_completed", "Descriptors whose completion was posted."),
    ("errors", "dispatch_errors", "Descriptors completed with an error status."),
    ("cut", "dispatches_cut", "Dispatches run in pieces while a higher priority was active."),
    ("pieces", "dispatch_pieces", "The pieces those dispatches ran in."),
]
_GAUGES = [
    ("memory_bytes", "memory_bytes", "Device and shared buffer memory allocated now."),
    ("peak_memory_bytes", "memory_peak_bytes", "Most buffer memory allocated at once."),
]


class ArbiterCollector(Collector):
    """Turns ``arbiter.snapshot()`` into metric families on every scrape."""

    def __init__(self, arbiter):
        self._arbiter = arbiter

    def collect(self):
        """Yield the server's families, then the per-client ones."""
        snapshot = self._arbiter.snapshot()
        yield from _server_families(snapshot["server"])
        yield from _client_families(snapshot["clients"])


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


def _client_families(clients: list[dict]):
    rows = [([str(c["client_id"]), str(c["pid"]), str(c["name"])[:_NAME_CHARS], str(c["group"] or "")], c)
            for c in clients]
    active = GaugeMetricFamily("libshare_client_active", "1 while the client is ACTIVE, 0 once terminated or faulted (INACTIVE).",
                               labels=_CLIENT_LABELS)
    for labels, client in rows:
        active.add_metric(labels, 1.0 if client["state"] == "ACTIVE" else 0.0)
    yield active
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


class _Handler(WSGIRequestHandler):
    """One scrape: its socket times out (StreamRequestHandler applies ``timeout``), nothing is logged."""

    timeout = _SCRAPE_TIMEOUT

    def log_message(self, format, *args):
        """Log nothing."""


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most _MAX_SCRAPES at once: one more is closed unserved."""

    daemon_threads = True

    def __init__(self, *args, **kwargs):
        self._slots = threading.BoundedSemaphore(_MAX_SCRAPES)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the thread that serves it
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        """A connection that timed out or went away is closed quietly (socketserver would print a
        traceback per connection to stderr); anything else is logged."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            log.exception("metrics request from %s failed", client_address)


class MetricsServer:
    """A running metrics endpoint: ``http://address:port/metrics``."""

    def __init__(self, arbiter, address: str, port: int):
        registry = CollectorRegistry()
        registry.register(ArbiterCollector(arbiter))
        ProcessCollector(registry=registry)
        server_class = type("_Server", (_BoundedServer,), {
            "address_family": socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]})
        self._server = make_server(address, port, make_wsgi_app(registry), server_class, handler_class=_Handler)
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
