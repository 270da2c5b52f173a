"""Where things live and which mode to use: the LIBSHARE_* environment, with per-user defaults."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["pipe_directory", "socket_path", "lock_path", "log_directory", "connect_mode", "MODES"]

MODES = ("auto", "daemon", "embedded")


def pipe_directory(override: str | os.PathLike | None = None) -> Path:
    """The pipe directory: ``override``, else LIBSHARE_PIPE_DIRECTORY, else a per-user default."""
    if override:
        return Path(override)
    configured = os.environ.get("LIBSHARE_PIPE_DIRECTORY")
    if configured:
        return Path(configured)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return Path(runtime) / "libshare"
    return Path(f"/tmp/libshare-{os.getuid()}")


def socket_path(directory: Path) -> Path:
    """The arbiter's control socket inside a pipe directory."""
    return directory / "control"


def lock_path(directory: Path) -> Path:
    """The arbiter's PID lock file inside a pipe directory (held with flock while it runs)."""
    return directory / "arbiter.pid"


def supervisor_lock_path(directory: Path) -> Path:
    """The control daemon's lock file inside a pipe directory (held with flock while it supervises)."""
    return directory / "control-daemon.pid"


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
    if override:
        return Path(override)
    configured = os.environ.get("LIBSHARE_LOG_DIRECTORY")
    if configured:
        return Path(configured)
    return pipe_dir if pipe_dir is not None else pipe_directory()


def connect_mode(requested: str | None) -> str:
    """``requested``, else LIBSHARE_MODE, else "auto"; a clear ValueError for anything else."""
    mode = requested or os.environ.get("LIBSHARE_MODE") or "auto"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    return mode
