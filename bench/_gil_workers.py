"""Timing tiny round trips against an arbiter in this process while a pure-Python thread holds the GIL.

An embedded arbiter shares its process with the application: a Python thread there that computes
in pure Python holds the GIL for a switch interval (5 ms) at a time. :func:`compare` serves a
client in another process that times tiny round trips (saxpy over 64 floats, one workgroup:
dispatch, then wait), with a spinner, ``while spinning: x += 1``, in one of two places (or none):

- inside: a thread of this process, which competes with the arbiter for the GIL;
- apart: a process of its own, which competes with it for nothing but a CPU.

Both take a core from the machine, so the comparison measures the GIL alone, whatever else loads
the machine. The conditions are timed in alternating blocks (the order swapped each block), so
that drift in the machine's load falls on both. The client pauses 2 ms before each round trip,
long enough for the arbiter to go idle and the spinner to take the GIL. Back to back, a drain
loop that polls in short C calls can retake the GIL the moment it lets it go (CPython hands it to
no waiter then, and a waiter asks for it only after a switch interval in which nobody else took
it): that starves the spinner for whole blocks, and the stall comes and goes by chance.

bench/test_engine_bench.py (E3) reports the ratio; tests/arbiter/test_engine_gil.py checks the
mechanism (round trips complete while the GIL is held for their whole duration).

Run as ``python -m bench._gil_workers PIPE_DIR``, this module is the client: it prints ``ready``,
then for each line ``N`` on stdin times N round trips (after a few untimed ones; each timed one
after its pause) and prints their seconds on one line; on an empty line it checks that every
dispatch ran, prints ``ok`` and exits.
"""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import libshare
from tests.conftest import ROOT, stop_process

WARMUP = 5  # untimed round trips before each block
GAP = 0.002  # seconds between round trips: the arbiter goes idle, and the spinner takes the GIL
_SPIN = "x = 0\nwhile True:\n    x += 1\n"


class Spinner(threading.Thread):
    """A thread that counts in pure Python while ``spinning`` is set (and sleeps otherwise)."""

    def __init__(self):
        super().__init__(name="pure-python-spinner", daemon=True)
        self.spinning = False
        self.stopped = False
        self.wake = threading.Event()
        self.count = 0

    def run(self) -> None:
        while not self.stopped:
            self.wake.wait()
            self.wake.clear()
            x = 0
            while self.spinning:
                x += 1
            self.count += x

    def spin(self, on: bool) -> None:
        self.spinning = on
        if on:
            self.wake.set()

    def stop(self) -> None:
        self.stopped, self.spinning = True, False
        self.wake.set()
        self.join(timeout=10)


class RoundTrips:
    """The client process: ``times(n)`` has it time ``n`` round trips; ``close()`` checks its results,
    ``stop()`` ends it whatever state it is in."""

    def __init__(self, pipe_dir):
        self.process = subprocess.Popen([sys.executable, "-m", "bench._gil_workers", str(pipe_dir)],
                                        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            self.stop()
            pytest.fail("the round-trip client did not start")

    def times(self, count: int) -> list[float]:
        self.process.stdin.write(f"{count}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the round-trip client died"
        return [float(t) for t in line.split()]

    def close(self) -> str:
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return self.process.communicate(timeout=60)[0].strip()

    def stop(self) -> None:
        stop_process(self.process)
        self.process.stdin.close()
        self.process.stdout.close()


def compare(pipe_dir, blocks: int, per_block: int, alone: bool = False) -> dict[str, np.ndarray]:
    """Round-trip times (seconds) from a client process of the arbiter serving ``pipe_dir`` (in this
    process) with a pure-Python spinner "inside" this process and "apart" in another, and with
    ``alone`` also with no spinner, in ``blocks`` alternating blocks of ``per_block`` each."""
    spinner = Spinner()
    spinner.start()
    apart = subprocess.Popen([sys.executable, "-c", _SPIN])
    apart.send_signal(signal.SIGSTOP)
    client = None
    switch = {"inside": spinner.spin, "apart": lambda on: apart.send_signal(signal.SIGCONT if on else signal.SIGSTOP),
              "alone": lambda on: None}
    conditions = ["inside", "apart"] + (["alone"] if alone else [])
    times: dict[str, list[float]] = {name: [] for name in conditions}
    try:
        client = RoundTrips(pipe_dir)
        for block in range(blocks):
            for name in conditions[::-1] if block % 2 else conditions:
                switch[name](True)
                try:
                    times[name] += client.times(per_block)
                finally:
                    switch[name](False)
        assert client.close() == "ok", "a round trip's dispatch did not run"
    finally:
        if client is not None:
            client.stop()
        spinner.stop()
        apart.send_signal(signal.SIGCONT)  # a stopped process would not act on the SIGTERM
        stop_process(apart)
    assert spinner.count > 0, "the spinner never ran"
    return {name: np.array(t) for name, t in times.items()}


def _client(pipe_dir: str) -> None:
    with libshare.connect(name="round-trips", mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        x[:], y[:] = 1.0, 0.0
        push, rounds = struct.pack("If", 64, 1.0), 0
        print("ready", flush=True)
        for line in sys.stdin:
            if not line.strip():
                break
            for _ in range(WARMUP):
                session.dispatch(program, 1, [x, y], push).wait(60)
            times = []
            for _ in range(int(line)):
                time.sleep(GAP)
                begun = time.perf_counter()
                session.dispatch(program, 1, [x, y], push).wait(60)
                times.append(time.perf_counter() - begun)
            rounds += WARMUP + len(times)
            print(" ".join(f"{t:.9f}" for t in times), flush=True)
        print("ok" if np.all(y == rounds) else f"y is {y[0]} after {rounds} round trips", flush=True)


if __name__ == "__main__":
    _client(sys.argv[1])
