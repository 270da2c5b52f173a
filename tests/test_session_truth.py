"""The client library tells the truth (issue 12): closing under a waiter, sticky outcomes, a dead
arbiter seen by every way of asking, no record kept for tickets nobody holds, closing clients in
``ps``, and a code of its own for each libshare error in C.

Each test performs the failure against a real daemon on lavapipe. Scenarios that crashed the
process (a segfault when the ring was unmapped under a waiter) run in a child process:
``python -m tests.test_session_truth SCENARIO PIPE_DIR`` prints what it saw.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import libshare
from libshare.protocol import control as _control

from tests._busy import busy_iterations, long_queue
from tests._wait import wait_until
from tests.arbiter.conftest import daemon, hooked_daemon  # noqa: F401 - fixtures
from tests.conftest import ROOT, killed_on_exit
from tests.test_c_bindings import C_DIR, SHADERS, compile_c, counts, daemon_env, library  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("vulkan_device_name")


def connect(pipe_dir, name: str = "truth") -> libshare.Session:
    return libshare.connect(name=name, mode="daemon", pipe_directory=pipe_dir)


def threads_in_ticket_wait() -> list[int]:
    """Idents of the threads whose stack is inside a ticket wait of libshare's client (completions.py)."""
    found = []
    for ident, frame in sys._current_frames().items():
        while frame is not None:
            if frame.f_code.co_name == "wait_ticket" and frame.f_code.co_filename.endswith("completions.py"):
                found.append(ident)
                break
            frame = frame.f_back
    return found


# ---------------------------------------------------------------- closing under a waiter

def scenario_cancelled_await(pipe_dir: str) -> None:
    """A cancelled ``await ticket`` inside ``with connect()``, then the session closes. An await
    used to leave a thread waiting on the ring, which segfaulted once the ring was unmapped under
    it; now it waits on the doorbell socket in the event loop, and cancelling leaves nothing behind
    (no thread, no descriptor)."""
    import anyio

    async def main():
        with connect(pipe_dir) as session:
            ticket = long_queue(session, count=6)[-1]  # (seconds of queue; the arbiter ends it after the close)
            fds = len(os.listdir("/proc/self/fd"))
            with anyio.move_on_after(0.1):
                await ticket
            print("cancelled", "left", threads_in_ticket_wait(), len(os.listdir("/proc/self/fd")) - fds, flush=True)
        print("closed", flush=True)
        return ticket

    ticket = anyio.run(main)
    outcomes = []
    for _ in range(2):
        try:
            ticket.wait()
            outcomes.append("none")
        except libshare.LibshareError as exc:
            outcomes.append(type(exc).__name__)
    print("survived", *outcomes, ticket.done(), flush=True)


def scenario_thread_waiter(pipe_dir: str) -> None:
    """A thread blocked in ``wait()`` without a timeout while another thread closes the session."""
    session = connect(pipe_dir)
    ticket = long_queue(session, count=6)[-1]  # (seconds of queue; the arbiter ends it after the close)
    outcome = []

    def waiter():
        try:
            ticket.wait()
            outcome.append("none")
        except Exception as exc:  # noqa: BLE001 - reported to the test
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(threads_in_ticket_wait, what="the waiter to wait on the ring")
    session.close()
    thread.join(60)
    print("survived", thread.is_alive(), *outcome, flush=True)
    for call in (ticket.wait, lambda: session.dispatch(libshare.Program(1, 1, 0, (1, 1, 1)), 1)):
        try:
            call()
            print("none", flush=True)
        except libshare.LibshareError as exc:
            print(type(exc).__name__, isinstance(exc, ValueError), flush=True)


SCENARIOS = {"cancelled_await": scenario_cancelled_await, "thread_waiter": scenario_thread_waiter}


def run_scenario(name: str, pipe_dir) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "tests.test_session_truth", name, str(pipe_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"exit {done.returncode} (-11 is a segfault)\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout.splitlines()


def test_closing_under_a_cancelled_await_fails_the_waiter_instead_of_crashing(daemon):
    lines = run_scenario("cancelled_await", daemon[1])
    assert lines[:2] == ["cancelled left [] 0", "closed"]
    assert lines[2] == "survived SessionClosed SessionClosed True"  # the outcome is sticky


def test_closing_wakes_and_fails_a_thread_waiting_on_a_ticket(daemon):
    lines = run_scenario("thread_waiter", daemon[1])
    assert lines[0] == "survived False SessionClosed"
    assert lines[1:] == ["SessionClosed True", "SessionClosed True"]  # sticky; still a ValueError


# ---------------------------------------------------------------- sticky outcomes, a dead arbiter

def test_a_failed_ticket_fails_on_every_wait(daemon):
    import anyio

    with connect(daemon[1]) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x = session.array(1024)
        bad = session.dispatch(program, 1, [x], b"")  # saxpy takes two buffers
        for _ in range(3):
            with pytest.raises(libshare.InvalidSubmission, match="bindings"):
                bad.wait(10)
        assert bad.done()

        async def await_it():
            await bad

        with pytest.raises(libshare.InvalidSubmission, match="bindings"):
            anyio.run(await_it)


def test_cancelled_tickets_stay_failed_and_the_session_stays_lost_after_a_quit(daemon):
    _, pipe_dir = daemon
    with connect(pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("busy"))
        data = session.array(1 << 16, np.uint32)
        tickets = []
        for _ in range(2):  # two long submissions: the arbiter's most in flight (a few seconds each)
            tickets.append(session.dispatch(program, groups=1024, buffers=[data],
                                            push=struct.pack("II", 1 << 16, busy_iterations(200_000))))
            wait_until(lambda: session.stats()["submitted"] == len(tickets), what="the arbiter to take it")
        # These wait in the ring behind them, so the quit cancels them.
        tickets += [session.dispatch(program, groups=1, buffers=[data], push=struct.pack("II", 64, 1))
                    for _ in range(5)]
        _control.run("quit", pipe_directory=pipe_dir)
        outcomes = []
        for ticket in tickets:
            try:
                ticket.wait(60)
                outcomes.append(None)
            except libshare.ArbiterLost:
                outcomes.append("ArbiterLost")
        assert outcomes[-1] == "ArbiterLost"  # the queue's tail was cancelled
        for ticket, first in zip(tickets, outcomes):
            if first is None:
                assert ticket.wait(0) is ticket
            else:
                with pytest.raises(libshare.ArbiterLost):
                    ticket.wait(0)  # used to return normally
            assert ticket.done()
        with pytest.raises(libshare.ArbiterLost):
            session.dispatch(libshare.Program(1, 1, 0, (1, 1, 1)), 1)  # at once, not a ticket into the void
        with pytest.raises(libshare.ArbiterLost):
            session.wait_idle(10)


def test_every_way_of_asking_sees_a_killed_arbiter(daemon):
    """A wait, a poll of done(), an await and wait_idle, each on a long queue with no timeout of its
    own, all end with ArbiterLost (done() turns True) once the arbiter is killed. How soon after
    the kill each sees it (the library says within 1 s): bench/test_lifecycle_mechanism_bench.py."""
    import anyio

    process, pipe_dir = daemon
    sessions = [connect(pipe_dir, name) for name in ("wait", "done", "await", "wait_idle")]
    try:
        last = {s.client_id: long_queue(s, count=10)[-1] for s in sessions}
        wait_s, done_s, await_s, idle_s = sessions
        seen: dict[str, object] = {}
        killed = threading.Event()

        def record(way, call):
            try:
                call()
                seen[way] = "returned"
            except libshare.ArbiterLost:
                seen[way] = "ArbiterLost"
            except Exception as exc:  # noqa: BLE001 - reported below
                seen[way] = repr(exc)

        def poll_done():
            ticket = last[done_s.client_id]
            killed.wait()
            seen["done"] = wait_until(ticket.done, 30, fail=lambda _: "still False after 30 s")

        async def await_last():
            await last[await_s.client_id]

        threads = [threading.Thread(target=record, args=("wait", last[wait_s.client_id].wait)),
                   threading.Thread(target=poll_done),
                   threading.Thread(target=record, args=("await", lambda: anyio.run(await_last))),
                   threading.Thread(target=record, args=("wait_idle", idle_s.wait_idle))]
        for thread in threads:
            thread.start()
        assert not any(t.done() for t in last.values())  # all still running before the kill
        process.send_signal(signal.SIGKILL)
        killed.set()
        for thread in threads:
            thread.join(60)  # waits without a timeout of their own: only seeing the death ends them
        assert seen == {"wait": "ArbiterLost", "done": True, "await": "ArbiterLost", "wait_idle": "ArbiterLost"}, seen
        for session in sessions:
            ticket = last[session.client_id]
            assert ticket.done()
            for _ in range(2):
                with pytest.raises(libshare.ArbiterLost):
                    ticket.wait(0)
            with pytest.raises(libshare.ArbiterLost):
                session.dispatch(libshare.Program(1, 1, 0, (1, 1, 1)), 1)
    finally:
        for session in sessions:
            session.close()


# ---------------------------------------------------------------- records and numbers

def test_tickets_nobody_holds_leave_no_record_in_the_session(daemon):
    """Pipelining: dispatch, never wait the ticket, wait_idle now and then."""
    with connect(daemon[1]) as session:
        x, y = session.array(64), session.array(64)

        def burst(n: int = 2000):
            for _ in range(n):
                session.copy(x, y, 4)
            session.wait_idle(120)

        burst()  # warm up: buffers, lanes, caches
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(10):
                burst()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 256 * 1024, f"{grown} bytes kept after 20,000 tickets nobody held"
        held = session.copy(x, y, 4)
        assert held.wait(30) is held and held.done()  # a held ticket keeps its own outcome


def test_ticket_numbers_are_unique_across_threads(daemon):
    with connect(daemon[1]) as session:
        x, y = session.array(64), session.array(64)
        numbers: list[list[int]] = []

        def submit():
            mine = [session.copy(x, y, 4) for _ in range(300)]
            for ticket in mine:
                ticket.wait(60)
            numbers.append([t.id for t in mine])

        threads = [threading.Thread(target=submit) for _ in range(3)]  # 3 of the ring's 4 lanes
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        every = [n for mine in numbers for n in mine]
        assert len(numbers) == 3 and len(every) == len(set(every)) == 900


# ---------------------------------------------------------------- ps shows a closing client

def test_ps_shows_a_closing_client_whose_work_still_holds_memory(daemon):
    _, pipe_dir = daemon

    def rows():
        header, *lines = _control.run("ps", pipe_directory=pipe_dir).splitlines()
        return {line.split()[1]: line.split() for line in lines}

    session = connect(pipe_dir, "closer")
    client = str(session.client_id)
    long_queue(session, count=1, iterations=200_000)  # a few seconds on lavapipe
    wait_until(lambda: session.stats()["submitted"] >= 1, what="the arbiter to take the dispatch")
    assert rows()[client][4] == "ACTIVE"
    session.close()

    def closed_or_gone():
        row = rows().get(client)
        return "gone" if row is None else row[4] != "ACTIVE" and row

    seen = wait_until(closed_or_gone, what="the client to close")
    assert seen != "gone", "the closing client vanished from ps while its work still ran"
    assert seen[2] == "closer" and seen[4] == "CLOSING" and seen[8] != "0B", seen
    wait_until(lambda: client not in rows(), timeout=120, what="the closing client to be reclaimed")


# ---------------------------------------------------------------- C: codes and a dead arbiter

OPERATOR_ERRORS = {"AlreadyServing", "StartFailed", "ConfigError", "CompileError"}
"""Errors only Python tools raise (starting a daemon, reading its configuration, libshare.compile):
in C they take their nearest base's code (ls_serve answers AlreadyServing with -EBUSY itself; a C
program compiles its shaders with glslang itself)."""


def test_every_libshare_error_has_its_own_c_code():
    errors = libshare.errors
    answering = [row for row in errors.TABLE if row.answers]
    classes = [row.error.__name__ for row in answering]
    codes = [row.name for row in answering]
    assert len(set(classes)) == len(classes), "two codes answer one class"
    assert sorted(classes) == sorted(set(errors.__all__) - OPERATOR_ERRORS), "a libshare error has no C code"
    assert len(set(codes)) == len(codes) and "LS_EPYTHON" not in codes
    header = (C_DIR / "api.h").read_text() + (ROOT / "libshare" / "ring" / "ring.h").read_text()
    strerror = (C_DIR / "errors_table.h").read_text()
    for code in codes:
        assert re.search(rf"#define {code} \d+", header), f"{code} is not defined"
        assert f"case {code}:" in strerror, f"ls_strerror does not describe {code}"
    for name in OPERATOR_ERRORS & set(errors.__all__):  # the nearest base's code
        assert errors.code_for(getattr(errors, name)("x")) in codes, name
    for name in errors.__all__:  # each class, raised, is answered with its own code
        if name not in OPERATOR_ERRORS:
            error = getattr(errors, name)("x")
            assert errors.code_for(error) == codes[classes.index(name)], name


@pytest.fixture
def refused_binary(library, tmp_path):
    return compile_c(library, C_DIR / "tests" / "test_refused.c", tmp_path)


def test_c_connect_to_a_faulted_daemon_is_not_ready_not_a_python_failure(refused_binary, hooked_daemon):
    _, pipe_dir = hooked_daemon
    holder = subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", "hold", str(pipe_dir), "held"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert _control.run("inject_fault", str(holder.pid), pipe_directory=pipe_dir) == "FAULT"
        done = subprocess.run([str(refused_binary), "LS_ENOTREADY"], env=daemon_env(pipe_dir),
                              capture_output=True, text=True, timeout=120)
        assert counts(done.stdout) == (1, 0), done.stdout + done.stderr[-2000:]
    finally:
        holder.kill()
        holder.communicate()


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_c_connect_as_another_user_is_denied_not_a_python_failure(refused_binary, daemon):
    _, pipe_dir = daemon
    os.chmod(pipe_dir, 0o755)
    os.chmod(pipe_dir / "control", 0o666)
    # Another uid that may still read this checkout and its Python (under /root): the arbiter,
    # not the file system, is what refuses it.
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+dac_read_search",
               "--ambient-caps=+dac_read_search", str(refused_binary), "LS_EDENIED"]
    done = subprocess.run(command, env=daemon_env(pipe_dir), capture_output=True, text=True, timeout=120)
    if "setpriv:" in done.stderr and not done.stdout:
        pytest.skip(f"setpriv cannot keep a capability here: {done.stderr.strip()}")
    assert counts(done.stdout) == (1, 0), done.stdout + done.stderr[-2000:]


def test_c_poll_sees_a_killed_arbiter(library, daemon, tmp_path):
    process, pipe_dir = daemon
    binary = compile_c(library, C_DIR / "tests" / "test_lost.c", tmp_path)
    with killed_on_exit(subprocess.Popen([str(binary), str(SHADERS), "poll"], env=daemon_env(pipe_dir),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) as client:
        assert client.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGKILL)
        # The program polls for at most 120 s (LS_ELOST, or a failed check); this bound is against a hang.
        out, err = client.communicate(timeout=150)
    assert counts(out) == (1, 0), out + err  # ls_poll said -LS_ELOST, not "still running" for its 120 s


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](sys.argv[2])
