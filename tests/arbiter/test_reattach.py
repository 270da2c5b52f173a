"""Sessions that survive the arbiter: the control daemon, transparent reattach, live restart.

Real processes on lavapipe: a control daemon (``libshare-control -d``), its arbiters, and
clients in their own processes (tests/arbiter/_streaming_client.py) that stream dispatches
and check every result a ticket reported successful.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import numpy as np
import pytest

import libshare
from libshare.protocol import paths as _config
from libshare.protocol.control import ControlConnection
from libshare._proc import parent_of, running

from tests._busy import busy_iterations
from tests.conftest import ROOT
from tests.arbiter.conftest import open_fds, wait_until

CLIENTS = 4


class Daemon:
    """A control daemon started with ``libshare-control -d`` on a pipe directory of the test."""

    def __init__(self, pipe: Path):
        self.pipe = pipe
        result = subprocess.run([sys.executable, "-m", "libshare.control", "-d", "--pipe-directory", str(pipe)],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        self.pid = int(_config.supervisor_lock_path(pipe).read_text())

    def arbiter(self) -> int | None:
        """The pid of the arbiter serving now (None in the moment of a hand-over)."""
        try:
            return int(_config.lock_path(self.pipe).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def log(self) -> str:
        return (self.pipe / "control.log").read_text()

    def standbys(self) -> int:
        """How many times an arbiter stood by, ready to take over."""
        return self.log().count(" stands by")

    def run(self, *command: str) -> str:
        with ControlConnection(self.pipe, timeout=30) as connection:
            return connection.run(*command)

    def stop(self) -> None:
        try:
            self.run("quit")
        except libshare.LibshareError:
            pass
        if not exited(self.pid, 60):
            os.kill(self.pid, signal.SIGKILL)


def exited(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (gone, or a zombie) within ``timeout`` seconds."""
    try:
        wait_until(lambda: not running(pid), timeout, f"pid {pid} to exit")
    except AssertionError:
        return False
    return True


class Client:
    """A streaming client process; its JSON events are collected as they come."""

    def __init__(self, pipe: Path, depth: int = 4):
        self.process = subprocess.Popen([sys.executable, "-m", "tests.arbiter._streaming_client", str(pipe), str(depth)],
                                        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with self.process.stdout:
            for line in self.process.stdout:
                self.events.append(json.loads(line))

    def served_by(self, arbiter: int) -> bool:
        """True once a dispatch on ``arbiter`` succeeded."""
        return any(e["event"] == "ok" and e["arbiter"] == arbiter for e in self.events)

    def finish(self) -> dict:
        """Close its standard input and return its last event (it must exit with status 0)."""
        self.process.stdin.close()
        assert self.process.wait(timeout=120) == 0, self.events[-5:]
        self._reader.join(10)
        return self.events[-1]


@pytest.fixture
def supervised(tmp_path, vulkan_device_name):
    daemon = Daemon(tmp_path / "pipe")
    yield daemon
    daemon.stop()


def _start_clients(daemon: Daemon, count: int = CLIENTS) -> list[Client]:
    clients = [Client(daemon.pipe) for _ in range(count)]
    arbiter = daemon.arbiter()
    wait_until(lambda: all(c.served_by(arbiter) for c in clients), 120, "every client's first dispatch")
    return clients


def test_sigkilled_arbiters_cost_clients_only_the_work_in_flight(supervised):
    """20 SIGKILLs while 4 clients stream: each client dispatches again on every new arbiter, with
    the same arrays; no result reported successful is wrong (the clients check each one); tickets
    in flight raise ArbiterRestarted and none hangs; nothing leaks in the clients, the control
    daemon or the pipe directory."""
    clients = _start_clients(supervised)
    wait_until(lambda: supervised.standbys() >= 1, 120, "a standby arbiter")
    entries = sorted(os.listdir(supervised.pipe))
    daemon_fds = open_fds(supervised.pid)
    kills = 20
    for kill in range(kills):
        arbiter = supervised.arbiter()
        os.kill(arbiter, signal.SIGKILL)
        listed = supervised.run("get_server_list").split()  # the operator's tool waits for the new one
        wait_until(lambda: supervised.arbiter() not in (arbiter, None), 60, "the standby to take over")
        new = supervised.arbiter()
        assert listed == [str(new)]
        wait_until(lambda: all(c.served_by(new) for c in clients), 120, f"every client on arbiter {new}")
        wait_until(lambda: supervised.standbys() >= kill + 2, 120, "a new standby")
    ends = [c.finish() for c in clients]
    for end, client in zip(ends, clients):
        ready = client.events[0]
        assert end["event"] == "end" and end["same_arrays"], end
        assert end["reattached"] == kills and len(end["arbiters"]) == kills + 1, end
        assert end["fds"] == ready["fds"] and end["rings"] == ready["rings"] == 1, (ready, end)
    assert sum(end["restarted"] for end in ends) > 0  # the kills met work in flight, which failed cleanly
    assert sorted(os.listdir(supervised.pipe)) == entries
    assert open_fds(supervised.pid) == daemon_fds
    assert supervised.log().count("was killed by SIGKILL") == kills


def test_restart_under_load_is_a_pause_not_an_error(supervised):
    clients = _start_clients(supervised)
    old = supervised.arbiter()
    assert "hands over" in supervised.run("restart")
    wait_until(lambda: supervised.arbiter() not in (old, None), 120, "the new arbiter")
    new = supervised.arbiter()
    wait_until(lambda: all(c.served_by(new) for c in clients), 120, "every client on the new arbiter")
    assert exited(old, 60)
    ends = [c.finish() for c in clients]
    for end in ends:
        assert end["restarted"] == 0 and end["reattached"] == 1 and end["same_arrays"], end
    assert f"arbiter pid {old} handed over and exited with status 0" in supervised.log()


def test_after_a_restart_shared_buffers_carry_on_and_device_buffers_are_lost(supervised):
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(1024), session.array(1024)
        x[:] = np.arange(1024, dtype=np.float32)
        scratch = session.alloc(4096, "device")
        session.copy(x, scratch).wait(60)
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: supervised.arbiter() not in (before, None), 60, "the standby to take over")
        y[:] = 1.0
        session.dispatch(program, 16, [x, y], struct.pack("If", 1024, 2.0)).wait(60)  # same program, same arrays
        assert np.array_equal(y, 2.0 * np.arange(1024, dtype=np.float32) + 1.0)
        assert session.arbiter_pid == supervised.arbiter() and session.reattached == 1
        for _ in range(2):  # sticky
            with pytest.raises(libshare.BufferLost, match="died with the arbiter"):
                session.copy(scratch, y)
        session.free(scratch)  # a lost buffer can still be let go
        again = session.alloc(4096, "device")  # and a new one made
        session.copy(x, again).wait(60)


def test_a_ticket_in_flight_at_the_kill_raises_arbiter_restarted_every_time(supervised):
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        program = session.load_program(libshare.shaders.path("busy"))
        data = session.array(1 << 16, np.uint32)
        ticket = session.dispatch(program, 1024, [data], struct.pack("II", 1 << 16, 1_000_000))  # seconds of work
        wait_until(lambda: session.stats()["submitted"] >= 1, 60, "the arbiter to take the dispatch")
        assert not ticket.done()
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        for _ in range(2):
            with pytest.raises(libshare.ArbiterRestarted, match="may have partly run"):
                ticket.wait(60)
        assert ticket.done()
        with pytest.raises(libshare.ArbiterLost):  # a subclass: old handlers still catch it
            ticket.wait(0)


def test_a_ticket_waited_after_close_during_a_restart_fails_with_session_closed(supervised):
    """The session saw the arbiter's death (a restart is due) and was then closed: its ticket's
    outcome can no longer come, and a wait says so at once (it used to loop until its timeout,
    for ever without one)."""
    session = libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30)
    program = session.load_program(libshare.shaders.path("busy"))
    data = session.array(1 << 16, np.uint32)
    ticket = session.dispatch(program, 1024, [data], struct.pack("II", 1 << 16, 1_000_000))  # seconds of work
    wait_until(lambda: session.stats()["submitted"] >= 1, 60, "the arbiter to take the dispatch")
    before = supervised.arbiter()
    os.kill(before, signal.SIGKILL)
    # done() looks until it sees the death (a reattach is then due, and not made yet: the next look would make it)
    wait_until(lambda: session._gate.lost is not None or ticket.done(), 60, "the session to see the arbiter's death")
    assert isinstance(session._gate.lost, libshare.ArbiterRestarted) and not ticket._settled()
    session.close()
    with pytest.raises(libshare.SessionClosed):
        ticket.wait(30)
    assert ticket.done()


def test_a_restart_finishes_a_dispatch_that_runs_in_pieces(supervised):
    """A hand-over finishes what runs: a low dispatch that runs in pieces (a realtime client was
    active, policy/engine_policy.c, "Pieces") runs the rest of its workgroups at once on the old arbiter, and its
    ticket is answered done, with every workgroup run."""
    connect = lambda priority: libshare.connect(mode="daemon", pipe_directory=supervised.pipe,  # noqa: E731
                                                timeout=30, priority=priority)
    with connect("realtime") as realtime, connect("low") as low:
        saxpy, x, y = realtime.load_program(libshare.shaders.path("saxpy")), realtime.array(64), realtime.array(64)
        busy, data = low.load_program(libshare.shaders.path("busy")), low.array(4096, np.uint32)
        push = struct.pack("II", 4096, busy_iterations(1_000_000))  # 64 workgroups, ~2 s on lavapipe
        low.dispatch(busy, 64, [data], push).wait(120)  # whole, and timed: the next one has an estimate
        whole = np.array(data)
        data[:] = 0
        realtime.dispatch(saxpy, 1, [x, y], struct.pack("If", 64, 1.0)).wait(60)  # active: low work is cut
        ticket = low.dispatch(busy, 64, [data], push)
        wait_until(lambda: low.stats()["pieces"] >= 2, 60, "the low dispatch to run in pieces")
        old = supervised.arbiter()
        assert "hands over" in supervised.run("restart")
        ticket.wait(120)
        assert np.array_equal(data, whole), "every workgroup ran"
        wait_until(lambda: supervised.arbiter() not in (old, None), 120, "the new arbiter")
        assert exited(old, 60) and low.reattached == 1


def test_work_the_dead_arbiter_never_took_runs_on_the_new_one(supervised):
    """A dispatch pushed after the kill, before the session noticed it, sits in the dead ring
    untaken: the reattach sends it to the new arbiter under the same ticket, and it succeeds."""
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(1024), session.array(1024)
        x[:] = np.arange(1024, dtype=np.float32)
        y[:] = 1.0
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: not running(before), 60, "the arbiter's death")
        tickets = [session.dispatch(program, 16, [x, y], struct.pack("If", 1024, 2.0)) for _ in range(3)]
        for ticket in tickets:
            ticket.wait(60)
        assert session.reattached == 1 and session.arbiter_pid != before
        assert np.array_equal(y, 6.0 * x + 1.0)  # y += 2x three times: each ran once


def test_awaited_tickets_reattach_too(supervised):
    async def main(session):
        program = session.load_program(libshare.shaders.path("busy"))
        data = session.array(1 << 16, np.uint32)
        running = session.dispatch(program, 1024, [data], struct.pack("II", 1 << 16, 1_000_000))
        wait_until(lambda: session.stats()["submitted"] >= 1, 60, "the arbiter to take the dispatch")
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        with pytest.raises(libshare.ArbiterRestarted):
            await running
        x, y = session.array(1024), session.array(1024)
        x[:] = 1.0
        await session.dispatch(libshare_saxpy(session), 16, [x, y], struct.pack("If", 1024, 2.0))
        assert np.all(y == 2.0) and session.arbiter_pid != before

    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        anyio.run(main, session)


def libshare_saxpy(session):
    return session.load_program(libshare.shaders.path("saxpy"))


def test_arbiters_that_keep_dying_young_are_started_ever_later(supervised):
    """A crash loop costs little: each start after the second young death waits longer."""
    wait_until(lambda: supervised.standbys() >= 1, 120, "a standby arbiter")
    for death in range(3):
        standby = wait_until(lambda: _standby(supervised), 120, "a new standby process")
        os.kill(standby, signal.SIGKILL)
        wait_until(lambda: f"arbiter pid {standby} (" in supervised.log(), 60, "the death in control.log")
    log = supervised.log()
    assert "was killed by SIGKILL" in log and "the next starts in" in log, log[-2000:]
    assert supervised.run("get_server_status") == "ACTIVE"  # the active one served on throughout


def _standby(daemon: Daemon) -> int | None:
    """A child of the control daemon that is not the serving arbiter, if one runs."""
    active = daemon.arbiter()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != active and parent_of(int(entry)) == daemon.pid and running(int(entry)):
            return int(entry)
    return None


def test_quit_stops_the_control_daemon_and_its_standby(supervised):
    wait_until(lambda: supervised.standbys() >= 1, 120, "a standby arbiter")
    arbiter = supervised.arbiter()
    supervised.run("quit")
    assert exited(arbiter, 60) and exited(supervised.pid, 60)
    assert "the control daemon stops too" in supervised.log()
    assert not _config.supervisor_lock_path(supervised.pipe).exists()
    assert not _config.socket_path(supervised.pipe).exists()
    with pytest.raises(libshare.ArbiterUnavailable):
        libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=2)


def test_restart_without_a_control_daemon_is_refused(daemon):
    process, pipe_dir = daemon
    with ControlConnection(pipe_dir) as connection:
        with pytest.raises(libshare.ServerNotReady, match="needs the control daemon"):
            connection.run("restart")
        assert connection.run("get_server_status") == "ACTIVE"
