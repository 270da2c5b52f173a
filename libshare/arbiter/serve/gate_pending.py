"""The connections the gate holds: their places, their deadlines, and a log of those it closed.

A connection waits here (:class:`Waiting`) from its accept until its first frame is routed,
and a control connection again between its commands. :class:`Pending` keeps their books on
the gate's thread (gate.py) and enforces two bounds:

* **Time.** A new connection must complete its first frame (hello or a control
  command) within ``hello_timeout`` of being accepted (LIBSHARE_HELLO_TIMEOUT, 10 s);
  a frame begun must be finished within ``request_timeout`` (LIBSHARE_REQUEST_TIMEOUT,
  30 s; a session's thread holds its frames to it too); a control
  connection may idle between commands for ``control_idle`` (10 min), and must take the
  rest of a control reply within ``request_timeout`` (gate_replies.py). Past its
  deadline a connection is told why (unless it is an idle control connection, whose
  client dials again) and closed. The deadlines are a heap of (deadline, sequence,
  connection); an entry whose connection left or whose deadline moved is skipped when it
  comes up, and the heap is rebuilt when such entries far outnumber the connections.
* **Number.** At most ``max_waiting`` connections wait at once (sized from the
  descriptor budget, at most 512: fd_budget.py). When a new one would pass that, the one
  that has waited longest is closed to make room, so a flood of idle connections cannot
  lock out the operator or an honest client, who speaks as soon as it connects. An idle
  control connection closed this way is closed without a word, as at its deadline: a
  command its client sent meanwhile was never read, and the client sends it again on a
  new connection (``ControlConnection.run``). A uid other than root and the arbiter's
  own may hold at most a quarter of the places, counting its connections out with a
  control worker (those cannot be closed to make room: one uid that kept 520 cheap
  commands running once held all 512 places).

Replies the gate sends are small and sent without blocking (:func:`send_now`): a peer
whose socket cannot take one at once does not read its replies, and is closed.
Closings are summed up in server.log by :class:`Closings`, at most one line every 10 s.

Threads: the gate's thread owns the books (the connections by descriptor, the count per
uid, the heap) and the selector's registrations of connections. Other threads hand
connections in (:meth:`Pending.hand_in`: a socket of an embedded client, or a control
connection back from its worker), which the gate's thread takes at its next turn, and
count connections out with a worker; those two, and ``closed``, are under ``_lock``.
"""

from __future__ import annotations

import heapq
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from libshare import errors
from libshare.errors import LibshareError, ProtocolError
from libshare.protocol import wire as protocol

log = logging.getLogger("libshare.arbiter")

_LOG_EVERY = 10.0  # seconds between summaries of connections the gate closed


@dataclass(eq=False)
class Waiting:
    """A connection in the gate."""

    conn: socket.socket
    pid: int
    uid: int
    deadline: float
    control: bool = False  # it has run control commands (it idles between them)
    reader: protocol.FrameReader = field(default_factory=lambda: protocol.FrameReader(0, protocol.FIRST_FRAME))
    begun: bool = False  # its deadline already counts the frame under way
    fd: int = -1
    share: str | None = None  # the group whose share socket it came through (None: the arbiter's own socket)
    expires: float = 0.0  # when it must have said hello, or may idle until: its deadline between frames
    outbox: bytes = b""  # the rest of a control reply its socket could not take at once

    def __post_init__(self):
        self.fd = self.conn.fileno()
        self.expires = self.deadline

    def between_frames(self, expires: float | None = None) -> bool:
        """Its deadline once a frame is complete (``expires``, if given, from now on); True if it moved."""
        self.begun = False
        if expires is not None:
            self.expires = expires
        moved, self.deadline = self.deadline != self.expires, self.expires
        return moved


class Pending:
    """The connections the gate holds and their deadlines (see the module's docstring)."""

    def __init__(self, selector: selectors.BaseSelector, *, max_waiting: int, hello_timeout: float,
                 request_timeout: float, control_idle: float):
        self.max_waiting = max_waiting
        self.hello_timeout = hello_timeout
        self.request_timeout = request_timeout
        self.control_idle = control_idle
        self.closings = Closings()
        self._selector = selector
        self._per_uid = max(max_waiting // 4, 1)  # for uids other than root and the arbiter's
        self._lock = threading.Lock()
        self._incoming: list[Waiting] = []  # handed in by other threads, registered by the gate's
        self._waiting: dict[int, Waiting] = {}  # by fd, oldest first
        self._by_uid: dict[int, int] = {}
        self._busy = 0  # control connections out with a worker
        self._busy_by_uid: dict[int, int] = {}
        self._deadlines: list[tuple[float, int, Waiting]] = []
        self._sequence = 0
        self.closed = False

    # ---------------------------------------------------------------- from any thread

    @property
    def population(self) -> int:
        """Connections the gate holds (waiting, or with a control worker)."""
        with self._lock:
            return len(self._waiting) + len(self._incoming) + self._busy

    @property
    def held(self) -> int:
        """Connections waiting in the gate's selector."""
        return len(self._waiting)

    def hand_in(self, waiting: Waiting) -> bool:
        """Give the gate's thread ``waiting`` to hold from its next turn; False once the gate is closed."""
        with self._lock:
            if self.closed:
                return False
            self._incoming.append(waiting)
            return True

    def out_to_worker(self, waiting: Waiting) -> None:
        """Count ``waiting`` (released) out with a control worker, towards its uid's places too."""
        with self._lock:
            self._busy += 1
            self._busy_by_uid[waiting.uid] = self._busy_by_uid.get(waiting.uid, 0) + 1

    def back_from_worker(self, waiting: Waiting, keep: bool) -> bool:
        """A worker is done with ``waiting``: hand it back to idle between commands (or, with a reply
        still to send, to take it within ``request_timeout``) when ``keep``; False when the caller
        closes it (not ``keep``, or the gate closed)."""
        with self._lock:
            self._busy -= 1
            self._busy_by_uid[waiting.uid] -= 1
            if not self._busy_by_uid[waiting.uid]:
                del self._busy_by_uid[waiting.uid]
            if not keep or self.closed:
                return False
            waiting.control = True
            now = time.monotonic()
            waiting.between_frames(now + self.control_idle)
            if waiting.outbox:  # it must read the reply within the request bound
                waiting.deadline = now + self.request_timeout
            self._incoming.append(waiting)
            return True

    def shut(self) -> bool:
        """Hold nothing new from now on; False if that was so already."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            return True

    def close(self) -> None:
        """Close every connection held (once the gate's thread has stopped) and log the last closings."""
        with self._lock:
            held = list(self._waiting.values()) + self._incoming
            self._waiting.clear()
            self._incoming.clear()
        for waiting in held:
            waiting.reader.close()
            waiting.conn.close()
        self.closings.flush(force=True)

    # ---------------------------------------------------------------- the gate's thread

    def take_incoming(self) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for waiting in incoming:
            self.hold(waiting)

    def hold(self, waiting: Waiting) -> None:
        """Hold ``waiting`` until its deadline, making room for it, or refuse it when there is none."""
        if self.closed:
            waiting.conn.close()
            return
        if not self._make_room(waiting.uid):
            self._refuse(waiting, errors.TooManyClients(
                f"the arbiter holds {self.max_waiting} connections that have not said hello yet or "
                "have a control command running; try again"), "refused: the gate was full")
            return
        try:  # a connection whose reply is not all sent is not read: it sends its next command after
            self._selector.register(waiting.fd, selectors.EVENT_WRITE if waiting.outbox else selectors.EVENT_READ,
                                    waiting)
        except (OSError, ValueError, KeyError):
            waiting.conn.close()
            return
        self._waiting[waiting.fd] = waiting
        self._by_uid[waiting.uid] = self._by_uid.get(waiting.uid, 0) + 1
        self._schedule(waiting)

    def holds(self, waiting: Waiting) -> bool:
        """Whether ``waiting`` is still in the gate (a selector event may come for one that left)."""
        return self._waiting.get(waiting.fd) is waiting

    def _make_room(self, uid: int) -> bool:
        """Close the longest-waiting connection(s) until ``uid`` may add one; False when none can go.
        A uid's connections out with a control worker count towards its places too (they cannot be
        closed to make room: a uid that kept all of them busy once held every place)."""
        with self._lock:
            busy = self._busy_by_uid.get(uid, 0)
        if not protocol.trusted_uid(uid) and self._by_uid.get(uid, 0) + busy >= self._per_uid:
            oldest = next((w for w in self._waiting.values() if w.uid == uid), None)
            if oldest is None:
                return False
            self.drop(oldest, "closed to make room for a newer connection of the same uid",
                      self._eviction(oldest, "closed: too many connections of this uid wait at the arbiter"))
        with self._lock:
            held = len(self._waiting) + self._busy
        while held >= self.max_waiting:
            if not self._waiting:
                return False
            oldest = next(iter(self._waiting.values()))
            self.drop(oldest, "closed to make room for a newer connection",
                      self._eviction(oldest, "closed: too many connections wait at the arbiter"))
            held -= 1
        return True

    @staticmethod
    def _eviction(waiting: Waiting, message: str) -> LibshareError | None:
        """What a connection closed to make room is told: nothing, for a control connection idle
        between commands (its client may have a command on the way, and dials again when this
        one finds the connection closed), else why."""
        return None if waiting.control else errors.TooManyClients(message)

    def frame_begun(self, waiting: Waiting) -> None:
        """``waiting`` began a frame: it must finish it within ``request_timeout`` (or its deadline, if sooner)."""
        if waiting.begun or not waiting.reader.started:
            return
        waiting.begun = True
        bound = time.monotonic() + self.request_timeout
        if bound < waiting.deadline:
            waiting.deadline = bound
            self._schedule(waiting)

    def frame_done(self, waiting: Waiting, expires: float | None = None) -> None:
        """``waiting`` finished a frame and stays: its deadline between frames (``expires``, if given, from now on)."""
        if waiting.between_frames(expires):
            self._schedule(waiting)

    def read_next(self, waiting: Waiting) -> None:
        """``waiting``'s reply is all sent: read its next command, for which it may idle ``control_idle``."""
        self._selector.modify(waiting.fd, selectors.EVENT_READ, waiting)
        waiting.between_frames(time.monotonic() + self.control_idle)
        self._schedule(waiting)

    def _schedule(self, waiting: Waiting) -> None:
        self._sequence += 1
        heapq.heappush(self._deadlines, (waiting.deadline, self._sequence, waiting))
        if len(self._deadlines) > 4 * len(self._waiting) + 256:  # mostly entries that moved or left
            self._deadlines = [entry for entry in self._deadlines
                               if self._waiting.get(entry[2].fd) is entry[2] and entry[2].deadline == entry[0]]
            heapq.heapify(self._deadlines)

    def next_deadline(self) -> float | None:
        """The earliest deadline in the heap (perhaps one that moved since); None when there is none."""
        return self._deadlines[0][0] if self._deadlines else None

    def expire(self, now: float) -> None:
        """Close every connection whose deadline is past, telling it why unless it is an idle control connection."""
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, waiting = heapq.heappop(self._deadlines)
            if self._waiting.get(waiting.fd) is not waiting or waiting.deadline != deadline:
                continue  # gone, or its deadline moved
            if waiting.outbox:
                self.drop(waiting, f"a control reply not read within {self.request_timeout:g} s")
            elif waiting.begun and deadline < waiting.expires:
                self.drop(waiting, f"a frame not finished within {self.request_timeout:g} s",
                          ProtocolError(f"a frame was begun and not finished within {self.request_timeout:g} s"))
            elif waiting.control:  # the operator's tool dials again when it needs to
                self.drop(waiting, None)
            else:
                self.drop(waiting, f"no hello within {self.hello_timeout:g} s",
                          ProtocolError(f"no hello or control command within {self.hello_timeout:g} s of "
                                        "connecting"))

    def release(self, waiting: Waiting) -> None:
        """Take ``waiting`` out of the books (the caller closes it or hands it on)."""
        if self._waiting.get(waiting.fd) is waiting:
            del self._waiting[waiting.fd]
            count = self._by_uid.get(waiting.uid, 1) - 1
            if count:
                self._by_uid[waiting.uid] = count
            else:
                self._by_uid.pop(waiting.uid, None)
            try:
                self._selector.unregister(waiting.fd)
            except (KeyError, ValueError, OSError):
                pass

    def drop(self, waiting: Waiting, reason: str | None, exc: LibshareError | None = None) -> None:
        """Close a held connection (telling it ``exc``); ``reason`` goes into the next log summary."""
        self.release(waiting)
        if exc is not None:
            send_now(waiting.conn, protocol.error_reply(exc))
        waiting.reader.close()
        waiting.conn.close()
        self.closings.note(reason)

    def _refuse(self, waiting: Waiting, exc: LibshareError, reason: str) -> None:
        send_now(waiting.conn, protocol.error_reply(exc))
        waiting.conn.close()
        self.closings.note(reason)


class Closings:
    """Why the gate closed connections, summed up in server.log at most once every 10 s
    (the first closing after a quiet spell at once). Used on the gate's thread only."""

    def __init__(self):
        self._counts: dict[str, int] = {}
        self._last_summary = -_LOG_EVERY

    def note(self, reason: str | None) -> None:
        """Count one closing for ``reason`` (None: one not worth a line, such as a peer that left)."""
        if reason is not None:
            self._counts[reason] = self._counts.get(reason, 0) + 1

    def due(self) -> float | None:
        """When the next summary is due (on the monotonic clock); None when there is nothing to say."""
        return self._last_summary + _LOG_EVERY if self._counts else None

    def flush(self, force: bool = False) -> None:
        """Log the summary if it is due (``force``: now)."""
        if not self._counts:
            return
        now = time.monotonic()
        if not force and now - self._last_summary < _LOG_EVERY:
            return
        counts, self._counts = self._counts, {}
        self._last_summary = now
        log.warning("the gate closed connections: %s",
                    "; ".join(f"{count} {reason}" for reason, count in sorted(counts.items())))


def send_now(conn: socket.socket, reply: dict) -> bool:
    """Send a small reply without waiting; False when the peer's socket could not take it."""
    try:
        protocol.send(conn, reply)
        return True
    except (LibshareError, OSError):
        return False
