"""Fixtures for arbiter tests: a real daemon in a temporary pipe directory, client processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from libshare._proc import stat_fields, thread_ids
from tests._wait import wait_until  # noqa: F401 - the arbiter tests import it from here too
from tests.conftest import ROOT, stop_process


@pytest.fixture
def daemon(tmp_path, vulkan_device_name):
    """A running ``python -m libshare.arbiter`` on lavapipe; yields (process, pipe directory)."""
    yield from run_daemon(tmp_path / "pipe")


@pytest.fixture
def hooked_daemon(tmp_path, vulkan_device_name):
    """Like ``daemon``, with the test hooks (``inject_fault``) enabled."""
    yield from run_daemon(tmp_path / "pipe", LIBSHARE_TEST_HOOKS="1")


def run_daemon(pipe_dir, *args: str, **env):
    """Start an arbiter on ``pipe_dir`` with extra command-line ``args`` and ``env``; yield
    (process, pipe_dir); stop it."""
    stderr_path = pipe_dir.parent / f"{pipe_dir.name}.stderr"  # a file: a full pipe would stall the arbiter
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir), *args],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **env})

    def did_not_start(message: str) -> None:
        process.kill()
        process.wait()
        pytest.fail(f"arbiter did not start ({message}): {stderr_path.read_text()[-2000:]}")

    # listening, or exited (then the wait ends at once and fails below)
    wait_until(lambda: (pipe_dir / "control").exists() or process.poll() is not None, 30, "the arbiter's socket",
               fail=did_not_start)
    if not (pipe_dir / "control").exists():
        did_not_start(f"exit status {process.returncode}")
    try:  # (a failure inside ``with contextmanager(run_daemon)(...)`` is thrown in here: stop the arbiter all the same)
        yield process, pipe_dir
    finally:
        stop_process(process)


def open_fds(pid: int) -> int:
    """How many file descriptors process ``pid`` holds, not counting ring memfds: the arbiter keeps
    one only for the spare rings it makes ahead of its next clients (a client's ring keeps none
    there), on a thread of their own, so they come and go beside what a test counts."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:libshare-ring")
        except OSError:  # closed meanwhile
            pass
    return count


def accepted_connections(pid: int) -> int:
    """How many connections accepted on its listening sockets (sessions and control connections
    alike) process ``pid`` holds open now: its socket descriptors that /proc/net/unix lists as
    connected (state 03) under the path one of its listening sockets was bound to (the arbiter
    binds a temporary name and renames it, so the path is not the socket's name now)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    with open("/proc/net/unix") as table:
        next(table)  # Num RefCount Protocol Flags Type St Inode Path
        rows = [fields for fields in map(str.split, table) if len(fields) >= 8 and fields[6] in inodes]
    listening = {fields[7] for fields in rows if int(fields[3], 16) & 0x10000}  # __SO_ACCEPTCON
    return sum(fields[5] == "03" and fields[7] in listening for fields in rows)


def asleep(pid: int, tids=None) -> bool:
    """Whether every thread of process ``pid`` (or each of its threads ``tids``) sleeps in the
    kernel now: none runs, nor waits for a core (a thread that polls or spins never does)."""
    for tid in thread_ids(pid) if tids is None else tids:
        fields = stat_fields(pid, tid)
        if fields is not None and fields[0] not in ("S", "D", "I"):  # (None: a thread that just ended)
            return False
    return True


class AtRest:
    """A predicate for :func:`wait_until`: true once ``looks`` looks in a row have found ``asleep(pid,
    tids)``. A process that rests between rare wake-ups gets there at once; one with a thread that
    polls or spins is found running at nearly every look and does not. ``during``, if given, must
    stay true at each look: what the rest is observed under (a dispatch still running, say)."""

    def __init__(self, pid: int, tids=None, looks: int = 5, during=None):
        self.pid, self.tids, self.looks, self.during = pid, tids, looks, during
        self.streak = 0

    def __call__(self) -> bool:
        if self.during is not None and not self.during():
            pytest.fail(f"what the rest was to be seen under ended first ({self.streak} look(s) at rest in a row)")
        self.streak = self.streak + 1 if asleep(self.pid, self.tids) else 0
        return self.streak >= self.looks


def rest_seen_during(pid: int, tids, start_work, what: str, looks: int = 5, tries: int = 3) -> list:
    """Wait for ``looks`` looks in a row finding ``asleep(pid, tids)`` while work runs, and return
    the tickets of that work. ``start_work(size)`` starts ``size`` units of it (1, then 8, 64...)
    and returns their tickets; the work runs until the last one is done. Work that ends before
    the rest is seen (a device or a machine faster than the sizes were written for) says nothing
    either way, so eight times as much is started, up to ``tries`` sizes; a thread that never
    rests while work runs fails at every size."""
    for attempt in range(tries):
        tickets = start_work(8 ** attempt)
        rest = AtRest(pid, tids, looks)

        def outcome():
            at_rest = rest()
            return "ended" if tickets[-1].done() else "rest" if at_rest else None

        if wait_until(outcome, 60, what) == "rest":
            return tickets
        for ticket in tickets:
            ticket.wait(120)
    pytest.fail(f"the work ended before {what} at each of {tries} sizes ({rest.streak} look(s) at rest in a row last)")


def start_client(role: str, pipe_dir, *args) -> subprocess.Popen:
    """Start ``tests/arbiter/_client.py ROLE PIPE_DIR ARGS`` with its stdout piped."""
    return subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", role, str(pipe_dir), *map(str, args)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def streams():
    """Start honest streaming clients (``tests.arbiter.test_reattach.Client``) with
    ``streams(pipe)``; any that a failure left running is killed at the end."""
    from tests.arbiter.test_reattach import Client  # (that module imports this one)

    started = []

    def start(pipe):
        started.append(Client(pipe))
        return started[-1]

    yield start
    for client in started:
        if client.process.poll() is None:
            client.process.kill()
            client.process.wait()
        client.process.stdin.close()
        client._reader.join(10)
