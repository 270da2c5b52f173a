"""Control commands on the gate's few worker threads, and their replies, which the gate finishes sending.

A control command's first frame leaves the gate (gate.py) for one of at most four worker
threads, started as they are needed, which runs it (``run_control``: the arbiter's
``Commands.answer``) and sends its reply as far as the socket takes it at once. The
connection then goes back to the gate, counted out with the worker meanwhile
(gate_pending.py): to idle until its next command, or, when part of the reply is still
to send, to be watched for room in its socket, where the gate's thread sends the rest
(:meth:`ControlWorkers.finish`). Until its reply is all sent, the connection's next
command is not read, and a reply not taken within ``request_timeout`` closes it. So a
peer that pipelines commands and reads no reply holds no worker: sent blocking, one such
peer held a worker 30 s per command, and four held all of them.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from collections.abc import Callable

from libshare.arbiter.serve.gate_pending import Pending, Waiting
from libshare.errors import LibshareError
from libshare.protocol import wire as protocol

log = logging.getLogger("libshare.arbiter")

CONTROL_WORKERS = 4  # control commands that run at once


class ControlWorkers:
    """The threads that run control commands, and the replies they leave for the gate to finish.

    ``run_control(fields, pid, uid)`` returns the reply to a control command; ``wake()`` wakes
    the gate's thread to take a connection back.
    """

    def __init__(self, run_control: Callable[[dict, int, int], dict], pending: Pending,
                 wake: Callable[[], None]):
        self.run_control = run_control
        self._pending, self._wake = pending, wake
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._idle = 0  # workers waiting for a job

    def submit(self, waiting: Waiting, frame: protocol.Frame) -> None:
        """Run the control command ``frame`` of ``waiting`` (released from the gate) on a worker."""
        self._pending.out_to_worker(waiting)
        self._start_worker()
        self._jobs.put((waiting, frame))

    def finish(self, waiting: Waiting) -> None:
        """On the gate's thread: send more of a control reply; once it is all sent, read the
        connection's next command."""
        if not self._pending.holds(waiting):
            return
        try:
            waiting.outbox = waiting.outbox[send_some(waiting.conn, waiting.outbox):]
        except OSError:  # the peer left
            self._pending.drop(waiting, None)
            return
        if not waiting.outbox:
            self._pending.read_next(waiting)

    def close(self) -> None:
        """Let every worker end once its command is done."""
        for _ in self._workers:
            self._jobs.put(None)

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
            self._serve(waiting, frame)
            with self._lock:
                self._idle += 1

    def _serve(self, waiting: Waiting, frame: protocol.Frame) -> None:
        """Run one command and send what its reply's socket takes at once; the gate sends the rest."""
        conn = waiting.conn
        keep = False
        try:
            reply = protocol.encode(self.run_control(frame.fields, waiting.pid, waiting.uid))
            waiting.outbox = reply[send_some(conn, reply):]
            keep = True
        except (LibshareError, OSError):
            pass
        except Exception:
            log.exception("control command")
        if self._pending.back_from_worker(waiting, keep):
            self._wake()
        else:
            conn.close()


def send_some(conn: socket.socket, data: bytes) -> int:
    """Send what a non-blocking socket takes of ``data`` now; how many bytes (OSError: the peer left)."""
    try:
        return conn.send(data)
    except (BlockingIOError, InterruptedError):
        return 0
