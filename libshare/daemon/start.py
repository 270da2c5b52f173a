"""Starting an arbiter (or the control daemon) in the background and waiting until it answers ACTIVE.

Used by ``libshare-control -d`` and :mod:`libshare.manager`; it starts ``python -m
libshare.arbiter`` as a detached process and talks to it only through its control socket,
so it imports nothing of the engine or Vulkan.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from libshare.protocol import paths as _config
from libshare.protocol.control import ControlConnection, decimal
from libshare._proc import MAX_PID, parent_of
from libshare.daemon.directory import serving_pid
from libshare.daemon.options import STDERR_FILE, Options
from libshare.errors import ArbiterUnavailable, LibshareError, StartFailed

__all__ = ["start_background"]


def _tail(path: Path, offset: int, lines: int = 8) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _status(pipe_directory: Path, pid: int) -> str | None:
    """The state of the arbiter ``pid`` at ``pipe_directory``; None until it holds the lock and answers."""
    try:
        if _config.lock_path(pipe_directory).read_text().strip() != str(pid):
            return None
        with ControlConnection(pipe_directory, timeout=5.0) as connection:
            if connection.run("get_server_list").split() != [str(pid)]:
                return None
            return connection.run("get_server_status").strip()
    except (ArbiterUnavailable, FileNotFoundError):
        return None


def _child_serving(pipe_directory: Path, parent: int) -> int | None:
    """The pid of the arbiter serving ``pipe_directory`` if it is a child of ``parent``."""
    pid = decimal(serving_pid(pipe_directory) or "", MAX_PID)
    return pid if pid and parent_of(pid) == parent else None


def start_background(options: Options, timeout: float = 60.0, supervised: bool = False) -> subprocess.Popen:
    """Start a detached arbiter and return once it answers ACTIVE; :class:`StartFailed` with its reason if not.

    The arbiter runs in a new session with stdin and stdout on /dev/null and stderr
    appended to ``arbiter.stderr`` in the log directory; it logs to server.log. With
    ``supervised`` the process started is the control daemon (_supervisor.py), whose child
    arbiter must answer ACTIVE.
    """
    options.log_directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    stderr_path = options.log_directory / STDERR_FILE
    with open(stderr_path, "ab") as stderr:
        offset = stderr.tell()
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--quiet",
                                    *(["--supervise"] if supervised else []), *options.argv()],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True, close_fds=True, cwd="/")
    try:
        _wait_active(process, options.pipe_directory, timeout, lambda: _tail(stderr_path, offset), supervised)
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait()
        raise
    return process


def _wait_active(process: subprocess.Popen, pipe_directory: Path, timeout: float, reason,
                 supervised: bool = False) -> None:
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartFailed(reason() or f"the arbiter exited with status {process.returncode}")
        try:
            pid = _child_serving(pipe_directory, process.pid) if supervised else process.pid
            status = None if pid is None else _status(pipe_directory, pid)
        except LibshareError as exc:
            status = f"unanswered ({exc})"
        if status == "ACTIVE":
            return
        if status == "FAULT":
            raise StartFailed(f"the arbiter (pid {process.pid}) is in FAULT state: {reason()}")
        time.sleep(0.02)
    raise StartFailed(f"the arbiter (pid {process.pid}) was not ACTIVE after {timeout:.0f} s "
                      f"(last status: {status}); {reason()}")
