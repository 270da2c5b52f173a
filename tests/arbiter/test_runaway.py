"""Runaway dispatches: a dispatch that never ends, on a live daemon arbiter and real lavapipe.

Vulkan cannot abort a dispatch, and lavapipe never reports one lost, so the runaway below
runs until its process exits: the watchdog must fault the server on time whatever shares its
submission, nothing may wait for the runaway (recovery, SIGTERM, ``quit``), and since the
device cannot be recovered in-process the arbiter must say so and exit for a supervisor.
"""

from __future__ import annotations

import contextlib
import signal
import struct
import time

import numpy as np
import pytest

import libshare
from libshare.protocol import paths as _config, control as _control
from libshare.daemon.options import EXIT_UNRECOVERABLE

from tests.arbiter.conftest import run_daemon, wait_until

BUSY = libshare.shaders.path("busy")
RUNAWAY_N = 65535 * 64  # one invocation per element, 65535 workgroups of 64
RUNAWAY_GROUPS = (65535, 64, 1)  # the y groups repeat the x ones: 64 times the work
RUNAWAY_PUSH = struct.pack("II", RUNAWAY_N, 1_000_000)  # busy.comp's most rounds per invocation on lavapipe
TINY_PUSH = struct.pack("II", 64, 1)


def control(pipe_dir, command: str, *args: str) -> str:
    return _control.run(command, *args, pipe_directory=pipe_dir)


def ps_rows(pipe_dir) -> dict[str, list[str]]:
    """``ps`` rows by client name: PID ID NAME DEVICE STATE PRIORITY DISPATCHES ..."""
    _, *rows = control(pipe_dir, "ps").splitlines()
    return {row.split()[2]: row.split() for row in rows}


def popped(pipe_dir, name: str) -> int:
    """How many of client ``name``'s descriptors the arbiter has taken (ps DISPATCHES)."""
    row = ps_rows(pipe_dir).get(name)
    return int(row[6]) if row else 0


def start_runaway(session: libshare.Session):
    """Dispatch busy.comp for hours (every wait on it would hang); return its ticket."""
    program = session.load_program(BUSY)
    data = session.array(RUNAWAY_N, np.uint32)
    return session.dispatch(program, groups=RUNAWAY_GROUPS, buffers=[data], push=RUNAWAY_PUSH)


def gone(process, pipe_dir) -> str:
    """Check that the arbiter has exited and removed its socket and lock file; its server.log."""
    assert process.poll() is not None
    assert not _config.socket_path(pipe_dir).exists()
    assert not _config.lock_path(pipe_dir).exists()
    return (pipe_dir / "server.log").read_text()


@contextlib.contextmanager
def arbiter(tmp_path, watchdog: str):
    """A daemon arbiter with the watchdog at ``watchdog`` seconds ("0": off); yields (process, pipe_dir)."""
    generator = run_daemon(tmp_path / "pipe", LIBSHARE_WATCHDOG_SECONDS=watchdog)
    try:
        yield next(generator)
    finally:
        next(generator, None)


def connect(pipe_dir, name: str) -> libshare.Session:
    return libshare.connect(name=name, mode="daemon", pipe_directory=pipe_dir)


def test_runaway_faults_names_its_client_and_the_arbiter_exits_for_a_restart(tmp_path, vulkan_device_name):
    with arbiter(tmp_path, "1") as (process, pipe_dir):
        with connect(pipe_dir, "honest") as honest, connect(pipe_dir, "runaway") as session:
            program, data = honest.load_program(BUSY), honest.array(64, np.uint32)
            honest.dispatch(program, groups=1, buffers=[data], push=TINY_PUSH).wait(timeout=60)
            ticket = start_runaway(session)
            wait_until(lambda: popped(pipe_dir, "runaway"), what="the runaway on the device")
            behind = honest.dispatch(program, groups=1, buffers=[data], push=TINY_PUSH)  # queued behind it
            with pytest.raises(libshare.ServerFault):
                ticket.wait(timeout=120)
            with pytest.raises(libshare.ServerFault):  # an honest client is told, not left waiting
                behind.wait(timeout=120)
            rows = ps_rows(pipe_dir)  # listed while its work runs, which is until the arbiter exits
            assert rows["runaway"][4] == "RUNAWAY"
            assert "honest" not in rows or rows["honest"][4] == "INACTIVE"  # listed while its work is queued
            with pytest.raises(libshare.ServerFault):  # sticky
                honest.dispatch(program, groups=1, buffers=[data], push=TINY_PUSH).wait(timeout=60)
            assert process.wait(timeout=120) == EXIT_UNRECOVERABLE  # after the recovery timeout (10 s)
        log = gone(process, pipe_dir)
        assert "past the 1 s watchdog; raised by client 2 (runaway" in log
        assert "the device cannot be recovered in this process" in log
        assert f"exits with status {EXIT_UNRECOVERABLE}" in log


def test_runaway_batched_with_29_tiny_dispatches_faults_within_twice_the_watchdog(tmp_path, vulkan_device_name):
    # A 2 s watchdog leaves the fillers below (0.4 s on an idle machine) room on a loaded one.
    with arbiter(tmp_path, "2") as (_, pipe_dir), connect(pipe_dir, "runaway") as session:
        program = session.load_program(BUSY)
        data, small = session.array(RUNAWAY_N, np.uint32), session.array(4096, np.uint32)
        # Two short dispatches fill the device's two in-flight slots, one submission each, so
        # that the next 30 descriptors wait in the ring and are taken as one batch.
        filler = struct.pack("II", 4096, 100_000)
        fillers = []
        for count in (1, 2):
            fillers.append(session.dispatch(program, groups=64, buffers=[small], push=filler))
            wait_until(lambda: popped(pipe_dir, "runaway") >= count, what=f"filler {count} on the device")
        tiny = [session.dispatch(program, groups=1, buffers=[small], push=TINY_PUSH) for _ in range(29)]
        ticket = session.dispatch(program, groups=RUNAWAY_GROUPS, buffers=[data], push=RUNAWAY_PUSH)
        pushed = time.monotonic()
        for earlier in fillers:
            earlier.wait(timeout=60)  # they ran: only the runaway's submission trips the watchdog
        for lost in (*tiny, ticket):  # one fence answers a submission: the tiny ones share its fault
            with pytest.raises(libshare.ServerFault):
                lost.wait(timeout=120)
        # The batch of 30 had 30 times the watchdog before (60 s); its runaway command now has the
        # watchdog from when the batch's progress marker last moved (within 4 s of reaching the head
        # of the queue). A generous bound that 60 s misses.
        assert time.monotonic() - pushed < 30
        assert ps_rows(pipe_dir)["runaway"][4] == "RUNAWAY"
        log = (pipe_dir / "server.log").read_text()
        assert "a submission of 30 command(s) has run" in log
        assert "since its last command ended, past its 2.0 s limit (the 2 s watchdog)" in log


def test_a_batch_of_legal_dispatches_longer_than_twice_the_watchdog_runs_to_its_end(tmp_path, vulkan_device_name):
    """48 dispatches of about 0.1 s each, taken as one submission under a 2 s watchdog: about 5 s in
    all on an idle machine. Timed from the head of the queue, the batch had 4 s and faulted the server
    for every client (256 dispatches of a second each did so at the default 120 s); each command now
    has the watchdog. (With 24 of about 0.2 s, one went past 2 s once, on a machine that hostile-review
    processes loaded: the dispatches are halved for the margin, the batch's length kept.)"""
    with arbiter(tmp_path, "2") as (process, pipe_dir), connect(pipe_dir, "batcher") as session, \
            connect(pipe_dir, "bystander") as bystander:
        program = session.load_program(BUSY)
        small = session.array(4096, np.uint32)
        filler = struct.pack("II", 4096, 100_000)
        fillers = []
        for count in (1, 2):  # the device's two in-flight slots, so that the next 48 wait and go as one batch
            fillers.append(session.dispatch(program, groups=64, buffers=[small], push=filler))
            wait_until(lambda: popped(pipe_dir, "batcher") >= count, what=f"filler {count} on the device")
        started = time.monotonic()
        half = struct.pack("II", 4096, 50_000)
        batch = [session.dispatch(program, groups=128, buffers=[small], push=half) for _ in range(48)]
        for ticket in fillers + batch:
            ticket.wait(timeout=300)  # no ServerFault
        took = time.monotonic() - started
        assert took > 4, f"the batch took {took:.1f} s: not past the 4 s an unmarked batch had"
        assert control(pipe_dir, "get_server_status") == "ACTIVE"
        assert saxpy_works(bystander)
        assert "watchdog" not in (pipe_dir / "server.log").read_text()


def saxpy_works(session) -> bool:
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(64), session.array(64)
    x[:], y[:] = 1.0, 2.0
    session.dispatch(program, 1, [x, y], struct.pack("If", 64, 3.0)).wait(timeout=60)
    return bool(np.all(y == 5.0))


def test_sigterm_during_a_hung_dispatch_stops_the_arbiter_within_its_timeout(tmp_path, vulkan_device_name):
    with arbiter(tmp_path, "0") as (process, pipe_dir):  # no watchdog: the runaway just runs
        with connect(pipe_dir, "runaway") as session:
            ticket = start_runaway(session)
            wait_until(lambda: popped(pipe_dir, "runaway"), what="the runaway on the device")
            process.send_signal(signal.SIGTERM)
            stopping = time.monotonic()
            assert process.wait(timeout=120) == 0
            # --shutdown-timeout is 10 s; before, the arbiter waited in vkDeviceWaitIdle for ever.
            assert time.monotonic() - stopping < 40
            with pytest.raises(libshare.ArbiterLost):  # answered (or its arbiter seen gone), not left hanging
                ticket.wait(timeout=60)
        assert "abandoned on the device, answered LS_ECANCELED: client 1 (runaway" in gone(process, pipe_dir)


def test_quit_after_a_runaway_fault_stops_the_arbiter_within_its_timeout(tmp_path, vulkan_device_name):
    with arbiter(tmp_path, "1") as (process, pipe_dir):
        with connect(pipe_dir, "runaway") as session:
            with pytest.raises(libshare.ServerFault):
                start_runaway(session).wait(timeout=120)
            assert control(pipe_dir, "get_server_status") == "FAULT"  # the runaway still runs
            control(pipe_dir, "quit", "-t", "2")
            stopping = time.monotonic()
            assert process.wait(timeout=120) == 0  # quit before the device was given up (10 s after the fault)
            assert time.monotonic() - stopping < 20
        assert "stopping (quit command), work in flight gets 2.0 s" in gone(process, pipe_dir)
