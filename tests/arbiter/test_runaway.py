"""Runaway dispatches: a dispatch that never ends, on a live daemon arbiter and real lavapipe.

Vulkan cannot abort a dispatch, and lavapipe never reports one lost, so the runaway below
runs until its process exits: the watchdog must fault the server on time whatever shares its
submission, nothing may wait for the runaway (recovery, SIGTERM, ``quit``), and since the
device cannot be recovered in-process the arbiter must say so and exit for a supervisor.
"""

from __future__ import annotations

import contextlib
import math
import signal
import struct

import numpy as np
import pytest

import libshare
from libshare.protocol import paths as _config, control as _control
from libshare.daemon.options import EXIT_UNRECOVERABLE

from tests._busy import busy_iterations
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


pytestmark = pytest.mark.alone  # the test command runs these after the others, in one process (pyproject.toml)


@contextlib.contextmanager
def arbiter(tmp_path, watchdog: str, *args: str):
    """A daemon arbiter with the watchdog at ``watchdog`` seconds ("0": off) and extra command-line
    ``args``; yields (process, pipe_dir). Unplaced: its device threads may run on any core, so that
    the other tests beside it (the suite runs in two workers) cannot hold its one device core while an
    honest command is timed against the watchdog (a placed arbiter's command sized at 20 ms once ran past
    a 2 s watchdog beside three other workers)."""
    generator = run_daemon(tmp_path / "pipe", *args, LIBSHARE_WATCHDOG_SECONDS=watchdog, LIBSHARE_PLACEMENT="0")
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
        for earlier in fillers:
            earlier.wait(timeout=60)  # they ran: only the runaway's submission trips the watchdog
        for lost in (*tiny, ticket):  # one fence answers a submission: the tiny ones share its fault
            with pytest.raises(libshare.ServerFault):
                lost.wait(timeout=120)
        # The batch of 30 had 30 times the watchdog before (60 s); its runaway command now has the
        # watchdog from when the batch's progress marker last moved, and the verdict says which
        # limit it applied: that of one command since the one before it ended, not the batch's.
        # (How long the fault took: bench/test_lifecycle_mechanism_bench.py.)
        assert ps_rows(pipe_dir)["runaway"][4] == "RUNAWAY"
        log = (pipe_dir / "server.log").read_text()
        assert "a submission of 30 command(s) has run" in log
        # the marker said which command ran: the runaway, after the 29 tiny ones
        assert "since its last command ended (its command 30 running), past its 2.0 s limit (the 2 s watchdog)" \
            in log
        assert log.count("past its") == 1, log  # one verdict, on the runaway's command alone


def test_a_batch_of_legal_dispatches_longer_than_twice_the_watchdog_runs_to_its_end(tmp_path, vulkan_device_name):
    """A batch of legal dispatches taken as one submission, each at most a sixteenth of the
    watchdog and all together three times it. Timed from the head of the queue, such a batch had
    twice the watchdog and faulted the server for every client (256 dispatches of a second each did
    so at the default 120 s); each command now has the watchdog, and the batch runs to its end.

    The sizes come from the arbiter's own device time for one such dispatch (the tickets'
    ``device_ns``), not from a clock the test reads: the watchdog is set with ``reload`` to 16 of
    them (2 s at least, against the machine's hiccups), and the batch has as many dispatches as make
    three watchdogs (1000 at most, the engine's batch holds 1024). So the batch is past twice the
    watchdog on any device, and each command far within it, unless the machine slows down sixteen
    times or speeds up one and a half times between the measure and the batch. (On a fixed 2 s
    watchdog a batch meant to take 5 s ended in 3.4 s on a fast machine: the test checked nothing.)
    How long the batch took against its watchdog is a figure of bench/test_lifecycle_mechanism_bench.py."""
    config = tmp_path / "libshare.toml"
    config.write_text("[defaults]\nwatchdog_seconds = 0\n")  # off while one dispatch is measured
    with arbiter(tmp_path, "0", "--config", str(config)) as (process, pipe_dir), \
            connect(pipe_dir, "batcher") as session, connect(pipe_dir, "bystander") as bystander:
        program = session.load_program(BUSY)
        one = struct.pack("II", 4096, busy_iterations(20_000))
        reference = session.array(4096, np.uint32)
        session.dispatch(program, groups=64, buffers=[reference], push=one).wait(timeout=300)  # compiled
        measured = [session.dispatch(program, groups=64, buffers=[reference], push=one) for _ in range(2)]
        command_s = max(ticket.wait(timeout=300).device_ns for ticket in measured) / 1e9
        assert command_s > 0, "the arbiter measured no device time"
        watchdog = round(max(2.0, 16 * command_s), 3)
        count = min(1000, max(48, math.ceil(3 * watchdog / command_s)))
        config.write_text(f"[defaults]\nwatchdog_seconds = {watchdog}\n")
        control(pipe_dir, "reload")
        assert f"watchdog_seconds = {watchdog!r}  # file" in control(pipe_dir, "get_config"), "the watchdog was not set"

        small = session.array(4096, np.uint32)
        outputs = [session.array(4096, np.uint32) for _ in range(count)]
        fillers, before = [], popped(pipe_dir, "batcher")
        for k in (1, 2):  # the device's two in-flight slots, so that the batch waits and goes as one submission
            fillers.append(session.dispatch(program, groups=64, buffers=[small], push=one))
            wait_until(lambda: popped(pipe_dir, "batcher") >= before + k, what=f"filler {k} on the device")
        batch = [session.dispatch(program, groups=64, buffers=[out], push=one) for out in outputs]
        for ticket in fillers + batch:
            ticket.wait(timeout=600)  # no ServerFault
        assert control(pipe_dir, "get_server_status") == "ACTIVE"
        assert reference.any() and all(np.array_equal(out, reference) for out in outputs), "a command did not run"
        assert ps_rows(pipe_dir)["batcher"][4] == "ACTIVE"
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
            # Before, the arbiter waited in vkDeviceWaitIdle for ever (the bound here is against a
            # hang; how long the stop took is a figure of bench/test_lifecycle_mechanism_bench.py).
            assert process.wait(timeout=120) == 0
            with pytest.raises(libshare.ArbiterLost):  # answered (or its arbiter seen gone), not left hanging
                ticket.wait(timeout=60)
        log = gone(process, pipe_dir)
        assert "stopping (SIGTERM), work in flight gets 10.0 s" in log  # --shutdown-timeout's default
        assert "abandoned on the device, answered LS_ECANCELED: client 1 (runaway" in log


def test_quit_after_a_runaway_fault_stops_the_arbiter_within_its_timeout(tmp_path, vulkan_device_name):
    with arbiter(tmp_path, "1") as (process, pipe_dir):
        with connect(pipe_dir, "runaway") as session:
            with pytest.raises(libshare.ServerFault):
                start_runaway(session).wait(timeout=120)
            assert control(pipe_dir, "get_server_status") == "FAULT"  # the runaway still runs
            control(pipe_dir, "quit", "-t", "2")
            # 0, not EXIT_UNRECOVERABLE: the quit stopped it, before the device was given up (10 s
            # after the fault, when the arbiter exits for a restart).
            assert process.wait(timeout=120) == 0
        log = gone(process, pipe_dir)
        assert "stopping (quit command), work in flight gets 2.0 s" in log
        assert "abandoned on the device, answered LS_EFAULT: client 1 (runaway" in log
        assert "the device cannot be recovered in this process" not in log
