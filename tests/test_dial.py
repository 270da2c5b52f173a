"""Dialling the arbiter's socket: absent, refusing, and a listen queue that is full for a while."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from libshare import ArbiterUnavailable
from libshare._protocol import dial


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
