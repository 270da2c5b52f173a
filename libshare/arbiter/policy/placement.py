"""Where a daemon's threads run: the engine and the driver's threads on one core, the rest on the others.

On a CPU device (lavapipe) a tiny round trip hops between threads: the engine pops a
client's descriptor and submits, lavapipe's queue thread runs the dispatch and signals the
fence, the engine answers. Each hop across cores is a wake-up, and on the 2-core VM this
project is measured on a wake-up across cores costs more than the dispatch itself (a
socket ping-pong between two processes: 13 us on one core, 33 us across two; a direct
submit-and-wait, the caller and lavapipe's thread: 19-25 us on one core, 84-112 us across).

So a daemon arbiter (a process of its own: nothing else of the user's runs in it) puts its
engine thread and the threads the driver started while it made the device on one core,
the *device core* (one of the cores this process may use, picked by its pid, so that
arbiters side by side spread over the cores), and every other thread of the
process (the control thread, the gate, the session threads, and those they start later,
which inherit it) on the remaining cores. The engine pins its own thread
(``ls_engine_place``), and its polls then yield the device core between looks (engine/wait.c,
``poll_step``): what the engine waits for, the queue thread, runs there.

Not placed:

* an embedded arbiter: its process is the application's, whose threads are not ours to
  move, and a yield could hand the core to one of them for a whole time slice;
* a GPU: the device runs the work, and no thread of the driver's waits on our core;
* a process allowed one core only, where there is nothing to choose.

Nothing placed there may sleep and wake at a high rate while the queue thread runs: on this
VM's kernel (6.18) a pinned thread napping every 25 us-1 ms beside a pinned busy one kept a
process of another session that pinned itself to that core (Mesa does, in every process that
loads lavapipe, vetting children included) off it for seconds; so the engine sleeps on a long
submission in naps that grow to 20 ms (engine/wait.c, wait_for_fence).

A yield may still hand the device core to another process's busy thread for a whole time
slice; the engine then stops yielding for a while, and its polls keep the core meanwhile,
as unplaced (engine/wait.c, YIELD_PAUSE_NS). Placement is best effort: a thread whose affinity
is refused leaves the arbiter unplaced, every thread back on every core, and the polls
keep their core as before (a thread that ended meanwhile is skipped).
"""

from __future__ import annotations

import logging
import os
import threading

from libshare._proc import thread_ids
from libshare.errors import LibshareError

log = logging.getLogger("libshare.arbiter")

__all__ = ["place_device_threads"]


def place_device_threads(device, engine, cores: set[int]) -> bool:
    """Put ``engine``'s thread and ``device``'s driver threads on a device core and every other
    thread of this process on the other ``cores`` (those the arbiter was given when it started);
    True when done, False when not to be done here or when it failed (every thread left or put
    back on every one of ``cores``)."""
    cores = sorted(cores)
    if not device.cpu or len(cores) < 2:
        return False
    device_core = cores[os.getpid() % len(cores)]  # arbiters side by side spread over the cores
    other_cores = set(cores) - {device_core}
    python_threads = {thread.native_id for thread in threading.enumerate()}
    engine_thread = engine.thread_id
    driver_threads = set(device.driver_threads) - python_threads - {engine_thread}
    try:
        for thread in thread_ids():
            if thread != engine_thread:
                _set_cores(thread, {device_core} if thread in driver_threads else other_cores)
        engine.place(device_core)
    except (OSError, LibshareError) as exc:
        log.warning("could not place the engine's and the driver's threads on core %d (%s); they run on any "
                    "core", device_core, exc)
        _unplace(engine, set(cores))
        return False
    log.info("engine and driver threads on core %d, the arbiter's other threads on %s", device_core,
             ",".join(map(str, sorted(other_cores))))
    return True


def _set_cores(thread: int, cores: set[int]) -> None:
    try:
        os.sched_setaffinity(thread, cores)
    except ProcessLookupError:
        pass  # it ended meanwhile


def _unplace(engine, cores: set[int]) -> None:
    for thread in thread_ids():
        try:
            _set_cores(thread, cores)
        except OSError:
            pass  # refused: as unplaced as it can be
    try:
        engine.place(None)  # it stops yielding
    except LibshareError:
        pass
