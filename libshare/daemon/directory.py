"""A pipe directory: its mode and owner, the PID lock that proves who serves it, and stale sockets.

One arbiter serves a pipe directory. It proves that by holding an ``flock`` on the
directory's lock file for its whole life (the kernel drops the lock when the process dies,
however it dies), with its pid written inside for whoever is refused. A socket left behind
by a dead arbiter is stale: nobody accepts on it, ``connect`` is refused, and the new
arbiter removes it. A socket that answers belongs to a live arbiter that holds no lock (an
embedded host): the newcomer names its pid and leaves.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import stat
import struct
import time
from pathlib import Path

from libshare.protocol import paths as _config
from libshare.errors import AlreadyServing, LibshareError

__all__ = ["prepare_directory", "holder", "serving_pid", "PidLock", "remove_stale_socket"]

log = logging.getLogger("libshare.arbiter")


def prepare_directory(directory: Path, multi_user: bool = False) -> None:
    """Create the pipe directory (or take an existing one) and set its mode: 0700, or in multi-user
    mode 0711, which lets every user reach the socket (0666, set by the arbiter) but not list or
    change the directory. It must be a directory of this uid: one that another user owns could
    have its socket replaced under the arbiter."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = os.lstat(directory)
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
        raise LibshareError(f"the pipe directory {directory} is not a directory of uid {os.getuid()} (owner uid "
                            f"{status.st_uid}); remove it or choose another --pipe-directory")
    os.chmod(directory, 0o711 if multi_user else 0o700)


def holder(path: Path) -> str:
    """The pid written in a held lock file (it may still be empty a moment after it was taken)."""
    for _ in range(20):
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text:
            return text
        time.sleep(0.01)
    return "unknown"


def serving_pid(directory: Path) -> str | None:
    """The pid of the arbiter that holds ``directory``'s lock, or None when none does."""
    path = _config.lock_path(directory)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return holder(path)
    finally:
        os.close(fd)
    return None


class PidLock:
    """The flock on a pipe directory's lock file, held with this pid written in it."""

    def __init__(self, path: Path, directory: Path):
        self.path = path
        """The lock file."""
        self._fd = self._take(path, directory)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    @staticmethod
    def _take(path: Path, directory: Path) -> int:
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise AlreadyServing(f"another arbiter (pid {holder(path)}) serves {directory}") from None
            # The previous holder unlinks the file before it lets go: a lock on an inode that
            # is no longer at ``path`` guards nothing, so take the new file instead.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def release(self) -> None:
        """Remove the lock file, then let go of the lock. Idempotent."""
        if self._fd < 0:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def _peer_pid(sock: socket.socket) -> int:
    pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid


def remove_stale_socket(path: Path, directory: Path) -> None:
    """Remove a socket nobody accepts on; raise :class:`AlreadyServing` when one answers."""
    if not os.path.lexists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.settimeout(2.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        log.warning("removed stale socket %s (no arbiter answered on it)", path)
        return
    except OSError as exc:
        raise AlreadyServing(f"cannot tell whether {path} is in use ({exc}); remove it if no arbiter runs") from exc
    else:
        raise AlreadyServing(f"another arbiter (pid {_peer_pid(probe)}) serves {directory}")
    finally:
        probe.close()
