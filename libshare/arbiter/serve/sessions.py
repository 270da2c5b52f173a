"""A client's session: its welcome, its thread, its requests read one after another, its end.

Connections. A connection costs a thread only once it is a client. Until it has said hello, and
between an operator's control commands, it waits in the gate (gate.py): one selector thread
that accepts, reads first frames in steps, and holds a bounded number of connections, each for
a bounded time (``hello_timeout`` to say hello, ``request_timeout`` to finish a frame once
begun: libshare/settings.py). An admitted hello (hello.py) is welcomed on the gate's thread
(:meth:`Sessions.start`: nothing in that waits on the peer); the connection then gets a thread
of its own (one that a departed client left idle, or a new one), which answers its requests
(requests.py); a control command runs on one of the gate's few worker threads, and its
connection then goes back to the gate. An embedded session's hello goes through the gate as
well.

Between requests a session thread polls its connection for _REQUEST_SPIN (200 us), yielding
the core at each look, before it sleeps in ``recv`` (:class:`RequestPoll`): an idle core halts,
and waking it cost this 2-core VM tens of microseconds per request (an attach went from 0.99
to 0.87 ms). One thread polls at a time; a client whose request did not come within that time
is not polled for again until one does; a client's polling is held to a tenth of its time
connected (a new client's first millisecond of it is there at once, so an attach is polled
throughout); an embedded arbiter never polls (its client needs the GIL). A client polls for
its replies the same way (libshare/client/exchange.py).

A frame that does not parse as a whole (deep JSON, a list where an id belongs) is answered and
the connection goes on; only a frame the reader cannot follow (a bad header, a length past the
bound, a frame begun and not finished in time) ends it, and a client that does not read its
replies for _SEND_TIMEOUT seconds is dropped. Once the control thread knows a client, the end
of its connection reclaims it, whatever failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import socket
import struct
import threading
import time

from libshare.errors import LibshareError, TooManyClients
from libshare.protocol import wire as protocol
from libshare.arbiter.serve.clients import Client
from libshare.arbiter.serve.hello import Hellos, SpareRegions
from libshare.arbiter.serve.requests import SCARCE, Requests, reply_error

__all__ = ["Sessions", "RequestPoll"]

log = logging.getLogger("libshare.arbiter")

_SEND_TIMEOUT = 30  # seconds a reply may wait for a client to read (SO_SNDTIMEO); then it is dropped
_IDLE_SESSION_THREADS = 4  # session threads kept waiting for the next client once theirs left
_IDLE_SESSION_SECONDS = 2.0  # ... for this long at most
_REQUEST_SPIN = 200e-6  # seconds a session thread polls for a client's next request before it sleeps (RequestPoll)
_POLL_SHARE = 0.1  # ... within a budget that grows by this share of the time the client is connected
_POLL_BURST = 1e-3  # ... up to this many seconds: a new client's first requests are all polled for


class RequestPoll:
    """How a session thread waits for its client's next request (see "Between requests" in the
    module's essay): it polls the connection for _REQUEST_SPIN (``protocol.poll_briefly``), then
    sleeps in ``recv``.

    It polls only while the client's requests come within that time of each other, only while no
    other session thread polls (``lock``), and within a budget: _POLL_SHARE of the client's time
    connected, _POLL_BURST at most. Without the budget a client that sent a request 90 us after
    each reply kept a core polling (the arbiter at 94-96% of a core, 20% without polling)."""

    def __init__(self, conn: socket.socket, lock: threading.Lock, enabled: bool):
        self._poller = select.poll()
        self._poller.register(conn, select.POLLIN)
        self._lock, self._enabled, self._armed = lock, enabled, enabled
        self._budget = _POLL_BURST
        self._refilled = self._waited_from = time.perf_counter()

    def wait(self) -> None:
        """Poll until a request can be read or the poll's time is up (or not at all)."""
        start = self._waited_from = time.perf_counter()
        if not self._armed:
            return
        self._budget = min(_POLL_BURST, self._budget + (start - self._refilled) * _POLL_SHARE)
        self._refilled = start
        if self._budget <= 0 or not self._lock.acquire(blocking=False):
            return
        try:
            protocol.poll_briefly(self._poller, min(_REQUEST_SPIN, self._budget))
        finally:
            self._lock.release()
        self._budget -= time.perf_counter() - start

    def arrived(self) -> None:
        """A request came: poll before the next one only if this one came within a poll's time of
        the last :meth:`wait`."""
        self._armed = self._enabled and time.perf_counter() - self._waited_from < _REQUEST_SPIN


class Sessions:
    """The welcomed clients' connections and the threads that serve them. ``lock`` is the arbiter's
    (its ``closed``, the connections, the idle threads); ``hellos`` welcomes, ``requests`` answers,
    ``spares`` are refilled after each welcome."""

    def __init__(self, arbiter, lock: threading.Lock, hellos: Hellos, requests: Requests, spares: SpareRegions):
        self._arbiter, self._lock = arbiter, lock
        self._hellos, self._requests, self._spares = hellos, requests, spares
        self._connections: set[socket.socket] = set()
        self._closing: list[socket.socket] = []  # the connections open when the arbiter closed
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # admitted connections for idle session threads
        self._idle = 0  # session threads waiting for a connection (under the lock)
        self._polling = threading.Lock()  # held by the one session thread that polls for a request

    def start(self, conn: socket.socket, hello: protocol.Frame, pid: int, uid: int, client_id: int) -> None:
        """Welcome an admitted connection on the gate's thread (the gate's ``on_session``), then give it a
        thread of its own for its requests: an idle session thread when one waits, else a new one.
        Handed over while the client maps its ring (after :meth:`_joined`), that thread is awake
        before the first request comes; handed over before the welcome, its wake-up (and a new
        thread's start, which a burst of clients can afford but a lone attach notices) delayed the
        welcome."""
        with self._lock:
            self._connections.add(conn)
        client = self._welcome(conn, hello.fields, pid, uid, client_id)
        if client is None:
            return
        try:
            self._joined(client)  # while the client maps its ring
            job = (conn, client)
            with self._lock:
                idle = self._idle > 0
                if idle:  # claimed and queued under one lock: an idle thread that gives up checks both
                    self._idle -= 1  # that thread's: each job handed over had one counted idle
                    self._jobs.put(job)
            if not idle:
                threading.Thread(target=self._thread, args=(job,), name="libshare-client", daemon=True).start()
        except BaseException:
            self._end(conn, client, client.id)
            raise
        self._spares.refill()  # a head start for the next hello, made on the spares thread once the
        # session thread has its wake-up under way (made before, it held that up)

    def stop(self) -> None:
        """The arbiter closes (``closed`` is set): the idle session threads end, and the connections
        open now are kept for :meth:`disconnect`."""
        with self._lock:
            self._closing = list(self._connections)
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._jobs.put(None)

    def disconnect(self) -> None:
        """Shut down the connections that were open when the arbiter closed (their threads end)."""
        for conn in self._closing:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _thread(self, job: tuple) -> None:
        """Serve one connection after another; wait for the next one while fewer than
        _IDLE_SESSION_THREADS others wait (an idle thread costs no CPU: it sleeps in ``get``, named
        libshare-idle: it is nobody's connection thread then), and for _IDLE_SESSION_SECONDS at
        most, so that a quiet arbiter goes back to the threads it started with.

        Every waiting thread stands for an idle count not yet claimed or a job queued (the gate
        claims and queues under the lock): one whose wait ran out takes a job still queued, if
        any, else gives its count back and ends."""
        me = threading.current_thread()
        while job is not None:
            me.name = "libshare-client"
            self._serve(*job)
            job = None
            with self._lock:
                if self._arbiter.closed or self._idle >= _IDLE_SESSION_THREADS:
                    return
                self._idle += 1
            me.name = "libshare-idle"
            try:
                job = self._jobs.get(timeout=_IDLE_SESSION_SECONDS)
            except queue.Empty:
                with self._lock:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return

    def _welcome(self, conn: socket.socket, fields: dict, pid: int, uid: int, client_id: int) -> Client | None:
        """Make and welcome the client the gate admitted (``Hellos.welcome``), on the gate's thread: the
        socket is still non-blocking there, and the empty send buffer of a new connection takes the
        welcome whole. None when that failed: the peer was told why if it could be, and it is closed."""
        with self._handler_end(conn):
            try:
                return self._hellos.welcome(conn, fields, pid, uid, client_id)
            except OSError as exc:  # making its ring, pidfd or doorbell: the peer is told, not dropped
                if exc.errno not in SCARCE:
                    raise
                raise TooManyClients(f"the arbiter could not make this client ({exc.strerror}): it is out of "
                                     "file descriptors or memory; try again later") from exc
        self._end(conn, None, client_id)
        return None

    def _joined(self, client: Client) -> None:
        """The rest of a hello, on the gate's thread once the welcome is out, before the connection
        has a thread of its own (so before any request of the client is served): the client maps
        its ring meanwhile, and its session thread, woken after this, is ready for its first request
        (run on that thread, this held up the first request)."""
        arbiter = self._arbiter
        arbiter.drainer.tasks.flush()  # add_client: here, unless the control thread is awake anyway
        if arbiter.client_oom_score_adj is not None and client.pid != os.getpid():
            _raise_oom_score_adj(client.pid, arbiter.client_oom_score_adj)
        if arbiter.fd_budget is not None:
            arbiter.fd_budget.client_joined()

    def _serve(self, conn: socket.socket, client: Client) -> None:
        """Serve a welcomed client's requests until its connection ends (on its session thread)."""
        try:
            with self._handler_end(conn):
                conn.setblocking(True)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", _SEND_TIMEOUT, 0))
                timeout = self._arbiter.request_timeout
                poll = RequestPoll(conn, self._polling, enabled=client.pid != os.getpid())  # embedded: its GIL
                while True:
                    poll.wait()
                    try:
                        frame = protocol.recv(conn, max_fds=1, timeout=timeout)
                    except protocol.MalformedFrame as exc:  # whole, and bad: answered; the next one is read
                        reply_error(conn, exc)
                        continue
                    poll.arrived()
                    client.counters.control_bytes += len(frame.payload) + 64
                    self._requests.answer(conn, client, frame)
        finally:
            self._end(conn, client, client.id)

    @contextlib.contextmanager
    def _handler_end(self, conn: socket.socket):
        """How a connection's handling ends: a LibshareError is answered, the peer's departure ends it
        quietly, anything else is logged (the caller closes the connection)."""
        try:
            yield
        except LibshareError as exc:  # before OSError: some libshare errors are OSErrors too
            reply_error(conn, exc)
        except (EOFError, OSError):
            pass  # the client went away
        except Exception:
            log.exception("connection handler error")

    def _end(self, conn: socket.socket, client: Client | None, client_id: int) -> None:
        """Close a connection; its client slot goes back, and the control thread reclaims its client
        (``client`` None: the hello failed, and no client was made, or it was reclaimed already)."""
        self._hellos.release(client_id if client is None else client.id)
        if client is not None:  # the control thread logs the end (with the reclaim, when that comes at once)
            drainer = self._arbiter.drainer
            try:  # not waited for: this thread may serve the next client meanwhile
                drainer.post(drainer.connection_closed, client)
            except LibshareError:
                pass  # the arbiter is shutting down, and its shutdown reclaims every client
        with self._lock:
            self._connections.discard(conn)
        conn.close()


def _raise_oom_score_adj(pid: int, floor: int) -> None:
    """Raise process ``pid``'s oom_score_adj to ``floor`` if it is lower (never lower it)."""
    try:  # four system calls (a buffered open() in "r+" makes nine): this is on the way to a client's requests
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
        try:
            if int(os.read(fd, 32)) < floor:
                os.pwrite(fd, str(floor).encode(), 0)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        log.info("cannot raise the oom_score_adj of pid %d to %d: %s", pid, floor, exc)
