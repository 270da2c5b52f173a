"""Producer processes for bench/test_engine_bench.py: ``python -m bench._engine_workers nop PIPE_DIR SECONDS``.

``nop`` connects to the daemon, prints ``ready``, and for each line on stdin runs a window: for
SECONDS it pushes ``LS_OP_NOP`` descriptors (opcode 0, every other field 0 but a ticket of its own)
as fast as its lane takes them, a lane's worth per call, and reads its completions. It prints the
completions with status 0 that it read within the window, then the number with any other status,
then the window's length in seconds. Past the window it pushes nothing more and reads what it
still has outstanding, so that the next window, and the session's close, start on an empty ring.
The end of stdin ends it.

The session has no call that pushes a batch of descriptors, so this goes through the session's
ring region as a C client does (``session._region``, as tests/arbiter/test_fence.py does): its
producer pushes many descriptors in one ``ls_push``, and the completions are popped from the
region directly. The session's own completion reader is never called, so nothing else reads them.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import libshare
from libshare.ring import CQE_DTYPE, DESC_DTYPE

_DRAIN_TIMEOUT = 30.0  # seconds to read the completions still outstanding after the window


def nop(pipe_dir: str, seconds: str) -> None:
    with libshare.connect(name="nop-producer", mode="daemon", pipe_directory=pipe_dir) as session:
        region = session._region  # the raw ring: the session pushes one descriptor per call
        producer = region.lanes.producer()
        batch = np.zeros(region.lane_entries, DESC_DTYPE)  # opcode 0 is LS_OP_NOP; every field 0
        steps = np.arange(len(batch), dtype=np.uint64)
        tickets = batch["ticket"]
        cqes = np.empty(region.cq_entries, CQE_DTYPE)
        print("ready", flush=True)
        next_ticket = 1
        for _ in sys.stdin:
            next_ticket = window(region, producer, batch, steps, tickets, cqes, next_ticket, float(seconds))


def window(region, producer, batch, steps, tickets, cqes, next_ticket: int, seconds: float) -> int:
    """One window of pushes; prints its counts; returns the next ticket number."""
    outstanding, good, bad = 0, 0, 0
    started = time.perf_counter()
    end = started + seconds
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        tickets[:] = steps + next_ticket
        pushed = producer.try_push(batch)
        next_ticket += pushed
        outstanding += pushed
        n = region.completions.take_into(cqes)
        if n:
            ok = int(np.count_nonzero(cqes["status"][:n] == 0))
            good, bad, outstanding = good + ok, bad + n - ok, outstanding - n
        elif not pushed:  # lane full and nothing back yet: sleep until something comes
            try:
                region.completions.wait(1, timeout=min(0.05, end - now))
            except libshare.Timeout:
                pass
    elapsed = time.perf_counter() - started
    deadline = time.monotonic() + _DRAIN_TIMEOUT
    while outstanding > 0 and time.monotonic() < deadline:  # not counted: outside the window
        try:
            region.completions.wait(1, timeout=0.1)
        except libshare.Timeout:
            continue
        outstanding -= region.completions.take_into(cqes)
    print(good, bad, elapsed, flush=True)
    return next_ticket


if __name__ == "__main__":
    {"nop": nop}[sys.argv[1]](*sys.argv[2:])
