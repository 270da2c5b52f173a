"""Arbiters on demand, for orchestrators that start workloads (job runners, container runtimes).

``acquire()`` returns a :class:`Lease` on the arbiter of one pipe directory, starting it
(exactly as ``libshare-control -d`` does) when this process holds no lease on it yet;
``Lease.environment`` is what to add to each workload's environment so that its
sessions attach to that arbiter. Leases are counted per pipe directory: when the last
one is released the manager sends ``quit`` and waits for the arbiter to exit. An
arbiter that was already running when the manager first needed it (started by an
operator, systemd, or another manager) is used but never stopped.

One arbiter serves a pipe directory and owns one device: to share several devices,
give each its own pipe directory. The manager is thread-safe; arbiters it started
and that the process never released keep running after it exits, like a daemon
started with ``libshare-control -d``.

    lease = libshare.manager.acquire(device="0", pipe_directory="/run/libshare/gpu0")
    subprocess.run(["python", "worker.py"], env={**os.environ, **lease.environment})
    lease.release()
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

from libshare.protocol.control import ControlConnection
from libshare.daemon.options import Options
from libshare.daemon.start import start_background
from libshare.errors import ArbiterLost, ArbiterUnavailable

__all__ = ["Lease", "acquire", "release"]

_STOP_TIMEOUT = 30.0


class _Arbiter:
    """The manager's record of one pipe directory's arbiter: who started it, how many leases hold it."""

    def __init__(self, options: Options):
        self.options = options
        self.leases = 0
        self.lock = threading.Lock()  # held while starting or stopping; the registry's lock is not
        self.process: subprocess.Popen | None = None  # set when this manager started it
        self.pid: int | None = None

    def running(self) -> bool:
        if self.pid is None:
            return False
        return self.process.poll() is None if self.process is not None else _answers(self.options.pipe_directory)

    def start(self, timeout: float) -> None:
        pid = _server_pid(self.options.pipe_directory)
        if pid is not None:
            self.process, self.pid = None, pid  # someone else's: use it, never quit it
            return
        self.process = start_background(self.options, timeout)
        self.pid = self.process.pid

    def stop(self) -> None:
        process, self.process, self.pid = self.process, None, None
        if process is None:
            return
        try:
            with ControlConnection(self.options.pipe_directory, timeout=10.0) as connection:
                connection.run("quit")
        except (ArbiterUnavailable, ArbiterLost):
            pass  # already gone or going; wait() below says which
        try:
            process.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _server_pid(pipe_directory: Path) -> int | None:
    try:
        with ControlConnection(pipe_directory, timeout=5.0) as connection:
            return int(connection.run("get_server_list").split()[0])
    except (ArbiterUnavailable, ArbiterLost, IndexError, ValueError):
        return None


def _answers(pipe_directory: Path) -> bool:
    return _server_pid(pipe_directory) is not None


_registry: dict[Path, _Arbiter] = {}
_registry_lock = threading.Lock()


class Lease:
    """One user's hold on an arbiter; release it (or leave its ``with`` block) when the workload ends."""

    def __init__(self, arbiter: _Arbiter):
        self._arbiter = arbiter
        self._released = False
        options = arbiter.options
        self.pipe_directory: Path = options.pipe_directory
        """The arbiter's pipe directory."""
        self.log_directory: Path = options.log_directory
        """Where its server.log and control.log are."""
        self.device: str | None = options.device
        """The device the arbiter was started for (None: LIBSHARE_DEVICE, else device 0)."""
        self.pid: int = arbiter.pid
        """The arbiter's pid."""
        self.started: bool = arbiter.process is not None
        """Whether this manager started the arbiter (and will quit it after the last release)."""

    @property
    def environment(self) -> dict[str, str]:
        """Variables to add to a workload's environment so its sessions use this arbiter, and only it."""
        env = {"LIBSHARE_PIPE_DIRECTORY": str(self.pipe_directory), "LIBSHARE_MODE": "daemon",
               "LIBSHARE_LOG_DIRECTORY": str(self.log_directory)}
        if self.device is not None:
            env["LIBSHARE_DEVICE"] = str(self.device)
        return env

    def release(self) -> None:
        """Give the lease back; the last one of an arbiter the manager started quits it. Idempotent."""
        if self._released:
            return
        self._released = True
        _release(self._arbiter)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<libshare.manager.Lease {state} arbiter pid {self.pid} at {self.pipe_directory}>"


def acquire(device: str | int | None = None, pipe_directory: str | os.PathLike | None = None,
            log_directory: str | os.PathLike | None = None, *, timeout: float = 60.0,
            multi_user: bool = False) -> Lease:
    """A lease on the arbiter of ``pipe_directory`` (default: LIBSHARE_PIPE_DIRECTORY or the per-user one).

    Starts the arbiter for ``device`` when none runs there, and waits (at most ``timeout``
    seconds) until it is ACTIVE; raises :class:`libshare.errors.StartFailed` with
    the arbiter's own reason if it does not start, and ValueError when the pipe directory
    is already leased for another device. ``multi_user`` starts it with ``--multi-user`` (root
    only): clients of every uid may connect (an arbiter already running is used as it is).
    """
    options = Options.create(pipe_directory, log_directory,
                                     device=None if device is None else str(device), multi_user=multi_user)
    with _registry_lock:
        arbiter = _registry.setdefault(options.pipe_directory, _Arbiter(options))
        _check_device(arbiter, options)
        arbiter.leases += 1
    try:
        with arbiter.lock:
            if not arbiter.running():
                arbiter.start(timeout)
            return Lease(arbiter)
    except BaseException:
        _release(arbiter, stop=False)
        raise


def _check_device(arbiter: _Arbiter, options: Options) -> None:
    held, wanted = arbiter.options.device, options.device
    if arbiter.leases and None not in (held, wanted) and held != wanted:
        raise ValueError(f"{options.pipe_directory} is leased for device {held}; one arbiter serves one device, "
                         f"so give device {wanted} its own pipe_directory")
    if arbiter.leases and options.log_directory != arbiter.options.log_directory:
        raise ValueError(f"{options.pipe_directory} is leased with logs in {arbiter.options.log_directory}, "
                         f"not {options.log_directory}")
    if not arbiter.leases:
        arbiter.options = options


def release(lease: Lease) -> None:
    """Give ``lease`` back (the same as ``lease.release()``)."""
    lease.release()


def _release(arbiter: _Arbiter, stop: bool = True) -> None:
    with _registry_lock:
        arbiter.leases -= 1
        if arbiter.leases:
            return
    with arbiter.lock:
        with _registry_lock:
            if arbiter.leases:  # someone acquired it again meanwhile: keep it
                return
        if stop:
            arbiter.stop()
