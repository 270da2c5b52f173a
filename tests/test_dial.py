"""Dialling the arbiter's socket: absent, refusing, and a listen queue that is full for a while."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from libshare import AccessDenied, ArbiterUnavailable
from libshare.protocol.wire import dial


class Calls:
    """The C functions (``socket.connect``, ``time.sleep``, ``select.poll``...) that one thread
    calls while it is profiled (``sys.setprofile``, that thread only): their names in order, and
    ``retrying``, set once the thread sleeps after a ``connect`` (dial's pause before a retry)."""

    def __init__(self):
        self.names: list[str] = []
        self.raised: list[str] = []
        self.retrying = threading.Event()

    def _profile(self, frame, event, arg) -> None:
        if event == "c_call":
            name = getattr(arg, "__name__", "?")
            if name == "sleep" and "connect" in self.names:
                self.retrying.set()
            self.names.append(name)
        elif event == "c_exception":
            self.raised.append(getattr(arg, "__name__", "?"))

    def run(self, call):
        """``call()`` with this thread profiled."""
        sys.setprofile(self._profile)
        try:
            return call()
        finally:
            sys.setprofile(None)


def test_no_socket_or_no_listener_is_none(tmp_path):
    assert dial(tmp_path / "absent", 1.0) is None
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "stale"))  # bound, never listening: refused
    try:
        assert dial(tmp_path / "stale", 1.0) is None
    finally:
        stale.close()


@pytest.fixture
def full_listener(tmp_path):
    """A listener with a queue of one that nobody accepts from, already holding one connection."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "control"))
    listener.listen(0)
    queued = []
    while True:  # fill the queue until the kernel says EAGAIN
        sock = socket.socket(socket.AF_UNIX)
        sock.setblocking(False)
        try:
            sock.connect(str(tmp_path / "control"))
        except BlockingIOError:
            sock.close()
            break
        queued.append(sock)
    yield listener, tmp_path / "control"
    for sock in queued:
        sock.close()
    listener.close()


def test_a_full_queue_is_retried_until_the_timeout(full_listener):
    """A full queue is tried again and again, with pauses between, and then refused with the
    timeout named. How long the refusal took against the timeout: bench/test_ring_mechanism_bench.py."""
    _, path = full_listener
    calls = Calls()
    with pytest.raises(ArbiterUnavailable, match=r"within 1 s \(its listen queue stayed full\)"):
        calls.run(lambda: dial(path, 1.0))
    assert calls.names.count("connect") >= 2, calls.names
    assert calls.retrying.is_set(), "dial did not pause between its tries"


def test_a_full_queue_that_drains_connects(full_listener):
    """The queue frees a place only once dial has found it full and is retrying: the retry connects."""
    listener, path = full_listener
    calls, outcome = Calls(), []
    dialler = threading.Thread(target=lambda: outcome.append(calls.run(lambda: dial(path, 120.0))), daemon=True)
    dialler.start()
    accepted = []
    try:
        assert calls.retrying.wait(30), "dial never found the queue full"
        accepted.append(listener.accept())  # frees one place in the queue
        dialler.join(60)
        assert not dialler.is_alive(), "the retry never connected"
        (sock,) = outcome
        assert sock is not None
        sock.close()
        assert calls.names.count("connect") >= 2, calls.names
    finally:
        for conn, _ in accepted:
            conn.close()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another uid")
def test_a_listener_of_another_user_is_not_trusted():
    """The default pipe directory is /tmp/libshare-UID: another user who made it first and listened
    there received a client's hello, its programs and its buffers (a reviewer read a secret out of
    one). The client now asks the kernel who listens before it sends anything."""
    base = Path(tempfile.mkdtemp(prefix="libshare-squat-"))  # pytest's own directories are 0700
    base.chmod(0o777)
    path, said = base / "control", base / "said"
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the squatter, as nobody: records whether anything was sent to it
        try:
            os.close(ready_read)
            os.setgid(65534), os.setuid(65534)
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(str(path))
            listener.listen(1)
            os.write(ready_write, b"1")
            conn, _ = listener.accept()
            conn.settimeout(10)
            said.write_bytes(conn.recv(64))
        finally:
            os._exit(0)
    os.close(ready_write)
    try:
        assert os.read(ready_read, 1) == b"1"
        with pytest.raises(AccessDenied, match="runs as uid 65534"):
            dial(path, 5.0)
        os.waitpid(pid, 0)
        assert said.read_bytes() == b"", "the client sent something to the squatter"
    finally:
        os.close(ready_read)
        shutil.rmtree(base, ignore_errors=True)


def test_a_request_whose_reply_never_comes_polls_only_briefly():
    """A client polls for a control reply for _REPLY_SPIN (200 us) before it sleeps: after the
    polls, the wait is one blocking ``recvmsg`` that the socket's timeout ends, with no poll after
    it. (The CPU that waiting out a 0.5 s timeout costs the thread is a figure of
    bench/test_ring_mechanism_bench.py.)"""
    from libshare.client import exchange

    ours, theirs = socket.socketpair()
    ours.settimeout(0.5)
    calls, outcome = Calls(), {}

    def ask():
        try:
            calls.run(lambda: exchange.exchange(ours, {"op": "stats"}))
        except TimeoutError as exc:
            outcome["error"] = exc

    try:
        asker = threading.Thread(target=ask)
        asker.start()
        asker.join(10)
        assert isinstance(outcome.get("error"), TimeoutError), outcome
        assert exchange._REPLY_SPIN <= 1e-3, "the poll before the sleep is not brief"
        names = calls.names
        assert names.count("recvmsg") == 1 and calls.raised == ["recvmsg"], (names, calls.raised)
        polls = [k for k, name in enumerate(names) if name == "poll"]
        assert len(polls) >= 2 and polls[-1] < names.index("recvmsg"), names  # polled, then slept
        assert theirs.recv(4096)  # the request was sent
    finally:
        ours.close()
        theirs.close()
