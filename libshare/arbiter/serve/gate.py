"""The arbiter's gate: accepting connections, and holding every one that has no work to do yet.

A connection costs the arbiter a thread only once it is a client (it said hello and
was admitted, so at most ``--max-clients`` of them) or while one of its control
commands runs. Until then, and between an operator's control commands, it waits in
the gate: one thread with an epoll selector that owns the listening socket and reads
first frames in steps (:class:`~libshare.protocol.wire.FrameReader`) from non-blocking
sockets. 2,000 connections that never speak cost 2,000 descriptors and one thread.

Bounds, each enforced here:

* **Time.** A new connection must complete its first frame (hello or a control
  command) within ``hello_timeout`` of being accepted (LIBSHARE_HELLO_TIMEOUT, 10 s);
  a frame begun must be finished within ``request_timeout`` (LIBSHARE_REQUEST_TIMEOUT,
  30 s; sessions are held to it too, see _server.py); a control connection may idle
  between commands for ``control_idle`` (10 min). Past its deadline a connection is
  told why (unless it is an idle control connection, whose client dials again) and
  closed. Closings are summed up in server.log, at most one line every 10 s.
* **Number.** At most ``max_waiting`` connections wait at once (sized from the
  descriptor budget, at most 512). When a new one would pass that, the one that has
  waited longest is closed to make room, so a flood of idle connections cannot lock
  out the operator or an honest client, who speaks as soon as it connects. An idle
  control connection closed this way is closed without a word, as at its deadline: a
  command its client sent meanwhile was never read, and the client sends it again on a
  new connection (``ControlConnection.run``). A uid other
  than root and the arbiter's own may hold at most a quarter of the places, counting
  its connections out with a control worker (those cannot be closed to make room: one
  uid that kept 520 cheap commands running once held all 512 places).
* **Replies** from the gate are sent without blocking; a peer whose socket cannot take
  a small error reply at once does not read its replies, and is closed. A control
  command's reply is sent by its worker as far as the socket takes it at once, and the
  rest by the gate when the socket is writable; meanwhile the connection's next command
  is not read, and a reply not taken within ``request_timeout`` closes it. (Sent
  blocking, a peer that pipelined commands and read no reply held a worker 30 s per
  command, and four such peers held all of them: the operator waited 27-30 s.)
* **Accept never dies.** ``accept`` failing for want of descriptors or memory (EMFILE,
  ENFILE, ENOBUFS, ENOMEM) stops accepting for a while (50 ms, doubling to 1 s) and
  logs it once per episode; any other failure is logged and retried the same way. The
  connections meanwhile wait in the kernel's listen queue and are served once
  descriptors are free again.

The gate accepts on the arbiter's socket and on every share socket (``Gate.listen`` with a
group; see _share_sockets.py); each connection remembers which one it came through, and ``route``
is told.

A first frame goes to the arbiter's ``route``, which checks it against its schema
(a bad one is answered and the connection stays, within its deadline), refuses it
(AccessDenied, TooManyClients: answered, then closed) or takes it: a hello is welcomed
here (``on_session``) and becomes a session with its own thread, a control command runs
on one of a few worker threads and its connection then comes back here. Nothing the gate
does waits on a peer.
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import queue
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from libshare.protocol import wire as protocol
from libshare import errors
from libshare.errors import InvalidSubmission, LibshareError, ProtocolError, QuotaExceeded

log = logging.getLogger("libshare.arbiter")

HELLO_TIMEOUT = 10.0  # seconds from accept to a complete first frame
CONTROL_IDLE = 600.0  # seconds a control connection may wait between commands
MAX_WAITING = 512  # connections in the gate at once, at most
MIN_WAITING = 16  # the descriptor budget must leave the gate at least this many
CONTROL_WORKERS = 4  # control commands that run at once
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 1.0  # seconds accept rests after a failure
_LOG_EVERY = 10.0  # seconds between summaries of connections the gate closed
_ACCEPT_BATCH = 64  # accepts per wake-up, so that reading first frames keeps its turn
_STEPS_PER_TURN = 64  # reads from one connection per wake-up, so that one peer cannot keep the gate
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


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


@dataclass(eq=False)
class _Listener:
    """A listening socket the gate accepts on: the arbiter's own (``share`` None) or a group's share
    socket (``Arbiter.open_share``), whose connections the arbiter routes as that group's."""

    sock: socket.socket
    share: str | None
    registered: bool = False  # with the selector (not while accepting is paused)


class Gate:
    """The selector thread in front of the arbiter (see the module's docstring).

    ``route(frame, pid, uid, control, share)`` returns ("session", token) or ("control", None),
    or raises a LibshareError to answer; ``on_session(conn, frame, pid, uid, token)`` takes
    a connection for good; ``run_control(fields, pid, uid)`` returns the reply to a control
    command.
    """

    def __init__(self, route, on_session, run_control, *, max_waiting: int, hello_timeout: float = HELLO_TIMEOUT,
                 request_timeout: float = 30.0, control_idle: float = CONTROL_IDLE):
        self._route, self._on_session, self._run_control = route, on_session, run_control
        self.max_waiting = max_waiting
        self.hello_timeout = hello_timeout
        self.request_timeout = request_timeout
        self.control_idle = control_idle
        self._per_uid = max(max_waiting // 4, 1)  # for uids other than root and the arbiter's
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._incoming: list[Waiting] = []  # handed in by other threads, registered by the gate's
        self._waiting: dict[int, Waiting] = {}  # by fd, oldest first
        self._by_uid: dict[int, int] = {}
        self._busy = 0  # control connections out with a worker
        self._busy_by_uid: dict[int, int] = {}
        self._idle = 0  # control workers waiting for a job
        self._deadlines: list[tuple[float, int, Waiting]] = []
        self._sequence = 0
        self._listeners: list[_Listener] = []  # changed under the lock; registered by the gate's thread
        self._unlistened: list[_Listener] = []  # taken out by another thread: the gate's closes them
        self._accepting = False
        self._resume_at = 0.0
        self._failures = 0  # accept failures in the current episode
        self._closed_counts: dict[str, int] = {}
        self._last_summary = -_LOG_EVERY  # the first closing after a quiet spell is logged at once
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self.closed = False
        self._thread = threading.Thread(target=self._run, name="libshare-gate", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- from other threads

    @property
    def population(self) -> int:
        """Connections the gate holds (waiting, or with a control worker)."""
        with self._lock:
            return len(self._waiting) + len(self._incoming) + self._busy

    def listen(self, listener: socket.socket, share: str | None = None) -> None:
        """Accept on ``listener`` (a bound, listening socket) from now on; the gate closes it. A
        ``share`` listener is that group's share socket: ``route`` is told so for each first frame."""
        listener.setblocking(False)
        with self._lock:
            closed = self.closed
            if not closed:
                self._listeners.append(_Listener(listener, share))
        if closed:
            listener.close()
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

    def add(self, conn: socket.socket) -> None:
        """Take a connected socket (a socketpair end in embedded mode) as if it had been accepted."""
        pid, uid = protocol.peer_credentials(conn)
        conn.setblocking(False)
        with self._lock:
            closed = self.closed
            if not closed:
                self._incoming.append(Waiting(conn, pid, uid, time.monotonic() + self.hello_timeout))
        if closed:
            self._send(conn, protocol.error_reply(errors.ServerNotReady("the arbiter is shutting down")))
            conn.close()
            return
        self._wake()

    def close(self) -> None:
        """Stop accepting; close the listener and every connection the gate holds. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        for _ in self._workers:
            self._jobs.put(None)
        with self._lock:
            held = list(self._waiting.values()) + self._incoming
            self._waiting.clear()
            self._incoming.clear()
            listeners = self._listeners + self._unlistened
            self._listeners, self._unlistened = [], []
        for waiting in held:
            waiting.reader.close()
            waiting.conn.close()
        for listener in listeners:
            listener.sock.close()
        self._selector.close()
        self._flush_summary(force=True)
        with self._lock:  # a worker that finishes later must not write to a reused descriptor number
            os.close(self._wake_read)
            os.close(self._wake_write)
            self._wake_write = -1

    def _wake(self) -> None:
        with self._lock:
            if self._wake_write < 0:
                return
            try:
                os.write(self._wake_write, b"\0")
            except BlockingIOError:
                pass  # full: the gate is awake anyway

    # ---------------------------------------------------------------- the gate's thread

    def _run(self) -> None:
        while not self.closed:
            try:
                self._turn()
            except Exception:  # never die: a gate that stops leaves the arbiter deaf
                log.exception("gate error")
                time.sleep(0.05)

    def _turn(self) -> None:
        self._take_incoming()
        self._toggle_accepting()
        now = time.monotonic()
        wait = self._deadlines[0][0] - now if self._deadlines else _LOG_EVERY
        if not self._accepting and self._listeners:
            wait = min(wait, self._resume_at - now)
        if self._closed_counts:
            wait = min(wait, self._last_summary + _LOG_EVERY - now)
        for key, mask in self._selector.select(max(wait, 0.0)):
            if key.data is None:
                try:
                    while os.read(self._wake_read, 4096):
                        pass
                except BlockingIOError:
                    pass
            elif isinstance(key.data, _Listener):
                self._accept(key.data)
            elif mask & selectors.EVENT_WRITE:
                self._writable(key.data)
            else:
                self._readable(key.data)
        self._expire(time.monotonic())
        self._flush_summary()

    def _take_incoming(self) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for waiting in incoming:
            self._hold(waiting)

    def _toggle_accepting(self) -> None:
        """Close the listeners taken out, and register new ones (all of them, once a pause is over)."""
        with self._lock:
            listeners, gone = list(self._listeners), self._unlistened
            self._unlistened = []
        for listener in gone:
            self._unregister(listener)
            listener.sock.close()
        if self.closed or not listeners:
            return
        if not self._accepting and time.monotonic() >= self._resume_at:
            self._accepting = True
        if self._accepting:
            for listener in listeners:
                if not listener.registered:
                    self._selector.register(listener.sock, selectors.EVENT_READ, listener)
                    listener.registered = True

    def _unregister(self, listener: _Listener) -> None:
        if listener.registered:
            self._selector.unregister(listener.sock)
            listener.registered = False

    def _pause_accepting(self, delay: float) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            self._unregister(listener)
        self._accepting = False
        self._resume_at = time.monotonic() + delay

    def _accept(self, listener: _Listener) -> None:
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
                self._accept_failed(exc)
                return
            if self._failures:
                log.warning("accepting connections again after %d failed attempts", self._failures)
                self._failures = 0
            try:
                pid, uid = protocol.peer_credentials(conn)
                conn.setblocking(False)
            except OSError:
                conn.close()
                continue
            waiting = Waiting(conn, pid, uid, time.monotonic() + self.hello_timeout, share=listener.share)
            self._hold(waiting)
            self._readable(waiting)  # a client sends its hello as it connects: often it is here already

    def _accept_failed(self, exc: OSError) -> None:
        self._failures += 1
        delay = min(_BACKOFF_FIRST * 2 ** (self._failures - 1), _BACKOFF_MAX)
        if self._failures == 1:  # once an episode; its end is logged by the next accept
            why = "out of descriptors or memory; " if exc.errno in _OUT_OF_FDS else ""
            log.warning("accept() failed: %s; %sretrying every %g s at most (%d connections wait here, the "
                        "open-file limit is %d)", exc, why, _BACKOFF_MAX, len(self._waiting),
                        resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._pause_accepting(delay)

    # ---------------------------------------------------------------- holding connections

    def _hold(self, waiting: Waiting) -> None:
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
            self._drop(oldest, "closed to make room for a newer connection of the same uid",
                       self._eviction(oldest, "closed: too many connections of this uid wait at the arbiter"))
        with self._lock:
            held = len(self._waiting) + self._busy
        while held >= self.max_waiting:
            if not self._waiting:
                return False
            oldest = next(iter(self._waiting.values()))
            self._drop(oldest, "closed to make room for a newer connection",
                       self._eviction(oldest, "closed: too many connections wait at the arbiter"))
            held -= 1
        return True

    @staticmethod
    def _eviction(waiting: Waiting, message: str) -> LibshareError | None:
        """What a connection closed to make room is told: nothing, for a control connection idle
        between commands (its client may have a command on the way, and dials again when this
        one finds the connection closed), else why."""
        return None if waiting.control else errors.TooManyClients(message)

    def _schedule(self, waiting: Waiting) -> None:
        self._sequence += 1
        heapq.heappush(self._deadlines, (waiting.deadline, self._sequence, waiting))
        if len(self._deadlines) > 4 * len(self._waiting) + 256:  # mostly entries that moved or left
            self._deadlines = [entry for entry in self._deadlines
                               if self._waiting.get(entry[2].fd) is entry[2] and entry[2].deadline == entry[0]]
            heapq.heapify(self._deadlines)

    def _release(self, waiting: Waiting) -> None:
        """Take ``waiting`` out of the gate's books (the caller closes it or hands it on)."""
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

    def _drop(self, waiting: Waiting, reason: str | None, exc: LibshareError | None = None) -> None:
        """Close a held connection (telling it ``exc``); ``reason`` goes into the next log summary."""
        self._release(waiting)
        if exc is not None:
            self._send(waiting.conn, protocol.error_reply(exc))
        waiting.reader.close()
        waiting.conn.close()
        if reason is not None:
            self._closed_counts[reason] = self._closed_counts.get(reason, 0) + 1

    def _refuse(self, waiting: Waiting, exc: LibshareError, reason: str) -> None:
        self._send(waiting.conn, protocol.error_reply(exc))
        waiting.conn.close()
        self._closed_counts[reason] = self._closed_counts.get(reason, 0) + 1

    @staticmethod
    def _send(conn: socket.socket, reply: dict) -> bool:
        """Send a small reply without waiting; False when the peer's socket could not take it."""
        try:
            protocol.send(conn, reply)
            return True
        except (LibshareError, OSError):
            return False

    def _writable(self, waiting: Waiting) -> None:
        """Send more of a control reply; once it is all sent, read the connection's next command."""
        if self._waiting.get(waiting.fd) is not waiting:
            return
        try:
            waiting.outbox = waiting.outbox[_send_some(waiting.conn, waiting.outbox):]
        except OSError:  # the peer left
            self._drop(waiting, None)
            return
        if not waiting.outbox:
            self._selector.modify(waiting.fd, selectors.EVENT_READ, waiting)
            waiting.between_frames(time.monotonic() + self.control_idle)
            self._schedule(waiting)

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, waiting = heapq.heappop(self._deadlines)
            if self._waiting.get(waiting.fd) is not waiting or waiting.deadline != deadline:
                continue  # gone, or its deadline moved
            if waiting.outbox:
                self._drop(waiting, f"a control reply not read within {self.request_timeout:g} s")
            elif waiting.begun and deadline < waiting.expires:
                self._drop(waiting, f"a frame not finished within {self.request_timeout:g} s",
                           ProtocolError(f"a frame was begun and not finished within {self.request_timeout:g} s"))
            elif waiting.control:  # the operator's tool dials again when it needs to
                self._drop(waiting, None)
            else:
                self._drop(waiting, f"no hello within {self.hello_timeout:g} s",
                           ProtocolError(f"no hello or control command within {self.hello_timeout:g} s of "
                                         "connecting"))

    def _flush_summary(self, force: bool = False) -> None:
        if not self._closed_counts:
            return
        now = time.monotonic()
        if not force and now - self._last_summary < _LOG_EVERY:
            return
        counts, self._closed_counts = self._closed_counts, {}
        self._last_summary = now
        log.warning("the gate closed connections: %s",
                    "; ".join(f"{count} {reason}" for reason, count in sorted(counts.items())))

    # ---------------------------------------------------------------- first frames

    def _readable(self, waiting: Waiting) -> None:
        if self._waiting.get(waiting.fd) is not waiting:
            return
        for _ in range(_STEPS_PER_TURN):  # then the others' turn: epoll reports it again
            try:
                frame = waiting.reader.step(waiting.conn)
            except (BlockingIOError, InterruptedError):
                return
            except protocol.MalformedFrame as exc:
                if not self._send(waiting.conn, protocol.error_reply(exc)):
                    self._drop(waiting, "did not read their replies")
                    return
                if waiting.between_frames():
                    self._schedule(waiting)
                continue
            except ProtocolError as exc:
                self._drop(waiting, "sent a frame that cannot be read", exc)
                return
            except (EOFError, OSError):  # the peer left: nothing to tell anyone
                self._drop(waiting, None)
                return
            if frame is None:
                if not waiting.begun and waiting.reader.started:
                    waiting.begun = True
                    bound = time.monotonic() + self.request_timeout
                    if bound < waiting.deadline:
                        waiting.deadline = bound
                        self._schedule(waiting)
                continue
            self._first_frame(waiting, frame)
            return

    def _first_frame(self, waiting: Waiting, frame: protocol.Frame) -> None:
        try:
            action, token = self._route(frame, waiting.pid, waiting.uid, waiting.control, waiting.share)
        except (ProtocolError, InvalidSubmission) as exc:  # a bad request: answered, the connection stays
            frame.close_fds()
            if not self._send(waiting.conn, protocol.error_reply(exc)):
                self._drop(waiting, "did not read their replies")
            elif waiting.between_frames(time.monotonic() + self.control_idle if waiting.control else None):
                self._schedule(waiting)
            return
        except LibshareError as exc:  # refused: answered, then closed
            frame.close_fds()
            self._drop(waiting, f"refused ({type(exc).__name__})", exc)
            return
        except Exception as exc:
            log.exception("routing a first frame")
            self._drop(waiting, "failed", ProtocolError(f"the arbiter failed to read this request: {exc}"))
            return
        self._release(waiting)
        if action == "session":
            waiting.reader.close()
            try:
                self._on_session(waiting.conn, frame, waiting.pid, waiting.uid, token)
            except Exception:
                log.exception("starting a session")
                waiting.conn.close()
            return
        with self._lock:
            self._busy += 1
            self._busy_by_uid[waiting.uid] = self._busy_by_uid.get(waiting.uid, 0) + 1
        self._start_worker()
        self._jobs.put((waiting, frame))

    # ---------------------------------------------------------------- control commands

    def _start_worker(self) -> None:
        with self._lock:
            start = self._idle == 0 and len(self._workers) < CONTROL_WORKERS
            if start:
                self._idle += 1  # counted idle until it takes its first job
        if start:
            thread = threading.Thread(target=self._work, name="libshare-control", daemon=True)
            self._workers.append(thread)
            thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
            if job is None:
                return
            waiting, frame = job
            self._serve_control(waiting, frame)
            with self._lock:
                self._idle += 1

    def _serve_control(self, waiting: Waiting, frame: protocol.Frame) -> None:
        """Run one command and send what its reply's socket takes at once: the gate sends the rest
        (a peer that does not read its replies once held a worker for 30 s per command, and four
        such peers held every worker)."""
        conn = waiting.conn
        keep = False
        try:
            reply = protocol.encode(self._run_control(frame.fields, waiting.pid, waiting.uid))
            waiting.outbox = reply[_send_some(conn, reply):]
            keep = True
        except (LibshareError, OSError):
            pass
        except Exception:
            log.exception("control command")
        with self._lock:
            self._busy -= 1
            self._busy_by_uid[waiting.uid] -= 1
            if not self._busy_by_uid[waiting.uid]:
                del self._busy_by_uid[waiting.uid]
            if keep and not self.closed:
                waiting.control = True
                now = time.monotonic()
                waiting.between_frames(now + self.control_idle)
                if waiting.outbox:  # it must read the reply within the request bound
                    waiting.deadline = now + self.request_timeout
                self._incoming.append(waiting)
                keep = "handed"
        if keep == "handed":
            self._wake()
        else:
            conn.close()


class FdBudget:
    """The arbiter's file descriptors against its limit: room kept for every client slot.

    Each client slot not yet taken keeps ``per_client`` descriptors (its socket,
    pidfd and doorbell), the gate keeps ``waiting``, and ``slack`` serves the rest (logs,
    control commands, a compile). What is left serves shared buffers, at most
    ``per_buffer`` descriptors each (a bound: what one costs depends on how it is mapped
    and on the driver's import). Counting
    open descriptors means listing /proc/self/fd, which costs a millisecond per few
    hundred; so the count is an upper bound kept up to date (the last count, plus
    ``per_buffer`` for every buffer since), and counted again only when that bound comes
    near the limit.
    """

    def __init__(self, per_client: int, per_buffer: int, waiting: int, slack: int):
        self.per_client, self.per_buffer, self.waiting, self.slack = per_client, per_buffer, waiting, slack
        self._lock = threading.Lock()
        self._bound = open_fds()

    def reserve_buffer(self, free_slots: int) -> None:
        """Count one more shared buffer, or raise QuotaExceeded when its descriptors would eat into
        the room kept for the ``free_slots`` client slots not yet taken."""
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return
        kept = free_slots * self.per_client + self.waiting + self.slack
        with self._lock:
            if self._bound + self.per_buffer + kept > limit:
                self._bound = open_fds()
                if self._bound + self.per_buffer + kept > limit:
                    raise QuotaExceeded(
                        f"the arbiter's file descriptors are spent: {self._bound} of {limit} are open and "
                        f"{kept} are kept for the clients still to come ({free_slots} places) and connections "
                        "waiting; free shared buffers, use device buffers, or raise the arbiter's open-file "
                        "limit (LimitNOFILE=, ulimit -n)")
            self._bound += self.per_buffer

    def client_joined(self) -> None:
        """A client took a slot: its descriptors are open now."""
        with self._lock:
            self._bound += self.per_client


def _send_some(conn: socket.socket, data: bytes) -> int:
    """Send what a non-blocking socket takes of ``data`` now; how many bytes (OSError: the peer left)."""
    try:
        return conn.send(data)
    except (BlockingIOError, InterruptedError):
        return 0


def open_fds() -> int:
    """How many file descriptors this process has open."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own
    except OSError:
        return 0
