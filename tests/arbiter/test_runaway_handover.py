"""A runaway dispatch under the control daemon costs the other tenants a retry, not their session.

Real processes on lavapipe: a control daemon with a 1 s watchdog, an honest client streaming
checked saxpy dispatches (tests/arbiter/_streaming_client.py), and a tenant that dispatches
busy.comp for hours. The arbiter must hand over to its standby at once (see "Handing over at
once" in libshare/arbiter/drain/containment.py): the honest session reattaches and computes
again on the same arrays, its errors are ArbiterRestarted for the work in flight and nothing
else, and only the runaway's session ends, with ClientTerminated naming the watchdog. How long
the honest client waits is a figure of tools/attack_containment.py, not a test.
"""

from __future__ import annotations

import contextlib

import pytest

import libshare
from libshare.protocol import paths as _config, wire

from tests.arbiter.conftest import wait_until
from tests.arbiter.test_reattach import Daemon, exited
from tests.arbiter.test_runaway import start_runaway

WATCHDOG = "1"


@pytest.fixture
def guarded(tmp_path, vulkan_device_name, monkeypatch):
    """A control daemon whose arbiters have a 1 s watchdog and the test hooks, with a standby ready."""
    monkeypatch.setenv("LIBSHARE_WATCHDOG_SECONDS", WATCHDOG)
    monkeypatch.setenv("LIBSHARE_TEST_HOOKS", "1")
    daemon = Daemon(tmp_path / "pipe")
    wait_until(lambda: daemon.standbys() >= 1, 120, "a standby arbiter")
    yield daemon
    daemon.stop()


def test_a_runaway_hands_over_and_only_its_client_loses_its_session(guarded, streams):
    honest = streams(guarded.pipe)
    first = guarded.arbiter()
    wait_until(lambda: honest.served_by(first), 120, "the honest client's first dispatch")
    with libshare.connect(name="runaway", mode="daemon", pipe_directory=guarded.pipe, timeout=30) as runaway:
        ticket = start_runaway(runaway)
        with pytest.raises(libshare.ArbiterRestarted):
            ticket.wait(timeout=120)  # the arbiter ended under it: the work may have partly run
        assert exited(first, 60)
        second = wait_until(lambda: guarded.arbiter() not in (None, first) and guarded.arbiter(), 60,
                            "the standby to serve")
        with pytest.raises(libshare.ClientTerminated, match="watchdog"):
            runaway.stats()  # its reattach is refused: the new arbiter read the journal
        with pytest.raises(libshare.ClientTerminated):
            runaway.array(16)  # sticky
    wait_until(lambda: honest.served_by(second), 60, "the honest client to compute on the new arbiter")
    end = honest.finish()
    assert end["same_arrays"] and end["reattached"] >= 1  # the same Session, arrays and programs
    log = guarded.log()
    assert f"arbiter pid {first} ends now (a dispatch ran past the {WATCHDOG} s watchdog" in log
    assert "FAULT" not in (guarded.pipe / "server.log").read_text()  # no session was failed wholesale
    with libshare.connect(name="after", mode="daemon", pipe_directory=guarded.pipe) as fresh:
        assert fresh.arbiter_pid == second  # the service goes on


def test_a_lost_device_hands_over_and_every_session_goes_on(guarded, streams):
    """As a GPU driver's VK_ERROR_DEVICE_LOST: no FAULT, no ServerFault; the standby serves."""
    honest = streams(guarded.pipe)
    first = guarded.arbiter()
    wait_until(lambda: honest.served_by(first), 120, "the honest client's first dispatch")
    sock = wire.dial(_config.socket_path(guarded.pipe), 30)  # once: a ControlConnection would send it again
    with sock, contextlib.suppress(EOFError, OSError):  # to the new arbiter when this one ends before answering
        wire.send(sock, {"op": "control", "command": "inject_device_lost", "args": []})
        wire.recv(sock)
    assert exited(first, 60)
    second = wait_until(lambda: guarded.arbiter() not in (None, first) and guarded.arbiter(), 60,
                        "the standby to serve")
    wait_until(lambda: honest.served_by(second), 60, "the honest client to compute on the new arbiter")
    end = honest.finish()  # status 0: its only errors were ArbiterRestarted
    assert end["same_arrays"] and end["reattached"] >= 1
    assert f"arbiter pid {first} ends now (the device was lost" in guarded.log()
