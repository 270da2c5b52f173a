"""The Python client's hot path: one ``Session.dispatch()`` call; figures in the summary.

A timed round makes 100 pipelined dispatches (tiny saxpy, never waited); an untimed
``wait_idle`` before each round keeps the lane from filling, so no call waits for room. A block
(bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default) is ``ROUNDS`` rounds, and its value
the median round per call; the figure is the median over blocks, with its range. The daemon is
the untimed one of test_arbiter_bench.py; embedded, the arbiter's threads share this process (and
its GIL). Target on a 2-core machine: <= 2 us per call through a daemon (bench/test_c_bench.py
has ls_dispatch, the same encoder called from C).

A second figure keeps every ticket: per block, 10,000 dispatches are pushed and held, then waited
in order, alternated (ABBA) with the same 10,000 never waited, and this process's CPU time per
dispatch of the first is divided by that of the second. The ticket book then holds 10,000
records at once.
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest

import libshare
from bench._compare import at_most, compare, measure
from bench.test_arbiter_bench import arbiter_dir  # noqa: F401 - the untimed daemon fixture

INNER = 100  # dispatches per timed round
ROUNDS = 40  # rounds per block
HELD = 10_000  # tickets held at once in the second figure


@pytest.fixture(params=["daemon", "embedded"])
def session(request, arbiter_dir):  # noqa: F811 - the fixture imported above
    with libshare.connect(name="client-bench", mode=request.param, pipe_directory=arbiter_dir) as session:
        yield session


def tiny_saxpy(session) -> tuple:
    """What both figures dispatch on ``session``: the saxpy program, its two 64-float arrays x and y,
    and its push constants (n = 64, a = 1.0)."""
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(64), session.array(64)
    return program, x, y, struct.pack("If", 64, 1.0)


def test_session_dispatch(benchmark, session):
    program, x, y, push = tiny_saxpy(session)
    dispatch = session.dispatch

    def block() -> float:
        rounds = []
        for _ in range(ROUNDS):
            session.wait_idle(60)
            begun = time.perf_counter()
            for _ in range(INNER):
                dispatch(program, 1, [x, y], push)
            rounds.append((time.perf_counter() - begun) / INNER)
        return float(np.median(rounds))

    block()  # warm
    mode = "embedded" if session.embedded else "daemon"
    benchmark.pedantic(measure, args=(f"K1. Session.dispatch ({mode}), pipelined, per call", block, "us"),
                       kwargs={"scale": 1e6, "target": at_most(2.0) if mode == "daemon" else None,
                               "method": f"{INNER} dispatches never waited per round, the lane emptied (untimed) "
                                         f"before each round; a block's value is the median of {ROUNDS} rounds, "
                                         "per call"}, rounds=1)


def test_held_tickets(benchmark, session):
    program, x, y, push = tiny_saxpy(session)
    dispatch = session.dispatch

    def held() -> float:
        start = time.process_time()
        tickets = [dispatch(program, 1, [x, y], push) for _ in range(HELD)]
        for ticket in tickets:
            ticket.wait(60)
        return (time.process_time() - start) / HELD

    def dropped() -> float:
        start = time.process_time()
        for _ in range(HELD):
            dispatch(program, 1, [x, y], push)
        session.wait_idle(60)
        return (time.process_time() - start) / HELD

    held(), dropped()  # warm
    mode = "embedded" if session.embedded else "daemon"
    benchmark.pedantic(compare, args=(f"K2. {HELD:,} tickets held then waited in order / never waited ({mode}), "
                                      "CPU per dispatch", held, dropped),
                       kwargs={"a": "held", "b": "never waited",
                               "method": f"this process's CPU time per dispatch: {HELD:,} dispatches pushed and their "
                                         f"tickets held, then waited in order, against {HELD:,} never waited "
                                         "(then wait_idle), alternated ABBA"}, rounds=1)
