"""Doorbells and rings under attack, against a real daemon on lavapipe.

A client that reads its doorbell in a loop (hoping to swallow the others' wake-ups), one that
writes it in a loop (to keep the arbiter awake), and one that corrupts its own ring. Each runs
as a separate process (``python -m tests.arbiter.test_doorbells ROLE PIPE_DIR``, roles at the
end of this file; bench/test_doorbell_bench.py runs the same ones and prints the figures, and
bench/test_engine_mechanism_bench.py the arbiter's CPU and wake-ups under them).
What stays here is the mechanism: honest round trips keep completing, each within its wait's
bound and with the right result; a client's doorbell is its own, so a client reading its own in
a loop reads nothing of anyone's; the arbiter stops listening to a hammering doorbell and still
serves that client's work; the arbiter comes to rest (every thread asleep, look after look)
when nothing is asked of it; and a corrupted ring gets its client a sticky RingCorrupted with
everything it held reclaimed.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

import libshare
from libshare.protocol import control as _control
from libshare.protocol import wire as protocol
from libshare.ring import C
from libshare.ring._binding import ffi, lib

from tests.conftest import ROOT, stop_process
from tests.arbiter.conftest import AtRest, open_fds, wait_until

pytestmark = pytest.mark.usefixtures("vulkan_device_name")

SAXPY = libshare.shaders.path("saxpy")
PUSH = struct.pack("If", 64, 1.0)  # y += x over 64 floats, one workgroup
ROUNDS = 40
STEAL_ROUNDS = 200  # a stealer wins the race for a wake-up often, not always: many chances
PACED_FIRST = 1000  # requests a pacing client makes before the test looks (past the poll's burst budget)
MUTED = "not listening to its doorbell"  # what server.log says when a doorbell is muted


def start_attacker(role: str, pipe_dir, *args) -> subprocess.Popen:
    """Start ``python -m tests.arbiter.test_doorbells ROLE PIPE_DIR ARGS``; wait for its 'ready'."""
    process = subprocess.Popen([sys.executable, "-m", "tests.arbiter.test_doorbells", role, str(pipe_dir),
                                *map(str, args)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "ready", f"the {role} did not start"
    return process


def stop_attacker(process: subprocess.Popen) -> None:
    """Close its stdin (a role waiting for lines exits), stop it, close its stdout."""
    try:
        process.stdin.close()
    except OSError:
        pass  # it died: the pipe is broken
    stop_process(process)
    process.stdout.close()


def round_trips(session, program, x, y, rounds: int = ROUNDS) -> int:
    """Make ``rounds`` dispatch-and-wait round trips (each wait bounded at 30 s, against a hang: a
    Timeout fails the test); how many were made. How long they took: bench/test_doorbell_bench.py."""
    for _ in range(rounds):
        session.dispatch(program, 1, [x, y], PUSH).wait(30)
    return rounds


def honest(pipe_dir):
    """A daemon session with saxpy loaded on two 64-float arrays: (session, program, x, y)."""
    session = libshare.connect(name="honest", mode="daemon", pipe_directory=pipe_dir)
    program = session.load_program(SAXPY)
    x, y = session.array(64), session.array(64)
    x[:] = 1.0
    return session, program, x, y


def server_log(pipe_dir) -> str:
    return (pipe_dir / "server.log").read_text()


def assert_no_traceback(pipe_dir) -> None:
    text = server_log(pipe_dir)
    assert "Traceback" not in text and "control loop error" not in text, text[-3000:]


# ---------------------------------------------------------------- doorbells


def test_a_client_reading_its_doorbell_steals_no_one_elses_wake_up(daemon):
    _process, pipe_dir = daemon
    session, program, x, y = honest(pipe_dir)
    with session:
        stealers = [start_attacker("steal", pipe_dir) for _ in range(2)]  # one may be off the CPU
        try:
            assert round_trips(session, program, x, y, STEAL_ROUNDS) == STEAL_ROUNDS
            assert np.all(y == float(STEAL_ROUNDS))
        finally:
            read = [stolen(stealer) for stealer in stealers]
        # Every one of the honest client's rings went to the arbiter's end of its own doorbell: a
        # stealer read nothing in all its reads (with one shared doorbell it swallowed wake-ups, and
        # the arbiter slept out its 2 s idle poll), and its doorbell is another socket than the
        # honest client's.
        honest_bell = os.fstat(session._gate.attached.wake_fd).st_ino
        assert all(count == 0 and inode != honest_bell for count, inode in read), read
    assert_no_traceback(pipe_dir)


def stolen(stealer: subprocess.Popen) -> tuple[int, int]:
    """Stop a stealer (EOF on its stdin) and take its report: (datagrams it read, its doorbell's inode)."""
    stealer.stdin.close()
    report = stealer.stdout.readline().split()
    stop_attacker(stealer)
    assert len(report) == 2, f"the stealer said {report}"
    return int(report[0]), int(report[1])


@contextlib.contextmanager
def asking_for_every_wake_up(pipe_dir):
    """A session of its own that, in a thread, sets every completion flag of its ring (every kind of
    wake-up, the doorbell socket's too, which it never reads), pushes 64 dispatches and waits for
    the last, again and again; yields (the thread, the session, its y); stops it at the end."""
    hostile, program, x, y = honest(pipe_dir)
    bells = lib.ls_region_bells(hostile._gate.attached.region._handle)
    stop = threading.Event()

    def ask():
        while not stop.is_set():
            bells.cq_flags = 0xFFFFFFFF
            tickets = [hostile.dispatch(program, 1, [x, y], PUSH) for _ in range(64)]
            tickets[-1].wait(30)

    attacker = threading.Thread(target=ask)
    with hostile:
        attacker.start()
        try:
            yield attacker, hostile, y
        finally:
            stop.set()
            attacker.join(60)
            hostile.wait_idle(30)


def test_a_client_that_asks_for_every_wake_up_by_socket_and_never_reads_it_costs_the_others_nothing(daemon):
    """The worst value of the completion flags: every bit set, again after each post, by a client that
    pushes work and never reads its doorbell socket. The arbiter's byte per post never blocks (the
    socket fills and refuses), the client's own work still completes, and the honest one's too."""
    _process, pipe_dir = daemon
    session, program, x, y = honest(pipe_dir)
    with session:
        with asking_for_every_wake_up(pipe_dir) as (attacker, hostile, hy):
            assert round_trips(session, program, x, y) == ROUNDS  # a send that blocked would hang them
        assert not attacker.is_alive(), "the client's own work stopped completing"
        assert np.all(y == float(ROUNDS))
        assert np.all(hy == hy[0]) and hy[0] >= 64  # every one of its dispatches ran (the last waited for)
    assert_no_traceback(pipe_dir)


def test_a_hammered_doorbell_is_muted_and_its_client_still_served(daemon):
    process, pipe_dir = daemon
    session, program, x, y = honest(pipe_dir)
    with session:
        hammer = start_attacker("hammer", pipe_dir)
        try:
            wait_until(lambda: MUTED in server_log(pipe_dir), 30, "the arbiter to mute the hammered doorbell")
            assert_rests(process.pid, "hammered")  # it was a core flat out
            assert round_trips(session, program, x, y) == ROUNDS
            assert np.all(y == float(ROUNDS))
            hammer.stdin.write("dispatch\n")  # its own work is still served (on the slow path while muted)
            hammer.stdin.flush()
            assert hammer.stdout.readline().strip() == "ok"
        finally:
            stop_attacker(hammer)
        wait_until(lambda: re.search(r"\(hammer, pid \d+\) (disconnected and )?reclaimed", server_log(pipe_dir)), 30,
                   "the hammering client to be reclaimed")
        # At rest again. (Its wake-ups a second against an idle arbiter's, which say that no slow
        # path was left behind: bench/test_engine_mechanism_bench.py.)
        assert_rests(process.pid, "idle")
    assert_no_traceback(pipe_dir)


def test_a_client_quiet_after_a_burst_of_requests_leaves_the_arbiter_at_rest(daemon):
    """A session thread polls for its client's next request for a moment (_REQUEST_SPIN in
    _server.py) before it sleeps: bounded, so a client that went quiet costs no CPU."""
    process, pipe_dir = daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="quiet") as session:
        for _ in range(50):
            session.stats()
        assert_rests(process.pid, "quiet")


def test_a_client_that_paces_its_requests_cannot_keep_the_arbiter_polling(daemon):
    """A request 60 us after each reply is always inside the poll's time: without the budget
    (RequestPoll, serve/sessions.py) the arbiter would poll a whole core for such a client. With it,
    the session thread sleeps in ``recv`` between requests once the budget is spent: the arbiter,
    serving a pacing client, is found with every thread asleep, and the client goes on being served
    after that. (The share of a core it uses meanwhile: bench/test_engine_mechanism_bench.py.)"""
    process, pipe_dir = daemon
    pacer = start_attacker("pace", pipe_dir)

    def served() -> int:
        pacer.stdin.write("count\n")
        pacer.stdin.flush()
        word, count = pacer.stdout.readline().split()
        assert word == "served"
        return int(count)

    try:
        assert pacer.stdout.readline().split() == ["pacing", str(PACED_FIRST)]  # the budget spent, and on it goes
        wait_until(AtRest(process.pid, looks=1, during=lambda: pacer.poll() is None), 60,
                   "the arbiter to sleep between a pacing client's requests")
        seen_at_rest = served()
        wait_until(lambda: served() > seen_at_rest, 60, "the pacer to go on being served after the arbiter slept")
    finally:
        stop_attacker(pacer)
    assert_no_traceback(pipe_dir)


def assert_rests(pid: int, what: str) -> None:
    """The arbiter comes to rest: five looks in a row (50 ms apart) find every thread of it asleep,
    which a thread that spins or polls does not let happen. The bound is against a hang."""
    wait_until(AtRest(pid), 60, f"the {what} arbiter to rest")


# ---------------------------------------------------------------- corrupted rings


def header(session, name: str) -> int:
    """A u64 field of the session's ring header (lanes_offset, lane_stride, cq_offset)."""
    return struct.unpack_from("<Q", session._gate.attached.region._map, ffi.offsetof("struct ls_region_header", name))[0]


def overwrite(session, offset: int, value: int) -> None:
    """Write a u32 into the session's ring region, as a buggy or hostile client could."""
    struct.pack_into("<I", session._gate.attached.region._map, offset, value & 0xFFFFFFFF)


def corrupt_completion_head(session) -> None:
    """Move the completion ring's head one past its tail: more completions seen than posted."""
    cq = header(session, "cq_offset")
    tail = struct.unpack_from("<I", session._gate.attached.region._map, cq + ffi.offsetof("struct ls_cq", "tail"))[0]
    overwrite(session, cq + ffi.offsetof("struct ls_cq", "head"), tail + 1)


def corrupt_lane_tail(session, lane: int) -> None:
    """Publish more slots in ``lane`` than it has: its tail a whole lane and one past its head."""
    base = header(session, "lanes_offset") + lane * header(session, "lane_stride")
    head = struct.unpack_from("<I", session._gate.attached.region._map, base + ffi.offsetof("struct ls_lane", "head"))[0]
    overwrite(session, base + ffi.offsetof("struct ls_lane", "tail"), head + session._gate.attached.region.lane_entries + 1)


def raw_alloc(session) -> dict:
    """An alloc sent on the session's socket past the library (which refuses once it knows)."""
    protocol.send(session._gate.attached.sock, {"op": "alloc", "size": 4096, "kind": "shared"})
    reply = protocol.recv(session._gate.attached.sock, max_fds=1)
    reply.close_fds()
    return reply.fields


def assert_dropped(session, program, x, y, pipe_dir, where: str) -> None:
    """Every later call of the session raises RingCorrupted, and so does the arbiter to a raw request."""
    for call in (lambda: session.dispatch(program, 1, [x, y], PUSH).wait(10), lambda: session.alloc(4096),
                 lambda: session.load_program(SAXPY)):
        with pytest.raises(libshare.RingCorrupted, match="dropped this session"):
            call()
    reply = raw_alloc(session)
    assert not reply["ok"] and reply["error"] == "RingCorrupted", reply
    assert where in reply["message"], reply["message"]
    assert "dropping it" in server_log(pipe_dir)


def test_a_corrupted_completion_head_drops_its_client_with_a_sticky_error(daemon):
    process, pipe_dir = daemon
    bystander, program, x, y = honest(pipe_dir)  # saxpy loaded (and vetted) before the count below
    with bystander:
        before = open_fds(process.pid)
        with libshare.connect(name="corrupt", mode="daemon", pipe_directory=pipe_dir) as session:
            own = session.load_program(SAXPY)
            a, b = session.array(64), session.array(64)
            session.dispatch(own, 1, [a, b], PUSH).wait(10)
            corrupt_completion_head(session)
            ticket = session.dispatch(own, 1, [a, b], PUSH)  # rings the doorbell: the arbiter looks, drops it
            with pytest.raises(libshare.RingCorrupted, match="dropped this session"):
                ticket.wait(10)
            assert session._gate.attached.region.peers.close_reason() == C.ECORRUPT
            assert_dropped(session, own, a, b, pipe_dir, "completion ring")
            assert round_trips(bystander, program, x, y, 5), "the others are served as before"
        wait_until(lambda: open_fds(process.pid) <= before, 30,
                   "the arbiter to let go of every fd the dropped client held")
    assert_no_traceback(pipe_dir)


def test_a_corrupted_lane_tail_found_by_the_drain_pass_drops_its_client(daemon):
    _process, pipe_dir = daemon
    bystander, program, x, y = honest(pipe_dir)
    with bystander, libshare.connect(name="corrupt", mode="daemon", pipe_directory=pipe_dir) as session:
        own = session.load_program(SAXPY)
        a, b = session.array(64), session.array(64)
        session.dispatch(own, 1, [a, b], PUSH).wait(10)
        lane = session._gate.attached.region.lane_count - 1  # not the one this thread pushes from
        corrupt_lane_tail(session, lane)
        bystander.alloc(4096)  # a task: the drain pass after it looks at every ring
        wait_until(lambda: session._gate.attached.region.peers.close_reason() == C.ECORRUPT, 30, "the arbiter to drop the client")
        assert_dropped(session, own, a, b, pipe_dir, f"submission lane {lane}")
        assert round_trips(bystander, program, x, y, 5), "the others are served as before"
    assert_no_traceback(pipe_dir)  # a drop during the drain pass's look at every ring raised there


def test_a_request_right_after_the_drop_is_refused_before_the_control_thread_heard_of_it(tmp_path):
    """The engine closes a corrupt ring at once, and the control thread hears of it later. A
    request in between (here: the control thread held busy by a task) is still refused as the
    drop says, never granted to the dropped client."""
    from libshare.arbiter import Arbiter

    tmp_path.chmod(0o700)
    arbiter = Arbiter()
    arbiter.serve(tmp_path / "control")
    started, release = threading.Event(), threading.Event()
    try:
        with libshare.connect(name="corrupt", mode="daemon", pipe_directory=tmp_path) as session:
            own = session.load_program(SAXPY)
            a, b = session.array(64), session.array(64)
            session.dispatch(own, 1, [a, b], PUSH).wait(10)
            arbiter.drainer.post(lambda: (started.set(), release.wait(60)))
            assert started.wait(30), "the control thread did not take the blocking task"
            corrupt_completion_head(session)
            session.dispatch(own, 1, [a, b], PUSH)  # rings the doorbell: the engine drops the ring
            wait_until(lambda: session._gate.attached.region.peers.close_reason() == C.ECORRUPT, 30, "the engine to drop the client")
            replies = []
            sender = threading.Thread(target=lambda: replies.append(raw_alloc(session)))
            sender.start()
            wait_until(lambda: arbiter.drainer.tasks.queue.qsize() > 0, 30, "the request to wait for the control thread")
            release.set()
            sender.join(30)
            assert replies and not replies[0]["ok"] and replies[0]["error"] == "RingCorrupted", replies
            assert "completion ring" in replies[0]["message"], replies[0]["message"]
    finally:
        release.set()
        arbiter.close()


# ---------------------------------------------------------------- roles (separate processes)


def steal(pipe_dir: str) -> None:
    """Read this session's doorbell in a loop, hoping to swallow the others' wake-ups; at EOF on
    stdin, print how many reads got something and the doorbell's inode, and exit."""
    session = libshare.connect(name="stealer", mode="daemon", pipe_directory=pipe_dir)
    bell = session._gate.attached.wake_fd
    got = [0]

    def report_at_eof():
        sys.stdin.read()
        print(got[0], os.fstat(bell).st_ino, flush=True)
        os._exit(0)

    threading.Thread(target=report_at_eof, daemon=True).start()
    print("ready", flush=True)
    while True:
        try:
            os.eventfd_read(bell)
            got[0] += 1
        except OSError:
            pass


def pace(pipe_dir: str) -> None:
    """Send a request 60 us after each reply (the pace busy-waited: a sleep's timer slack can pass
    200 us), until EOF on stdin: print 'pacing N' after the first N (PACED_FIRST), 'served N' (the
    requests answered so far) for each line read, then exit at EOF."""
    import time

    session = libshare.connect(name="pacer", mode="daemon", pipe_directory=pipe_dir)
    session.stats()
    stop = threading.Event()
    served = [0]

    def answer_counts():
        for _line in sys.stdin:
            print("served", served[0], flush=True)
        stop.set()

    threading.Thread(target=answer_counts, daemon=True).start()
    print("ready", flush=True)
    while not stop.is_set():
        session.stats()
        served[0] += 1
        if served[0] == PACED_FIRST:
            print("pacing", served[0], flush=True)
        paced = time.perf_counter() + 60e-6
        while time.perf_counter() < paced:
            pass
    os._exit(0)


def hammer(pipe_dir: str) -> None:
    """Write this session's doorbell in a tight loop (with the ring's NEED_WAKEUP flag set, as a
    producer that rings on every push would), while answering each stdin line 'dispatch' with
    one saxpy round trip: 'ok' or the error's class. Exits at EOF."""
    session = libshare.connect(name="hammer", mode="daemon", pipe_directory=pipe_dir)
    program = session.load_program(SAXPY)
    x, y = session.array(64), session.array(64)
    bell = session._gate.attached.wake_fd
    flags = np.frombuffer(session._gate.attached.region._map, np.uint32, count=1,
                          offset=ffi.sizeof("struct ls_region_header") + ffi.offsetof("struct ls_bells", "sq_flags"))

    def ring():
        while True:
            flags[0] = lib.LS_NEED_WAKEUP
            try:
                os.eventfd_write(bell, 1)
            except OSError:
                pass  # full: rings pile up

    threading.Thread(target=ring, daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "dispatch":
            try:
                session.dispatch(program, 1, [x, y], PUSH).wait(30)
                print("ok", flush=True)
            except libshare.LibshareError as exc:
                print(type(exc).__name__, flush=True)
    os._exit(0)  # the ringing thread never ends


def _ring_for_ever(bell: int) -> None:
    while True:
        try:
            os.eventfd_write(bell, 1)
        except OSError:
            pass  # full: rings pile up


def fill_completions(pipe_dir: str) -> None:
    """Push NOPs until the completion ring is full and a few more wait behind it in the lanes,
    reading no completion; at the stdin line 'ring', write its doorbell in a loop from then on; at
    'read', read them all (every ticket must be answered, the ones that waited too) and print
    'ok N'. Exits at EOF."""
    session = libshare.connect(name="filler", mode="daemon", pipe_directory=pipe_dir)
    region = session._gate.attached.region
    producers = []
    for lane in range(region.lane_count):  # every lane, under made-up thread ids
        out = ffi.new("ls_producer **")
        if lib.ls_producer_open(region._c(), 1 << 22 | lane, os.getpid(), out) == 0:
            producers.append(out[0])
    wanted, pushed, capacity = region.cq_entries + 8, 0, sum(lib.ls_space(p) for p in producers)
    while pushed < wanted:
        if not any(lib.ls_push_op(p, pushed + 1, C.OP_NOP, 0, 0, 0, 0, 0, ffi.NULL, 0, ffi.NULL, ffi.NULL, 0) == 1
                   for p in producers):  # every lane full: wait until the engine has popped (answered) one
            region.completions.wait(pushed - capacity + 1, timeout=30)
            continue
        pushed += 1
    region.completions.wait(region.cq_entries, timeout=30)  # answered as far as its slots go: full
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "ring":  # write its doorbell in a loop, as if its pushes rang
            threading.Thread(target=_ring_for_ever, args=(session._gate.attached.wake_fd,), daemon=True).start()
            print("ringing", flush=True)
        if line.strip() == "read":
            answered = set()
            while len(answered) < wanted:
                region.completions.wait(1, timeout=30)
                answered.update(int(t) for t in region.completions.take()["ticket"])
            print("ok", len(answered), flush=True)
    os._exit(0)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])


def test_descriptors_rung_through_a_doorbell_are_not_kept(daemon):
    """A doorbell is a datagram socket: a client may attach descriptors to its rings. The arbiter
    reads rings without taking them, so the kernel closes them; none accumulates in the arbiter."""
    import socket

    process, pipe_dir = daemon
    session, program, x, y = honest(pipe_dir)
    with session:
        assert round_trips(session, program, x, y, 5)
        before = open_fds(process.pid)
        bell = socket.socket(fileno=os.dup(session._gate.attached.wake_fd))
        spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(4)]
        try:
            sent = 0
            for _ in range(2000):
                try:
                    sent += bell.sendmsg([b"\1" * 8], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("4i", *spare))])
                except BlockingIOError:  # the least send buffer is full: let the arbiter read some
                    assert round_trips(session, program, x, y, 1)
            assert sent > 0
            assert round_trips(session, program, x, y, 20), "the honest work goes on"
            assert open_fds(process.pid) <= before + 2, "the arbiter keeps descriptors rung to it"
        finally:
            bell.close()
            for fd in spare:
                os.close(fd)
    assert_no_traceback(pipe_dir)


@pytest.mark.parametrize("mode", ["throughput", "fairshare"])
def test_a_client_that_never_reads_its_completions_stalls_no_one(daemon, mode):
    """A client whose completion ring is full, with work waiting behind it in its lanes, can be
    given nothing more until it reads. The engine counted it as waiting all the same: it polled
    that ring with a core flat out for as long as the client stayed, and fairshare, finding it the
    least served, held every other client back (an honest round trip took 25.7 s, until the
    filler exited). Now it is not waiting, the engine sleeps, and its read wakes the engine."""
    process, pipe_dir = daemon
    assert _control.run("set_scheduling_mode", mode, pipe_directory=pipe_dir) == mode
    session, program, x, y = honest(pipe_dir)
    with session:
        assert round_trips(session, program, x, y) == ROUNDS  # device time: ahead of the filler
        filler = start_attacker("fill_completions", pipe_dir)
        try:
            assert round_trips(session, program, x, y) == ROUNDS  # held back, they would time out
            assert np.all(y == 2.0 * ROUNDS)
            assert_rests(process.pid, "stalled")
            filler.stdin.write("ring\n")  # its rings were never charged: a core, and others' p99 x25
            filler.stdin.flush()
            assert filler.stdout.readline().strip() == "ringing"
            wait_until(lambda: MUTED in server_log(pipe_dir), 30, "the arbiter to mute the stalled client's doorbell")
            assert_rests(process.pid, "rung")
            filler.stdin.write("read\n")
            filler.stdin.flush()
            assert filler.stdout.readline().split() == ["ok", "1032"]  # the 8 that waited were answered
        finally:
            stop_attacker(filler)
    assert_no_traceback(pipe_dir)
