"""Attacks on the arbiter's connections and control messages, each performed against a real daemon.

Idle and half-sent connections, descriptors sent unasked, hostile control messages (a seeded
fuzz with an honest client alongside), descriptor exhaustion at accept, at hello and by
shared buffers, and a peer of another uid. See the essays of libshare/arbiter/serve/server.py,
serve/gate.py (and its parts, serve/gate_*.py) and libshare/protocol/wire.py for the defences.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import math
import os
import random
import resource
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import termios
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.protocol import control as _control
from libshare.protocol import wire as protocol
from libshare.errors import AccessDenied, QuotaExceeded, TooManyClients

from tests.conftest import ROOT, stop_process
from tests.arbiter.conftest import open_fds, run_daemon, start_client, wait_until

HEADER = struct.Struct("<IHHII")
NOBODY = 65534


# -------------------------------------------------------------------- helpers

@contextlib.contextmanager
def start_arbiter(pipe_dir: Path, *args: str, nofile: tuple[int, int] | None = None, **env):
    """Like conftest.run_daemon, with arbiter options and an open-file limit (soft, hard) to start with."""
    stderr_path = pipe_dir.parent / f"{pipe_dir.name}.stderr"
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)) if nofile else None
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir),
                                    *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                   env={**os.environ, **env}, preexec_fn=limit)
    try:
        wait_until(lambda: (pipe_dir / "control").exists() or process.poll() is not None, what="the arbiter")
        assert process.poll() is None, stderr_path.read_text()[-2000:]
        yield process, pipe_dir
    finally:
        stop_process(process)


def control(pipe_dir, command: str, *args: str) -> str:
    return _control.run(command, *args, pipe_directory=pipe_dir)


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def server_log(pipe_dir: Path) -> str:
    return (pipe_dir / "server.log").read_text()


def connect_raw(pipe_dir: Path) -> socket.socket:
    sock = protocol.dial(pipe_dir / "control", 30.0)
    assert sock is not None
    sock.settimeout(60)
    return sock


def frame(fields=None, payload: bytes = b"", body: bytes | None = None) -> bytes:
    """One frame's bytes: ``fields`` as JSON (or ``body`` as it is) and ``payload``."""
    if body is None:
        body = json.dumps(fields).encode()
    return HEADER.pack(protocol.MAGIC, protocol.VERSION, 0, len(body), len(payload)) + body + payload


def reply(sock: socket.socket, max_fds: int = 0) -> dict:
    answer = protocol.recv(sock, max_fds=max_fds)
    answer.close_fds()
    return answer.fields


def session_raw(pipe_dir: Path) -> socket.socket:
    """A session that said hello by hand (its ring and doorbell closed at once)."""
    sock = connect_raw(pipe_dir)
    sock.sendall(frame({"op": "hello", "name": "raw", "version": 1}))
    assert reply(sock, max_fds=protocol.MAX_FDS)["ok"]
    return sock


def gone(sock: socket.socket) -> bool:
    """True when the arbiter closed ``sock`` (after any replies it sent first)."""
    try:
        while True:
            protocol.recv(sock, max_fds=protocol.MAX_FDS).close_fds()
    except EOFError:
        return True


def limit_leaving(pid: int, free: int) -> int:
    """The soft open-file limit under which process ``pid`` has exactly ``free`` descriptor numbers left."""
    used = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
    number = found = 0
    while True:
        if number not in used:
            if found == free:
                return number
            found += 1
        number += 1


def own_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"needs {wanted} open files (hard limit {hard})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def saxpy_checked(session) -> None:
    """One saxpy on the device, checked against numpy."""
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(1024, np.float32), session.array(1024, np.float32)
    x[:] = np.arange(1024, dtype=np.float32)
    y[:] = 1.0
    session.dispatch(program, 16, [x, y], struct.pack("If", 1024, 2.0)).wait(60)
    assert np.array_equal(y, 2.0 * np.arange(1024, dtype=np.float32) + 1.0)


@pytest.fixture
def strict_daemon(tmp_path, vulkan_device_name):
    """A daemon with short bounds: 2 s to say hello, 1 s to finish a frame begun."""
    yield from run_daemon(tmp_path / "pipe", LIBSHARE_HELLO_TIMEOUT="2", LIBSHARE_REQUEST_TIMEOUT="1")


# -------------------------------------------------------------------- accept, idle and slow connections

def test_accept_survives_running_out_of_descriptors(daemon):
    process, pipe_dir = daemon
    soft, hard = resource.prlimit(process.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (limit_leaving(process.pid, 0), hard))
    client = start_client("mixed", pipe_dir, 1, 3)  # its connection waits in the listen queue
    try:
        try:
            wait_until(lambda: "accept() failed" in server_log(pipe_dir), what="the failed accept in server.log")
        finally:
            resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (soft, hard))
        assert client.communicate(timeout=120)[0].strip() == "ok"
    finally:
        stop_process(client)
    assert "accepting connections again" in server_log(pipe_dir)
    assert control(pipe_dir, "quit").startswith(f"arbiter pid {process.pid}")
    assert process.wait(timeout=60) == 0


def test_idle_connections_cost_no_thread_and_are_closed(strict_daemon):
    process, pipe_dir = strict_daemon
    own_fd_limit(2300)
    operator = _control.ControlConnection(pipe_dir)
    assert operator.run("get_server_status") == "ACTIVE"  # now it idles in the gate between commands
    before = open_fds(process.pid)
    idle = [connect_raw(pipe_dir) for _ in range(2000)]  # none ever speaks
    try:
        assert threads(process.pid) < 50  # one each: 2,007
        assert open_fds(process.pid) < before + 600  # the gate holds at most 512
        assert operator.run("get_server_status") == "ACTIVE"  # closed to make room: it dials again
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir, timeout=30) as session:
            saxpy_checked(session)
        oldest, newest = idle[0], idle[-1]
        evicted = reply(oldest)
        assert evicted["error"] == "TooManyClients" and "too many connections" in evicted["message"]
        assert gone(oldest)
        late = reply(newest)
        assert late["error"] == "ProtocolError" and "no hello" in late["message"], late
        assert gone(newest)
        wait_until(lambda: open_fds(process.pid) < before + 10, what="the idle connections to be closed")
        assert "closed to make room for a newer connection" in server_log(pipe_dir)  # logged, summed up
    finally:
        operator.close()
        for sock in idle:
            sock.close()


def test_an_idle_control_connection_closed_to_make_room_sends_its_command_again(strict_daemon, monkeypatch):
    """The race that a flood opens: the operator's tool finds its idle connection open, sends
    a command, and the gate closes the connection (to make room) before reading it. The gate
    closes it without a word, and the tool runs the command on a new connection."""
    process, pipe_dir = strict_daemon
    own_fd_limit(1300)
    operator = _control.ControlConnection(pipe_dir)
    assert operator.run("get_server_status") == "ACTIVE"
    idle = [connect_raw(pipe_dir) for _ in range(1000)]
    try:
        wait_until(operator._closed_by_arbiter, what="the operator's idle connection to be closed for room")
        assert operator._sock.recv(1, socket.MSG_PEEK) == b""  # closed, and told nothing
        monkeypatch.setattr(operator, "_closed_by_arbiter", lambda: False)  # it looked just before
        assert operator.run("get_server_status") == "ACTIVE"
    finally:
        operator.close()
        for sock in idle:
            sock.close()
    assert process.poll() is None


def test_a_frame_begun_and_not_finished_is_dropped(strict_daemon):
    process, pipe_dir = strict_daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as honest:
        stalled_session = session_raw(pipe_dir)
        stalled_session.sendall(frame({"op": "stats"})[:10])  # part of a header, then nothing
        stalled_hello = connect_raw(pipe_dir)
        stalled_hello.sendall(frame({"op": "hello", "name": "slow"})[:20])  # a header and part of the body
        for sock in (stalled_session, stalled_hello):
            answer = reply(sock)
            assert answer["error"] == "ProtocolError" and "not finished within 1 s" in answer["message"], answer
            assert gone(sock)
            sock.close()
        assert honest.stats()["clients"] == 1  # idle between requests for longer than that: fine
        saxpy_checked(honest)


# -------------------------------------------------------------------- descriptors in messages

def test_descriptors_a_message_should_not_carry_are_closed_at_once(daemon):
    process, pipe_dir = daemon
    null = os.open(os.devnull, os.O_RDONLY)
    session = session_raw(pipe_dir)
    try:
        before = open_fds(process.pid)
        body = b'{"op":"stats"}' + b" " * 4000  # sent a byte at a time, four descriptors on each byte
        session.sendall(HEADER.pack(protocol.MAGIC, protocol.VERSION, 0, len(body), 0))
        peak = 0
        for i in range(len(body)):
            session.sendmsg([body[i:i + 1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * 4))])
            if i % 400 == 0:
                peak = max(peak, open_fds(process.pid))
        answer = reply(session)
        assert answer["error"] == "ProtocolError" and "file descriptors" in answer["message"], answer
        assert peak < before + 8  # 16,000 were sent
        session.sendmsg([frame({"op": "stats"})], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                    array.array("i", [null] * 250))])  # 250 in one message
        assert reply(session)["error"] == "ProtocolError"
        session.sendall(frame({"op": "stats"}))  # the connection lives on
        assert reply(session)["ok"]
        assert open_fds(process.pid) < before + 8

        operator = connect_raw(pipe_dir)  # before hello: the gate reads the frame
        request = frame({"op": "control", "command": "get_server_status"})
        operator.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * 4))])
        assert reply(operator)["error"] == "ProtocolError"
        operator.sendall(request)
        assert reply(operator) == {"ok": True, "output": "ACTIVE"}
        operator.close()
        assert open_fds(process.pid) < before + 8
    finally:
        session.close()
        os.close(null)


# -------------------------------------------------------------------- malformed requests: the fuzz

_DEEP_LIST = "[" * 30_000 + "]" * 30_000  # under the 64 KiB bound of a first frame, far past any nesting limit
_DEEP_OBJECT = '{"a":' * 5_000 + "1" + "}" * 5_000


def hostile_value(rng: random.Random):
    """A JSON value of the wrong type, range or shape for any field of any request."""
    pick = rng.randrange(16)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([-1, -(1 << 70), 1 << 64, 1 << 200, 10 ** 300])
    if pick == 3:
        return rng.choice([0.5, -3.25, 1e308, math.nan, math.inf, -math.inf])
    if pick == 4:
        return "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 40)))
    if pick == 5:
        return "x" * rng.choice([5_000, 60_000])
    if pick == 6:
        return [rng.randrange(10) for _ in range(rng.randrange(1, 5))]
    if pick == 7:
        return {"k": rng.randrange(10), "l": [1, {"m": None}]}
    if pick == 8:
        value = []
        for _ in range(rng.randrange(2, 60)):
            value = [value]
        return value
    if pick == 9:
        return [[]] * 20
    if pick == 10:
        return {str(i): i for i in range(rng.randrange(20, 40))}
    if pick == 11:
        return "\n\x1b[2J\x00\ud800"
    if pick == 12:
        return rng.choice(["", " ", "shared ", "SHARED", "devicee"])
    if pick == 13:
        return [None]
    if pick == 14:
        return rng.choice([{"": -5}, {"": "1G"}, {"0": 1.5}, {"a" * 100: 1}])
    return {"op": "hello"}


def not_text(rng: random.Random):
    """A hostile value that is not a string."""
    while isinstance(value := hostile_value(rng), str):
        pass
    return value


def hostile_session_request(rng: random.Random):
    """(fields or raw body, payload) of a session request that is wrong in at least one way."""
    kind = rng.randrange(12)
    if kind == 0:
        return {"op": hostile_value(rng)}, b""
    if kind == 1:
        return {"op": rng.choice(["allocate", "hello", "control", "free_all", "", "ALLOC"])}, b""
    if kind == 2:
        return {"op": "alloc", "size": hostile_value(rng)}, b""
    if kind == 3:
        return {"op": "alloc", "size": 4096, "kind": hostile_value(rng)}, b""
    if kind == 4:
        key = rng.choice(["buffer_id", "program_id"])
        value = hostile_value(rng)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            value = -1 - value  # an id in range is a request for a real buffer
        return {"op": "free", key: value}, b""
    if kind == 5:
        return rng.choice([{"op": "free"}, {"op": "free", "buffer_id": 1, "program_id": 1},
                           {"op": "free", "buffer_id": 10 ** 12}]), b""
    if kind == 6:
        return {"op": rng.choice(["stats", "alloc", "free"]), rng.choice(["x", "size2", "op "]): hostile_value(rng)}, b""
    if kind == 7:
        return {"op": "stats"}, b"\x03\x02\x23\x07"  # a payload where none belongs
    if kind == 8:
        return {"op": "load_program", "extra": 1} if rng.random() < 0.5 else {"op": "load_program"}, b""
    if kind == 9:
        return rng.choice([_DEEP_LIST, _DEEP_OBJECT]).encode(), b""
    if kind == 10:
        return rng.choice([b"[1, 2]", b"42", b'"op"', b"null", b"\xff\xfe{", b'{"op": "stats"', b"{,}",
                           b'{"op": 1' + b"9" * 5_000 + b"}", b"NaN"]), b""
    return {"op": "alloc", "size": rng.choice([0, (1 << 40) + 1, -4096])}, b""


def hostile_hello(rng: random.Random):
    fields = {"op": "hello", "name": "fuzz", "version": 1}
    kind = rng.randrange(10)
    if kind == 0:
        fields["name"] = rng.choice([not_text(rng), "n" * 2000])
    elif kind == 1:
        fields["version"] = rng.choice([-1, 1 << 40, "1", None, [1]])
    elif kind == 2:
        fields["priority"] = rng.choice(["bogus", "HIGHEST", not_text(rng)])
    elif kind == 3:
        fields["group"] = rng.choice(["evil\ngroup", "\x1b[31m", [], "g" * 300])
    elif kind == 4:
        fields["share"] = rng.choice(["0", "101", "abc", 1000, -5, [50], 50.5])
    elif kind == 5:
        fields["mem_limit"] = rng.choice([[], "1G", {"": -1}, {"": 1.5}, {str(i): 1 for i in range(30)}])
    elif kind == 6:
        fields[rng.choice(["pid", "uid", "client_id"])] = hostile_value(rng)
    elif kind == 7:
        fields["op"] = rng.choice(["HELLO", "hello ", "stats", hostile_value(rng)])
    elif kind == 8:
        fields[rng.choice(["reattach", "device_info"])] = rng.choice([1, 0, "true", None, [True], {"": True}])  # flags
    else:
        return rng.choice([_DEEP_LIST, b"[]", b"\x00"]) if rng.random() < 0.5 else fields, b"payload"
    return fields, b""


def hostile_control(rng: random.Random):
    kind = rng.randrange(8)
    if kind == 0:
        return {"op": "control", "command": hostile_value(rng)}
    if kind == 1:
        return {"op": "control", "command": rng.choice(["bogus", "PS", "ps ", "_ps", "__init__", "serve"])}
    if kind == 2:
        return {"op": "control", "command": "ps", "args": hostile_value(rng)}
    if kind == 3:
        return {"op": "control", "command": "ps", "args": [hostile_value(rng)]}
    if kind == 4:
        return {"op": "control", "command": rng.choice(["ps", "get_client_list", "get_server_status"]),
                "args": rng.choice([["-x"], ["-p", "abc"], ["-p"], ["1", "2", "3"], ["a"] * 17, ["x" * 5000]])}
    if kind == 5:
        return {"op": "control", "command": "get_server_status", rng.choice(["extra", "argv"]): hostile_value(rng)}
    if kind == 6:
        return {"op": rng.choice(["hello", "stats", "Control"]), "command": "ps"}
    return {"op": "control", "command": rng.choice(["quit", "terminate_client", "set_client_priority"]),
            "args": rng.choice([["-t", "nope"], ["x", "y", "z", "w"], ["-1"], ["1", "realtime", "extra"]])}


def send_hostile(sock: socket.socket, message) -> None:
    fields, payload = message if isinstance(message, tuple) else (message, b"")
    if isinstance(fields, bytes):
        sock.sendall(frame(body=fields, payload=payload))
    else:
        sock.sendall(frame(fields, payload))


def test_hostile_messages_are_answered_and_the_connection_lives_on(daemon):
    process, pipe_dir = daemon
    rng = random.Random(12)
    honest = start_client("mixed", pipe_dir, 7, 60)  # checks every result against numpy
    session, operator = session_raw(pipe_dir), connect_raw(pipe_dir)
    refused = {"ProtocolError": 0, "InvalidSubmission": 0}
    hello = connect_raw(pipe_dir)
    try:
        for i in range(10_000):
            kind = i % 3
            if kind == 0:
                sock, message = session, hostile_session_request(rng)
            elif kind == 1:
                sock, message = operator, hostile_control(rng)
            else:
                if i % 1500 == 2:  # a connection has 10 s to say hello: a fresh one now and then
                    hello.close()
                    hello = connect_raw(pipe_dir)
                sock, message = hello, hostile_hello(rng)
            send_hostile(sock, message)
            answer = reply(sock)
            assert answer["ok"] is False and answer["error"] in refused, (i, repr(message)[:300], answer)
            refused[answer["error"]] += 1
        # Every connection still works.
        session.sendall(frame({"op": "stats"}))
        assert reply(session)["ok"]
        operator.sendall(frame({"op": "control", "command": "get_server_status"}))
        assert reply(operator)["output"] == "ACTIVE"
        hello.sendall(frame({"op": "hello", "name": "late", "version": 1}))
        assert reply(hello, max_fds=protocol.MAX_FDS)["ok"]
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        for sock in (session, operator, hello):
            sock.close()
        stop_process(honest)
    assert min(refused.values()) > 1000, refused
    log = server_log(pipe_dir)
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert process.poll() is None and control(pipe_dir, "get_server_status") == "ACTIVE"


# -------------------------------------------------------------------- descriptors: hello and buffers

def test_a_hello_that_runs_out_of_descriptors_leaves_no_ghost(tmp_path, vulkan_device_name):
    with start_arbiter(tmp_path / "pipe", "--max-clients", "3") as (process, pipe_dir):
        soft, hard = resource.prlimit(process.pid, resource.RLIMIT_NOFILE)
        script = ("import sys, libshare\n"
                  "try:\n"
                  "    libshare.connect(mode='daemon', pipe_directory=sys.argv[1], timeout=60).close()\n"
                  "    print('ok')\n"
                  "except libshare.LibshareError as exc:\n"
                  "    print(type(exc).__name__, exc)\n")
        outcomes = []
        for free in range(1, 7):  # the descriptors run out at each step of the hello in turn
            resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (limit_leaving(process.pid, free), hard))
            try:
                outcome = subprocess.run([sys.executable, "-c", script, str(pipe_dir)], cwd=ROOT, text=True,
                                         capture_output=True, timeout=120).stdout.strip()
            finally:
                resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (soft, hard))
            outcomes.append(outcome)
            assert outcome == "ok" or outcome.startswith(("TooManyClients", "QuotaExceeded")), outcomes
            wait_until(lambda: control(pipe_dir, "get_client_list") == "", what=f"no client left ({outcomes})")
        assert "ok" in outcomes and any(o != "ok" for o in outcomes), outcomes
        sessions = [libshare.connect(mode="daemon", pipe_directory=pipe_dir) for _ in range(3)]
        try:
            with pytest.raises(TooManyClients):
                libshare.connect(mode="daemon", pipe_directory=pipe_dir)
        finally:
            for session in sessions:
                session.close()


def test_shared_buffers_cannot_take_the_descriptors_of_clients_to_come(tmp_path, vulkan_device_name):
    """More shared buffers than the arbiter has descriptors: each costs it none once handed over
    (its mapping keeps no descriptor), so they cannot crowd out the clients still to come."""
    own_fd_limit(2048)  # this process holds every buffer's memfd
    with start_arbiter(tmp_path / "pipe", "--max-clients", "24", nofile=(256, 600)) as (process, pipe_dir):
        assert resource.prlimit(process.pid, resource.RLIMIT_NOFILE) == (600, 600)  # raised to the hard limit
        greedy = libshare.connect(mode="daemon", pipe_directory=pipe_dir)
        others = []
        try:
            before = open_fds(process.pid)
            held = [greedy.alloc(4096) for _ in range(700)]  # past the arbiter's whole limit
            assert open_fds(process.pid) <= before + 2, "shared buffers cost the arbiter descriptors"
            others += [libshare.connect(mode="daemon", pipe_directory=pipe_dir) for _ in range(23)]
            assert all(s.stats()["clients"] == 24 for s in others)
            with pytest.raises(TooManyClients):
                libshare.connect(mode="daemon", pipe_directory=pipe_dir)
            for buffer in held[:20]:
                greedy.free(buffer)
            held.append(greedy.alloc(4096))
            assert greedy.stats()["clients"] == 24
        finally:
            for session in others:
                session.close()
            greedy.close()
        assert open_fds(process.pid) <= 600


def test_an_arbiter_whose_hard_limit_cannot_hold_max_clients_does_not_start(tmp_path, vulkan_device_name):
    started = subprocess.run([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(tmp_path / "pipe"),
                              "--max-clients", "100"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)))
    assert started.returncode == 1
    assert "100 clients need about" in started.stderr and "the hard limit is 256" in started.stderr, started.stderr


# -------------------------------------------------------------------- another user

def as_uid(uid: int, fn) -> str:
    """Run ``fn`` in a forked child that has become ``uid``; its result (or error class) as text.

    A fork, not a new interpreter: the venv's Python under /root is not readable by other users.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here on
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                result = str(fn())
            except BaseException as exc:
                result = f"{type(exc).__name__}: {exc}"
            os.write(write, result.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.fixture
def open_base(vulkan_device_name):
    """A directory every user may enter (pytest's own are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="libshare-users-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another uid")


@needs_root
def test_another_uid_gets_access_denied(open_base):
    with start_arbiter(open_base / "pipe") as (_process, pipe_dir):
        assert (pipe_dir.stat().st_mode & 0o777, (pipe_dir / "control").stat().st_mode & 0o777) == (0o700, 0o600)
        connected = as_uid(NOBODY, lambda: libshare.connect(mode="daemon", pipe_directory=pipe_dir))
        assert connected.startswith("AccessDenied: uid 65534 may not connect"), connected
        queried = as_uid(NOBODY, lambda: control(pipe_dir, "get_server_status"))
        assert queried.startswith("AccessDenied"), queried


@needs_root
def test_multi_user_mode_serves_other_users_and_hides_the_details_of_clients(open_base):
    with start_arbiter(open_base / "pipe", "--multi-user") as (process, pipe_dir):
        assert (pipe_dir.stat().st_mode & 0o777, (pipe_dir / "control").stat().st_mode & 0o777) == (0o711, 0o666)
        secret = subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", "allocator", str(pipe_dir),
                                   "pw=hunter2"], cwd=ROOT, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert secret.stdout.readline().strip() == "ready"
            assert "hunter2" in control(pipe_dir, "ps")  # root sees everything

            def nobody_works():
                with libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="nobody's") as session:
                    data = session.array(1024, np.uint32)
                    data[:] = 5
                    table = control(pipe_dir, "ps")
                    return f"{session.stats()['clients']}|{int(data.sum())}|{table}"

            clients, total, table = as_uid(NOBODY, nobody_works).split("|", 2)
            assert (clients, total) == ("2", "5120"), table
            rows = {row.split()[0]: row for row in table.splitlines()[1:]}
            assert "hunter2" not in table and "allocator" not in table, table
            assert "(another user's client)" in rows[str(secret.pid)], table
            assert "nobody's" in table  # its own client it sees in full
            assert as_uid(NOBODY, lambda: control(pipe_dir, "quit")).startswith("AccessDenied")
            for priority in ("high", "realtime"):  # it would hold everyone else to a slice per pass
                asked = as_uid(NOBODY, lambda: libshare.connect(mode="daemon", pipe_directory=pipe_dir,
                                                                priority=priority))
                assert asked.startswith("AccessDenied") and "above the default" in asked, asked
            with_low = as_uid(NOBODY, lambda: libshare.connect(mode="daemon", pipe_directory=pipe_dir,
                                                               priority="low").close())
            assert with_low == "None", with_low  # lowering its own priority is its right
            for query in (("get_active_thread_percentage", str(secret.pid)),  # they answered 100 and 3G (client)
                          ("get_device_pinned_mem_limit", str(secret.pid), "0")):
                assert control(pipe_dir, *query)  # root may ask
                answer = as_uid(NOBODY, lambda: control(pipe_dir, *query))
                assert answer.startswith("InvalidSubmission") and "no client with pid" in answer, (query, answer)
            for log in ("server.log", "control.log"):  # they name every client and its group
                assert (pipe_dir / log).stat().st_mode & 0o007 == 0, log
                assert as_uid(NOBODY, lambda: (pipe_dir / log).read_text()).startswith("PermissionError"), log
            assert process.poll() is None
        finally:
            secret.communicate("", timeout=60)


def _pipeline_unread(pipe_dir: Path, commands: int) -> socket.socket:
    """A control connection that sends ``commands`` commands (as many as its socket takes) and
    reads no reply: an unknown command, whose reply (the list of commands) is 700 bytes."""
    sock = connect_raw(pipe_dir)
    sock.setblocking(False)
    request = frame({"op": "control", "command": "no_such_command"})
    with contextlib.suppress(BlockingIOError):
        for _ in range(commands):
            sock.send(request)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the arbiter has closed ``sock`` (its end hung up, or reset), looked at without reading:
    reading the replies of a jammer not closed yet unjammed it, and the arbiter went on with its
    3,000 commands (the test waited 30 s on the first of them still open, and failed)."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)
    return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


def _unread(sock: socket.socket) -> int:
    """Bytes waiting in ``sock`` to be read (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def test_control_peers_that_read_no_reply_hold_no_worker(tmp_path, vulkan_device_name):
    """Eight connections pipeline commands and read none of the replies. Sent blocking, each reply
    held one of the four control workers until the request bound (20 s here): the operator's
    command waited that long. Now the gate sends what the socket does not take, reads no more of
    that connection meanwhile, and closes it once the bound passes."""
    with start_arbiter(tmp_path / "pipe", LIBSHARE_REQUEST_TIMEOUT="20") as (process, pipe_dir):
        jammers = [_pipeline_unread(pipe_dir, 3000) for _ in range(8)]
        try:
            wait_until(lambda: any(_unread(sock) > 10_000 for sock in jammers), what="a jammer's replies to pile up")
            for _ in range(5):
                assert _control.run("get_server_status", pipe_directory=pipe_dir, timeout=10) == "ACTIVE"
            with libshare.connect(mode="daemon", pipe_directory=pipe_dir, timeout=10) as session:
                saxpy_checked(session)
            wait_until(lambda: "a control reply not read within 20 s" in server_log(pipe_dir), 60,
                       "the jammers to be closed")
            wait_until(lambda: all(_closed_by_peer(sock) for sock in jammers), 60, "every jammer to be closed")
        finally:
            for sock in jammers:
                sock.close()
        assert process.poll() is None


def _flood_as(uid: int, pipe_dir: Path, connections: int) -> tuple[int, int]:
    """Fork a process of ``uid`` that keeps ``connections`` control connections busy (each sends
    a cheap command again as soon as its reply comes, and one closed is dialled again); (its pid,
    the write end of a pipe whose closing stops it), once every connection has sent a command."""
    ready_read, ready_write = os.pipe()
    stop_read, stop_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here on
        try:
            os.close(ready_read), os.close(stop_write)
            os.setgroups([]), os.setgid(uid), os.setuid(uid)
            request = frame({"op": "control", "command": "get_server_list"})

            def busy() -> socket.socket:
                while True:
                    sock = protocol.dial(pipe_dir / "control", 30.0)
                    try:
                        sock.sendall(request)
                        return sock
                    except OSError:
                        sock.close()

            socks = [busy() for _ in range(connections)]
            os.write(ready_write, b"ready")  # every connection has sent its command
            os.close(ready_write)
            ready_write = -1
            while True:
                readable, _, _ = select.select(socks + [stop_read], [], [], 30)
                if stop_read in readable:
                    break
                for sock in readable:
                    try:
                        if sock.recv(65536):
                            sock.sendall(request)
                            continue
                    except OSError:
                        pass
                    sock.close()  # closed to make room: dial again
                    socks[socks.index(sock)] = busy()
        except BaseException as exc:
            if ready_write >= 0:
                os.write(ready_write, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(ready_write), os.close(stop_read)
    with os.fdopen(ready_read, "rb") as ready:
        said = ready.read()
        assert said == b"ready", f"the flood did not start: {said}"
    return pid, stop_write


@needs_root
def test_another_uids_control_commands_cannot_take_every_place_in_the_gate(open_base):
    """A connection out with a control worker cannot be closed to make room, and was not counted
    against its uid's quarter of the gate's places: a user whose 520 connections each had a command
    queued behind busy workers held all 512 places, and root's sessions and commands were refused
    (0 of 10). The other uid's commands are held here until the end, as slow workers would be."""
    from libshare.arbiter import Arbiter

    pipe_dir = open_base / "pipe"
    pipe_dir.mkdir(mode=0o711)
    arbiter, release = Arbiter(multi_user=True), threading.Event()
    try:
        arbiter.serve(pipe_dir / "control")
        gate = arbiter._gate
        run_control = gate.control.run_control
        gate.control.run_control = lambda fields, pid, uid: (release.wait(60) if uid == NOBODY else None,
                                                             run_control(fields, pid, uid))[1]
        pid, stop = _flood_as(NOBODY, pipe_dir, 520)
        try:
            wait_until(lambda: gate.population >= 128, what="the other uid's commands to wait for workers")
            with libshare.connect(mode="daemon", pipe_directory=pipe_dir, timeout=30) as session:
                saxpy_checked(session)
        finally:
            release.set()
            os.close(stop)
            os.waitpid(pid, 0)
    finally:
        release.set()
        arbiter.close()


@needs_root
def test_in_multi_user_mode_a_group_is_joined_by_its_owner_only(open_base):
    """A group was a name any client could give. A reviewer as nobody joined a Slurm job's group
    and spent its memory limit (the job's own 32M allocation failed), joined a group the operator
    had made realtime (the honest client's p99 went from 6.5 to 148 ms), or left its own group
    out to escape its limits. Now a group may have an owner (the Slurm prolog gives a job's group
    to the job's user), and a client of another uid than root and the arbiter's may join only its
    own groups or unowned ones of no raised priority, and must name one of its own."""
    def join(group=None):
        return as_uid(NOBODY, lambda: libshare.connect(mode="daemon", pipe_directory=pipe_dir, group=group).close())

    with start_arbiter(open_base / "pipe", "--multi-user") as (process, pipe_dir):
        for command in (("set_group_mem_limit", "job1", "64M"), ("set_group_owner", "job1", "0"),
                        ("set_group_priority", "ops", "realtime")):
            control(pipe_dir, *command)
        assert join() == join("anything") == "None"  # no groups of its own: as before
        assert join("job1").startswith("AccessDenied") and "belongs to uid 0" in join("job1")
        assert join("ops").startswith("AccessDenied") and "priority realtime" in join("ops")
        assert control(pipe_dir, "set_group_owner", "mine", str(NOBODY)) == str(NOBODY)
        assert join("mine") == "None"
        assert join().startswith("AccessDenied") and "name one of them" in join()  # it cannot leave it out
        assert join("anything").startswith("AccessDenied")
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir, group="mine") as root_session:  # root may
            saxpy_checked(root_session)
        assert control(pipe_dir, "get_group_owner", "mine") == str(NOBODY)
        assert control(pipe_dir, "set_group_owner", "mine", "none") == "none"
        assert join() == "None" and control(pipe_dir, "get_group_owner", "mine") == "none"
        for bad in ("-1", "4294967295", "x", "١"):
            with pytest.raises(libshare.LibshareError, match="a uid is a number"):
                control(pipe_dir, "set_group_owner", "g", bad)
        assert as_uid(NOBODY, lambda: control(pipe_dir, "set_group_owner", "job1", str(NOBODY))).startswith(
            "AccessDenied")
        assert process.poll() is None


@needs_root
def test_in_multi_user_mode_one_user_leaves_a_quarter_of_the_client_slots(open_base):
    """One user opened every client slot (48 by default) and every other user's hello was refused
    with TooManyClients until it let go. Now a uid other than root's and the arbiter's leaves a
    quarter of them to the others; root's own clients are not counted against anyone."""
    def fill_slots():
        sessions, refusal = [], ""
        try:
            for _ in range(8):
                sessions.append(libshare.connect(mode="daemon", pipe_directory=pipe_dir))
        except libshare.TooManyClients as exc:
            refusal = str(exc)
        finally:
            for session in sessions:
                session.close()
        return f"{len(sessions)} {refusal}"

    with start_arbiter(open_base / "pipe", "--multi-user", "--max-clients", "8") as (process, pipe_dir):
        admitted, refusal = as_uid(NOBODY, fill_slots).split(" ", 1)
        assert admitted == "6" and f"uid {NOBODY} has 6 clients" in refusal, (admitted, refusal)
        with contextlib.ExitStack() as roots:
            for _ in range(4):  # root's: counted against the arbiter's limit only
                roots.enter_context(libshare.connect(mode="daemon", pipe_directory=pipe_dir))
            admitted, refusal = as_uid(NOBODY, fill_slots).split(" ", 1)
            assert admitted == "4" and "already serves 8 clients" in refusal, (admitted, refusal)
        assert process.poll() is None


def test_a_hello_asking_for_no_compute_share_is_refused_not_unlimited(daemon):
    _, pipe_dir = daemon
    for share in (0, "0", -5, 101, "12.5"):
        sock = connect_raw(pipe_dir)
        try:
            sock.sendall(frame({"op": "hello", "share": share}))
            answer = reply(sock, max_fds=protocol.MAX_FDS)
            assert answer["ok"] is False and answer["error"] in ("InvalidSubmission", "ProtocolError"), (share, answer)
        finally:
            sock.close()
    sock = connect_raw(pipe_dir)
    try:
        sock.sendall(frame({"op": "hello", "share": 40}))
        assert reply(sock, max_fds=protocol.MAX_FDS)["ok"]
    finally:
        sock.close()
