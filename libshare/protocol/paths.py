"""Where things live and which mode to use: the settings (libshare/settings.py, the LIBSHARE_*
environment with per-user defaults), and the files of a pipe directory."""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

from libshare import settings as _settings
from libshare.errors import InvalidSubmission

__all__ = ["pipe_directory", "socket_path", "lock_path", "log_directory", "connect_mode", "MODES",
           "SHARES", "SOCKET", "share_name", "share_directory"]

MODES = _settings.SETTINGS["mode"].parse.choices
SHARES = "shares"  # the pipe directory's subdirectory that holds one directory per share socket
SOCKET = "control"  # the socket's name in its directory: what a client dials in its pipe directory
_SHARE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def pipe_directory(override: str | os.PathLike | None = None) -> Path:
    """The pipe directory: ``override``, else LIBSHARE_PIPE_DIRECTORY, else a per-user default."""
    return _settings.value("pipe_directory", override or None)


def socket_path(directory: Path) -> Path:
    """The arbiter's control socket inside a pipe directory."""
    return directory / SOCKET


def lock_path(directory: Path) -> Path:
    """The arbiter's PID lock file inside a pipe directory (held with flock while it runs)."""
    return directory / "arbiter.pid"


def supervisor_lock_path(directory: Path) -> Path:
    """The control daemon's lock file inside a pipe directory (held with flock while it supervises)."""
    return directory / "control-daemon.pid"


REPLACEMENT_WAIT = 30.0
"""Seconds a session waits for a new arbiter, at least, while a control daemon supervises its pipe
directory: the daemon's longest back-off between two starts (``BACKOFF_MAX`` in
libshare/daemon/supervisor.py, kept well inside this) plus an arbiter's start, with room. A
burst of arbiter deaths so makes sessions pause, not end."""


def supervised(directory: Path) -> bool:
    """True while a control daemon supervises ``directory``: it starts a new arbiter whenever the
    one serving there goes away other than by ``quit`` (so a session waits for it and reattaches)."""
    try:
        fd = os.open(supervisor_lock_path(directory), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # (a lock taken here goes with the descriptor)
    return False


def log_directory(override: str | os.PathLike | None = None, pipe_dir: Path | None = None) -> Path:
    """Where control.log and server.log go: ``override``, else LIBSHARE_LOG_DIRECTORY, else the pipe directory."""
    configured = _settings.value("log_directory", override or None)
    if configured is not None:
        return configured
    return pipe_dir if pipe_dir is not None else pipe_directory()


def connect_mode(requested: str | None) -> str:
    """``requested``, else LIBSHARE_MODE, else "auto"; a clear ValueError (InvalidSubmission) for anything else."""
    return _settings.value("mode", requested or None)


def share_name(group: str) -> str:
    """``group`` when it may name a share socket (it names a directory: letters, digits, ``.``, ``_``
    and ``-``, at most 64, not starting with a dot or dash); InvalidSubmission otherwise."""
    if not isinstance(group, str) or not _SHARE_NAME.fullmatch(group):
        from libshare.protocol.control import printable  # (control imports this module)

        raise InvalidSubmission(f"a share's group is 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                                f"letter or digit (it names a directory), got {printable(str(group)[:80])!r}")
    return group


def share_directory(pipe_directory: Path, group: str) -> Path:
    """The directory of ``group``'s share socket (arbiter/serve/share_sockets.py): what a container
    gets as its pipe directory."""
    return Path(pipe_directory) / SHARES / share_name(group)
