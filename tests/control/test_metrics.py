"""The Prometheus endpoint: scraped over HTTP from a real daemon and parsed with prometheus_client."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import urllib.request

import numpy as np
import pytest
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
    _MAX_SCRAPES are served at once now: each new one takes the slot of the oldest still silent."""
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
        wait_until(lambda: threads() <= before + _MAX_SCRAPES, 30,  # a taken slot's thread ends a moment after
                   lambda: f"{threads() - before} threads more with 200 silent connections")
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


# ---------------------------------------------------------------- attacks, each beside an honest client

SECRET_NAME, SECRET_GROUP = "payroll-secret-7731", "finance"
_FOREIGN_SCRAPE = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())"
needs_root = pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")


def _as_nobody(*args: str) -> list[str]:
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", *args]


def _scrape_as_nobody(port: int) -> dict[str, list]:
    text = subprocess.run(_as_nobody("-c", _FOREIGN_SCRAPE, f"http://127.0.0.1:{port}/metrics"),
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert SECRET_NAME not in text and SECRET_GROUP not in text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


class _Honest:
    """A session doing checked saxpy round trips beside an attack."""

    def __init__(self, session):
        self.session = session
        self.program = session.load_program(libshare.shaders.path("saxpy"))
        self.x, self.y = session.array(4096, np.float32), session.array(4096, np.float32)
        self.x[:] = np.arange(4096) % 100

    def round_trips(self, count: int = 5) -> None:
        for _ in range(count):
            self.y[:] = 1.0
            self.session.dispatch(self.program, groups=64, buffers=[self.x, self.y],
                                  push=struct.pack("If", 4096, 2.0)).wait(timeout=30)
            assert np.array_equal(self.y, 1.0 + 2.0 * self.x)


@needs_root
def test_another_uid_sees_no_clients_name_group_or_usage(dirs, foreground):
    """Any local user can reach the TCP port, and saw every client's name and group. A scraper of
    another uid (read from the kernel's socket table) now sees another user's client as ps shows it:
    its id and pid, whether it is active, no name, group or usage; the arbiter's own uid sees all."""
    port = _free_port()
    foreground("--metrics-port", str(port))
    with libshare.connect(name=SECRET_NAME, group=SECRET_GROUP, mode="daemon", pipe_directory=dirs.pipe) as session:
        honest = _Honest(session)
        honest.round_trips()
        foreign = _scrape_as_nobody(port)
        honest.round_trips()
        own = _scrape(port)
    [active] = foreign["libshare_client_active"]
    assert active.value == 1 and active.labels == {"client_id": str(session.client_id), "pid": str(os.getpid()),
                                                   "name": "", "group": ""}
    assert foreign["libshare_client_dispatches_completed"] == [] and foreign["libshare_client_memory_bytes"] == []
    assert _value(foreign["libshare_dispatches_completed"]) >= 5  # the server's totals are anyone's
    [completed] = own["libshare_client_dispatches_completed"]
    assert completed.labels["name"] == SECRET_NAME and completed.labels["group"] == SECRET_GROUP
    assert completed.value == 10


@needs_root
def test_the_operator_may_show_every_client_to_every_scraper(dirs, foreground, monkeypatch):
    """LIBSHARE_METRICS_CLIENT_NAMES=1 (the operator's choice, for an endpoint only trusted hosts
    reach) gives every scraper the full labels."""
    monkeypatch.setenv("LIBSHARE_METRICS_CLIENT_NAMES", "1")
    port = _free_port()
    foreground("--metrics-port", str(port))
    with libshare.connect(name=SECRET_NAME, group=SECRET_GROUP, mode="daemon", pipe_directory=dirs.pipe) as session:
        _Honest(session).round_trips()
        text = subprocess.run(_as_nobody("-c", _FOREIGN_SCRAPE, f"http://127.0.0.1:{port}/metrics"),
                              capture_output=True, text=True, timeout=60, check=True).stdout
    assert f'name="{SECRET_NAME}"' in text and f'group="{SECRET_GROUP}"' in text


_HOLD = "import socket, sys; c = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); c.sendall(b'x'); sys.stdin.read()"


@needs_root
def test_the_scrapers_uid_is_the_owner_of_the_other_end():
    """The uid the metrics read for a TCP peer: the owner of its socket, for root and for another uid."""
    from libshare.arbiter.serve.metrics import _peer_uid

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = str(listener.getsockname()[1])
        for command, uid in ((["/usr/bin/python3"], 0), (_as_nobody(), 65534)):
            holder = subprocess.Popen([*command, "-c", _HOLD, port], stdin=subprocess.PIPE)
            try:
                conn, _ = listener.accept()
                with conn:
                    assert conn.recv(1) == b"x"
                    assert _peer_uid(conn) == uid
            finally:
                holder.stdin.close()
                holder.wait(30)


def _slow(port: int) -> socket.socket:
    """A connection that has begun a request and not finished it."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: a")
    return conn


def _closed(conn: socket.socket, wait: float = 0.2) -> bool:
    """Whether the arbiter has closed ``conn`` (it never answers a request left unfinished)."""
    conn.settimeout(wait)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_slow_connections_do_not_keep_a_scraper_out(dirs, foreground):
    """Connections that dribble their requests took every slot, and a scrape was closed unserved for
    as long as they went on. A scrape now takes the slot of the oldest connection still reading."""
    from libshare.arbiter.serve.metrics import _MAX_SCRAPES

    port = _free_port()
    foreground("--metrics-port", str(port))
    with libshare.connect(mode="daemon", pipe_directory=dirs.pipe) as session:
        honest = _Honest(session)
        honest.round_trips()
        slow = [_slow(port) for _ in range(_MAX_SCRAPES)]  # accepted in order, before the scrape
        try:
            assert _value(_scrape(port)["libshare_server_state"], state="ACTIVE") == 1  # at the first try
            assert _closed(slow[0]), "the oldest slow connection kept its slot"
            honest.round_trips()
        finally:
            for conn in slow:
                conn.close()


def test_a_request_sent_a_byte_at_a_time_is_cut_at_its_deadline(dirs, foreground):
    """Each socket operation waited 5 s, so a byte every second kept a connection (and its thread)
    for ever. Reading the whole request has one deadline now: the connection is closed however
    often it sends."""
    port = _free_port()
    foreground("--metrics-port", str(port))
    conn = _slow(port)
    sent = []

    def dribbled_until_closed():
        if _closed(conn, 0.5):
            return True
        conn.sendall(b"a")  # a byte every half second, far inside any per-operation timeout
        sent.append(1)
        return False

    try:
        with libshare.connect(mode="daemon", pipe_directory=dirs.pipe) as session:
            honest = _Honest(session)
            wait_until(dribbled_until_closed, 60, "the dribbling connection to be closed")
            honest.round_trips()
        assert sent, "closed before it dribbled"
        assert _value(_scrape(port)["libshare_server_state"], state="ACTIVE") == 1
    finally:
        conn.close()
