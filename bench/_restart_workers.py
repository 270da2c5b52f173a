"""Client processes for bench/test_restart_bench.py: ``python -m bench._restart_workers gaps PIPE_DIR [DEPTH]``.

``gaps`` streams checked dispatches like tests/arbiter/_streaming_client.py (saxpy on the same
two shared arrays, ``DEPTH`` dispatches in flight on distinct slices, every result a ticket
reported successful is checked; a wrong one ends it with status 1), and keeps the time of every
successful completion (``time.monotonic()``, system-wide, so the bench can compare it with the
moment it asked for a restart). It prints one JSON line per event:

* ``{"event": "ok", "t": ..., "arbiter": PID}`` for the first success on each arbiter;
* ``{"event": "error", "t": ..., "kind": NAME, "why": TEXT}`` for every ticket or dispatch that
  failed (a restart should cost none);
* ``{"event": "window", "max_gap": S, "gap_from": T, "gap_to": T, "switch_gap": S, "ok": N,
  "errors": N, "arbiter": PID}`` for each line ``window`` read on its standard input: the longest
  time between two consecutive successful completions since the previous window (a window opens
  when the previous one is reported: its first gap starts there), with the two moments that bound
  it; the gap that ended with the first success on a new arbiter (0 if none in the window); the
  successes and errors in the window. Then a new window opens;
* ``{"event": "end", "ok": N, "errors": N, "reattached": N, "same_arrays": bool}`` when its
  standard input closes.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time

import numpy as np

import libshare
from tests.arbiter._streaming_client import Stream


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


class Window:
    """The successes and errors since the last report, and the longest gap between two successes."""

    def __init__(self) -> None:
        self.last = 0.0  # the last success, or the window's opening if later
        self.reset()

    def reset(self) -> None:
        self.max_gap = self.gap_from = self.gap_to = self.switch_gap = 0.0
        self.ok = self.errors = 0
        if self.last:
            self.last = time.monotonic()

    def success(self, now: float, switched: bool) -> None:
        if self.last and now - self.last > self.max_gap:
            self.max_gap, self.gap_from, self.gap_to = now - self.last, self.last, now
        if self.last and switched:
            self.switch_gap = now - self.last
        self.last = now
        self.ok += 1

    def report(self, arbiter: int) -> None:
        say(event="window", max_gap=self.max_gap, gap_from=self.gap_from, gap_to=self.gap_to,
            switch_gap=self.switch_gap, ok=self.ok, errors=self.errors, arbiter=arbiter)
        self.reset()


def _commands(pending: bytearray) -> list[str] | None:
    """Lines read from standard input without blocking; None once it is closed."""
    try:
        data = os.read(0, 4096)
    except BlockingIOError:
        return []
    if not data:
        return None
    pending += data
    *lines, rest = pending.split(b"\n")
    pending[:] = rest
    return [line.decode().strip() for line in lines]


def gaps(pipe_directory: str, depth: int) -> int:
    stream = Stream(pipe_directory, depth)
    session, program, x, y = stream.session, stream.program, stream.x, stream.y
    slice_size, expected = stream.slice_size, stream.expected
    push = struct.pack("If", slice_size, 2.0)
    window, arbiters, pending = Window(), set(), bytearray()
    ok = errors = 0
    os.set_blocking(0, False)
    while (commands := _commands(pending)) is not None:
        for command in commands:
            if command == "window":
                window.report(session.arbiter_pid)
        y[:] = 1.0
        tickets = []
        try:
            for k in range(depth):
                part = slice(k * slice_size, (k + 1) * slice_size)
                tickets.append((part, session.dispatch(program, slice_size // 64, [x[part], y[part]], push)))
        except libshare.LibshareError as exc:
            errors += 1
            window.errors += 1
            say(event="error", t=time.monotonic(), kind=type(exc).__name__, why=str(exc))
        for part, ticket in tickets:
            try:
                ticket.wait(60)
            except libshare.LibshareError as exc:
                errors += 1
                window.errors += 1
                say(event="error", t=time.monotonic(), kind=type(exc).__name__, why=str(exc))
                continue
            new = session.arbiter_pid not in arbiters
            window.success(time.monotonic(), new)
            if not np.array_equal(y[part], expected[part]):
                say(event="wrong", slice=[part.start, part.stop])
                return 1
            ok += 1
            if new:
                arbiters.add(session.arbiter_pid)
                say(event="ok", t=window.last, arbiter=session.arbiter_pid)
    say(event="end", ok=ok, errors=errors, reattached=session.reattached, same_arrays=stream.same_arrays())
    session.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1] != "gaps":
        sys.exit(f"unknown worker {sys.argv[1]!r}")
    sys.exit(gaps(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 4))
