"""How long the arbiter's lifecycle takes: faults, stops, deaths seen by clients, refusals, attaches.

These are the figures that tests asserted on before they checked the mechanisms instead (issue
31): tests/arbiter/test_runaway.py, test_multiprocess.py, test_session.py, test_scheduling.py,
tests/test_session_truth.py, tests/control/test_daemon.py and test_cli.py. Every figure comes
from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default), its median judged
against its target and printed with its range. Each block starts its own daemon where the
scenario ends one.

LM1. a batch of 48 legal busy.comp dispatches of ~0.1 s, taken as one submission under a 2 s
     watchdog: the batch's time / twice the watchdog (the old test needed it over 1, and a fast
     machine gave 0.85); no fault in any block;
LM2. a runaway batched behind 29 tiny dispatches under a 2 s watchdog: from its push to the fault
     (s; was asserted under 30 s, against the 60 s a batch once had);
LM3. SIGTERM with a dispatch that never ends (no watchdog): the arbiter's exit after the signal
     (s; was asserted under 40 s, its --shutdown-timeout being 10 s);
LM4. ``quit -t 2`` after a runaway's fault: the exit after the command (s; was asserted under 20 s);
LM5. SIGKILL of the arbiter: when each way of asking of a session with a long queue sees it
     (``wait``, a poll of ``done()``, ``await``, ``wait_idle``: ms; was asserted under 5 s, the
     library saying 1 s), and a later call's wait (was asserted under 5 s);
LM6. SIGTERM of the arbiter: when a client looping over round trips prints ``lost`` (ms; was
     asserted under 1 s);
LM7. ``drainer.call`` after ``Arbiter.close``: the time to its refusal (ms; was asserted under 1 s);
LM8. ``libshare-control -d --device no-such-device``: the time to the failure (s; was under 30 s);
LM9. 60 sessions attaching one after another to an in-process arbiter: the time for all (s; was
     asserted under 30 s).
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import libshare
from bench._compare import at_most, below, measure, record, repeat
from libshare.protocol import control as _control
from tests._busy import busy_iterations
from tests.arbiter.conftest import run_daemon, wait_until
from tests.conftest import ROOT, stop_process
from tests.conftest import long_dispatches_fit_the_device, vulkan_device_name  # noqa: F401 - fixtures, as in tests/

pytestmark = pytest.mark.usefixtures("vulkan_device_name")

BUSY = libshare.shaders.path("busy")
TINY = struct.pack("II", 64, 1)


daemon = contextlib.contextmanager(run_daemon)  # with daemon(pipe_dir, *args, **env) as (process, pipe_dir)


def connect(pipe_dir, name: str) -> libshare.Session:
    return libshare.connect(name=name, mode="daemon", pipe_directory=pipe_dir)


def popped(pipe_dir, name: str) -> int:
    """How many of client ``name``'s descriptors the arbiter has taken (ps DISPATCHES)."""
    _, *rows = _control.run("ps", pipe_directory=pipe_dir).splitlines()
    row = next((r.split() for r in rows if r.split()[2] == name), None)
    return int(row[6]) if row else 0


def fill_the_device(session, program, buffer, pipe_dir, name: str, push: bytes) -> list:
    """Two dispatches that fill the device's two in-flight slots, so that what comes next waits in the ring."""
    fillers, before = [], popped(pipe_dir, name)
    for k in (1, 2):
        fillers.append(session.dispatch(program, groups=64, buffers=[buffer], push=push))
        wait_until(lambda: popped(pipe_dir, name) >= before + k, what=f"filler {k} on the device")
    return fillers


def numbered(tmp_path):
    """A maker of a new path below ``tmp_path`` per block: ``fresh("kill")`` gives kill0, then
    ``fresh("term")`` term1, and so on (one count for every stem)."""
    count = itertools.count()
    return lambda stem: tmp_path / f"{stem}{next(count)}"


def measure_in_fresh_dirs(name: str, block, unit: str, tmp_path, stem: str, **figure):
    """``measure`` a figure whose ``block(path)`` gets a new path below ``tmp_path`` each block
    (stem0, stem1, ...); ``figure`` is the rest of ``measure``'s arguments (target, method)."""
    fresh = numbered(tmp_path)
    return measure(name, lambda: block(fresh(stem)), unit, **figure)


def test_a_legal_batch_against_twice_the_watchdog(tmp_path):
    def block(base) -> float:
        with daemon(base, LIBSHARE_WATCHDOG_SECONDS="2") as (_, pipe_dir), \
                connect(pipe_dir, "batcher") as session:
            program, small = session.load_program(BUSY), session.array(4096, np.uint32)
            fillers = fill_the_device(session, program, small, pipe_dir, "batcher", struct.pack("II", 4096, 100_000))
            started = time.perf_counter()
            half = struct.pack("II", 4096, 50_000)
            batch = [session.dispatch(program, groups=128, buffers=[small], push=half) for _ in range(48)]
            for ticket in fillers + batch:
                ticket.wait(timeout=300)
            return (time.perf_counter() - started) / 4.0

    measure_in_fresh_dirs("LM1. 48 legal dispatches in one submission: their time / twice the 2 s watchdog", block,
                          "x", tmp_path, "batch", method="busy.comp over 4096 words, 50,000 rounds each, behind two fillers; no ServerFault in any block")


def test_faults_and_stops(tmp_path):
    runaway_n = 65535 * 64
    runaway_push = struct.pack("II", runaway_n, 1_000_000)
    fresh = numbered(tmp_path)

    def start_runaway(session):
        data = session.array(runaway_n, np.uint32)
        return session.dispatch(session.load_program(BUSY), groups=(65535, 64, 1), buffers=[data], push=runaway_push)

    def batched_fault() -> float:
        with daemon(fresh("fault"), LIBSHARE_WATCHDOG_SECONDS="2") as (process, pipe_dir), \
                connect(pipe_dir, "runaway") as session:
            program, small = session.load_program(BUSY), session.array(4096, np.uint32)
            data = session.array(runaway_n, np.uint32)
            fillers = fill_the_device(session, program, small, pipe_dir, "runaway", struct.pack("II", 4096, 100_000))
            for _ in range(29):
                session.dispatch(program, groups=1, buffers=[small], push=TINY)
            ticket = session.dispatch(program, groups=(65535, 64, 1), buffers=[data], push=runaway_push)
            pushed = time.perf_counter()
            for earlier in fillers:
                earlier.wait(timeout=60)
            with pytest.raises(libshare.ServerFault):
                ticket.wait(timeout=120)
            return time.perf_counter() - pushed

    def sigterm_stop() -> float:
        with daemon(fresh("term"), LIBSHARE_WATCHDOG_SECONDS="0") as (process, pipe_dir), \
                connect(pipe_dir, "runaway") as session:
            start_runaway(session)
            wait_until(lambda: popped(pipe_dir, "runaway"), what="the runaway on the device")
            process.send_signal(signal.SIGTERM)
            signalled = time.perf_counter()
            process.wait(timeout=120)
            return time.perf_counter() - signalled

    def quit_stop() -> float:
        with daemon(fresh("quit"), LIBSHARE_WATCHDOG_SECONDS="1") as (process, pipe_dir), \
                connect(pipe_dir, "runaway") as session:
            with pytest.raises(libshare.ServerFault):
                start_runaway(session).wait(timeout=120)
            _control.run("quit", "-t", "2", pipe_directory=pipe_dir)
            asked = time.perf_counter()
            process.wait(timeout=120)
            return time.perf_counter() - asked

    measure("LM2. a runaway batched behind 29 tiny dispatches: from its push to the fault (2 s watchdog)",
            batched_fault, "s", target=below(30.0), method="the scenario of tests/arbiter/test_runaway.py")
    measure("LM3. SIGTERM during a dispatch that never ends: the arbiter's exit after it", sigterm_stop, "s",
            target=below(40.0), method="no watchdog; --shutdown-timeout 10 s (the default)")
    measure("LM4. quit -t 2 after a runaway's fault: the arbiter's exit after it", quit_stop, "s",
            target=below(20.0), method="a 1 s watchdog faulted the runaway; the device is given up 10 s after")


def _long_queue(session, count: int = 10):
    program = session.load_program(BUSY)
    data = session.array(1 << 16, np.uint32)
    push = struct.pack("II", 1 << 16, busy_iterations(20_000))
    return [session.dispatch(program, groups=1024, buffers=[data], push=push) for _ in range(count)]


def test_a_killed_arbiter_seen_by_every_way_of_asking(tmp_path):
    import anyio

    fresh = numbered(tmp_path)

    def block() -> dict[str, float]:
        with daemon(fresh("kill")) as (process, pipe_dir):
            sessions = [connect(pipe_dir, name) for name in ("wait", "done", "await", "wait_idle", "later")]
            try:
                last = [_long_queue(s)[-1] for s in sessions[:4]]
                later = sessions[4]
                saxpy, x = later.load_program(libshare.shaders.path("saxpy")), later.array(64)
                seen: dict[str, float] = {}
                killed = threading.Event()

                def record_way(way, call):
                    try:
                        call()
                    except libshare.ArbiterLost:
                        seen[way] = time.perf_counter()

                def poll_done():
                    killed.wait()
                    wait_until(last[1].done, 30, interval=0.001)
                    seen["done"] = time.perf_counter()

                async def await_last():
                    await last[2]

                threads = [threading.Thread(target=record_way, args=("wait", last[0].wait)),
                           threading.Thread(target=poll_done),
                           threading.Thread(target=record_way, args=("await", lambda: anyio.run(await_last))),
                           threading.Thread(target=record_way, args=("wait_idle", sessions[3].wait_idle))]
                for thread in threads:
                    thread.start()
                process.send_signal(signal.SIGKILL)
                at = time.perf_counter()
                killed.set()
                for thread in threads:
                    thread.join(60)
                process.wait(timeout=10)
                began = time.perf_counter()
                with pytest.raises(libshare.ArbiterLost):
                    later.dispatch(saxpy, 1, [x, x], b"").wait(timeout=30)
                after = {way: (t - at) * 1e3 for way, t in seen.items()}
                after["a later call"] = (time.perf_counter() - began) * 1e3  # from its call, the death known
                return after
            finally:
                for session in sessions:
                    session.close()

    values = repeat(block)
    for way in ("wait", "done", "await", "wait_idle", "a later call"):
        record(f"LM5. a killed arbiter seen by {way}", [v[way] for v in values if way in v], "ms",
               target=at_most(1000.0), method="a daemon SIGKILLed under four sessions each waiting on a long queue "
                                              "(and a fifth calling afterwards); from the kill")


def test_a_stopped_arbiter_seen_by_a_looping_client(tmp_path):
    def block(base) -> float:
        with daemon(base) as (process, pipe_dir):
            client = subprocess.Popen([sys.executable, "-m", "tests.control._client", str(pipe_dir)], cwd=ROOT,
                                      stdout=subprocess.PIPE, text=True)
            try:
                assert client.stdout.readline().strip() == "ready"
                process.send_signal(signal.SIGTERM)
                signalled = time.perf_counter()
                assert client.stdout.readline().strip() == "lost"
                return (time.perf_counter() - signalled) * 1e3
            finally:
                stop_process(client)
                client.stdout.close()

    measure_in_fresh_dirs("LM6. SIGTERM: a client looping over round trips sees ArbiterLost after", block, "ms",
                          tmp_path, "term", target=at_most(1000.0), method="tests/control/_client.py against a daemon arbiter, SIGTERM to the arbiter")


def test_a_call_after_close_is_refused_at_once(tmp_path):
    from tests.arbiter.test_engine_gil import serving

    def block(pipe_dir) -> float:
        pipe_dir.mkdir()
        with serving(pipe_dir) as arbiter:
            sessions = [libshare.connect(mode="daemon", pipe_directory=pipe_dir) for _ in range(3)]
            arbiter.close()
            started = time.perf_counter()
            with pytest.raises(libshare.ServerNotReady):
                arbiter.drainer.call(lambda: None)
            refused = time.perf_counter()
            for session in sessions:
                session.close()
        return (refused - started) * 1e3

    measure_in_fresh_dirs("LM7. drainer.call after Arbiter.close: refused after", block, "ms", tmp_path, "closed",
                          target=at_most(1000.0), method="an in-process arbiter with three sessions, closed; one call")


def test_a_start_that_cannot_open_its_device_fails_soon(tmp_path):
    def block(base) -> float:
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "libshare.control", "-d", "--pipe-directory", str(base / "pipe"),
                                 "--log-directory", str(base / "log"), "--device", "no-such-device"],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode != 0
        return time.perf_counter() - started

    measure_in_fresh_dirs("LM8. libshare-control -d --device no-such-device: fails after", block, "s", tmp_path,
                          "start", target=below(30.0), method="the command run to its end")


def test_sixty_attaches(tmp_path):
    from libshare.arbiter import Arbiter

    def block(pipe_dir) -> float:
        pipe_dir.mkdir(mode=0o700)
        arbiter = Arbiter(max_clients=60)
        sessions = []
        try:
            arbiter.serve(pipe_dir / "control")
            started = time.perf_counter()
            sessions = [libshare.connect(mode="daemon", pipe_directory=pipe_dir) for _ in range(60)]
            return time.perf_counter() - started
        finally:
            for session in sessions:
                session.close()
            arbiter.close()

    measure_in_fresh_dirs("LM9. 60 sessions attaching one after another", block, "s", tmp_path, "sixty",
                          target=below(30.0), method="libshare.connect to an in-process Arbiter(max_clients=60), in turn")
