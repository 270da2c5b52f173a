"""A session's control socket: one request and its reply, and the hello that opens a session.

Control requests are rare (programs, buffers, stats, a reattach's hand-over of objects): each
is one frame out and one frame back (libshare/protocol/wire.py), with the descriptors either
carries. A wait for a reply polls the socket briefly before it sleeps in ``recv``
(``protocol.poll_briefly``: an idle core halts, and waking it costs a VM tens of microseconds),
one thread of the process at a time, and never for an embedded arbiter, which needs this
process's GIL to answer.
"""

from __future__ import annotations

import select
import socket
import threading

from libshare import errors
from libshare.protocol import wire as protocol

__all__ = ["REPLY_TIMEOUT", "exchange", "hello"]

REPLY_TIMEOUT = 60.0
"""Seconds a client's request waits for its reply; one the arbiter does not answer in this long fails
(read when each request is made). Not the arbiter's ``request_timeout`` (libshare/settings.py), the
time a client has to finish sending a request it began."""

_REPLY_SPIN = 200e-6  # seconds a control request polls for its reply before it sleeps
_polling = threading.Lock()  # held by the one thread of this process that polls for a reply


def exchange(sock: socket.socket, fields: dict, payload: bytes = b"", max_fds: int = 0,
             fds: tuple[int, ...] = (), poll: bool = True) -> protocol.Frame:
    """Send one request and read its reply (EOFError or OSError when the arbiter went away); with
    ``poll`` (not for an embedded arbiter), poll for the reply briefly before sleeping."""
    protocol.send(sock, fields, payload, fds)
    if poll:
        _await_reply(sock)
    return protocol.recv(sock, max_fds=max_fds)


def _await_reply(sock: socket.socket) -> None:
    """Poll for a reply for _REPLY_SPIN before ``recv`` sleeps (:func:`protocol.poll_briefly`); one
    thread of the process at a time polls, the others sleep at once."""
    if not _polling.acquire(blocking=False):
        return
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        protocol.poll_briefly(poller, _REPLY_SPIN)
    finally:
        _polling.release()


def hello(sock: socket.socket, fields: dict, timeout: float, embedded: bool = False) -> protocol.Frame:
    """Say hello (``fields``) on a connected socket; the welcome, with its ring and doorbell (the
    caller closes the socket when this raises)."""
    sock.settimeout(timeout)
    try:
        welcome = exchange(sock, fields, max_fds=2, poll=not embedded)
    except (EOFError, OSError) as exc:
        raise errors.ArbiterUnavailable(f"the arbiter did not answer hello: {exc}") from exc
    if not welcome.fields.get("ok"):
        raise errors.remote_error(welcome.fields)
    if len(welcome.fds) != 2:
        welcome.close_fds()
        raise errors.ProtocolError("the arbiter's welcome did not carry the ring and doorbell")
    return welcome
