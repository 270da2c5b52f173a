"""Attaching to the arbiter, and what an idle arbiter costs; figures in the summary.

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default), its
sides alternated, and is printed as the median over blocks with its range.

4. attach: from ``connect()`` to the first completed dispatch (connect, load saxpy, which
   another session keeps loaded the whole time, two 64-float arrays, dispatch, wait) through a
   warm daemon vs a private in-process device from instance creation to its first completed
   dispatch (``Device()``, create_pipeline, two imported host buffers, submit, wait). A block is
   ``ATTACH_PER_BLOCK`` attaches and ``PRIVATE_PER_BLOCK`` private devices, alternated ABBA;
   the block values are their medians (and the attaches' p90 and median per step). Target
   <= 1 ms through the arbiter. Both sides wait for their one dispatch and check its result;
   closing (session, device) is not timed. Beside it, the CPU time that the client process and
   the arbiter spend per attach-and-close cycle (the arbiter's in 10 ms ticks): on a 2-core
   machine half their sum is a floor for the cycle.
   Also a burst: 256 sessions connecting at once, 4 worker processes x 64 threads, each thread
   calling ``connect()`` once (threads, so that all 256 are in ``connect()`` together, as when
   256 processes start at once). The workers have imported libshare and started their threads
   before "go", so Python start-up is not measured; every session stays attached until all
   are counted. The figure is from "go" to the last session attached (``time.monotonic`` is
   shared across processes). Target < 1 s. The same burst with each worker connecting its 64
   sessions one after another (4 in flight at a time) alternates with it, block by block.
   This daemon runs with ``--max-clients 512`` (the default, 48, would refuse the burst) and
   ``--no-timestamps`` (the private device submits untimed too).
5. idle arbiter CPU: a fresh daemon with default settings, the run time of its threads
   (/proc/PID/task/*/schedstat) over ``IDLE_SECONDS`` per block, with no client, with one client
   that ran one dispatch and then stays idle, and with 256 such clients, the three in rotated
   order each block. Target < 0.5% of one core. utime + stime from /proc/PID/stat (10 ms ticks)
   over all blocks together is printed beside it.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import libshare
from bench._compare import at_most, below, interleave, note, pick, ratio, record
from libshare._proc import cpu_seconds
from libshare.arbiter.device import Device, Dispatch
from tests.conftest import ROOT, stop_process

SAXPY = libshare.shaders.path("saxpy")
PUSH = struct.pack("If", 64, 1.0)  # y = 1.0 * x + y over 64 floats, one workgroup
ATTACH_PER_BLOCK = 40
PRIVATE_PER_BLOCK = 6  # a private device costs tens of ms on lavapipe
WARMUP = 5
BURST_WORKERS, BURST_SESSIONS = 4, 64
IDLE_SECONDS = 2.0
IDLE_CLIENTS = 256


def start_daemon(base: Path, *flags: str) -> tuple[subprocess.Popen, Path]:
    """``python -m libshare.arbiter --pipe-directory base/pipe FLAGS``, once its socket exists."""
    pipe_dir = base / "pipe"
    with open(base / "daemon.stderr", "wb") as stderr:  # a file: a full pipe would stall the arbiter
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir),
                                    "--quiet", *flags], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 30
    while not (pipe_dir / "control").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            pytest.fail(f"arbiter did not start: {(base / 'daemon.stderr').read_text()[-2000:]}")
        time.sleep(0.05)
    return process, pipe_dir


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """The daemon of 4 (its client limit raised for the burst), and a session that keeps saxpy loaded
    (and has run it) throughout."""
    process, pipe_dir = start_daemon(tmp_path_factory.mktemp("attach"), "--max-clients", "512", "--no-timestamps")
    try:
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="keeper") as keeper:
            program = keeper.load_program(SAXPY)
            x, y = keeper.array(64), keeper.array(64)
            keeper.dispatch(program, 1, [x, y], PUSH).wait(10)
            yield pipe_dir, keeper, process.pid
    finally:
        stop_process(process)


# ---------------------------------------------------------------- 4. attach

def private_first_dispatch() -> float:
    """Seconds from instance creation to the first completed dispatch on a device of this process's
    own; the result is checked and everything closed after the clock stops."""
    held: dict = {}
    try:
        begun = time.perf_counter()
        held["device"] = device = Device()
        pipeline = device.create_pipeline(SAXPY.read_bytes(), 2, 8)
        held["memory"] = memory = [mmap.mmap(-1, 4096) for _ in range(2)]
        x, y = (np.frombuffer(m, np.float32, 64) for m in memory)
        x[:], y[:] = 1.0, 2.0
        buffers = [device.import_host(a.ctypes.data, 4096) for a in (x, y)]
        submission = device.submit([Dispatch(pipeline, [(b, 0) for b in buffers], (1, 1, 1), PUSH)], timed=False)
        assert submission.wait(10), "the private dispatch did not complete in 10 s"
        submission.release()
        elapsed = time.perf_counter() - begun
        assert np.all(y == 3.0), "the private dispatch computed a wrong saxpy"
        del x, y
        return elapsed
    finally:
        close_private(held)


def close_private(held: dict) -> None:
    """Close what a private round made (the device first: it destroys its buffers and pipeline)."""
    device = held.pop("device", None)
    if device is not None:
        device.close()
    for m in held.pop("memory", ()):
        m.close()


def attach_once(pipe_dir: Path) -> tuple[float, ...]:
    """connect() to the first completed dispatch through the daemon: the seconds of each step
    (connect, load_program, two arrays, dispatch + wait); checked and closed untimed."""
    t0 = time.perf_counter()
    session = libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="attach")
    try:
        t1 = time.perf_counter()
        program = session.load_program(SAXPY)
        t2 = time.perf_counter()
        x, y = session.array(64), session.array(64)
        x[:], y[:] = 1.0, 2.0
        t3 = time.perf_counter()
        session.dispatch(program, 1, [x, y], PUSH).wait(10)
        t4 = time.perf_counter()
        assert np.all(y == 3.0), "the dispatch through the arbiter computed a wrong saxpy"
    finally:
        session.close()
    return t1 - t0, t2 - t1, t3 - t2, t4 - t3


STEPS = ("connect", "load_program", "2x array", "dispatch+wait")


def attach_block(pipe_dir: Path, arbiter_pid: int) -> dict:
    """ATTACH_PER_BLOCK attach-and-close cycles: the median and p90 attach, each step's median, and
    the CPU seconds per cycle of this process and of the arbiter."""
    client_cpu, arbiter_cpu = time.process_time(), cpu_seconds(arbiter_pid)
    steps = np.array([attach_once(pipe_dir) for _ in range(ATTACH_PER_BLOCK)])
    client_cpu, arbiter_cpu = time.process_time() - client_cpu, cpu_seconds(arbiter_pid) - arbiter_cpu
    total = steps.sum(axis=1)
    return {"p50": float(np.median(total)), "p90": float(np.percentile(total, 90)),
            **{name: float(v) for name, v in zip(STEPS, np.median(steps, axis=0))},
            "client cpu": client_cpu / ATTACH_PER_BLOCK, "arbiter cpu": arbiter_cpu / ATTACH_PER_BLOCK}


def test_attach(benchmark, warm):
    pipe_dir, keeper, arbiter_pid = warm
    for _ in range(WARMUP):
        attach_once(pipe_dir)
        private_first_dispatch()
    values = benchmark.pedantic(interleave, args=({
        "arbiter": lambda: attach_block(pipe_dir, arbiter_pid),
        "private": lambda: float(np.median([private_first_dispatch() for _ in range(PRIVATE_PER_BLOCK)]))},),
        rounds=1)
    assert keeper.stats()["completed"] >= 1  # the keeper outlived every attach
    arbiter, private = values["arbiter"], values["private"]
    method = (f"connect() to the first completed dispatch through a warm daemon (load saxpy, two 64-float arrays, "
              f"dispatch, wait), {ATTACH_PER_BLOCK} per block, against a private device from Device() to its first "
              f"completed dispatch, {PRIVATE_PER_BLOCK} per block, alternated ABBA; block values are medians")
    record("4. attach through a daemon, connect() to first completed dispatch", pick(arbiter, "p50"), "ms",
           target=at_most(1.0), scale=1e3, method=method)
    record("4. attach through a daemon, p90", pick(arbiter, "p90"), "ms", scale=1e3, method=method)
    record("4. private device, Device() to first completed dispatch", private, "ms", scale=1e3, method=method)
    ratio("4. attach, daemon / private device", pick(arbiter, "p50"), private, names=("daemon", "private"),
          side_unit="ms", side_scale=1e3, method=method)
    for step in STEPS:
        record(f"4. attach step: {step}", pick(arbiter, step), "ms", scale=1e3, method=method)
    for who in ("client", "arbiter"):
        record(f"4. attach CPU per attach and close: {who}", pick(arbiter, f"{who} cpu"), "ms", scale=1e3,
               method=method + "; CPU time over the block's cycles (the arbiter's utime + stime, 10 ms ticks)")
    floor = (np.median(pick(arbiter, "client cpu")) + np.median(pick(arbiter, "arbiter cpu"))) / 2
    note(f"4. on 2 cores an attach-and-close cycle cannot take less than half the CPU both sides spend on it: "
         f"{floor * 1e3:.2f} ms")


BURST_WORKER = """
import json, sys, threading, time, libshare
pipe_dir, count, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sessions, attached, errors = [None] * count, [0.0] * count, []
go = threading.Event()

def attach(i):
    try:
        sessions[i] = libshare.connect(mode="daemon", pipe_directory=pipe_dir, name=f"burst{i}")
        attached[i] = time.monotonic()
    except Exception as exc:
        errors.append(repr(exc))

def in_thread(i):
    go.wait()
    attach(i)

threads = [threading.Thread(target=in_thread, args=(i,)) for i in range(count)] if how == "threads" else []
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.readline()
start = time.monotonic()
if threads:
    go.set()
    for t in threads:
        t.join()
else:
    for i in range(count):
        attach(i)
print(json.dumps({"start": start, "attached": [t for s, t in zip(sessions, attached) if s], "errors": errors}),
      flush=True)
sys.stdin.readline()  # every session stays attached until the parent has counted them
for s in sessions:
    if s is not None:
        s.close()
"""


def start_burst(pipe_dir: Path, how: str) -> list[subprocess.Popen]:
    """The workers, imported, threads started, each waiting for "go"."""
    workers = []
    try:
        for _ in range(BURST_WORKERS):
            workers.append(subprocess.Popen([sys.executable, "-c", BURST_WORKER, str(pipe_dir), str(BURST_SESSIONS),
                                             how], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for w in workers:
            assert w.stdout.readline().strip() == "ready", "burst worker failed to start"
    except BaseException:
        end_burst(workers)
        raise
    return workers


def release_burst(workers: list[subprocess.Popen], reports: list[dict]) -> None:
    """Say "go" to every worker and collect when each session attached."""
    reports.append({"go": time.monotonic()})
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    for w in workers:
        reports.append(json.loads(w.stdout.readline()))


def end_burst(workers: list[subprocess.Popen]) -> None:
    """Let the workers close their sessions and exit; kill any that do not."""
    for w in workers:
        try:
            w.stdin.write("close\n")
            w.stdin.close()
        except OSError:
            pass
    for w in workers:
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        stop_process(w, timeout=5)
        w.stdout.close()


def burst(pipe_dir: Path, keeper, how: str, benchmark=None) -> dict:
    """One burst: when each session attached (seconds after go), the errors, and how many
    clients the arbiter counted while all of them were attached."""
    reports: list[dict] = []
    workers = start_burst(pipe_dir, how)
    try:
        if benchmark is None:
            release_burst(workers, reports)
        else:
            benchmark.pedantic(release_burst, args=(workers, reports), rounds=1)
        go, reports = reports[0]["go"], reports[1:]
        result = {"attached": sorted(t - go for r in reports for t in r["attached"]),
                  "errors": [e for r in reports for e in r["errors"]],
                  "clients": keeper.stats()["clients"] - 1}  # all attached at once (less the keeper)
    finally:
        end_burst(workers)
    assert all(w.returncode == 0 for w in workers), [w.returncode for w in workers]
    return result


def test_attach_burst(benchmark, warm):
    pipe_dir, keeper, _ = warm
    n = BURST_WORKERS * BURST_SESSIONS
    values = benchmark.pedantic(interleave, args=({how: (lambda h=how: burst(pipe_dir, keeper, h))
                                                   for how in ("threads", "sequential")},), rounds=1)
    for result in values["threads"] + values["sequential"]:
        assert not result["errors"], f"{len(result['errors'])} of {n} sessions failed: {result['errors'][0]}"
        assert len(result["attached"]) == n
        assert result["clients"] >= n, f"the arbiter counted {result['clients']} of {n} clients attached"
    method = (f"{BURST_WORKERS} processes, each with {BURST_SESSIONS} threads that call connect() at once on "
              f"\"go\", against the same processes connecting their {BURST_SESSIONS} sessions one after another; "
              "from \"go\" to the last session attached, one burst of each per block, alternated")
    record(f"4. burst of {n} sessions connecting at once: last attached", [r["attached"][-1] for r in
                                                                           values["threads"]], "ms",
           target=below(1000), scale=1e3, method=method)
    record(f"4. {n} sessions, {BURST_SESSIONS} one after another per process: last attached",
           [r["attached"][-1] for r in values["sequential"]], "ms", scale=1e3, method=method)


# ---------------------------------------------------------------- 5. idle CPU

def thread_run_ns(pid: int) -> dict[int, int]:
    """On-CPU nanoseconds of each thread of ``pid`` alive now (/proc/PID/task/*/schedstat)."""
    times = {}
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            times[int(path.parent.name)] = int(path.read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that just ended
    return times


def run_since(pid: int, before: dict[int, int]) -> float:
    """Seconds on CPU since ``before`` (a ``thread_run_ns``) of the threads of ``pid`` alive now: a
    thread started since counts whole, one that ended since is left out (never a negative time)."""
    return sum(ns - before.get(tid, 0) for tid, ns in thread_run_ns(pid).items()) / 1e9


class Idle:
    """The daemon of 5 and the idle clients it holds: ``window(n)`` has ``n`` clients attached (each
    ran one dispatch), then measures the arbiter's CPU over IDLE_SECONDS."""

    def __init__(self, pid: int, pipe_dir: Path):
        self.pid, self.pipe_dir, self.sessions = pid, pipe_dir, []
        self.ticks = 0.0  # utime + stime over every window, seconds
        self.seconds = 0.0

    def attach(self, count: int) -> None:
        while len(self.sessions) > count:
            self.sessions.pop().close()
        while len(self.sessions) < count:
            session = libshare.connect(mode="daemon", pipe_directory=self.pipe_dir, name=f"idle{len(self.sessions)}")
            self.sessions.append(session)
            x, y = session.array(64), session.array(64)
            x[:], y[:] = 1.0, 2.0
            session.dispatch(session.load_program(SAXPY), 1, [x, y], PUSH).wait(10)
            assert np.all(y == 3.0)

    def window(self, count: int) -> float:
        """Percent of one core that the arbiter's threads ran over IDLE_SECONDS with ``count`` idle clients."""
        self.attach(count)
        time.sleep(1.0)  # the dispatches retired, closed clients reclaimed, the drain thread asleep
        before, run_before, begun = cpu_seconds(self.pid), thread_run_ns(self.pid), time.monotonic()
        time.sleep(IDLE_SECONDS)
        ran, elapsed = run_since(self.pid, run_before), time.monotonic() - begun
        self.ticks += cpu_seconds(self.pid) - before
        self.seconds += elapsed
        assert all(s.stats()["completed"] == 1 for s in self.sessions)  # still attached, and idle
        return 100.0 * ran / elapsed

    def close(self) -> None:
        self.attach(0)


def test_idle_arbiter_cpu(benchmark, tmp_path_factory):
    process, pipe_dir = start_daemon(tmp_path_factory.mktemp("idle"), "--max-clients", str(IDLE_CLIENTS + 8))
    idle = Idle(process.pid, pipe_dir)
    try:
        time.sleep(1.0)  # start-up done
        conditions = {"no client": 0, "one idle client": 1, f"{IDLE_CLIENTS} idle clients": IDLE_CLIENTS}
        values = benchmark.pedantic(interleave, args=({name: (lambda n=n: idle.window(n))
                                                       for name, n in conditions.items()},), rounds=1)
        idle.close()
        assert process.poll() is None, "the arbiter exited while idle"
    finally:
        idle.close()
        stop_process(process)
    method = (f"a fresh daemon with default settings; the run time of its threads (schedstat) over {IDLE_SECONDS:g} s "
              f"with no client, with one client that ran one dispatch and stays idle, and with {IDLE_CLIENTS} such "
              "clients, in rotated order each block")
    for name in conditions:
        record(f"5. idle arbiter CPU, {name}", values[name], "%", target=below(0.5), method=method)
    tick = 100.0 / os.sysconf("SC_CLK_TCK") / idle.seconds
    note(f"5. idle arbiter CPU by utime + stime over all {idle.seconds:.0f} s of windows together: "
         f"{100.0 * idle.ticks / idle.seconds:.2f}% of one core (resolution {tick:.2f}%)")
