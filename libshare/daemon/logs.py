"""The logs of a daemon: timestamped lines in server.log and control.log, like MPS's.

Used by the arbiter, the control daemon, the CLI and the Slurm hooks; imports nothing of the
engine or Vulkan.

A log file is bounded: once a line takes it to ``LIBSHARE_LOG_MAX_SIZE`` (16 MiB by default)
it is renamed to ``NAME.1`` (replacing the one before) and a new one is begun, so a log takes at
most twice that plus a line (a client attaching in a loop writes some 290 bytes an attach to
server.log, and the log directory is usually the pipe directory, on tmpfs). Several processes
append to one file (the arbiter and the control daemon to control.log, two arbiters during a
handover): each writes with O_APPEND and reads the file's size after each line; the one that
sees it full renames it under an exclusive ``flock`` of the file and checks first that no other
did, and every writer opens the new file when it finds, once a second, that the name no longer
is its file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import time
from pathlib import Path

from libshare import settings as _settings
from libshare.errors import InvalidSubmission

__all__ = ["log_handler", "configure_logging", "close_logging", "ROTATED"]

log = logging.getLogger("libshare.arbiter")
control_log = logging.getLogger("libshare.control")

_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"  # of a log line's date (_LogFile)
ROTATED = ".1"
"""The suffix of a log's one older copy (server.log.1)."""


def log_handler(path: Path, max_bytes: int | None = None) -> logging.Handler:
    """A handler appending timestamped lines (``[date time.ms pid] LEVEL message``) to ``path``,
    which is made readable by its owner and group only: the logs name every client, its group and
    the operator's commands, and in multi-user mode other users could open them by name.

    The file is rotated at ``max_bytes`` (None: the setting ``log_max_size``; see the module's
    docstring); a bad LIBSHARE_LOG_MAX_SIZE raises InvalidSubmission naming it."""
    if max_bytes is None:
        max_bytes = _settings.value("log_max_size")
    return _LogFile(_open(path), Path(path), max_bytes)


def _open(path: Path) -> int:
    """``path`` opened to append, mode 0640."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    try:
        os.fchmod(fd, 0o640)  # one made before, by an older arbiter, as well
    except BaseException:
        os.close(fd)
        raise
    return fd


class _LogFile(logging.Handler):
    """Lines of ``[date time.ms pid] LEVEL message`` (a traceback after, if any) appended to the
    descriptor ``fd``, which it owns, with one ``os.write`` each (O_APPEND: the lines of several
    processes never interleave), the date formatted once a second; with a ``path``, the file is
    rotated at ``max_bytes`` (the module's docstring).

    A FileHandler's text stream, Formatter and flush made a line cost the arbiter's Python some 40 us,
    and each attach logs two (attach cycles in a loop: 0.85-0.90 ms with it, 0.83 ms with this); the
    ``fstat`` after a line costs about 1 us."""

    def __init__(self, fd: int, path: Path | None = None, max_bytes: int = 0):
        super().__init__()
        self.setFormatter(logging.Formatter())  # for tracebacks and stacks
        self._fd = fd
        self._path, self._max_bytes = path, max_bytes
        self._second, self._date = -1, ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            second = int(record.created)
            if second != self._second:
                self._second, self._date = second, time.strftime(_DATE_FORMAT, time.localtime(second))
                self._follow()
            line = f"[{self._date}.{int(record.msecs):03d} {record.process}] {record.levelname} {record.getMessage()}"
            if record.exc_info:
                line += "\n" + self.formatter.formatException(record.exc_info)
            if record.stack_info:
                line += "\n" + self.formatter.formatStack(record.stack_info)
            if self._fd >= 0:
                os.write(self._fd, (line + "\n").encode("utf-8", "replace"))
                if self._path is not None and os.fstat(self._fd).st_size >= self._max_bytes:
                    self._rotate()
        except Exception:  # a full disk: what logging does with any handler's failure
            self.handleError(record)

    def _follow(self) -> None:
        """Open the file anew if another process rotated it away from under this one's descriptor."""
        if self._path is not None and self._fd >= 0 and not self._is_current():
            self._reopen()

    def _rotate(self) -> None:
        """Make the full file NAME.1 and go on in a new one (only open the new one where another
        process rotated it already)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # the same file's writers, one at a time
        try:
            fresh = self._renamed() if self._is_current() else _open(self._path)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        old, self._fd = self._fd, fresh
        os.close(old)

    def _renamed(self) -> int:
        """Rename the file NAME.1 and return a new one at its name. The name never goes missing: the
        file is linked as NAME.1 first, and the new one, made beside it, is renamed over the name."""
        path = str(self._path)
        fresh = _open(Path(path + ".new"))
        try:
            os.ftruncate(fresh, 0)  # (one left by a process that died here)
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path + ".old")
                os.link(path, path + ".old")
                os.replace(path + ".old", path + ROTATED)
            except OSError:  # a file system without hard links: the name is missing for a moment
                os.replace(path, path + ROTATED)
            os.replace(path + ".new", path)
        except BaseException:
            os.close(fresh)
            raise
        return fresh

    def _is_current(self) -> bool:
        """Whether the log's name still names this handler's file."""
        here = os.fstat(self._fd)
        try:
            there = os.stat(self._path)
        except FileNotFoundError:
            return False
        return (there.st_ino, there.st_dev) == (here.st_ino, here.st_dev)

    def _reopen(self) -> None:
        old, self._fd = self._fd, _open(self._path)
        os.close(old)

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        with self.lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        super().close()


def configure_logging(log_directory: Path, echo: bool) -> None:
    """Send libshare.arbiter to server.log and libshare.control to control.log (and stderr when ``echo``),
    each rotated at the setting ``log_max_size`` (a bad LIBSHARE_LOG_MAX_SIZE: the default, and an error
    logged)."""
    log_directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        max_bytes, refused = _settings.value("log_max_size"), None
    except InvalidSubmission as exc:
        max_bytes, refused = _settings.default("log_max_size"), exc
    for logger, name in ((log, "server.log"), (control_log, "control.log")):
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(log_handler(log_directory / name, max_bytes))
        if echo and (stderr := _stderr_copy()) >= 0:
            logger.addHandler(_LogFile(stderr))
    if refused is not None:
        control_log.error("%s; the logs rotate at %s", refused, _settings.format_size(max_bytes))


def _stderr_copy() -> int:
    """A descriptor of this process's stderr for a log handler to own, or -1 when there is none (a
    daemon started with its stderr closed logs to its files alone)."""
    try:
        return os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # sys.stderr None, closed, or not a file
        return -1


def close_logging() -> None:
    """Remove and close the handlers :func:`configure_logging` added."""
    for logger in (log, control_log):
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
