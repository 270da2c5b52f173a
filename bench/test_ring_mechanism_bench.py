"""How long the ring's and the dial's waits take: the figures that tests/ring/test_wait.py and
tests/test_dial.py asserted on before they checked the mechanisms instead (issue 31).

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default), its
median judged against its target and printed with its range:

RM1. a wait with nothing to wait for, against its timeout (0.2 s): the time it took / the timeout
     (both the submission lanes' and the completions'; was asserted within [0.9, 5]);
RM2. a client asleep on completions when its consumer dies (SIGKILL) or closes its side: the time
     from the death (or the close) to ArbiterLost, in ms (was asserted under 1 s; a sleep is cut
     into 50 ms slices, between which the sleeper looks at its peer);
RM3. dial on a listen queue that stays full, with a 0.3 s timeout: the time to the refusal / the
     timeout (was asserted within [0.83, 6.7]);
RM4. a control request whose reply never comes, waited out for 0.5 s: the CPU seconds of the
     waiting thread (was asserted under 0.1 s: it polls for 200 us, then sleeps in recv).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from bench._compare import at_most, measure, within
from libshare import ArbiterLost, ArbiterUnavailable, Timeout
from libshare.protocol.wire import dial
from libshare.ring import Region
from libshare.ring._binding import lib
from tests._wait import wait_until
from tests.test_dial import full_listener  # noqa: F401 - a fixture


def _timed_out(wait) -> float:
    started = time.perf_counter()
    with pytest.raises(Timeout):
        wait(timeout=0.2)
    return (time.perf_counter() - started) / 0.2


def test_a_wait_against_its_timeout():
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        measure("RM1. ring wait with nothing to wait for, lanes: time / its 0.2 s timeout",
                lambda: _timed_out(region.lanes.wait), "x", target=within(0.9, 5.0),
                method="Region.lanes.wait(timeout=0.2) on an empty ring, one per block")
        measure("RM1. ring wait with nothing to wait for, completions: time / its 0.2 s timeout",
                lambda: _timed_out(region.completions.wait), "x", target=within(0.9, 5.0),
                method="Region.completions.wait(timeout=0.2) on an empty ring, one per block")


def _lost_after(end_the_consumer) -> float:
    """Milliseconds from ``end_the_consumer(region)`` to ArbiterLost in a client asleep on completions."""
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        outcome = []

        def wait():
            try:
                region.completions.wait(1, timeout=30)
            except ArbiterLost:
                outcome.append(time.perf_counter())

        waiter = threading.Thread(target=wait)
        waiter.start()
        bells = lib.ls_region_bells(region._c())
        wait_until(lambda: bells.cq_flags & lib.LS_NEED_WAKEUP, 30, "the waiter to sleep")
        ended = end_the_consumer(region)
        waiter.join(60)
        assert outcome, "the waiter did not see the consumer go"
        return (outcome[0] - ended) * 1e3


def _killed(region) -> float:
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    region.peers.watch(sleeper.pid)
    sleeper.kill()
    killed = time.perf_counter()
    sleeper.wait()
    sleeper.stdin.close()
    return killed


def _closed(region) -> float:
    peer = Region.attach(region.fd)
    try:
        closed = time.perf_counter()
        peer.peers.announce_consumer(alive=False)
        return closed
    finally:
        peer.close()


def test_a_dead_or_closed_consumer_seen_by_a_sleeping_waiter():
    measure("RM2. consumer killed: its sleeping client's ArbiterLost after", lambda: _lost_after(_killed), "ms",
            target=at_most(1000.0), method="a thread asleep in completions.wait(timeout=30); the watched consumer "
                                           "process SIGKILLed; from the kill to the exception")
    measure("RM2. consumer closed: its sleeping client's ArbiterLost after", lambda: _lost_after(_closed), "ms",
            target=at_most(1000.0), method="as above, the consumer announcing itself closed instead")


def test_a_full_queue_refused_against_its_timeout(full_listener):
    _, path = full_listener

    def refused() -> float:
        started = time.perf_counter()
        with pytest.raises(ArbiterUnavailable):
            dial(path, 0.3)
        return (time.perf_counter() - started) / 0.3

    measure("RM3. dial on a full listen queue: time to the refusal / its 0.3 s timeout", refused, "x",
            target=within(0.83, 6.7), method="dial(path, 0.3) on a listener whose queue of one is full")


def test_waiting_out_a_reply_costs_next_to_no_cpu():
    from libshare.client.exchange import exchange

    def cpu() -> float:
        ours, theirs = socket.socketpair()
        ours.settimeout(0.5)
        used = []

        def ask():
            started = time.thread_time()
            with pytest.raises(TimeoutError):
                exchange(ours, {"op": "stats"})
            used.append(time.thread_time() - started)

        try:
            asker = threading.Thread(target=ask)
            asker.start()
            asker.join(10)
            return used[0]
        finally:
            ours.close()
            theirs.close()

    measure("RM4. a control request waiting out a 0.5 s timeout: CPU of its thread", cpu, "s",
            target=at_most(0.1), method="exchange() on a socket pair whose peer never answers, timeout 0.5 s; "
                                        "time.thread_time() of the waiting thread")
