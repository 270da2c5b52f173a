"""Surviving the arbiter: the control daemon's warm standby, live restart, and what supervising
costs; figures in the summary.

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default) and is
printed as the median over blocks with its range: a block is one kill (R1), one restart (R2), or
one ABBA pair of runs on the two arbiters (R3).

R1. SIGKILL to first dispatch: 4 clients stream checked dispatches
    (tests/arbiter/_streaming_client.py) through an arbiter under the control daemon
    (``libshare-control -d``); the bench SIGKILLs the serving arbiter once per block, each time
    once control.log shows a new standby (" stands by"), so that every kill meets a warm one. For
    each client and kill, the time from the kill to that client's first successful dispatch on the
    new arbiter (``time.monotonic`` is system-wide: the clients' timestamps compare with the
    bench's). A kill's values: the median over the clients, target <= 1 s, and the slowest
    client, target <= 2 s. Beside it, the tickets that failed with ArbiterRestarted after each
    kill (work in flight at the kill).
R2. restart pause: 4 clients (bench/_restart_workers.py ``gaps``, the same stream) while
    ``libshare-control restart`` replaces the arbiter, once per block; for each restart, the
    longest gap between two consecutive successful completions of any client in a window from
    just before the restart to after every client succeeded on the new arbiter and the old one
    exited. Target <= 500 ms. Beside it, the gap that ended with each client's first success on
    the new arbiter (the hand-over itself; the longest gap can lie elsewhere, e.g. while the fresh
    arbiter starts on the same 2 cores), and the errors the clients saw (a restart should cost
    none).
R3. supervision cost: tiny round trip (64-float saxpy, one workgroup, wait each) through an
    arbiter under the control daemon vs one started plainly (``python -m libshare.arbiter``),
    both with the options the control daemon gives its arbiters (``--quiet``, defaults otherwise);
    a block is ``COST_TURNS`` turns of ``COST_PER_TURN`` round trips on each, the order reversed
    every turn (ABBA); the ratio of the block medians. Both arbiters' threads are pinned to one
    CPU and the bench's thread to another while it measures: unpinned, a round trip takes about
    30 us or 60 us depending on whether the client and the engine thread share a core, and the
    scheduler keeps that placement for long stretches.

Every process started here is stopped at the end, on failure too: clients are told to finish
(then killed), each control daemon is told to quit (then signalled), and every arbiter its
control.log names that still runs is killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

import libshare
from bench._compare import at_most, blocks, interleave, pick, ratio, record
from bench._helpers import timed
from libshare._proc import running
from tests.arbiter.conftest import wait_until
from tests.arbiter.test_reattach import Client, Daemon, exited
from tests.conftest import ROOT, stop_process, vulkan_device_name  # noqa: F401  (a fixture: skips without Vulkan)

CLIENTS = 4
COST_TURNS, COST_PER_TURN = 100, 25  # R3: 2,500 round trips on each arbiter per block
COST_WARMUP = 200
PUSH = struct.pack("If", 64, 1.0)


# ---------------------------------------------------------------- processes

def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


@contextlib.contextmanager
def control_daemon(pipe: Path):
    """``libshare-control -d`` on ``pipe``; on the way out: quit, then SIGTERM and SIGKILL the daemon
    if it stays, and SIGKILL every arbiter of this pipe directory its log names that still runs."""
    daemon = Daemon(pipe)
    try:
        yield daemon
    finally:
        try:
            daemon.run("quit")
        except (libshare.LibshareError, OSError):  # no arbiter to ask: SIGTERM stops the daemon and its children
            _signal(daemon.pid, signal.SIGTERM)
        if not exited(daemon.pid, 30):
            _signal(daemon.pid, signal.SIGTERM)
            if not exited(daemon.pid, 30):
                _signal(daemon.pid, signal.SIGKILL)
                exited(daemon.pid, 10)
        log = pipe / "control.log"
        for pid in {int(p) for p in re.findall(r"arbiter pid (\d+)", log.read_text() if log.exists() else "")}:
            with contextlib.suppress(OSError):
                if running(pid) and str(pipe).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    _signal(pid, signal.SIGKILL)


@contextlib.contextmanager
def plain_arbiter(pipe: Path):
    """``python -m libshare.arbiter --pipe-directory pipe --quiet``, once its socket exists."""
    stderr_path = pipe.parent / "plain.stderr"  # a file: a full pipe would stall the arbiter
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe),
                                    "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_until(lambda: (pipe / "control").exists() or process.poll() is not None, 60, "the plain arbiter")
        assert process.poll() is None, f"arbiter did not start: {stderr_path.read_text()[-2000:]}"
        yield pipe
    finally:
        stop_process(process)


class GapClient(Client):
    """A ``bench._restart_workers gaps`` process; its JSON events are collected as they come (as
    Client's are: its own ``__init__`` starts this worker instead of tests/arbiter/_streaming_client.py)."""

    def __init__(self, pipe: Path, depth: int = 4):
        self.process = subprocess.Popen([sys.executable, "-m", "bench._restart_workers", "gaps", str(pipe),
                                         str(depth)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def window(self) -> dict:
        """End the client's window: its longest gap between successes, its successes and errors since the last."""
        seen = sum(e["event"] == "window" for e in self.events)
        self.process.stdin.write("window\n")
        self.process.stdin.flush()
        return wait_until(lambda: ([e for e in self.events if e["event"] == "window"][seen:] or [None])[0], 60,
                          "the client's window")


@contextlib.contextmanager
def streaming(daemon: Daemon, kind: type[Client]):
    """CLIENTS clients of ``kind``, each once it succeeded on the serving arbiter; all stopped on the way out."""
    clients: list[Client] = []
    try:
        for _ in range(CLIENTS):
            clients.append(kind(daemon.pipe))
        arbiter = daemon.arbiter()
        wait_until(lambda: all(c.served_by(arbiter) for c in clients), 120, "every client's first dispatch")
        yield clients
    finally:
        for client in clients:
            with contextlib.suppress(OSError):
                client.process.stdin.close()
            if client.process.poll() is None:
                try:
                    client.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    client.process.kill()
                    client.process.wait()
            client._reader.join(10)


def replace_arbiter(daemon: Daemon, clients: list, standbys: int, act, timeout: float) -> tuple[float, int, int]:
    """Once ``standbys`` standbys have stood by (so a warm one waits), ``act(old)`` replaces the serving
    arbiter (a kill, a restart) and returns when it did; then wait for the new arbiter and for every
    client's first success on it. Returns (that time, old pid, new pid)."""
    wait_until(lambda: daemon.standbys() >= standbys, 120, "a standby arbiter")  # its start is over
    old = daemon.arbiter()
    t_act = act(old)
    new = wait_until(lambda: (pid := daemon.arbiter()) not in (None, old) and pid, timeout, "the new arbiter")
    wait_until(lambda: all(c.served_by(new) for c in clients), 120, f"every client on arbiter {new}")
    return t_act, old, new


def streamed_series(benchmark, pipe: Path, kind: type[Client], series) -> tuple[Daemon, list[Client], list]:
    """``series(daemon, clients, blocks())`` timed once, under a control daemon on ``pipe`` with CLIENTS
    clients of ``kind`` streaming through it; checks that every client came back after every
    replacement, on the same arrays, with every result right. Returns (the daemon, its clients, the series)."""
    count = blocks()
    with control_daemon(pipe) as daemon, streaming(daemon, kind) as clients:
        values = benchmark.pedantic(series, args=(daemon, clients, count), rounds=1)
        ends = [c.finish() for c in clients]
    for end in ends:
        assert end["event"] == "end" and end["same_arrays"] and end["reattached"] == count, end
    return daemon, clients, values


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


# ---------------------------------------------------------------- R1. SIGKILL to first dispatch

def kill_series(daemon: Daemon, clients: list[Client], kills: int) -> list[tuple[float, int]]:
    """``kills`` SIGKILLs of the serving arbiter, each once a warm standby waits; (kill time, new arbiter) per kill."""
    def kill_it(old: int) -> float:
        t_kill = time.monotonic()
        os.kill(old, signal.SIGKILL)
        return t_kill

    out = []
    for kill in range(kills):
        t_kill, _, new = replace_arbiter(daemon, clients, kill + 1, kill_it, 60)
        out.append((t_kill, new))
    return out


def test_sigkill_to_first_dispatch(benchmark, tmp_path, vulkan_device_name):
    daemon, clients, series = streamed_series(benchmark, tmp_path / "kill", Client, kill_series)
    assert (daemon.pipe / "control.log").read_text().count("was killed by SIGKILL") == len(series)
    latencies, failed = [], []
    for k, (t_kill, new) in enumerate(series):
        t_next = series[k + 1][0] if k + 1 < len(series) else float("inf")
        latencies.append([next(e["t"] for e in c.events if e["event"] == "ok" and e["arbiter"] == new) - t_kill
                          for c in clients])
        failed.append(sum(e["tickets"] for c in clients for e in c.events
                          if e["event"] == "restarted" and t_kill <= e["t"] < t_next))
    method = (f"{CLIENTS} clients streaming checked dispatches through an arbiter under the control daemon; one "
              "SIGKILL of the serving arbiter per block, once a warm standby waits; from the kill to each client's "
              "first successful dispatch on the new arbiter")
    record("R1. arbiter SIGKILL to a client's first dispatch on the new one, median of the clients",
           [np.median(k) for k in latencies], "ms", target=at_most(1000), scale=1e3, method=method)
    record("R1. arbiter SIGKILL to a client's first dispatch on the new one, slowest client",
           [max(k) for k in latencies], "ms", target=at_most(2000), scale=1e3, method=method,
           detail=f"slowest of all kills {max(map(max, latencies)) * 1e3:.0f} ms")
    record("R1. tickets failed with ArbiterRestarted per kill, all clients", failed, "", method=method)


# ---------------------------------------------------------------- R2. restart pause

def restart_series(daemon: Daemon, clients: list[GapClient], restarts: int) -> list[tuple[float, list[dict]]]:
    """``restarts`` restarts, each once a standby waits; (restart time, each client's window) per restart."""
    def restart_it(old: int) -> float:
        for client in clients:
            client.window()  # the window opens here
        t_restart = time.monotonic()
        assert "hands over" in daemon.run("restart")
        return t_restart

    out = []
    for restart in range(restarts):
        t_restart, old, new = replace_arbiter(daemon, clients, restart + 1, restart_it, 120)
        assert exited(old, 60), f"arbiter {old} did not exit after handing over"
        out.append((t_restart, [client.window() for client in clients]))
        wait_until(lambda: f"arbiter pid {old} handed over and exited with status 0" in daemon.log(), 60,
                   f"the control daemon to see arbiter {old} hand over")
    return out


def test_restart_pause(benchmark, tmp_path, vulkan_device_name):
    _, _, series = streamed_series(benchmark, tmp_path / "restart", GapClient, restart_series)
    method = (f"{CLIENTS} clients streaming checked dispatches while `libshare-control restart` replaces the "
              "arbiter, one restart per block; gaps between a client's consecutive successful completions in a "
              "window from just before the restart to after every client succeeded on the new arbiter")
    worst = [max(windows, key=lambda w: w["max_gap"]) for _, windows in series]
    record("R2. restart: longest pause between a client's successes", [w["max_gap"] for w in worst], "ms",
           target=at_most(500), scale=1e3, method=method,
           detail="worst per restart " + ", ".join(f"{ms(w['max_gap'])} (+{ms(w['gap_from'] - t)} to "
                                                   f"+{ms(w['gap_to'] - t)} after the command)"
                                                   for (t, _), w in zip(series, worst)))
    record("R2. restart: the gap ending with a client's first success on the new arbiter, median of the clients",
           [np.median([w["switch_gap"] for w in windows]) for _, windows in series], "ms", scale=1e3,
           method=method)
    record("R2. restart: errors the clients saw", [sum(w["errors"] for w in windows) for _, windows in series], "",
           target=at_most(0), method=method,
           detail=f"successes per window {[sum(w['ok'] for w in ws) for _, ws in series]}")


# ---------------------------------------------------------------- R3. supervision cost

@contextlib.contextmanager
def pinned(arbiters: list[int]):
    """This thread on one allowed CPU and every thread of ``arbiters`` on another, for the duration
    (nothing is pinned with fewer than 2 CPUs); this thread's CPUs are restored on the way out."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        yield "not pinned (1 CPU)"
        return
    for pid in arbiters:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task), {allowed[1]})
    os.sched_setaffinity(0, {allowed[0]})
    try:
        yield f"bench on CPU {allowed[0]}, arbiters on CPU {allowed[1]}"
    finally:
        os.sched_setaffinity(0, allowed)


def p50_p90(results: list) -> dict:
    samples = np.concatenate(results)
    return {"p50": float(np.percentile(samples, 50)), "p90": float(np.percentile(samples, 90))}


def test_supervision_cost(benchmark, tmp_path, vulkan_device_name):
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(plain_arbiter(tmp_path / "plain"))
        daemon = stack.enter_context(control_daemon(tmp_path / "supervised"))
        wait_until(lambda: daemon.standbys() >= 1, 120, "the standby arbiter")  # its start is over
        sides, sessions, results = {}, [], []
        for name, pipe in (("plain", plain), ("supervised", daemon.pipe)):
            session = stack.enter_context(libshare.connect(mode="daemon", pipe_directory=pipe, name=f"cost-{name}"))
            program = session.load_program(libshare.shaders.path("saxpy"))
            x, y = session.array(64), session.array(64)
            x[:], y[:] = 1.0, 0.0
            sides[name] = (lambda s, p, b: lambda: s.dispatch(p, 1, b, PUSH).wait(10))(session, program, [x, y])
            sessions.append(session)
            results.append(y)
        assert sessions[1].arbiter_pid == daemon.arbiter()
        placement = stack.enter_context(pinned([s.arbiter_pid for s in sessions]))
        for once in sides.values():
            for _ in range(COST_WARMUP):
                once()
        for y in results:
            assert np.all(y == COST_WARMUP), "the round trip computed a wrong saxpy"
        values = benchmark.pedantic(interleave, args=({name: (lambda o=once: timed(o, COST_PER_TURN))
                                                       for name, once in sides.items()},),
                                    kwargs={"turns": COST_TURNS, "reduce": p50_p90}, rounds=1)
    plain_, supervised = values["plain"], values["supervised"]
    ratio("R3. supervision cost, tiny round trip median, under the control daemon / plain",
          pick(supervised, "p50"), pick(plain_, "p50"), target=at_most(1.02), names=("supervised", "plain"),
          detail=f"p90 supervised {np.median(pick(supervised, 'p90')) * 1e6:.1f} us, plain "
                 f"{np.median(pick(plain_, 'p90')) * 1e6:.1f} us; {placement}",
          method=f"tiny round trips through an arbiter under the control daemon and a plain one, both pinned to one "
                 f"CPU and the bench to another; {COST_TURNS} turns of {COST_PER_TURN} on each per block, the order "
                 "reversed every turn (ABBA); the ratio of the block medians")
