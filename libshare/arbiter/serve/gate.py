"""The arbiter's gate: accepting connections, and holding every one that has no work to do yet.

A connection costs the arbiter a thread only once it is a client (it said hello and
was admitted, so at most ``--max-clients`` of them) or while one of its control
commands runs. Until then, and between an operator's control commands, it waits in
the gate: one thread with an epoll selector that owns the listening sockets and reads
first frames in steps (:class:`~libshare.protocol.wire.FrameReader`) from non-blocking
sockets, at most 64 reads from one connection a wake-up so that one peer cannot keep
the gate. 2,000 connections that never speak cost 2,000 descriptors and one thread.

:class:`Gate` runs that thread and reads first frames; it composes one object for each
of its other concerns, which share its selector:

* ``gate.accepting`` (:class:`~libshare.arbiter.serve.gate_accept.Acceptor`,
  gate_accept.py): the listening sockets and the accept loop, which never dies: it rests
  with back-off when ``accept`` fails.
* ``gate.pending`` (:class:`~libshare.arbiter.serve.gate_pending.Pending`,
  gate_pending.py): the connections held, their deadlines (hello, a frame begun, a
  control connection's idling), their number (at most ``max_waiting``, a quarter of it
  for a uid other than root and the arbiter's, the longest-waiting closed to make room),
  and the summary in server.log of those closed.
* ``gate.control`` (:class:`~libshare.arbiter.serve.gate_replies.ControlWorkers`,
  gate_replies.py): control commands on a few worker threads, and the rest of a reply
  that a socket could not take at once, which the gate's thread sends.

``max_waiting`` is sized by the arbiter from its descriptor budget (fd_budget.py):
between ``MIN_WAITING`` and ``MAX_WAITING``.

The gate accepts on the arbiter's socket and on every share socket (``Gate.listen`` with a
group; see share_sockets.py); each connection remembers which one it came through, and ``route``
is told.

A first frame goes to the arbiter's ``route``, which checks it against its schema
(a bad one is answered and the connection stays, within its deadline), refuses it
(AccessDenied, TooManyClients: answered, then closed) or takes it: a hello is welcomed
here (``on_session``) and becomes a session with its own thread, a control command runs
on one of a few worker threads and its connection then comes back here. Nothing the gate
does waits on a peer: a reply it sends itself is small and sent without blocking, and a
peer whose socket cannot take it at once does not read its replies, and is closed.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time

from libshare import errors
from libshare.arbiter.serve.gate_accept import Acceptor, Listener
from libshare.arbiter.serve.gate_pending import Pending, Waiting, send_now
from libshare.arbiter.serve.gate_replies import ControlWorkers
from libshare.errors import InvalidSubmission, LibshareError, ProtocolError
from libshare.protocol import wire as protocol

log = logging.getLogger("libshare.arbiter")

CONTROL_IDLE = 600.0  # seconds a control connection may wait between commands
MAX_WAITING = 512  # connections in the gate at once, at most
MIN_WAITING = 16  # the descriptor budget must leave the gate at least this many
_QUIET = 10.0  # seconds the selector waits when no connection has a deadline
_STEPS_PER_TURN = 64  # reads from one connection per wake-up, so that one peer cannot keep the gate


class Gate:
    """The selector thread in front of the arbiter (see the module's docstring).

    ``route(frame, pid, uid, control, share)`` returns ("session", token) or ("control", None),
    or raises a LibshareError to answer; ``on_session(conn, frame, pid, uid, token)`` takes
    a connection for good; ``run_control(fields, pid, uid)`` returns the reply to a control
    command.
    """

    def __init__(self, route, on_session, run_control, *, max_waiting: int, hello_timeout: float,
                 request_timeout: float, control_idle: float = CONTROL_IDLE):
        self._route, self._on_session = route, on_session
        self.max_waiting = max_waiting
        self.hello_timeout = hello_timeout
        self.request_timeout = request_timeout
        self.control_idle = control_idle
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._wake_lock = threading.Lock()
        self.pending = Pending(self._selector, max_waiting=max_waiting, hello_timeout=hello_timeout,
                               request_timeout=request_timeout, control_idle=control_idle)
        self.accepting = Acceptor(self._selector, self._wake, self._accepted, lambda: self.pending.held)
        self.control = ControlWorkers(run_control, self.pending, self._wake)
        self._thread = threading.Thread(target=self._run, name="libshare-gate", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- from other threads

    @property
    def closed(self) -> bool:
        return self.pending.closed

    @property
    def population(self) -> int:
        """Connections the gate holds (waiting, or with a control worker)."""
        return self.pending.population

    def listen(self, listener: socket.socket, share: str | None = None) -> None:
        """Accept on ``listener`` (a bound, listening socket) from now on; the gate closes it. A
        ``share`` listener is that group's share socket: ``route`` is told so for each first frame."""
        self.accepting.listen(listener, share)

    def unlisten(self, share: str) -> bool:
        """Stop accepting on ``share``'s listener and close it (on the gate's thread); False if none."""
        return self.accepting.unlisten(share)

    def add(self, conn: socket.socket) -> None:
        """Take a connected socket (a socketpair end in embedded mode) as if it had been accepted."""
        pid, uid = protocol.peer_credentials(conn)
        conn.setblocking(False)
        if not self.pending.hand_in(Waiting(conn, pid, uid, time.monotonic() + self.hello_timeout)):
            send_now(conn, protocol.error_reply(errors.ServerNotReady("the arbiter is shutting down")))
            conn.close()
            return
        self._wake()

    def close(self) -> None:
        """Stop accepting; close the listeners and every connection the gate holds. Idempotent."""
        if not self.pending.shut():
            return
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self.control.close()
        self.pending.close()
        self.accepting.close()
        self._selector.close()
        with self._wake_lock:  # a worker that finishes later must not write to a reused descriptor number
            os.close(self._wake_read)
            os.close(self._wake_write)
            self._wake_write = -1

    def _wake(self) -> None:
        with self._wake_lock:
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
        self.pending.take_incoming()
        resume = self.accepting.turn()
        now = time.monotonic()
        deadline = self.pending.next_deadline()
        wait = deadline - now if deadline is not None else _QUIET
        for at in (resume, self.pending.closings.due()):
            if at is not None:
                wait = min(wait, at - now)
        for key, mask in self._selector.select(max(wait, 0.0)):
            if key.data is None:
                try:
                    while os.read(self._wake_read, 4096):
                        pass
                except BlockingIOError:
                    pass
            elif isinstance(key.data, Listener):
                self.accepting.accept(key.data)
            elif mask & selectors.EVENT_WRITE:
                self.control.finish(key.data)
            else:
                self._readable(key.data)
        self.pending.expire(time.monotonic())
        self.pending.closings.flush()

    def _accepted(self, conn: socket.socket, share: str | None) -> None:
        try:
            pid, uid = protocol.peer_credentials(conn)
            conn.setblocking(False)
        except OSError:
            conn.close()
            return
        waiting = Waiting(conn, pid, uid, time.monotonic() + self.hello_timeout, share=share)
        self.pending.hold(waiting)
        self._readable(waiting)  # a client sends its hello as it connects: often it is here already

    # ---------------------------------------------------------------- first frames

    def _readable(self, waiting: Waiting) -> None:
        if not self.pending.holds(waiting):
            return
        for _ in range(_STEPS_PER_TURN):  # then the others' turn: epoll reports it again
            try:
                frame = waiting.reader.step(waiting.conn)
            except (BlockingIOError, InterruptedError):
                return
            except protocol.MalformedFrame as exc:
                if not send_now(waiting.conn, protocol.error_reply(exc)):
                    self.pending.drop(waiting, "did not read their replies")
                    return
                self.pending.frame_done(waiting)
                continue
            except ProtocolError as exc:
                self.pending.drop(waiting, "sent a frame that cannot be read", exc)
                return
            except (EOFError, OSError):  # the peer left: nothing to tell anyone
                self.pending.drop(waiting, None)
                return
            if frame is None:
                self.pending.frame_begun(waiting)
                continue
            self._first_frame(waiting, frame)
            return

    def _first_frame(self, waiting: Waiting, frame: protocol.Frame) -> None:
        try:
            action, token = self._route(frame, waiting.pid, waiting.uid, waiting.control, waiting.share)
        except (ProtocolError, InvalidSubmission) as exc:  # a bad request: answered, the connection stays
            frame.close_fds()
            if not send_now(waiting.conn, protocol.error_reply(exc)):
                self.pending.drop(waiting, "did not read their replies")
            else:
                self.pending.frame_done(waiting, time.monotonic() + self.control_idle if waiting.control else None)
            return
        except LibshareError as exc:  # refused: answered, then closed
            frame.close_fds()
            self.pending.drop(waiting, f"refused ({type(exc).__name__})", exc)
            return
        except Exception as exc:
            log.exception("routing a first frame")
            self.pending.drop(waiting, "failed", ProtocolError(f"the arbiter failed to read this request: {exc}"))
            return
        self.pending.release(waiting)
        if action == "session":
            waiting.reader.close()
            try:
                self._on_session(waiting.conn, frame, waiting.pid, waiting.uid, token)
            except Exception:
                log.exception("starting a session")
                waiting.conn.close()
            return
        self.control.submit(waiting, frame)
