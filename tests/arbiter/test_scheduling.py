"""Priorities, compute share, scheduling modes, the client limit and the watchdog, on a live arbiter."""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

import libshare
from libshare.protocol import control as _control
from libshare.arbiter import Arbiter
from libshare.arbiter.serve.clients import Client
from libshare.arbiter.policy.scheduler import Scheduler, percentage, priority_name
from libshare.errors import InvalidSubmission
from libshare.workloads import busy_reference

from tests._busy import busy_iterations, long_queue
from tests.conftest import ROOT
from tests.arbiter._spirv_attacks import compile_glsl
from tests.arbiter.conftest import rest_seen_during, run_daemon, wait_until


def control(pipe_dir, command: str, *args: str) -> str:
    return _control.run(command, *args, pipe_directory=pipe_dir)


def ps_rows(pipe_dir) -> dict[str, list[str]]:
    _, *rows = control(pipe_dir, "ps").splitlines()
    return {row.split()[2]: row.split() for row in rows}


@contextlib.contextmanager
def holding(pipe_dir, name: str, depth: int = 5, **env):
    """A client process ``name`` that keeps ``depth`` dispatches queued, once it says it is ready;
    killed on leaving."""
    process = subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", "hold", str(pipe_dir), name,
                                str(depth)],
                               cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, **env})
    try:
        assert process.stdout.readline().strip() == "ready"
        yield process
    finally:
        process.kill()
        process.communicate()


def test_priority_and_share_parsing():
    assert [priority_name(v) for v in ("0", "1", "HIGH", "realtime")] == ["normal", "low", "high", "realtime"]
    assert percentage("25") == 25
    for bad in ("urgent", "2"):
        with pytest.raises(ValueError, match="priority must be one of"):
            priority_name(bad)
    for bad in ("0", "101", "12.5", "x"):
        with pytest.raises(ValueError, match="whole number in 1..100"):
            percentage(bad)


def test_priority_commands_and_environment(daemon):
    _, pipe_dir = daemon
    with holding(pipe_dir, "by-env", LIBSHARE_CLIENT_PRIORITY="1") as low:  # MPS "below normal"
        assert control(pipe_dir, "get_default_client_priority") == "normal"
        assert control(pipe_dir, "set_default_client_priority", "high") == "high"
        with holding(pipe_dir, "later"):
            rows = ps_rows(pipe_dir)
            assert rows["by-env"][5] == "low" and rows["later"][5] == "high"
            assert control(pipe_dir, "set_client_priority", str(low.pid), "realtime") == "realtime"
            assert ps_rows(pipe_dir)["by-env"][5] == "realtime"  # changed live
            with pytest.raises(InvalidSubmission, match="priority must be one of"):
                control(pipe_dir, "set_default_client_priority", "urgent")
            with pytest.raises(InvalidSubmission, match="usage"):
                control(pipe_dir, "set_client_priority", str(low.pid))


def test_compute_share_commands_and_environment(daemon):
    process, pipe_dir = daemon
    assert control(pipe_dir, "get_default_active_thread_percentage") == "100"
    assert control(pipe_dir, "set_default_active_thread_percentage", "60") == "60"
    assert control(pipe_dir, "get_active_thread_percentage", str(process.pid)) == "60"
    with (holding(pipe_dir, "capped", LIBSHARE_ACTIVE_THREAD_PERCENTAGE="30") as capped,
          holding(pipe_dir, "plain") as plain):
        assert control(pipe_dir, "get_active_thread_percentage", str(capped.pid)) == "30"  # env lowers
        assert control(pipe_dir, "get_active_thread_percentage", str(plain.pid)) == "60"  # the default
        # The operator may not lift a client above what its own environment asked for.
        assert control(pipe_dir, "set_active_thread_percentage", str(capped.pid), "80") == "30"
        assert control(pipe_dir, "set_active_thread_percentage", str(plain.pid), "20") == "20"
        control(pipe_dir, "set_group_active_thread_percentage", "nobody-yet", "10")
        with pytest.raises(InvalidSubmission, match="1..100"):
            control(pipe_dir, "set_active_thread_percentage", str(plain.pid), "150")


def test_scheduling_mode_switches_live(daemon):
    _, pipe_dir = daemon
    assert control(pipe_dir, "get_scheduling_mode") == "throughput"
    assert control(pipe_dir, "set_scheduling_mode", "fairshare") == "fairshare"
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:  # work still flows
        x, y = session.array(64), session.array(64)
        x[:] = 2
        session.copy(x, y).wait(10)
        assert np.array_equal(x, y)
    with pytest.raises(InvalidSubmission, match="throughput, fairshare"):
        control(pipe_dir, "set_scheduling_mode", "lottery")


def test_live_share_change_applies_to_a_running_client(tmp_path, vulkan_device_name):
    """The mechanism: a live ceiling reaches the scheduler of a running client, which keeps running.

    How close the measured share comes to the ceiling is a figure of bench/test_scheduler_bench.py:
    on a loaded machine the other client may not keep its queue full, and a share measured
    here would say more about the machine than about the arbiter.
    """
    pipe_dir = tmp_path / "pipe"
    pipe_dir.mkdir(mode=0o700)
    arbiter = Arbiter()
    try:
        arbiter.serve(pipe_dir / "control")
        with holding(pipe_dir, "greedy", depth=8) as greedy, holding(pipe_dir, "other", depth=8) as other:
            _capped_client_goes_on(arbiter, pipe_dir, greedy, other)
    finally:
        arbiter.close()


def _capped_client_goes_on(arbiter, pipe_dir, greedy, other) -> None:
    """Cap ``greedy`` at 20%: the scheduler says so, ``other`` keeps 100, and greedy still completes work."""
    scheduler = arbiter.drainer.scheduler
    by_pid = lambda pid: next(c for c in arbiter.drainer.clients.values() if c.pid == pid)  # noqa: E731
    assert scheduler.share_of(by_pid(greedy.pid)) == 100
    assert control(pipe_dir, "set_active_thread_percentage", str(greedy.pid), "20") == "20"
    assert scheduler.share_of(by_pid(greedy.pid)) == 20 and scheduler.share_of(by_pid(other.pid)) == 100
    completed = arbiter.drainer.refresh(by_pid(greedy.pid)).completed  # the engine counts
    wait_until(lambda: arbiter.drainer.refresh(by_pid(greedy.pid)).completed > completed + 10, 60,
               "the capped client to go on completing work")


def test_client_limit_is_configurable_past_the_mps_default(tmp_path, vulkan_device_name):
    pipe_dir = tmp_path / "pipe"
    pipe_dir.mkdir(mode=0o700)
    arbiter = Arbiter(max_clients=60)
    sessions = []
    try:
        arbiter.serve(pipe_dir / "control")
        sessions = [libshare.connect(mode="daemon", pipe_directory=pipe_dir) for _ in range(60)]
        assert len({session.client_id for session in sessions}) == 60  # (how long 60 attaches take: bench/)
        with pytest.raises(libshare.TooManyClients, match="limit is 60"):
            libshare.connect(mode="daemon", pipe_directory=pipe_dir)
    finally:
        for session in sessions:
            session.close()
        arbiter.close()


def test_watchdog_faults_the_server_and_names_the_offender(tmp_path, vulkan_device_name):
    generator = run_daemon(tmp_path / "pipe", LIBSHARE_WATCHDOG_SECONDS="0.3")
    process, pipe_dir = next(generator)
    try:
        with libshare.connect(name="runaway", mode="daemon", pipe_directory=pipe_dir) as session:
            [ticket] = long_queue(session, count=1)
            with pytest.raises(libshare.ServerFault):
                ticket.wait(timeout=60)
            assert control(pipe_dir, "get_server_status") in ("FAULT", "INITIALIZING")
        wait_until(lambda: control(pipe_dir, "get_server_status") == "ACTIVE", 60, "the server to recover")
        log = (tmp_path / "pipe.stderr").read_text()
        assert "past the 0.3 s watchdog" in log and "runaway" in log
    finally:
        next(generator, None)


def test_scheduler_orders_by_priority_then_least_served():
    class Fake:
        def __init__(self, id, priority, group=""):
            self.id, self.priority, self.group, self.requested_share = id, priority, group, 100

    scheduler = Scheduler(mode="fairshare")
    low, high, a, b = Fake(1, "low"), Fake(2, "high"), Fake(3, "normal"), Fake(4, "normal")
    clients = [low, high, a, b]
    scheduler.charge(a, 10_000_000)
    everyone = {c.id: True for c in clients}
    plan = scheduler.plan(clients, everyone, everyone, 0, 1024)
    assert [c.id for c, *_ in plan][:1] == [2]  # high first
    assert 1 not in [c.id for c, *_ in plan[:3]] or plan[-1][0] is low  # low last
    assert [c.id for c, *_ in plan if c.priority == "normal"] == [4]  # a is far ahead: b catches up


class _Fake:
    """What the scheduler reads of a client."""

    trusted = Client.trusted

    def __init__(self, id, priority="normal"):
        self.id, self.priority, self.group, self.requested_share = id, priority, "", 100
        self.uid, self.own_priority, self.operator_priority, self.share = 0, False, False, None


def test_fairshare_holds_a_client_ahead_only_while_the_device_is_busy():
    """The least-served client may be one whose work takes no device time (fences, refused
    descriptors): it stays least served for ever, and a client ahead of it was never planned while
    it kept work waiting. Ahead, a client now waits only while something runs, and goes after the
    least served on an idle device."""
    scheduler = Scheduler(mode="fairshare")
    honest, fencer = _Fake(1), _Fake(2)
    scheduler.charge(honest, 10_000_000)
    everyone = {1: True, 2: True}
    assert [c for c, *_ in scheduler.plan([honest, fencer], everyone, everyone, 0, 1024)] == [fencer, honest]
    assert [c for c, *_ in scheduler.plan([honest, fencer], everyone, everyone, 1, 1024)] == [fencer]


def test_fairshare_compares_device_time_within_the_top_priority_only():
    """A low client with no device time made every realtime client that had some wait as
    "ahead" of it (13.8 s in a review's run): fairshare is within a priority."""
    scheduler = Scheduler(mode="fairshare")
    realtime, low = _Fake(1, "realtime"), _Fake(2, "low")
    scheduler.charge(realtime, 10_000_000)
    everyone = {1: True, 2: True}
    assert [c for c, *_ in scheduler.plan([realtime, low], everyone, everyone, 1, 1024)] == [realtime]


def test_fairshare_lets_a_newcomer_catch_up_a_bounded_lag_not_the_whole_history():
    scheduler = Scheduler(mode="fairshare")
    old, new = _Fake(1), _Fake(2)
    for _ in range(100):
        scheduler.charge(old, 10_000_000)  # 1 s of device time before the newcomer came
    everyone = {1: True, 2: True}
    assert [c for c, *_ in scheduler.plan([old, new], everyone, everyone, 1, 1024)] == [new]  # it catches up
    for _ in range(5):
        scheduler.charge(new, 10_000_000)  # 50 ms: the lag it was allowed
    assert {c.id for c, *_ in scheduler.plan([old, new], everyone, everyone, 1, 1024)} == {1, 2}


def test_a_lowered_default_lowers_a_priority_another_uid_asked_for():
    """A tenant of another uid asked for "high" while it was the default (allowed: the default or
    lower); the operator lowered the default to normal, and the tenant stayed high, above every
    client that followed the new default. It follows now; the operator's and root's own choices
    stay."""
    scheduler = Scheduler(mode="throughput", default_priority="high")
    tenant, root, chosen, plain, contained = (_Fake(i, "high") for i in range(5))
    tenant.uid, root.uid, chosen.uid, plain.uid, contained.uid = 65534, 0, 65534, 65534, 0
    tenant.own_priority = root.own_priority = chosen.own_priority = contained.own_priority = True
    chosen.operator_priority = True  # set_client_priority PID high
    plain.own_priority = False
    contained.share = "k8s-1"  # root, but through a share socket: a tenant (it stayed high before)
    scheduler.default_priority = "normal"
    scheduler.follow_defaults([tenant, root, chosen, plain, contained])
    assert [c.priority for c in (tenant, root, chosen, plain, contained)] == ["normal", "high", "high", "normal",
                                                                            "normal"]


def test_lower_priorities_share_one_slice_and_take_turns():
    scheduler = Scheduler(mode="throughput")
    realtime, lows = _Fake(0, "realtime"), [_Fake(i, "low") for i in range(1, 8)]
    clients = [realtime, *lows]
    for low in lows:
        for _ in range(30):
            scheduler.charge(low, 150_000)  # three quarters of a slice: a second would not fit
    everyone = {c.id: True for c in clients}
    served = []
    for _ in range(len(lows)):
        plan = scheduler.plan(clients, everyone, everyone, 0, 1024)
        assert plan[0] == (realtime, 1024, 0)
        assert [budget for _, budget, _ in plan[1:]] == [1], "one low command in all, not one per low client"
        assert plan[1].cut_ns > 0, "its long dispatches run in pieces (engine_policy.c, Pieces)"
        served.append(plan[1][0].id)
        scheduler.submitted(plan[1][0], 1)
    assert sorted(served) == [low.id for low in lows], "the low clients take turns"
    assert scheduler.plan(clients, everyone, everyone, 1, 1024) == [(realtime, 1024, 0)], "none while one runs"


def test_lower_priority_commands_longer_than_the_slice_get_no_negative_budget():
    """A low command that overruns the whole slice leaves the others none, never a negative budget
    (the engine takes a plan's budgets as unsigned counts)."""
    scheduler = Scheduler(mode="throughput")
    realtime, lows = _Fake(0, "realtime"), [_Fake(i, "low") for i in range(1, 4)]
    for low in lows:
        for _ in range(30):
            scheduler.charge(low, 3_000_000)  # fifteen slices each
    everyone = {c.id: True for c in [realtime, *lows]}
    plan = scheduler.plan([realtime, *lows], everyone, everyone, 0, 1024)
    assert [budget for _, budget, _ in plan] == [1024, 1], plan


def test_freed_objects_that_wait_for_their_clients_queue_count_against_its_limits(tmp_path, vulkan_device_name):
    """A free waits while descriptors pushed before it wait in the client's ring. A client whose
    work waited (behind a realtime client's here) could free and make buffers and programs for
    ever, past LIBSHARE_MAX_BUFFERS and LIBSHARE_MAX_PROGRAMS (a mapping and an import each)."""
    with low_and_realtime(tmp_path / "pipe", max_buffers=6, max_programs=6) as pair:
        low = pair.low
        long_run = pair.realtime_running(1_000_000)
        waiting = pair.low_busy(1, 64, 1)  # every free below waits for it
        made = []
        with pytest.raises(libshare.QuotaExceeded, match="holds 6 buffers"):
            for _ in range(20):
                buffer = low.array(64)
                made.append(buffer)
                low.free(buffer)
        with pytest.raises(libshare.QuotaExceeded, match="holds 6 programs"):
            for k in range(20):
                low.free(low.load_program(libshare.shaders.path("saxpy")))
        assert len(made) == 5 and not long_run.done()  # its busy words and 5 freed ones
        long_run.wait(120)
        waiting.wait(60)

        def allocates() -> bool:
            try:
                return low.array(64) is not None
            except libshare.QuotaExceeded:
                return False

        wait_until(allocates, 30, "the freed ones to be destroyed")


def test_a_slice_holds_few_commands_whatever_their_estimate_says():
    """The estimate of a command's device time comes from the client's own past commands, which
    it chooses: after 300 tiny dispatches, 65 heavy ones fit in one slice, and a realtime client
    waited 520 ms behind them (a fairshare neighbour 385 ms); capped at 8 commands, 8 heavy ones
    of 7.6 s made it wait 53.8 s. Lower priorities now get one command in all per pass, whatever
    their estimates, and a fairshare client's slice holds 8 at most."""
    scheduler = Scheduler(mode="throughput")
    realtime, lows = _Fake(0, "realtime"), [_Fake(i, "low") for i in range(1, 4)]
    for low in lows:
        scheduler.charge_many(low, 300 * 1_000, 300)  # 300 tiny commands: 1 us each, by their own account
    everyone = {c.id: True for c in [realtime, *lows]}
    plan = scheduler.plan([realtime, *lows], everyone, everyone, 0, 1024)
    assert plan[0] == (realtime, 1024, 0) and [budget for _, budget, _ in plan[1:]] == [1], plan
    fair = Scheduler(mode="fairshare")
    gamer, other = _Fake(1, "normal"), _Fake(2, "normal")
    fair.charge_many(gamer, 300 * 1_000, 300)
    assert fair.plan([gamer], {1: True}, {1: True}, 0, 1024) == [(gamer, 8, 0)]
    assert max(budget for _, budget, _ in fair.plan([gamer, other], {1: True, 2: True}, {1: True, 2: True}, 0,
                                                 1024)) <= 8


def test_a_lower_client_takes_a_slice_while_a_higher_one_is_connected_but_idle():
    """A realtime client that had not submitted for over 200 ms no longer counted, and a low client
    got all it had in one submission: a realtime client that came every 0.3 s waited 416 ms (p50)
    behind a low client's batch. Now a lower client's pass holds 1 ms of its estimated device time,
    64 commands at most, while a higher priority is connected; with no higher client, all it has."""
    scheduler = Scheduler(mode="throughput")
    realtime, low, other = _Fake(0, "realtime"), _Fake(1, "low"), _Fake(2, "low")
    for client in (low, other):
        scheduler.charge(client, 20_000_000)  # 20 ms commands
    waiting = {1: True, 2: False}
    assert scheduler.plan([realtime, low, other], waiting, waiting, 0, 1024) == [(low, 1, 0)]  # idle, but there
    assert scheduler.plan([low, other], waiting, waiting, 0, 1024) == [(low, 1024, 0)]
    quick = _Fake(3, "low")
    scheduler.charge_many(quick, 2_000 * 100, 100)  # 2 us commands: a pass of 64 (a pipelining client's
    assert scheduler.plan([realtime, quick], {3: True}, {3: True}, 0, 1024) == [(quick, 64, 0)]  # rate)


@contextlib.contextmanager
def low_and_realtime(pipe_dir, **arbiter_options):
    """An arbiter in this process serving ``pipe_dir``, a low client with busy.comp over 1024 words
    and a realtime one with a tiny saxpy that has run once and busy.comp, as a namespace: arbiter,
    low and realtime (the sessions), low_data (the low client's words), and the dispatches
    ``low_busy(groups, n, rounds)``, ``tiny()`` and ``realtime_busy(groups, n, rounds)``, and
    ``realtime_running(iterations)``: a long realtime dispatch (busy.comp sized by busy_iterations),
    returned once the engine has submitted it. The arbiter is made with ``arbiter_options``."""
    pipe_dir.mkdir(mode=0o700)
    arbiter = Arbiter(**arbiter_options)
    try:
        arbiter.serve(pipe_dir / "control")
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="low") as low, \
                libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="realtime") as realtime:
            busy, data = low.load_program(libshare.shaders.path("busy")), low.array(1024, np.uint32)
            saxpy, x, y = realtime.load_program(libshare.shaders.path("saxpy")), realtime.array(64), realtime.array(64)
            tiny = lambda: realtime.dispatch(saxpy, 1, [x, y], struct.pack("If", 64, 1.0))  # noqa: E731
            tiny().wait(10)
            realtime_program, realtime_data = realtime.load_program(libshare.shaders.path("busy")), realtime.array(1024)

            def low_busy(groups: int, n: int, rounds: int):
                return low.dispatch(busy, groups, [data], struct.pack("II", n, rounds))

            def realtime_busy(groups: int, n: int, rounds: int):
                return realtime.dispatch(realtime_program, groups, [realtime_data], struct.pack("II", n, rounds))

            def realtime_running(iterations: int):
                ticket = realtime_busy(16, 1024, busy_iterations(iterations))
                wait_until(lambda: arbiter.drainer.engine.in_flight() == 1, 30, "the realtime dispatch to be submitted")
                return ticket

            yield types.SimpleNamespace(arbiter=arbiter, low=low, realtime=realtime, low_data=data, low_busy=low_busy,
                                        tiny=tiny, realtime_busy=realtime_busy, realtime_running=realtime_running)
    finally:
        arbiter.close()


def test_a_realtime_dispatch_is_not_held_behind_low_work_popped_with_it(tmp_path, vulkan_device_name):
    with low_and_realtime(tmp_path / "pipe") as pair:
        arbiter, low_busy, tiny, realtime_busy = pair.arbiter, pair.low_busy, pair.tiny, pair.realtime_busy
        # The clients differ, so the engine asks the scheduler before each pass; holding the
        # scheduler's lock holds the engine there, and both dispatches below meet in one pass.
        engine, slot = arbiter.drainer.engine, low_slot(arbiter)
        with arbiter.drainer.scheduling:
            slow = low_busy(16, 1024, busy_iterations(500_000))  # ~0.5 s on lavapipe
            quick = tiny()
        quick.wait(10)
        # The realtime answer came while the low dispatch, popped in the same pass, still ran: the
        # two went in separate submissions, each with its own fence. (One fence for both answers
        # them together.) How long the low one ran on after: bench/test_engine_mechanism_bench.py.
        stats = engine.stats(slot)
        assert (slow.done(), stats.submitted, stats.outstanding) == (False, 1, 1), (slow.done(), stats)
        slow.wait(60)


def test_the_engine_sleeps_while_the_plan_keeps_the_waiting_work_waiting(tmp_path, vulkan_device_name):
    """Low work waits while a realtime dispatch runs (it is withheld, not popped). The engine took
    that waiting work for work to do and looked again at once: it used a whole core (half of the
    core lavapipe's queue thread runs on, placed) for as long as the realtime dispatch ran. Now it
    sleeps on the fence: while the realtime dispatch runs and the low work waits, five looks in a
    row find the engine's thread asleep (a thread that looks again at once is found running). The
    CPU it uses meanwhile is a figure of bench/test_engine_mechanism_bench.py."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        engine, slot = pair.arbiter.drainer.engine, low_slot(pair.arbiter)
        low_work = []  # (the withheld dispatch, the low slot's submissions before it) per size tried

        def realtime_work(size: int) -> list:
            for waiting, _ in low_work:
                waiting.wait(30)  # (it ran once the realtime work of a size too small ended)
            runs = [pair.realtime_running(1_000_000)]  # ~1 s on lavapipe
            runs += [pair.realtime_busy(16, 1024, busy_iterations(1_000_000)) for _ in range(size - 1)]
            low_work.append((pair.low_busy(1, 64, 1), engine.stats(slot).submitted))  # withheld: a higher priority runs
            return runs

        long_runs = rest_seen_during(os.getpid(), [engine.thread_id], realtime_work,
                                     "the engine to sleep while the low work waits")
        waiting, submitted_before = low_work[-1]
        assert not waiting.done() and engine.stats(slot).submitted == submitted_before, "the low work was not withheld"
        for long_run in long_runs:
            long_run.wait(120)
        waiting.wait(30)


def test_lower_work_popped_with_a_realtime_dispatch_waits_until_that_has_ended(tmp_path, vulkan_device_name):
    """Submitted behind the realtime dispatch, the low work ran as soon as the realtime one ended,
    on the core the engine shares with lavapipe's queue thread, and the realtime client's answer
    waited for it (180 us for a 2 us dispatch behind 75 us ones)."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        arbiter, low_busy, tiny, realtime_busy = pair.arbiter, pair.low_busy, pair.tiny, pair.realtime_busy
        engine = arbiter.drainer.engine
        with arbiter.drainer.scheduling:  # both meet in one pass (see the test above)
            long_run = realtime_busy(16, 1024, busy_iterations(500_000))
            low = low_busy(1, 64, 1)
        wait_until(lambda: engine.in_flight() >= 1, 30, "the pass to submit")
        assert (engine.in_flight(), long_run.done(), low.done()) == (1, False, False), "the low work went in behind"
        long_run.wait(120)
        low.wait(30)


def test_a_free_waits_behind_its_clients_queue_not_ahead_of_everyone(tmp_path, vulkan_device_name):
    """A free had the control plane pop and submit the client's whole ring at once (so that the
    descriptors pushed before it found the buffer), past the plan: a low client that queued heavy
    work and sent a free, even a refused one, made a realtime client's round trip take 660-740 ms.
    Now the drop waits for the engine to pop those descriptors as the plan says."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        engine, low = pair.arbiter.drainer.engine, pair.low
        long_run = pair.realtime_running(1_000_000)  # ~1 s on lavapipe
        doomed = low.array(1024, np.uint32)
        queued = [low.dispatch(low.load_program(libshare.shaders.path("busy")), 16, [doomed],
                               struct.pack("II", 1024, 1)) for _ in range(20)]
        memory = low.stats()["memory_bytes"]
        with pytest.raises(InvalidSubmission, match="no such buffer"):
            low._request("free", buffer_id=999_999)
        low.free(doomed)  # the queued dispatches still find it
        assert (low.stats()["submitted"], long_run.done()) == (0, False), "the free popped the low work"
        long_run.wait(120)
        for ticket in queued:
            ticket.wait(60)  # completed, with the buffer freed after they were pushed
        wait_until(lambda: low.stats()["memory_bytes"] < memory, 30, "the freed buffer to be destroyed")


def client_of(arbiter, priority: str) -> Client:
    """The arbiter's (first) client of ``priority``."""
    return next(c for c in arbiter.drainer.clients.values() if c.priority == priority)


def low_slot(arbiter) -> int:
    """The engine slot of the arbiter's (one) low-priority client."""
    return client_of(arbiter, "low").slot


def test_a_long_low_dispatch_runs_in_pieces_while_a_realtime_client_is_active(tmp_path, vulkan_device_name):
    """A realtime dispatch that comes while a low one runs waits for what is left of it: in bench 2
    (240 us low commands) the realtime p99 was 2.6-3.2x its p99 alone. While a higher priority is
    active, a long low dispatch now runs in pieces of about 50 us of device time, one on the device
    at a time, and computes what it computes whole; its ticket reports the pieces' device time."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        engine, slot = pair.arbiter.drainer.engine, low_slot(pair.arbiter)
        rounds = busy_iterations(4_000)  # 16 workgroups, ~2 ms on lavapipe
        pair.low_busy(16, 1024, rounds).wait(30)  # timed: the program has an estimate
        before = engine.stats(slot)
        pair.low_data[:] = 0
        pair.tiny().wait(10)  # the realtime client is active
        ticket = pair.low_busy(16, 1024, rounds)
        ticket.wait(30)
        stats = engine.stats(slot)
        assert stats.cut == before.cut + 1 and 2 <= stats.pieces - before.pieces <= 16, (before, stats)
        assert np.array_equal(pair.low_data, busy_reference(1024, rounds)), "the pieces ran every workgroup once"
        assert ticket.device_ns > 0 and stats.completed == 2 and stats.outstanding == 0
        pair.tiny().wait(10)
        pair.low_busy((1, 16, 1), 1024, rounds).wait(30)  # along y: each row of groups writes words 0..63
        assert engine.stats(slot).cut == stats.cut + 1, "a dispatch along y is cut along y"


def test_a_low_client_that_changes_every_dispatch_still_runs_in_pieces(tmp_path, vulkan_device_name):
    """A hostile-tenant review: the estimate was the recording's own last run, so a low client that
    changed a push constant at every dispatch had none, and each of its dispatches ran whole (a
    realtime p99 of 62 ms behind its 60 ms dispatches, 1.1 ms when they were alike). The estimate
    is the program's worst time per workgroup now, and a program without one runs in the most
    pieces it may (here one per workgroup)."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        engine, slot = pair.arbiter.drainer.engine, low_slot(pair.arbiter)
        for k in range(3):
            pair.tiny().wait(10)  # the realtime client is active
            pair.low_busy(16, 1024, busy_iterations(4_000) + k).wait(30)
        stats = engine.stats(slot)
        assert stats.cut == 3 and stats.pieces >= 3 * 2, stats


def test_a_low_client_cannot_lie_its_estimate_down_with_a_new_program(tmp_path, vulkan_device_name):
    """A second hostile-tenant review: with a program's own worst time as the estimate, a client ran
    each heavy dispatch from a new program that it had first run on empty workgroups (a tiny time per
    workgroup), and all 98 heavy ones ran whole. The estimate is the client's worst time now."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        engine, slot, low, data = pair.arbiter.drainer.engine, low_slot(pair.arbiter), pair.low, pair.low_data
        heavy = busy_iterations(4_000)
        pair.low_busy(16, 1024, heavy).wait(30)  # the client has shown a heavy time per workgroup
        before = engine.stats(slot)
        fresh = low.load_program(libshare.shaders.path("busy"))
        for groups, n in ((1024, 0), (16, 1024)):  # empty workgroups first (n = 0: each returns at once)
            pair.tiny().wait(10)  # the realtime client is active
            low.dispatch(fresh, groups, [data], struct.pack("II", n, heavy)).wait(30)
        assert engine.stats(slot).cut - before.cut == 2, "the heavy dispatch of the new program was cut"
        assert np.array_equal(data, busy_reference(1024, heavy))


def test_a_cut_dispatch_is_billed_the_time_its_pieces_held_the_device(tmp_path, vulkan_device_name):
    """The second review's shredding: a client whose worst time is high has even its cheap dispatches
    cut in many pieces, and the device idles between them; billed their device time alone, four such
    clients took 37% of a fifth low client's device time, and fairshare would favour them as the
    least served. A piece is now billed the time its submission held the device, gaps included."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        drainer, slot = pair.arbiter.drainer, low_slot(pair.arbiter)
        pair.low_busy(16, 1024, busy_iterations(4_000)).wait(30)  # a heavy worst time per workgroup
        before = drainer.engine.stats(slot)
        pair.tiny().wait(10)
        pair.low_busy(16, 1024, 1).wait(30)  # cheap, and cut one piece per workgroup
        assert drainer.engine.stats(slot).pieces - before.pieces == 16
        pair.tiny().wait(10)  # its plan books what retired
        low = client_of(pair.arbiter, "low")
        wait_until(lambda: drainer.scheduler.usage(low).total_ns > 0, 10, "the low client's charges")
        assert drainer.scheduler.usage(low).total_ns > drainer.engine.stats(slot).device_ns


def test_clients_counters_read_at_once_from_two_threads_stay_their_own(tmp_path, vulkan_device_name):
    """A third hostile-tenant review: Engine.stats read into one struct shared by every thread, and the
    C call releases the GIL, so another thread's call overwrote it before it was read (3 of 57,039
    replies to an idle client carried a busy client's counters, and the planner's take_usage shared
    it too). Two threads reading two clients' counters at once now each see their own."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        engine, low = pair.arbiter.drainer.engine, low_slot(pair.arbiter)
        realtime = client_of(pair.arbiter, "realtime").slot
        for _ in range(3):
            pair.low_busy(1, 64, 1).wait(10)  # 3 for the low client, 1 for the realtime one
        expected = {slot: engine.stats(slot).submitted for slot in (low, realtime)}
        assert expected[low] != expected[realtime]
        wrong = []

        def read(slot: int) -> None:
            for _ in range(20_000):
                seen = engine.stats(slot).submitted
                if seen != expected[slot]:
                    wrong.append((slot, seen))

        threads = [threading.Thread(target=read, args=(slot,)) for slot in (low, realtime)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not wrong, wrong[:5]


def test_a_lower_command_waits_for_the_cut_under_way(tmp_path, vulkan_device_name):
    """A third review: each realtime arrival's plan gave the lower clients a turn, and another low
    client's command went in between two pieces of a cut under way, which so lost a turn at every
    realtime dispatch (a cut client got 0.15 s of device time a second against an uncut neighbour's
    0.65, and two cut clients split 2:1). One lower command in all: it waits for the cut's end."""
    pipe_dir = tmp_path / "pipe"
    with low_and_realtime(pipe_dir) as pair, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="low") as other:
        engine, slot, low = pair.arbiter.drainer.engine, low_slot(pair.arbiter), pair.low
        busy, data = low.load_program(libshare.shaders.path("busy")), low.array(4096, np.uint32)
        long_busy = lambda: low.dispatch(busy, 64, [data], struct.pack("II", 4096, busy_iterations(200_000)))  # noqa: E731
        long_busy().wait(60)  # ~0.4 s on lavapipe: the client's worst; the next is cut one piece a workgroup
        program, words = other.load_program(libshare.shaders.path("busy")), other.array(64, np.uint32)
        before = engine.stats(slot).pieces
        pair.tiny().wait(10)
        cut = long_busy()
        wait_until(lambda: engine.stats(slot).pieces > before, 30, "the cut to be under way")
        quick = other.dispatch(program, 1, [words], struct.pack("II", 64, 1))
        while not quick.done():
            pair.tiny().wait(10)  # each realtime arrival's plan gives the lower clients a turn
            overtook = quick.done() and not cut.done()  # (a later answer is posted after the cut's own)
            assert not overtook, "the other low client's command went in before the cut under way ended"
        assert engine.stats(slot).pieces - before == 64


def test_several_cut_clients_all_go_on_while_a_realtime_client_keeps_coming(tmp_path, vulkan_device_name):
    """While one low client's cut was under way, another's turn began nothing (one lower command in
    all), and the plan's one lower turn kept going to that blocked client, never to the cut: in a run
    of bench 2 the 7 low clients got no device time in 4 s. The turn goes to the cut under way now."""
    pipe_dir = tmp_path / "pipe"
    with low_and_realtime(pipe_dir) as pair:
        sessions = [libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="low") for _ in range(3)]
        try:
            done, failures = [0] * len(sessions), []

            def stream(k: int, session) -> None:
                try:
                    busy, data = session.load_program(libshare.shaders.path("busy")), session.array(1024, np.uint32)
                    for _ in range(10):  # ~2 ms each on lavapipe, cut in pieces
                        session.dispatch(busy, 16, [data], struct.pack("II", 1024, busy_iterations(4_000))).wait(60)
                        done[k] += 1
                except Exception as exc:  # reported below
                    failures.append(exc)

            threads = [threading.Thread(target=stream, args=(k, s)) for k, s in enumerate(sessions)]
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                pair.tiny().wait(10)  # the realtime client stays active: the low clients' work is cut
            assert not failures and done == [10] * len(sessions), (done, failures)
            assert sum(pair.arbiter.drainer.refresh(c).cut for c in pair.arbiter.drainer.clients.values()) > 0
        finally:
            for session in sessions:
                session.close()


def test_a_dispatch_that_reads_its_workgroup_count_never_runs_in_pieces(tmp_path, vulkan_device_name):
    """A piece is a dispatch of its own (vkCmdDispatchBase): gl_NumWorkGroups there is the piece's count."""
    source = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Data { uint data[]; };
layout(push_constant) uniform Push { uint n; uint rounds; } pc;
void main() {
    uint i = gl_GlobalInvocationID.x, x = i;
    for (uint r = 0u; r < pc.rounds; ++r) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; }
    if (i < pc.n) data[i] = gl_NumWorkGroups.x + (x & 0u);
}
"""
    counting = compile_glsl(source, tmp_path / "shaders", "counting")
    with low_and_realtime(tmp_path / "pipe") as pair:
        engine, slot, low = pair.arbiter.drainer.engine, low_slot(pair.arbiter), pair.low
        program, data = low.load_program(counting), pair.low_data
        push = struct.pack("II", 1024, min(busy_iterations(4_000), 60_000))
        for _ in range(2):  # the second run has an estimate: it would be cut
            pair.tiny().wait(10)
            low.dispatch(program, 16, [data], push).wait(30)
            assert np.all(data == 16), np.unique(data)
        assert engine.stats(slot).cut == 0


def test_a_client_killed_while_its_dispatch_runs_in_pieces_is_reclaimed(tmp_path, vulkan_device_name):
    """The rest of a killed client's cut never runs; its ticket is answered as its piece on the
    device retires, and the client is reclaimed like any other."""
    pipe_dir = tmp_path / "pipe"
    with low_and_realtime(pipe_dir) as pair:
        drainer = pair.arbiter.drainer
        victim = subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", "spin", str(pipe_dir)], cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert victim.stdout.readline().strip() == "ready"
            slot = next(c.slot for c in drainer.clients.values() if c.name == "victim")

            def cut_running() -> bool:
                pair.tiny().wait(10)  # the realtime client stays active: the victim's dispatches are cut
                return drainer.engine.stats(slot).pieces >= 3
            wait_until(cut_running, 60, "the victim's dispatches to run in pieces")
        finally:
            victim.kill()
            victim.communicate()
        wait_until(lambda: all(c.name != "victim" for c in drainer.clients.values()), 30, "the victim's reclaim")
        pair.tiny().wait(10)
        wait_until(lambda: drainer.engine.in_flight() == 0, 30, "the device to be idle")


def test_a_client_under_its_share_may_catch_up_in_one_pass():
    class Fake:
        def __init__(self, id):
            self.id, self.priority, self.group, self.requested_share = id, "normal", "", 100

    scheduler = Scheduler(mode="throughput")
    limited, other = Fake(1), Fake(2)
    scheduler.usage(limited).share = 50
    for _ in range(30):
        scheduler.charge(other, 100_000)  # 3 ms of recent device time, 0.1 ms a command
    scheduler.charge(limited, 100_000)
    everyone = {1: True, 2: True}
    budgets = dict((c.id, b) for c, b, _ in scheduler.plan([limited, other], everyone, everyone, 0, 1024))
    # 0.1 ms used of 3.1 ms: 2.9 ms more brings it to 50%; at its estimate of 56 us a command
    # (it has seen one), 51 commands, where one slice would be 3
    assert scheduler._slice(limited) < budgets[1] <= 52 and budgets[2] == 1024
    for _ in range(40):
        scheduler.charge(limited, 100_000)
    assert [c.id for c, *_ in scheduler.plan([limited, other], everyone, everyone, 0, 1024)] == [2]


def test_compute_shares_that_add_up_to_the_whole_device_never_hold_everyone_at_once():
    """Three waiting clients with ceilings of 20, 30 and 50% that each used exactly their share:
    each is at its ceiling while the others want the device, and holding all three would leave the
    device idle with work waiting, for ever (a Slurm job's tasks hung so). One gets a slice."""
    class Fake:
        def __init__(self, id, group):
            self.id, self.priority, self.group, self.requested_share = id, "normal", group, 100

    scheduler = Scheduler(mode="throughput")
    clients = [Fake(1, "a"), Fake(2, "b"), Fake(3, "c")]
    for client, share in zip(clients, (20, 30, 50)):
        scheduler.group_share[client.group] = share
        for _ in range(share):
            scheduler.charge(client, 1_000_000)
    everyone = {c.id: True for c in clients}
    plan = scheduler.plan(clients, everyone, everyone, 0, 1024)
    assert len(plan) == 1 and plan[0][1] >= 1, plan
    assert scheduler.plan(clients, everyone, everyone, 1, 1024) == [], "none while work runs: it will rebalance"


def test_lower_pieces_are_as_long_as_the_higher_priority_s_own_commands():
    """A fourth review: behind a normal client's 25 ms commands, low work cut in 50 us pieces went
    one piece per pass between them, and four low clients did 0.25 dispatches a second each (5.7
    whole), with gaps of 4-6 s. The pieces are as long as the top priority's commands now, when
    those are longer: it waits for its own anyway."""
    scheduler = Scheduler(mode="throughput")
    high, low = _Fake(0, "normal"), _Fake(1, "low")
    everyone = {0: True, 1: True}
    scheduler.charge_many(high, 100 * 2_000, 100)  # 2 us commands: the pieces stay at 50 us
    assert [t.cut_ns for t in scheduler.plan([high, low], {1: True}, everyone, 0, 1024)] == [50_000]
    scheduler.charge_many(high, 100 * 25_000_000, 100)  # 25 ms commands
    (turn,) = scheduler.plan([high, low], {1: True}, everyone, 0, 1024)
    assert turn.client is low and 20_000_000 < turn.cut_ns < 30_000_000, turn


def test_a_held_lower_client_let_run_on_an_idle_device_is_still_cut():
    """The work-conserving turn (every waiting client at its ceiling, nothing on the device) carried no
    cut, so a capped low client ran whole while a realtime client was active (a third review: 76 of
    its 837 dispatches cut). It is cut like any lower turn now."""
    scheduler = Scheduler(mode="throughput")
    realtime, low = _Fake(0, "realtime"), _Fake(1, "low")
    scheduler.usage(low).share = 20
    scheduler.charge(low, 5_000_000)  # far over a fifth of what ran
    scheduler.charge(realtime, 100_000)
    plan = scheduler.plan([realtime, low], {1: True}, {0: True, 1: True}, 0, 1024)
    assert [(turn.client, turn.cut_ns > 0) for turn in plan] == [(low, True)], plan


def test_a_sessions_waits_spin_as_its_priority_says(daemon):
    """A wait's spin yields the core at each look (the thread it waits for may share it), except a
    realtime session's, whose latency a yield to an unrelated busy thread would cost a time slice,
    and a low one's, which does not spin (ring/wake.c, ring_wait_for). The priority comes from the welcome:
    asked for, or the arbiter's default. Every mode still gets its answers."""
    _process, pipe_dir = daemon
    saxpy = libshare.shaders.path("saxpy")
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="realtime") as realtime, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as normal, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="low") as low:
        assert (realtime.priority, normal.priority, low.priority) == ("realtime", "normal", "low")
        from libshare.ring import C
        assert (realtime._gate.attached.region.peers.spin_mode, normal._gate.attached.region.peers.spin_mode, low._gate.attached.region.peers.spin_mode) == (
            C.SPIN_KEEP, C.SPIN_YIELD, C.SPIN_NONE)
        for session in (realtime, normal, low):
            program = session.load_program(saxpy)
            x, y = session.array(64), session.array(64)
            x[:], y[:] = 1.0, 2.0
            session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0)).wait(30)
            assert np.all(y == 3.0)


def test_the_engine_asks_the_scheduler_again_only_when_something_changed(tmp_path, vulkan_device_name):
    """While a long low dispatch runs, the low client's next one is held (a realtime client is
    active) and the plan is empty: the engine, polling the fence, asks again when the waiting
    clients or the submissions on the device change, or once the plan is older than
    ``plan_for``, not at every look (it once called the scheduler, taking the GIL, tens of
    thousands of times a second there). With ``plan_for`` an hour while the test looks, the plans
    it asks for are counted against the changes it saw, no clock involved."""
    with low_and_realtime(tmp_path / "pipe") as pair:  # the realtime client is active
        arbiter, low_busy = pair.arbiter, pair.low_busy
        drainer, slot = arbiter.drainer, low_slot(arbiter)
        lifetime = drainer.scheduler.plan_for
        # A plan that does not expire while the test looks: every plan then comes from a change,
        # and the count is the engine's, not the clock's. (Plans a second, with the plans expiring
        # as they do: bench/test_engine_mechanism_bench.py.)
        drainer.call(lambda: (setattr(drainer.scheduler, "plan_for", 3600.0), drainer.planner.update()))
        try:
            slow = low_busy(16, 1024, busy_iterations(300_000))  # ~0.1 s on lavapipe
            wait_until(lambda: drainer.engine.in_flight() or slow.done(), 10, "the slow dispatch to start")
            before, plans = drainer.engine.stats(slot), drainer.planner.plans
            held = low_busy(1, 64, 1)  # waits in the ring while the slow one runs
            slow.wait(60)
            plans, after = drainer.planner.plans - plans, drainer.engine.stats(slot)
        finally:
            drainer.call(lambda: (setattr(drainer.scheduler, "plan_for", lifetime), drainer.planner.update()))
        held.wait(60)
    # A change: the held dispatch's arrival, each piece of the slow one ending (it runs in pieces
    # beside the realtime client), the slow one ending. At every look it was thousands.
    changes = 2 + (after.pieces - before.pieces)
    assert plans <= 2 * changes + 10, f"{plans} plans for {changes} changes"
