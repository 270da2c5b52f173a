"""Sleep and wake across processes: futex doorbells, need-wakeup flags, timeouts, dead peers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from libshare import ArbiterLost, Timeout
from libshare.ring import CQE_DTYPE, Region
from libshare.ring._binding import lib

from tests.conftest import spawn_peer
from tests.ring._peer import descriptors


def test_wait_times_out_within_bounds():
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        for wait in (region.lanes.wait, region.completions.wait):
            start = time.monotonic()
            with pytest.raises(Timeout):
                wait(timeout=0.2)
            assert 0.18 <= time.monotonic() - start < 1.0


def test_sleeping_consumer_is_woken_by_a_push_from_another_process():
    with Region.create(lanes=2, lane_entries=64, cq_entries=64) as region:
        echo = spawn_peer("echo", region.fd, 3)
        producer = region.lanes.producer()
        bells = lib.ls_region_bells(region._c())
        for ticket in range(3):
            deadline = time.monotonic() + 20
            while bells.sq_flags != 1 and time.monotonic() < deadline:
                time.sleep(0.01)  # until the echo side has spun and fallen asleep on the futex
            assert bells.sq_flags == 1, "the idle consumer should have asked for a wake-up"
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
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        region.peers.watch(sleeper.pid)
        threading.Timer(0.3, sleeper.kill).start()
        start = time.monotonic()
        with pytest.raises(ArbiterLost):
            region.completions.wait(1, timeout=30)
        assert time.monotonic() - start < 1.0
        sleeper.wait()


def test_waiter_on_completions_raises_when_the_consumer_closes():
    with Region.create(lanes=1, lane_entries=4, cq_entries=4) as region:
        peer = Region.attach(region.fd)
        threading.Timer(0.2, lambda: peer.peers.announce_consumer(alive=False)).start()
        start = time.monotonic()
        with pytest.raises(ArbiterLost):
            region.completions.wait(1, timeout=30)
        assert time.monotonic() - start < 1.0
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
        deadline = time.monotonic() + 30
        while not region.lanes.pending():  # the child has mapped the region and is producing
            assert time.monotonic() < deadline, "the producer never pushed"
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert set(os.listdir("/dev/shm")) == before
