"""A client process for the multi-process tests: ``python -m tests.arbiter._client ROLE PIPE_DIR ARGS``."""

from __future__ import annotations

import struct
import sys

import numpy as np

import libshare
from libshare import workloads
from tests._busy import busy_iterations
from tests._wait import wait_until


def mixed(pipe_dir: str, seed: str, rounds: str) -> None:
    """Run every workload ``rounds`` times, checked against numpy; exit 0 when all were right."""
    rng = np.random.default_rng(int(seed))
    with libshare.connect(name=f"mixed-{seed}", mode="daemon", pipe_directory=pipe_dir) as session:
        cache: dict = {}
        names = list(workloads.WORKLOADS)
        for i in range(int(rounds)):
            workloads.run(names[(i + int(seed)) % len(names)], session, rng, cache)
    print("ok", flush=True)


def spin(pipe_dir: str) -> None:
    """Keep long busy dispatches in flight until killed; print 'ready' once the first is queued."""
    with libshare.connect(name="victim", mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("busy"))
        data = session.array(1 << 16, np.uint32)
        push = struct.pack("II", 1 << 14, busy_iterations(1000))
        ticket = session.dispatch(program, groups=256, buffers=[data], push=push)
        print("ready", flush=True)
        while True:  # always one dispatch queued behind the one running
            following = session.dispatch(program, groups=256, buffers=[data], push=push)
            ticket.wait(timeout=60)
            ticket = following


def wait_forever(pipe_dir: str) -> None:
    """Submit long dispatches, then wait on them: prints how the waits ended ('finished', or
    'lost' with the number of tickets that had ended before)."""
    with libshare.connect(name="waiter", mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("busy"))
        data = session.array(1 << 16, np.uint32)
        tickets = [session.dispatch(program, groups=1024, buffers=[data],
                                    push=struct.pack("II", 1 << 16, busy_iterations(4000))) for _ in range(50)]
        print("ready", flush=True)
        ended = 0
        try:
            for ticket in tickets:
                ticket.wait(timeout=60)
                ended += 1
            print("finished", flush=True)
        except libshare.ArbiterLost:
            print(f"lost {ended}", flush=True)


def hold(pipe_dir: str, name: str, depth: str = "5") -> None:
    """Keep small busy dispatches queued until the arbiter ends the session.

    Keeps ``depth`` dispatches in flight. Prints 'ready', then, once a call fails, the error class of that call and of two
    later calls (a sticky error repeats), then waits for a line on stdin before exiting.
    """
    with libshare.connect(name=name, mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("busy"))
        data = session.array(1 << 10, np.uint32)
        push = struct.pack("II", 1 << 10, 2000)
        tickets = []
        print("ready", flush=True)
        try:
            while True:
                tickets.append(session.dispatch(program, groups=4, buffers=[data], push=push))
                if len(tickets) >= int(depth):
                    tickets.pop(0).wait(timeout=60)
        except libshare.LibshareError as exc:
            errors = [type(exc).__name__]
        for later in (lambda: session.dispatch(program, groups=4, buffers=[data], push=push).wait(5),
                      lambda: session.alloc(4096)):
            try:
                later()
                errors.append("none")
            except libshare.LibshareError as exc:
                errors.append(type(exc).__name__)
        print(" ".join(errors), flush=True)
        sys.stdin.readline()


def allocator(pipe_dir: str, name: str, group: str = "") -> None:
    """Allocate on request: prints 'ready', then answers each stdin line 'alloc BYTES' with
    'ok' or the error's class and message, 'free' (frees every buffer) with 'ok'; exits at EOF."""
    with libshare.connect(name=name, group=group or None, mode="daemon", pipe_directory=pipe_dir) as session:
        buffers = []
        print("ready", flush=True)
        for line in sys.stdin:
            verb, *args = line.split()
            try:
                if verb == "alloc":
                    buffers.append(session.alloc(int(args[0])))
                else:
                    while buffers:
                        session.free(buffers.pop())
                print("ok", flush=True)
            except libshare.LibshareError as exc:
                print(f"{type(exc).__name__}: {exc}", flush=True)


def _connect_when_up(pipe_dir: str, name: str):
    """A session with the next arbiter that takes one (None arbiter yet, or one in FAULT: try again
    for 120 s); None after printing 'refused CLASS: MESSAGE' when the arbiter refuses this process."""
    refused, unavailable = [], []

    def attempt():
        try:
            return libshare.connect(name=name, mode="daemon", pipe_directory=pipe_dir)
        except libshare.AccessDenied as exc:
            refused.append(exc)
            return True  # ends the wait: refused
        except libshare.ArbiterUnavailable as exc:  # the test starts the next arbiter once this one is gone
            unavailable[:] = [exc]
            return None

    def give_up(_message: str):
        raise unavailable[-1]

    session = wait_until(attempt, 120, "an arbiter to take the connection", fail=give_up)
    if refused:
        print(f"refused {type(refused[0]).__name__}: {refused[0]}", flush=True)
        return None
    return session


def runaway_rounds(pipe_dir: str, rounds: str) -> None:
    """One process that brings arbiters down: ``rounds`` times, connect to whichever arbiter answers,
    start a dispatch that never ends, print 'lost N CLASS' when the arbiter gives it up; a refused
    connection prints 'refused ...' (see _connect_when_up) and ends."""
    for n in range(1, int(rounds) + 1):
        session = _connect_when_up(pipe_dir, "runaway")
        if session is None:
            return
        print(f"connected {n}", flush=True)
        program = session.load_program(libshare.shaders.path("busy"))
        data = session.array(65535 * 64, np.uint32)
        ticket = session.dispatch(program, groups=(65535, 64, 1), buffers=[data],
                                  push=struct.pack("II", 65535 * 64, 1_000_000))  # hours on lavapipe
        try:
            ticket.wait(timeout=300)
            print(f"finished {n}", flush=True)
        except libshare.LibshareError as exc:
            print(f"lost {n} {type(exc).__name__}", flush=True)
        try:
            session.close()
        except libshare.LibshareError:
            pass


def load(pipe_dir: str, path: str) -> None:
    """Connect, print 'connected', load the SPIR-V module at ``path`` and print 'loaded' or the error's class."""
    session = _connect_when_up(pipe_dir, "loader")
    if session is None:
        return
    print("connected", flush=True)
    try:
        session.load_program(path)
        print("loaded", flush=True)
    except libshare.LibshareError as exc:
        print(type(exc).__name__, flush=True)
    try:
        session.close()
    except libshare.LibshareError:
        pass


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
