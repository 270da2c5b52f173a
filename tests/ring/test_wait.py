"""Sleep and wake across processes: futex doorbells, need-wakeup flags, timeouts, dead peers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from libshare import ArbiterLost, Timeout
from libshare.ring import CQE_DTYPE, Region
from libshare.ring._binding import lib

from tests._wait import wait_until
from tests.conftest import spawn_peer
from tests.ring._peer import descriptors


class Waiter(threading.Thread):
    """``wait()`` on a thread of its own: what it returned or raised is ``outcome``, once it has ended."""

    def __init__(self, wait):
        super().__init__(daemon=True)
        self.wait, self.outcome = wait, None

    def run(self) -> None:
        try:
            self.outcome = self.wait()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            self.outcome = exc

    def result(self):
        """What the wait returned or raised; it must end within 30 s (a bound against a hang)."""
        self.join(30)
        assert not self.is_alive(), "the wait never came back"
        return self.outcome


def asleep(word: str, region: Region):
    """A predicate: the waiter on ``word`` ("sq_flags" or "cq_flags") has asked for a wake-up
    (LS_NEED_WAKEUP), which it does only once it has spun and is about to sleep on the futex."""
    bells = lib.ls_region_bells(region._c())
    return lambda: getattr(bells, word) & lib.LS_NEED_WAKEUP


def test_a_wait_with_nothing_to_wait_for_times_out_and_takes_its_flag_back():
    """Nothing is pushed or posted: each wait raises Timeout, having slept with its wake-up flag
    set, and leaves the flag clear (a producer would otherwise ring for nobody), the ring as it was.
    How close to its timeout a wait comes back is a figure of bench/test_ring_mechanism_bench.py."""
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        bells = lib.ls_region_bells(region._c())
        for wait, word in ((region.lanes.wait, "sq_flags"), (region.completions.wait, "cq_flags")):
            with pytest.raises(Timeout):
                wait(timeout=0.2)
            assert getattr(bells, word) == 0
        assert region.lanes.pending() == 0 and len(region.completions.take()) == 0


@pytest.mark.parametrize("side", ["lanes", "completions"])
def test_a_sleeping_wait_returns_only_once_what_it_waits_for_is_there(side):
    """A wait with a long timeout goes to sleep (its flag set) and is still waiting there, not
    back early; the push (or post) that gives it something wakes it, and it returns the count."""
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        waiter = Waiter(lambda: getattr(region, side).wait(timeout=30))
        waiter.start()
        wait_until(asleep("sq_flags" if side == "lanes" else "cq_flags", region), 30, "the waiter to sleep")
        assert waiter.is_alive(), f"the wait came back with nothing there: {waiter.outcome!r}"
        if side == "lanes":
            region.lanes.producer().try_push(descriptors(0, 7, 1))
        else:
            cqe = np.zeros(1, CQE_DTYPE)
            cqe["ticket"] = 7
            region.completions.post(cqe)
        assert waiter.result() == 1


def test_sleeping_consumer_is_woken_by_a_push_from_another_process():
    with Region.create(lanes=2, lane_entries=64, cq_entries=64) as region:
        echo = spawn_peer("echo", region.fd, 3)
        producer = region.lanes.producer()
        bells = lib.ls_region_bells(region._c())
        for ticket in range(3):  # each time, once the echo side has spun and fallen asleep on the futex
            wait_until(lambda: bells.sq_flags == 1, 20, "the idle consumer to ask for a wake-up")
            producer.try_push(descriptors(0, ticket, 1))
            assert region.completions.wait(1, timeout=5, spin=0) == 1
            assert list(region.completions.take()["ticket"]) == [ticket]
        assert echo.wait(timeout=10) == 0


def test_no_wake_syscall_while_the_consumer_polls():
    with Region.create(lanes=1, lane_entries=16, cq_entries=16) as region:
        bells = lib.ls_region_bells(region._c())
        before = bells.sq_bell
        region.lanes.producer().try_push(descriptors(0, 0, 4))
        assert bells.sq_bell == before  # nobody asked for a wake-up, so nobody rang


def test_waiter_on_completions_raises_when_the_consumer_dies():
    """The consumer is killed while a client sleeps on completions: the wait raises ArbiterLost,
    not the Timeout of its 30 s (it looks at the peer between slices of its sleep). How soon after
    the death: bench/test_ring_mechanism_bench.py."""
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        region.peers.watch(sleeper.pid)
        waiter = Waiter(lambda: region.completions.wait(1, timeout=30))
        waiter.start()
        wait_until(asleep("cq_flags", region), 30, "the waiter to sleep")
        sleeper.kill()
        assert isinstance(waiter.result(), ArbiterLost), waiter.outcome
        sleeper.wait()
        sleeper.stdin.close()


def test_waiter_on_completions_raises_when_the_consumer_closes():
    """As above, with the consumer closing its side instead of dying."""
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        peer = Region.attach(region.fd)
        waiter = Waiter(lambda: region.completions.wait(1, timeout=30))
        waiter.start()
        wait_until(asleep("cq_flags", region), 30, "the waiter to sleep")
        peer.peers.announce_consumer(alive=False)
        assert isinstance(waiter.result(), ArbiterLost), waiter.outcome
        peer.close()


def test_completions_posted_before_the_consumer_died_are_still_delivered():
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        cqe = np.zeros(2, CQE_DTYPE)
        cqe["ticket"] = [5, 6]
        region.completions.post(cqe)
        region.peers.announce_consumer(alive=False)
        assert region.completions.wait(2, timeout=1) == 2
        assert list(region.completions.take()["ticket"]) == [5, 6]


def test_memfd_leaves_nothing_in_dev_shm_after_sigkill():
    before = set(os.listdir("/dev/shm"))
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        child = spawn_peer("produce", region.fd, 0, 1_000_000_000, 1)
        wait_until(region.lanes.pending, 30, "the child to map the region and push")
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert set(os.listdir("/dev/shm")) == before
