"""The Prometheus endpoint: scraped over HTTP from a real daemon and parsed with prometheus_client."""

from __future__ import annotations

import os
import socket
import struct
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import libshare

from tests._wait import wait_until


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _value(samples, **labels) -> float:
    [value] = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    return value


def test_metrics_follow_the_server_and_each_client(dirs, foreground):
    port = _free_port()
    process = foreground("--metrics-port", str(port))
    idle = _scrape(port)
    assert _value(idle["libshare_server_state"], state="ACTIVE") == 1
    assert _value(idle["libshare_server_state"], state="FAULT") == 0
    assert _value(idle["libshare_server_info"]) == 1
    assert idle["libshare_server_info"][0].labels["pid"] == str(process.pid)
    assert _value(idle["libshare_clients"]) == 0 and idle["libshare_client_dispatches_submitted"] == []

    name = "a-client-with-a-name-longer-than-thirty-two-characters"
    with libshare.connect(name=name, mode="daemon", pipe_directory=dirs.pipe) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(4096, np.float32), session.array(4096, np.float32)
        for _ in range(5):
            session.dispatch(program, groups=16, buffers=[x, y], push=struct.pack("If", 4096, 2.0)).wait(timeout=30)
        busy = _scrape(port)
    assert _value(busy["libshare_clients"]) == 1
    [sample] = busy["libshare_client_dispatches_completed"]
    assert sample.name == "libshare_client_dispatches_completed_total" and sample.value == 5
    assert sample.labels == {"client_id": sample.labels["client_id"], "pid": str(os.getpid()),
                             "name": name[:32], "group": ""}
    assert _value(busy["libshare_client_memory_bytes"]) >= 2 * 4096 * 4
    assert _value(busy["libshare_client_device_seconds"]) > 0
    assert _value(busy["libshare_dispatches_submitted"]) >= 5
    assert "process_cpu_seconds" in busy

    # A client that left leaves no series behind (the arbiter notices the closed session on its
    # own thread, a moment after close), and the server's totals keep its counts throughout.
    def reclaimed():
        after = _scrape(port)
        assert _value(after["libshare_dispatches_completed"]) >= 5  # no dip while it is reclaimed
        return None if after["libshare_client_dispatches_completed"] else after

    after = wait_until(reclaimed, 30, "the client's series to go")
    assert after["libshare_client_dispatches_completed"] == [] and _value(after["libshare_clients"]) == 0
    assert _value(after["libshare_dispatches_completed"]) == 5


def test_connections_that_never_send_a_request_hold_a_bounded_number_of_threads(dirs, foreground):
    """prometheus_client's server started a thread per connection and waited on it for ever: 200
    silent TCP connections (any local user can open them) held 200 of the arbiter's threads. At most
    _MAX_SCRAPES are served at once now; the rest are closed, and a scrape works once they are gone."""
    from libshare.arbiter.serve.metrics import _MAX_SCRAPES

    port = _free_port()
    process = foreground("--metrics-port", str(port))
    _scrape(port)
    threads = lambda: len(os.listdir(f"/proc/{process.pid}/task"))  # noqa: E731
    before = threads()
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        for connection in silent:  # each one accepted: served (a thread) or closed at once
            connection.settimeout(0.05)
            try:
                connection.recv(1)
            except TimeoutError:
                pass
        assert threads() <= before + _MAX_SCRAPES, f"{threads() - before} threads more with 200 silent connections"
    finally:
        for connection in silent:
            connection.close()
    with libshare.connect(mode="daemon", pipe_directory=dirs.pipe) as session:
        assert session.stats()["client_id"] == session.client_id  # the arbiter serves on

    def scraped():  # the served ones give their slots back as their peers' close reaches them
        try:
            return _scrape(port)
        except OSError:
            return None

    assert _value(wait_until(scraped, 30, "a scrape")["libshare_server_state"], state="ACTIVE") == 1
