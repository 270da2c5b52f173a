"""The gate's listening sockets, and accepting on them with back-off.

The gate accepts on the arbiter's socket and on every share socket (``Gate.listen`` with a
group; see share_sockets.py): :class:`Acceptor` keeps them, registers them with the gate's
selector, and hands each new connection to the gate with the group of the socket it came
through. It accepts at most 64 connections a wake-up, so that reading first frames keeps
its turn.

**Accept never dies.** ``accept`` failing for want of descriptors or memory (EMFILE,
ENFILE, ENOBUFS, ENOMEM) stops accepting for a while (50 ms, doubling to 1 s): the
listeners leave the selector until then. The failure is logged once per episode and its
end by the next accept; any other failure is logged and retried the same way. The
connections meanwhile wait in the kernel's listen queue and are served once descriptors
are free again.

Threads: the gate's thread accepts and registers; other threads add and take out
listeners (``listen``, ``unlisten``) under ``_lock`` and wake it, and it closes those
taken out.
"""

from __future__ import annotations

import errno
import logging
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("libshare.arbiter")

_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 1.0  # seconds accept rests after a failure
_ACCEPT_BATCH = 64  # accepts per wake-up, so that reading first frames keeps its turn
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass(eq=False)
class Listener:
    """A listening socket the gate accepts on: the arbiter's own (``share`` None) or a group's share
    socket (``Arbiter.open_share``), whose connections the arbiter routes as that group's."""

    sock: socket.socket
    share: str | None
    registered: bool = False  # with the selector (not while accepting is paused)


class Acceptor:
    """The gate's listeners and its accept loop (see the module's docstring).

    ``accepted(conn, share)`` takes each new connection on the gate's thread; ``wake()`` wakes
    that thread; ``held()`` says how many connections wait in the gate (for the log).
    """

    def __init__(self, selector: selectors.BaseSelector, wake: Callable[[], None],
                 accepted: Callable[[socket.socket, str | None], None], held: Callable[[], int]):
        self._selector, self._wake, self._accepted, self._held = selector, wake, accepted, held
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []  # changed under the lock; registered by the gate's thread
        self._unlistened: list[Listener] = []  # taken out by another thread: the gate's closes them
        self._accepting = False
        self._resume_at = 0.0
        self._failures = 0  # accept failures in the current episode
        self.closed = False

    # ---------------------------------------------------------------- from other threads

    def listen(self, sock: socket.socket, share: str | None = None) -> None:
        """Accept on ``sock`` (a bound, listening socket) from now on; closed with the gate."""
        sock.setblocking(False)
        with self._lock:
            closed = self.closed
            if not closed:
                self._listeners.append(Listener(sock, share))
        if closed:
            sock.close()
            return
        self._wake()

    def unlisten(self, share: str) -> bool:
        """Stop accepting on ``share``'s listener and close it (on the gate's thread); False if none."""
        with self._lock:
            found = [listener for listener in self._listeners if listener.share == share]
            self._listeners = [listener for listener in self._listeners if listener.share != share]
            self._unlistened.extend(found)
        self._wake()
        return bool(found)

    def close(self) -> None:
        """Close every listener (once the gate's thread has stopped)."""
        with self._lock:
            self.closed = True
            listeners = self._listeners + self._unlistened
            self._listeners, self._unlistened = [], []
        for listener in listeners:
            listener.sock.close()

    # ---------------------------------------------------------------- the gate's thread

    def turn(self) -> float | None:
        """Close the listeners taken out, and register new ones (all of them, once a pause is over);
        when a pause will be over (on the monotonic clock), or None when accepting is not paused."""
        with self._lock:
            listeners, gone = list(self._listeners), self._unlistened
            self._unlistened = []
        for listener in gone:
            self._unregister(listener)
            listener.sock.close()
        if self.closed or not listeners:
            return None
        if not self._accepting and time.monotonic() >= self._resume_at:
            self._accepting = True
        if not self._accepting:
            return self._resume_at
        for listener in listeners:
            if not listener.registered:
                self._selector.register(listener.sock, selectors.EVENT_READ, listener)
                listener.registered = True
        return None

    def accept(self, listener: Listener) -> None:
        """Accept what ``listener`` has waiting (at most a batch), or rest after a failure."""
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, _ = listener.sock.accept()
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that peer gave up before it was accepted
                self._failed(exc)
                return
            if self._failures:
                log.warning("accepting connections again after %d failed attempts", self._failures)
                self._failures = 0
            self._accepted(conn, listener.share)

    def _failed(self, exc: OSError) -> None:
        self._failures += 1
        delay = min(_BACKOFF_FIRST * 2 ** (self._failures - 1), _BACKOFF_MAX)
        if self._failures == 1:  # once an episode; its end is logged by the next accept
            why = "out of descriptors or memory; " if exc.errno in _OUT_OF_FDS else ""
            log.warning("accept() failed: %s; %sretrying every %g s at most (%d connections wait here, the "
                        "open-file limit is %d)", exc, why, _BACKOFF_MAX, self._held(),
                        resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._pause(delay)

    def _pause(self, delay: float) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            self._unregister(listener)
        self._accepting = False
        self._resume_at = time.monotonic() + delay

    def _unregister(self, listener: Listener) -> None:
        if listener.registered:
            self._selector.unregister(listener.sock)
            listener.registered = False
