"""Small pieces more than one bench (or bench worker process) uses: timing a call, keeping
dispatches in flight, and ending worker processes driven over stdin.

It imports nothing from tests/ or pytest, so the worker processes (``python -m bench._..._workers``)
can use it too.
"""

from __future__ import annotations

import collections
import subprocess
import time
from typing import Callable, Iterable


def timed(once: Callable[[], object], count: int) -> list[float]:
    """Seconds of each of ``count`` calls of ``once``."""
    out = []
    for _ in range(count):
        begun = time.perf_counter()
        once()
        out.append(time.perf_counter() - begun)
    return out


def keep_in_flight(go: Callable[[], object], depth: int, end: float) -> tuple[int, int]:
    """Keep ``depth`` dispatches of ``go()`` in flight until ``time.perf_counter()`` reaches ``end``;
    (device ns, count) of those that completed before it. The ones still in flight are left to the
    caller (a ``wait_idle``)."""
    device_ns, count = 0, 0
    flight = collections.deque(go() for _ in range(depth))
    while True:
        ticket = flight.popleft().wait(60)
        if time.perf_counter() >= end:
            break
        device_ns += ticket.device_ns or 0
        count += 1
        flight.append(go())
    return device_ns, count


def kill_if_running(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` if it still runs, and reap it."""
    if process.poll() is None:
        process.kill()
        process.wait()


def close_workers(workers: Iterable[subprocess.Popen], wait_s: float,
                  stop: Callable[[subprocess.Popen], None]) -> None:
    """End worker processes that run a window per line on stdin, one after another: close each one's
    stdin (its end), wait up to ``wait_s`` s for it to exit, ``stop`` it (``tests.conftest.stop_process``,
    ``kill_if_running``) should it still run, and close its stdout."""
    for w in workers:
        try:
            w.stdin.close()
            w.wait(timeout=wait_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        stop(w)
        w.stdout.close()
