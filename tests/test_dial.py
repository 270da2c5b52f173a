"""Dialling the arbiter's socket: absent, refusing, and a listen queue that is full for a while."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from libshare import AccessDenied, ArbiterUnavailable
from libshare.protocol.wire import dial


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
    _, path = full_listener
    started = time.monotonic()
    with pytest.raises(ArbiterUnavailable, match="listen queue stayed full"):
        dial(path, 0.3)
    assert 0.25 <= time.monotonic() - started < 2.0


def test_a_full_queue_that_drains_connects(full_listener):
    listener, path = full_listener
    accepted = []
    drain = threading.Timer(0.2, lambda: accepted.append(listener.accept()))  # frees one place in the queue
    drain.start()
    try:
        sock = dial(path, 10.0)
        assert sock is not None
        sock.close()
    finally:
        drain.join()
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
    """A client polls for a control reply for _REPLY_SPIN (200 us) before it sleeps: waiting out a
    0.5 s timeout on a peer that never answers costs its thread next to no CPU."""
    from libshare.client.exchange import exchange as _exchange

    ours, theirs = socket.socketpair()
    ours.settimeout(0.5)
    outcome = {}

    def ask():
        started = time.thread_time()
        try:
            _exchange(ours, {"op": "stats"})
        except TimeoutError as exc:
            outcome["error"] = exc
        outcome["cpu"] = time.thread_time() - started

    try:
        asker = threading.Thread(target=ask)
        asker.start()
        asker.join(10)
        assert isinstance(outcome.get("error"), TimeoutError), outcome
        assert outcome["cpu"] < 0.1, f"waiting 0.5 s for a reply took {outcome['cpu']:.3f} s of CPU"
        assert theirs.recv(4096)  # the request was sent
    finally:
        ours.close()
        theirs.close()
