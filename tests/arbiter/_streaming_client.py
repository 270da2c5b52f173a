"""A client that streams checked dispatches until its standard input closes, riding out arbiter restarts.

Usage: python -m tests.arbiter._streaming_client PIPE_DIRECTORY [DEPTH]

Each round sets ``y``, dispatches saxpy on the same two shared arrays (``DEPTH`` dispatches
in flight, on distinct slices) and checks every result a ticket reported successful. It
prints one JSON line per event, with ``time.monotonic()`` (system-wide, so the test can
compare it with the moment it killed the arbiter):

* ``{"event": "ready", "fds": N, "rings": N}`` once connected (descriptors open, ring mappings);
* ``{"event": "restarted", "t": ..., "tickets": N}`` when tickets failed with ArbiterRestarted;
* ``{"event": "ok", "t": ..., "arbiter": PID}`` for the first success on each arbiter;
* ``{"event": "end", "ok": N, "restarted": N, "same_arrays": bool, "fds": N, "rings": N, ...}`` at the end.

A result that is wrong, or any other error, ends it with status 1.
"""

from __future__ import annotations

import json
import os
import select
import struct
import sys
import time

import numpy as np

import libshare

N = 4096


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rings() -> int:
    """Ring regions mapped in this process (a reattach unmaps the old one)."""
    with open("/proc/self/maps") as maps:
        return sum("libshare-ring" in line for line in maps)


class Stream:
    """A session streaming saxpy over two shared arrays in ``depth`` slices (shared with the bench's
    restart worker): ``same_arrays()`` says whether they are still the buffers they began on."""

    def __init__(self, pipe_directory: str, depth: int):
        self.session = libshare.connect(mode="daemon", pipe_directory=pipe_directory, timeout=30)
        self.program = self.session.load_program(libshare.shaders.path("saxpy"))
        self.x, self.y = self.session.array(N, np.float32), self.session.array(N, np.float32)
        self._buffers = (self.x.base, self.y.base)
        self.x[:] = np.arange(N, dtype=np.float32)
        self.slice_size = N // depth
        self.expected = 2.0 * self.x + 1.0

    def same_arrays(self) -> bool:
        return self.x.base is self._buffers[0] and self.y.base is self._buffers[1]


def main() -> int:
    pipe_directory, depth = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    stream = Stream(pipe_directory, depth)
    session, program, x, y = stream.session, stream.program, stream.x, stream.y
    slice_size, expected = stream.slice_size, stream.expected
    ok = restarted = rounds = 0
    arbiters = set()
    say(event="ready", pid=session.arbiter_pid, fds=_fds(), rings=_rings())
    while not select.select([sys.stdin], [], [], 0)[0]:
        y[:] = 1.0
        tickets = []
        try:
            for k in range(depth):
                part_x, part_y = x[k * slice_size:(k + 1) * slice_size], y[k * slice_size:(k + 1) * slice_size]
                tickets.append((k, session.dispatch(program, slice_size // 64, [part_x, part_y],
                                                    struct.pack("If", slice_size, 2.0))))
        except libshare.ArbiterRestarted:
            pass  # the dispatch itself met the loss: the next round reattaches
        failed = 0
        for k, ticket in tickets:
            try:
                ticket.wait(60)
            except libshare.ArbiterRestarted as exc:
                failed += 1
                why = str(exc)
                continue
            part = slice(k * slice_size, (k + 1) * slice_size)
            if not np.array_equal(y[part], expected[part]):
                say(event="wrong", round=rounds, slice=k)
                return 1
            ok += 1
            if session.arbiter_pid not in arbiters:
                arbiters.add(session.arbiter_pid)
                say(event="ok", t=time.monotonic(), arbiter=session.arbiter_pid)
        if failed:
            restarted += failed
            say(event="restarted", t=time.monotonic(), tickets=failed, why=why)
        rounds += 1
    say(event="end", ok=ok, restarted=restarted, rounds=rounds, reattached=session.reattached,
        same_arrays=stream.same_arrays(), arbiters=sorted(arbiters), fds=_fds(), rings=_rings())
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
