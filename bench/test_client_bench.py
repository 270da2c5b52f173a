"""The Python client's hot path: one ``Session.dispatch()`` call; figures in the summary.

Each timed round makes 100 pipelined dispatches (tiny saxpy, never waited); an untimed
``wait_idle`` before each round keeps the lane from filling, so no call waits for room.
The daemon is the untimed one of test_arbiter_bench.py; embedded, the arbiter's threads
share this process (and its GIL). Target on a 2-core machine: <= 2 us per call through
a daemon (bench/test_c_bench.py has ls_dispatch, the same encoder called from C).

A second figure keeps every ticket: 10,000 dispatches are pushed and held, then waited in
order, and this process's CPU time per dispatch is printed beside that of the same 10,000 never
waited. The ticket book then holds 10,000 records at once (it once took 15.7 us per ticket there,
against 2.7, when consecutive ticket numbers made one long cluster in its table).
"""

from __future__ import annotations

import struct
import time

import pytest

import libshare
from bench.test_arbiter_bench import arbiter_dir  # noqa: F401 - the untimed daemon fixture

INNER = 100  # dispatches per timed round


@pytest.fixture(params=["daemon", "embedded"])
def session(request, arbiter_dir):  # noqa: F811 - the fixture imported above
    with libshare.connect(name="client-bench", mode=request.param, pipe_directory=arbiter_dir) as session:
        yield session


def test_session_dispatch(benchmark, session, report_ratio):
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(64), session.array(64)
    push = struct.pack("If", 64, 1.0)
    dispatch = session.dispatch

    def dispatches():
        for _ in range(INNER):
            dispatch(program, 1, [x, y], push)

    benchmark.pedantic(dispatches, setup=lambda: session.wait_idle(60), rounds=100, warmup_rounds=5)
    mode = "embedded" if session.embedded else "daemon"
    per_call = benchmark.stats.stats.median / INNER * 1e6
    report_ratio(f"Session.dispatch ({mode}, pipelined, {INNER} per round): {per_call:.2f} us per call "
                 f"(median round; target <= 2 us through a daemon)")


HELD = 10_000  # tickets held at once in the second figure


def test_held_tickets(benchmark, session, report_ratio):
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(64), session.array(64)
    push = struct.pack("If", 64, 1.0)
    dispatch = session.dispatch
    spent = {"held": [], "dropped": []}

    def held():
        start = time.process_time()
        tickets = [dispatch(program, 1, [x, y], push) for _ in range(HELD)]
        for ticket in tickets:
            ticket.wait(60)
        spent["held"].append(time.process_time() - start)
        start = time.process_time()
        for _ in range(HELD):
            dispatch(program, 1, [x, y], push)
        session.wait_idle(60)
        spent["dropped"].append(time.process_time() - start)

    benchmark.pedantic(held, rounds=5, warmup_rounds=1)
    mode = "embedded" if session.embedded else "daemon"
    each = {how: sorted(times)[len(times) // 2] / HELD * 1e6 for how, times in spent.items()}
    report_ratio(f"{HELD:,} tickets held, then waited in order ({mode}): {each['held']:.2f} us of this process's "
                 f"CPU per dispatch, against {each['dropped']:.2f} us never waited = {each['held'] / each['dropped']:.2f}x")
