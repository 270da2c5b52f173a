"""The arbiter keeps draining while Python holds the GIL in its process.

An embedded arbiter shares its process with the application, whose Python threads hold the GIL
for a switch interval (5 ms) at a time, or for as long as a C call that keeps it lasts. A drain
loop that needs the GIL to pop, submit and post makes every other client's round trip wait for it.

This test runs the arbiter in this process (the same ``Arbiter`` that ``connect(mode="embedded")``
starts, serving a pipe directory, since an embedded arbiter takes no other process's connections)
and a client in another process, and holds the GIL in this process for the whole of the client's
round trips: the main thread calls ``system()`` through ``ctypes.PyDLL``, which keeps the GIL, and
the shell it runs tells the client to go and then waits for the client's word that it is done. No
Python thread of the arbiter's process runs meanwhile (a counter that a Python thread of this
process bumps without pause stays still for the client to see), so a round trip that needed one
would wait for ever: the client's waits time out (30 s), and it says so. The client always
writes its word, so the hold ends even then.

How much a pure-Python thread in the arbiter's process slows a tiny round trip is a figure of
bench/test_engine_bench.py (E3), measured by bench/_gil_workers.py.

Run as ``python -m tests.arbiter.test_engine_gil PIPE_DIR COUNTER GO_FD DONE_FD ROUNDS``, this
module is the client: it prints ``ready``, waits for a byte on GO_FD, makes ROUNDS round trips,
writes a line to DONE_FD and prints ``ok N SAME`` (N round trips checked, SAME whether the counter
at the file COUNTER stayed still throughout) or what went wrong.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
import subprocess
import sys
import threading

import numpy as np

import libshare
from libshare.arbiter import Arbiter
from tests.conftest import ROOT, stop_process

ROUNDS = 50  # round trips made while the GIL is held


@contextlib.contextmanager
def serving(pipe_dir):
    """An in-process arbiter serving ``pipe_dir`` (a private directory); yields it."""
    pipe_dir.chmod(0o700)
    arbiter = Arbiter()
    try:
        arbiter.serve(pipe_dir / "control")
        yield arbiter
    finally:
        arbiter.close()


@contextlib.contextmanager
def counting(path):
    """A Python thread of this process that bumps a u64 in the file at ``path`` without pause; yields the view."""
    path.write_bytes(bytes(8))
    with open(path, "r+b") as f:
        mapping = mmap.mmap(f.fileno(), 8)
    counter = np.frombuffer(mapping, np.uint64)
    stop = threading.Event()

    def bump():
        while not stop.is_set():
            counter[0] += 1

    thread = threading.Thread(target=bump, name="pure-python-counter", daemon=True)
    thread.start()
    try:
        yield counter
    finally:
        stop.set()
        thread.join(30)  # (the mapping goes with the last view of it)


def hold_gil_while(go_fd: int, done_fd: int) -> int:
    """Keep the GIL in one C call: write a byte to ``go_fd``, then wait for a line on ``done_fd``;
    the shell's exit status (0: the line came)."""
    for fd in (go_fd, done_fd):
        os.set_inheritable(fd, True)
    command = f"printf g > /dev/fd/{go_fd}; read line < /dev/fd/{done_fd}"
    return ctypes.PyDLL(None).system(command.encode())  # PyDLL: the GIL is not released for the call


def test_round_trips_go_on_while_a_thread_of_the_arbiters_process_holds_the_gil(tmp_path, vulkan_device_name):
    pipe_dir = tmp_path / "pipe"
    pipe_dir.mkdir()
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()
    with serving(pipe_dir), counting(tmp_path / "counter") as counter:
        client = subprocess.Popen([sys.executable, "-m", "tests.arbiter.test_engine_gil", str(pipe_dir),
                                   str(tmp_path / "counter"), str(go_read), str(done_write), str(ROUNDS)],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True, pass_fds=(go_read, done_write))
        os.close(go_read)
        os.close(done_write)  # the client's end alone: its exit ends the hold, whatever happened
        try:
            assert client.stdout.readline().strip() == "ready", "the client did not start"
            before = int(counter[0])
            assert hold_gil_while(go_write, done_read) == 0, "the client never said it was done"
            outcome = client.communicate(timeout=60)[0].split()
        finally:
            os.close(go_write)
            os.close(done_read)
            stop_process(client)
            client.stdout.close()
        assert before > 0, "the counting thread never ran"
        assert outcome == ["ok", str(ROUNDS), "still"], (
            f"the client said {outcome}: with the GIL held in the arbiter's process, its round trips stalled")


def _client(pipe_dir: str, counter_path: str, go_fd: str, done_fd: str, rounds: str) -> None:
    with libshare.connect(name="round-trips", mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        x[:], y[:] = 1.0, 0.0
        push = struct.pack("If", 64, 1.0)
        session.dispatch(program, 1, [x, y], push).wait(60)  # compiled and recorded before the hold
        with open(counter_path, "r+b") as f:
            counter = np.frombuffer(mmap.mmap(f.fileno(), 8), np.uint64)
        print("ready", flush=True)
        said = "ok"
        try:
            assert os.read(int(go_fd), 1) == b"g"  # the GIL is held in the arbiter's process from now on
            seen = int(counter[0])
            done = 0
            for _ in range(int(rounds)):
                session.dispatch(program, 1, [x, y], push).wait(30)
                done += 1
            still = int(counter[0]) == seen  # nothing in the arbiter's process ran Python meanwhile
        except Exception as exc:  # noqa: BLE001 - reported to the test
            said = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(int(done_fd), b"done\n")  # ends the hold
        if said == "ok":
            said = f"ok {done if np.all(y == done + 1) else 'wrong'} {'still' if still else 'moved'}"
        print(said, flush=True)


if __name__ == "__main__":
    _client(*sys.argv[1:])
