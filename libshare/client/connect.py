"""Connecting: a session with the arbiter at a pipe directory, or with one inside this process.

:func:`connect` picks the mode (``mode``, else LIBSHARE_MODE, else "auto": a daemon when one
answers at the pipe directory, else embedded), dials the daemon's socket or starts the embedded
arbiter, says hello (exchange.py) and makes the Session from the welcome. Embedded mode starts one
arbiter inside this process, shared by every embedded session of the process and closed at exit,
and talks to it over a socketpair with the very same protocol; it has no second process to fall
back on, so an embedded session never reattaches.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading

from libshare import errors, settings as _settings
from libshare.client import exchange as _exchange
from libshare.client.session import Session
from libshare.protocol import paths as _config
from libshare.protocol import wire as protocol

__all__ = ["connect"]

_embedded_lock = threading.Lock()
_embedded_arbiter = None


def _embedded():
    """The arbiter of this process (started on the first embedded connect, closed at exit)."""
    global _embedded_arbiter
    with _embedded_lock:
        if _embedded_arbiter is None:
            from libshare.arbiter import Arbiter

            _embedded_arbiter = Arbiter()
            atexit.register(_embedded_arbiter.close)
        return _embedded_arbiter


def connect(name: str | None = None, priority: str | None = None, mode: str | None = None,
            pipe_directory: str | os.PathLike | None = None, timeout: float = 10.0,
            group: str | None = None, reattach: bool = True) -> Session:
    """Connect to the arbiter at the pipe directory, or run one in this process.

    ``mode``: "auto" (default, or LIBSHARE_MODE) uses a daemon when one answers and
    embeds one otherwise; "daemon" insists on a daemon (ArbiterUnavailable if none);
    "embedded" never looks for one. ``group`` (or LIBSHARE_GROUP) names a group of
    clients whose limits apply to them together. With ``reattach`` (the default) a session
    with a daemon started by the control daemon (``libshare-control -d``) survives that
    arbiter: when it dies or is restarted, the session waits up to ``timeout`` for the new
    one and carries on with the same arrays and programs (work in flight then fails with
    ArbiterRestarted). An embedded arbiter has no second process to fall back on.
    """
    mode = _config.connect_mode(mode)
    share = _settings.configured("active_thread_percentage")  # may only lower the arbiter's default
    hello = {"op": "hello", "name": name or "", "version": protocol.VERSION,
             "priority": _hello_field("client_priority", priority, "priority") or "",  # "": the default
             "group": _hello_field("group", group, "group"),
             "share": "" if share is None else share}
    mem_limit = _settings.configured("device_mem_limit")  # may only lower the arbiter's limit
    if mem_limit is not None:
        hello["mem_limit"] = mem_limit
    sock, embedded, path = None, False, _config.socket_path(_config.pipe_directory(pipe_directory))
    if mode != "embedded":
        sock = protocol.dial(path, timeout)
        if sock is None and mode == "daemon":
            raise errors.ArbiterUnavailable(
                f"no arbiter answers at {path.parent}; start one with `python -m libshare.arbiter` or use "
                "mode='auto'")
    if sock is None:
        sock, far_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        _embedded().attach(far_end)
        embedded = True
    try:
        welcome = _exchange.hello(sock, hello, timeout, embedded)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(_exchange.REPLY_TIMEOUT)
    return Session(sock, welcome, embedded, hello, None if embedded or not reattach else path, timeout)


def _hello_field(name: str, given: str | None, argument: str):
    """Setting ``name`` for the hello: the argument ``given`` if any, refused as the arbiter would
    refuse it (InvalidSubmission naming ``argument``), else the environment's or the default."""
    if given:
        return _settings.SETTINGS[name].check(given, argument)
    return _settings.value(name)
