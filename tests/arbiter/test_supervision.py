"""Supervision that survives its own supervisor, a restart under a long dispatch, a burst of deaths.

Real processes on lavapipe: control daemons (``libshare-control -d``), their arbiters, and an
honest client streaming checked saxpy dispatches beside each attack
(tests/arbiter/_streaming_client.py: any wrong result or error other than ArbiterRestarted
ends it with status 1, which ``Client.finish`` asserts against).
"""

from __future__ import annotations

import os
import signal
import struct

import numpy as np
import pytest

import libshare
from libshare._proc import parent_of, running
from libshare.daemon.supervisor import BACKOFF_MAX, backoff
from libshare.protocol import paths as _config
from libshare.workloads import busy_reference

from tests._busy import busy_iterations
from tests.arbiter.conftest import wait_until
from tests.arbiter.test_reattach import Daemon, exited


def children(parent: int) -> list[int]:
    """The pids of ``parent``'s living children."""
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    return [pid for pid in pids if parent_of(pid) == parent and running(pid)]


def standing_by(daemon: Daemon, serving: int) -> bool:
    """Whether a child of ``daemon`` other than ``serving`` has said it stands by."""
    log = daemon.log()
    return any(f"arbiter pid {pid} stands by" in log for pid in children(daemon.pid) if pid != serving)


def serving_other_than(daemon: Daemon, *pids: int) -> int | None:
    """The arbiter serving now, when it is none of ``pids``."""
    pid = daemon.arbiter()
    return pid if pid is not None and pid not in pids else None


def test_a_new_control_daemon_adopts_an_arbiter_whose_daemon_was_killed(tmp_path, vulkan_device_name, streams):
    first_daemon = Daemon(tmp_path / "pipe")
    honest = streams(first_daemon.pipe)
    first = first_daemon.arbiter()
    wait_until(lambda: honest.served_by(first), 120, "the honest client's first dispatch")
    os.kill(first_daemon.pid, signal.SIGKILL)
    assert exited(first_daemon.pid, 60)
    wait_until(lambda: f"arbiter pid {first}: its control daemon is gone" in first_daemon.log(), 60,
               "the arbiter to notice its control daemon is gone")
    with pytest.raises(libshare.ServerNotReady, match="restart needs the control daemon"):
        first_daemon.run("restart")  # nothing would happen: it says so instead of rc 0
    adopter = Daemon(first_daemon.pipe)  # libshare-control -d again: it adopts, it does not exit 1
    try:
        second = adopter.arbiter()
        assert second != first and parent_of(second) == adopter.pid
        assert exited(first, 60)  # it handed over and stopped
        wait_until(lambda: honest.served_by(second), 60, "the honest client on the adopting daemon's arbiter")
        # Supervision is back: a SIGKILL of the arbiter is answered by the new daemon's standby.
        wait_until(lambda: standing_by(adopter, second), 120, "a standby of the adopting daemon")
        os.kill(second, signal.SIGKILL)
        third = wait_until(lambda: serving_other_than(adopter, first, second), 60, "a new arbiter")
        wait_until(lambda: honest.served_by(third), 60, "the honest client after the SIGKILL")
        end = honest.finish()
        assert end["same_arrays"] and end["reattached"] >= 2
        assert f"arbiter pid {first} serves {adopter.pipe} without a control daemon" in adopter.log()
    finally:
        adopter.stop()


def test_restart_during_a_long_cut_dispatch_fails_nobody(tmp_path, vulkan_device_name, monkeypatch, streams):
    """The long dispatch goes on piece by piece on the retiring arbiter, which waits for it; the
    other client's taken work is never queued behind its whole rest; nobody sees an error."""
    monkeypatch.setenv("LIBSHARE_SCHEDULING", "fairshare")
    daemon = Daemon(tmp_path / "pipe")
    try:
        monkeypatch.setenv("LIBSHARE_CLIENT_PRIORITY", "high")  # a higher priority active: the low one is cut
        honest = streams(daemon.pipe)
        monkeypatch.delenv("LIBSHARE_CLIENT_PRIORITY")
        first = daemon.arbiter()
        wait_until(lambda: honest.served_by(first), 120, "the honest client's first dispatch")
        wait_until(lambda: daemon.standbys() >= 1, 120, "a standby arbiter")
        with libshare.connect(name="long", priority="low", mode="daemon", pipe_directory=daemon.pipe,
                              timeout=30) as session:
            n, iterations = 1 << 16, busy_iterations(100_000)  # seconds on lavapipe, in many pieces
            program = session.load_program(libshare.shaders.path("busy"))
            data = session.array(n, np.uint32)
            ticket = session.dispatch(program, groups=n // 64, buffers=[data], push=struct.pack("II", n, iterations))
            wait_until(lambda: session.stats()["pieces"] >= 2 or ticket.done(), 60, "the dispatch to be under way")
            assert not ticket.done(), "the dispatch ended before the restart: make it longer"
            daemon.run("restart")
            second = wait_until(lambda: serving_other_than(daemon, first), 60, "the new arbiter")
            wait_until(lambda: honest.served_by(second), 60, "the honest client on the new arbiter")
            # Its work taken by the old arbiter was answered between two pieces, not behind the rest.
            assert not ticket.done(), "the long dispatch ended before the honest client moved: make it longer"
            ticket.wait(timeout=600)  # no ArbiterRestarted: it finished on the retiring arbiter
            assert np.array_equal(data, busy_reference(n, iterations))
            assert session.reattached == 1
        end = honest.finish()
        assert end["restarted"] == 0 and end["same_arrays"]  # a pause, not an error
        assert "still ran after" not in daemon.log()
    finally:
        daemon.stop()


def test_the_backoff_stays_inside_what_sessions_wait():
    assert [backoff(n) for n in (0, 1, 2, 3)] == [0.0, 0.0, 0.25, 0.5]
    assert max(backoff(n) for n in range(100)) == BACKOFF_MAX
    assert BACKOFF_MAX < _config.REPLACEMENT_WAIT / 2  # room left for the arbiter's own start


def test_a_burst_of_arbiter_deaths_pauses_sessions_instead_of_ending_them(tmp_path, vulkan_device_name, streams):
    daemon = Daemon(tmp_path / "pipe")
    try:
        honest = streams(daemon.pipe)
        first = daemon.arbiter()
        wait_until(lambda: honest.served_by(first), 120, "the honest client's first dispatch")
        killed = 0
        while "the next starts in 4.00 s" not in daemon.log():  # standbys that die young: the back-off grows
            young = [pid for pid in children(daemon.pid) if pid != daemon.arbiter()]
            for pid in young:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            wait_until(lambda: killed > 30 or "the next starts in 4.00 s" in daemon.log()
                       or [pid for pid in children(daemon.pid) if pid not in young and pid != daemon.arbiter()],
                       60, "the next standby, or the longest back-off")
            assert killed <= 30, "the back-off never reached its longest"
        os.kill(first, signal.SIGKILL)  # no standby now: the next arbiter comes after the back-off
        second = wait_until(lambda: serving_other_than(daemon, first), 120, "the arbiter after the back-off")
        wait_until(lambda: honest.served_by(second), 60, "the honest client to reattach after the back-off")
        end = honest.finish()  # status 0: no ArbiterLost, no wrong result
        assert end["same_arrays"] and end["reattached"] >= 1
        assert "the next starts in 8.00 s" not in daemon.log()
    finally:
        daemon.stop()
