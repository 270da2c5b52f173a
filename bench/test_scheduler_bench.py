"""The arbiter's scheduler under contention; figures in the summary.

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default), its
sides alternated, and is printed as the median over blocks with its range. The worker processes
(bench/_scheduler_workers.py) start once per bench and run a window each time they are told.

P1. fairness: 4 equal-weight clients with 1x, 2x, 4x, 8x the busy work per dispatch, each
    keeping a few dispatches in flight for ``FAIR_SECONDS``; Jain's index of their device time,
    fairshare (target >= 0.95) beside throughput: one daemon of each, alternated block by block.
P2. priority: a realtime client's tiny round trip p99 while 7 low-priority clients saturate
    the device vs the realtime client alone in a daemon of its own (both throughput), alternated,
    ``PRIO_SECONDS`` each. Target <= 2x. Beside it, the floors that
    a device that cannot preempt sets for a scheduler that runs each low command whole: a
    realtime dispatch that comes just as a low command starts waits for all of it, so the
    alone p50 plus one low command's device time; and for the p99, the p99 of an alone round
    trip plus what is left of the low command running when it comes (uniform over the
    command's mean length, which makes it a lower bound). The arbiter runs a long low dispatch
    in pieces while a higher priority is active (policy/engine_policy.c, "Pieces"), which is how it gets
    under those floors; the bench prints how many pieces the low clients' dispatches ran in.
P3. compute share: one client at 25% (LIBSHARE_ACTIVE_THREAD_PERCENTAGE) against 3 unlimited
    ones, all saturating for ``SHARE_SECONDS``; its fraction of device time. Target 25% +- 5%.
P4. scheduler cost: uncontended tiny round trip (64-float saxpy, one workgroup, wait each),
    LIBSHARE_SCHEDULING=off vs throughput vs fairshare, one daemon each; a block is
    ``COST_TURNS`` turns of ``COST_PER_TURN`` round trips on each, the order rotated every turn.
    Target <= 1.05x.

Device time per client is the sum of ``Ticket.device_ns`` over the dispatches that a worker
saw complete inside its measuring window (the daemon runs with timestamps).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np

import libshare
from bench._compare import at_least, at_most, interleave, ratio, record, repeat, within
from bench._helpers import close_workers, kill_if_running, timed
from tests.conftest import ROOT

BUSY_N = 1024  # invocations of busy.comp per dispatch (16 workgroups)
BUSY_BASE = 128  # iterations of the 1x dispatch (about 0.2 ms of lavapipe time)


@contextlib.contextmanager
def daemon(tmp_path_factory, **env):
    """A daemon with timestamps and ``env`` (LIBSHARE_SCHEDULING, ...); terminated on exit."""
    base = tmp_path_factory.mktemp("sched")
    pipe_dir = base / "pipe"
    log = open(base / "daemon.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir)],
                               cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    try:
        while not (pipe_dir / "control").exists():
            assert process.poll() is None, f"arbiter failed to start, see {base / 'daemon.log'}"
            time.sleep(0.05)
        yield pipe_dir
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


class Workers:
    """One worker process per spec (name, priority, kind, n, iterations, depth, env), set up once;
    ``window()`` releases them together and returns their reports in spec order."""

    def __init__(self, pipe_dir, specs: list[dict], seconds: float):
        self.seconds, self.workers = seconds, []
        try:
            for spec in specs:
                args = [str(pipe_dir), spec["name"], spec.get("priority", ""), spec.get("kind", "busy"),
                        str(spec.get("n", BUSY_N)), str(spec.get("iterations", BUSY_BASE)),
                        str(spec.get("depth", 4)), str(seconds)]
                self.workers.append(subprocess.Popen([sys.executable, "-m", "bench._scheduler_workers", *args],
                                                     cwd=ROOT, env={**os.environ, **spec.get("env", {})},
                                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            for w in self.workers:
                assert w.stdout.readline().strip() == "ready", "worker failed to start"
        except BaseException:
            self.close()
            raise

    def window(self) -> list[dict]:
        for w in self.workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        reports = []
        for w in self.workers:
            line = w.stdout.readline()
            assert line, f"worker exited {w.poll()}"
            reports.append(json.loads(line))
        return reports

    def close(self) -> None:
        close_workers(self.workers, 60, kill_if_running)


def jain(values) -> float:
    x = np.asarray(values, dtype=float)
    return float(x.sum() ** 2 / (len(x) * (x ** 2).sum())) if x.any() else 0.0


# ---------------------------------------------------------------- P1. fairness

FAIR_SECONDS = 2.0


def test_fairness(benchmark, tmp_path_factory):
    specs = [{"name": f"x{k}", "iterations": BUSY_BASE * k, "depth": 3} for k in (1, 2, 4, 8)]
    with contextlib.ExitStack() as stack:
        groups = {}
        for mode in ("fairshare", "throughput"):
            pipe_dir = stack.enter_context(daemon(tmp_path_factory, LIBSHARE_SCHEDULING=mode))
            groups[mode] = Workers(pipe_dir, specs, FAIR_SECONDS)
            stack.callback(groups[mode].close)
        values = benchmark.pedantic(interleave, args=({mode: g.window for mode, g in groups.items()},), rounds=1)
    method = (f"4 clients whose dispatches take 1x, 2x, 4x and 8x the busy work, each keeping 3 in flight for "
              f"{FAIR_SECONDS:g} s; Jain's index of their device time; a fairshare daemon and a throughput daemon, "
              "alternated block by block")
    for mode, target in (("fairshare", at_least(0.95)), ("throughput", None)):
        device = [[r["device_ns"] / 1e9 for r in reports] for reports in values[mode]]
        shares = np.median(device, axis=0)
        record(f"P1. fairness, Jain's index of device time, {mode}", [jain(d) for d in device], "", target=target,
               method=method, detail="median device s " + ", ".join(f"{s:.2f}" for s in shares))


# ---------------------------------------------------------------- P2. priority

PRIO_SECONDS = 3.0
LOW_CLIENTS = 7


def floors(alone: np.ndarray, low_command: float) -> tuple[float, float]:
    """The floors for a scheduler that runs low commands whole, over the alone p99: alone p50 plus one
    low command; and the p99 of alone round trips plus what is left of the low command running when
    it comes (uniform over ``low_command`` seconds)."""
    a99 = np.percentile(alone, 99)
    left = np.random.default_rng(0).uniform(0, low_command, (20, len(alone)))
    return (np.percentile(alone, 50) + low_command) / a99, np.percentile(alone + left, 99) / a99


def test_priority(benchmark, tmp_path_factory):
    with contextlib.ExitStack() as stack:
        quiet = stack.enter_context(daemon(tmp_path_factory, LIBSHARE_SCHEDULING="throughput"))
        busy = stack.enter_context(daemon(tmp_path_factory, LIBSHARE_SCHEDULING="throughput"))
        spec = {"name": "rt", "priority": "realtime", "kind": "tiny"}
        rt_alone = Workers(quiet, [spec], PRIO_SECONDS)
        stack.callback(rt_alone.close)
        rt = Workers(busy, [spec], PRIO_SECONDS)
        stack.callback(rt.close)
        low = Workers(busy, [{"name": f"low{i}", "priority": "low", "iterations": BUSY_BASE * 4, "depth": 4}
                             for i in range(LOW_CLIENTS)], PRIO_SECONDS)
        stack.callback(low.close)

        def loaded() -> dict:
            for w in low.workers:  # the low clients first: they saturate the device within the window
                w.stdin.write("go\n")
                w.stdin.flush()
            (report,) = rt.window()
            lows = [json.loads(w.stdout.readline()) for w in low.workers]
            return {"latencies": np.asarray(report["latencies"]), "lows": lows}

        def alone() -> dict:
            return {"latencies": np.asarray(rt_alone.window()[0]["latencies"])}

        values = benchmark.pedantic(interleave, args=({"loaded": loaded, "alone": alone},), rounds=1)
    loaded_, alone = values["loaded"], values["alone"]
    method = (f"a realtime client's tiny round trips (each after a 2 ms pause) for {PRIO_SECONDS:g} s while "
              f"{LOW_CLIENTS} low-priority clients keep 4 busy dispatches each in flight, against the realtime "
              "client alone in a daemon of its own, alternated (both daemons in throughput mode); p99 and p50 "
              "per block")
    for q in (99, 50):
        ratio(f"P2. realtime tiny round trip p{q}, {LOW_CLIENTS} low clients saturating / alone",
              [np.percentile(v["latencies"], q) for v in loaded_], [np.percentile(v["latencies"], q) for v in alone],
              target=at_most(2.0) if q == 99 else None, names=("loaded", "alone"), method=method)
    low_command, whole, p99_floor, cut, pieces, device_s = [], [], [], [], [], []
    for lv, av in zip(loaded_, alone):
        count = max(sum(r["count"] for r in lv["lows"]), 1)
        command = sum(r["device_ns"] for r in lv["lows"]) / 1e9 / count
        low_command.append(command)
        w, p = floors(av["latencies"], command)
        whole.append(w)
        p99_floor.append(p)
        n_cut = sum(r["cut"] for r in lv["lows"])
        cut.append(100.0 * n_cut / max(sum(r["completed"] for r in lv["lows"]), 1))
        pieces.append(sum(r["pieces"] for r in lv["lows"]) / n_cut if n_cut else 0.0)
        device_s.append(sum(r["device_ns"] for r in lv["lows"]) / 1e9)
    record("P2. low command's device time (mean)", low_command, "us", scale=1e6, method=method)
    record("P2. realtime floor for whole low commands: (alone p50 + one low command) / alone p99", whole, "x",
           method=method + "; from each block's alone round trips and loaded low commands")
    record("P2. realtime p99 floor for whole low commands: p99 of alone + the rest of a low command / alone p99",
           p99_floor, "x", method=method + "; the rest uniform over the mean low command (a lower bound)")
    record("P2. low dispatches run in pieces", cut, "%", method=method)
    record("P2. pieces per cut low dispatch", pieces, "", method=method)
    record(f"P2. low clients' device time in {PRIO_SECONDS:g} s", device_s, "s", method=method)


# ---------------------------------------------------------------- P3. compute share

SHARE_SECONDS = 2.0


def test_compute_share(benchmark, tmp_path_factory):
    specs = [{"name": "limited", "iterations": BUSY_BASE * 4, "depth": 4,
              "env": {"LIBSHARE_ACTIVE_THREAD_PERCENTAGE": "25"}}]
    specs += [{"name": f"free{i}", "iterations": BUSY_BASE * 4, "depth": 4} for i in range(3)]
    with daemon(tmp_path_factory, LIBSHARE_SCHEDULING="throughput") as pipe_dir:
        workers = Workers(pipe_dir, specs, SHARE_SECONDS)
        try:
            reports = benchmark.pedantic(repeat, args=(workers.window,), rounds=1)
        finally:
            workers.close()
    device = [[r["device_ns"] for r in block] for block in reports]
    record("P3. compute share of a client capped at 25% against 3 uncapped", [d[0] / sum(d) for d in device], "%",
           target=within(20, 30), scale=100,
           method=f"one client with LIBSHARE_ACTIVE_THREAD_PERCENTAGE=25 and 3 unlimited ones, each keeping 4 busy "
                  f"dispatches in flight for {SHARE_SECONDS:g} s per block; its fraction of their device time")


# ---------------------------------------------------------------- P4. scheduler cost

COST_MODES = ("off", "throughput", "fairshare")
COST_TURNS, COST_PER_TURN = 15, 20  # 300 round trips per mode and block


def test_scheduler_cost(benchmark, tmp_path_factory):
    with contextlib.ExitStack() as stack:
        sessions = {}
        for mode in COST_MODES:
            pipe_dir = stack.enter_context(daemon(tmp_path_factory, LIBSHARE_SCHEDULING=mode))
            session = stack.enter_context(libshare.connect(mode="daemon", pipe_directory=pipe_dir,
                                                           name=f"cost-{mode}"))
            program = session.load_program(libshare.shaders.path("saxpy"))
            x, y = session.array(64), session.array(64)
            push = struct.pack("If", 64, 1.0)
            once = (lambda s, p, b, q: lambda: s.dispatch(p, 1, b, q).wait(10))(session, program, [x, y], push)
            for _ in range(200):
                once()
            sessions[mode] = (lambda o: lambda: timed(o, COST_PER_TURN))(once)
        values = benchmark.pedantic(interleave, args=(sessions,), kwargs={"turns": COST_TURNS}, rounds=1)
    method = (f"uncontended tiny round trips on three daemons (LIBSHARE_SCHEDULING off, throughput, fairshare): "
              f"{COST_TURNS} turns of {COST_PER_TURN} on each per block, the order rotated every turn (blocks, not "
              "single round trips: an arbiter looks for its client's next descriptor for a moment before it "
              "sleeps, and that look would burn the core the next daemon needs); medians per block")
    for mode in ("throughput", "fairshare"):
        ratio(f"P4. scheduler cost, uncontended tiny round trip, {mode} / off", values[mode], values["off"],
              target=at_most(1.05), names=(mode, "off"), method=method)
