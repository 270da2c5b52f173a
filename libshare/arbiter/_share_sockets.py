"""Share sockets: a group's own door into the arbiter, for clients that may not choose their group.

A client says which group it joins (LIBSHARE_GROUP) and asks for a compute share and a memory
limit in its environment. On a node where the operator hands shares of the device to
containers (the Kubernetes plugin), the environment is the container's own: a container
that dropped LIBSHARE_GROUP left its allocation's group and its limits (73% of the device
against a 20% grant, 300M against 100M), and a container running as root was the arbiter's
operator (root's control commands change the arbiter's state). Group owners
(``set_group_owner``) do not help there: the plugin never learns a container's uid.

So the operator opens a share socket for the group (``open_share GROUP``): a listening
socket at ``PIPE/shares/GROUP/control``, which the plugin mounts as the container's pipe
directory, so that it is the only socket of the arbiter the container can reach. What comes
through it is held to the group whatever it asks for (:func:`check_share_hello`):

* a hello joins GROUP: one that names another group is refused (naming none, or GROUP, is
  the same);
* it may ask for no priority above the default, whatever its uid (root in a container is
  not the operator);
* control commands are refused: the arbiter's own socket, which the container cannot
  reach, takes them.

The group's limits are the operator's (``set_group_active_thread_percentage``,
``set_group_mem_limit``); the environment can only lower a client's own.

A share socket outlives its arbiter: the directory holds it, and an arbiter that starts on
the pipe directory opens again every share whose directory holds a ``control`` entry (one
that crashed, or handed over, left its sockets there; ``close_share`` removes the socket and,
when it can, the directory). The sessions of a container that reattach after a restart dial that socket
again: a session reattaches when the control daemon supervises its pipe directory, which it
tells by the daemon's lock (_config.supervised), and a container sees only its share
directory, so the arbiter puts a hard link to that lock file there (the same file: the lock
is the daemon's). Only the arbiter's uid and root can write the pipe directory, and whoever can could
stop the arbiter anyway; the names found there are checked all the same (:func:`share_name`)
and at most :data:`MAX_SHARES` are opened.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from pathlib import Path

from .._config import supervisor_lock_path
from .._control import printable
from ..errors import AccessDenied, InvalidSubmission

log = logging.getLogger("libshare.arbiter")

SHARES = "shares"  # the pipe directory's subdirectory that holds one directory per share socket
SOCKET = "control"  # the socket's name in its directory: what a client dials in its pipe directory
MAX_SHARES = 256  # share sockets open at once (each is a descriptor of the arbiter's)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

__all__ = ["SHARES", "SOCKET", "MAX_SHARES", "share_name", "share_directory", "bind_listener",
           "check_share_hello", "ShareSockets"]


def share_name(group: str) -> str:
    """``group`` when it may name a share socket (it names a directory: letters, digits, ``.``, ``_``
    and ``-``, at most 64, not starting with a dot or dash); InvalidSubmission otherwise."""
    if not isinstance(group, str) or not _NAME.fullmatch(group):
        raise InvalidSubmission(f"a share's group is 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                                f"letter or digit (it names a directory), got {printable(str(group)[:80])!r}")
    return group


def share_directory(pipe_directory: Path, group: str) -> Path:
    """The directory of ``group``'s share socket: what a container gets as its pipe directory."""
    return Path(pipe_directory) / SHARES / share_name(group)


def bind_listener(path: Path, multi_user: bool) -> socket.socket:
    """A Unix socket listening at ``path`` (replacing whatever is there): 0600, or 0666 in multi-user
    mode, where the arbiter checks each peer's uid itself. It is bound under a hidden name and
    renamed into place once it listens, so whoever sees ``path`` can connect."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    unready = path.with_name(f".{path.name}.{os.getpid()}")
    unready.unlink(missing_ok=True)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(unready))
    except BaseException:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    try:
        if multi_user:  # opened only now: nobody could connect to it before it was ours
            os.chmod(unready, 0o666)
        listener.listen(socket.SOMAXCONN)  # the kernel caps it (net.core.somaxconn)
        os.rename(unready, path)  # atomic
    except BaseException:
        listener.close()
        unready.unlink(missing_ok=True)
        raise
    return listener


def check_share_hello(fields: dict, group: str) -> None:
    """Hold a hello that came through ``group``'s share socket to that group (see the module's
    opening): AccessDenied when it names another one; its ``group`` field is set to ``group``."""
    asked = fields.get("group") or ""
    if asked not in ("", group):
        raise AccessDenied(f"this socket is the share of group {group}: its clients join that group, not "
                           f"{printable(asked[:64])!r} (leave LIBSHARE_GROUP unset)")
    fields["group"] = group


class ShareSockets:
    """The share sockets of one arbiter's pipe directory; ``listen(sock, group)`` hands each one to
    the gate and ``unlisten(group)`` takes it back (thread-safe: control workers call these)."""

    def __init__(self, pipe_directory: Path, multi_user: bool, listen, unlisten):
        self.root = Path(pipe_directory) / SHARES
        self._multi_user = multi_user
        self._listen, self._unlisten = listen, unlisten
        self._lock = threading.Lock()  # control workers open and close at once
        self._open: set[str] = set()

    def names(self) -> list[str]:
        """The groups whose share socket is open, sorted."""
        with self._lock:
            return sorted(self._open)

    def open(self, group: str) -> Path:
        """Open ``group``'s share socket (again, after a restart: it replaces what a dead arbiter left);
        its directory. Opening an open one changes nothing."""
        directory = share_directory(self.root.parent, group)
        with self._lock:
            if group in self._open:
                return directory
            if len(self._open) >= MAX_SHARES:
                raise InvalidSubmission(f"{MAX_SHARES} share sockets are open already; close one first "
                                        "(close_share)")
            self.root.mkdir(mode=0o755, exist_ok=True)
            directory.mkdir(mode=0o755, exist_ok=True)
            self._listen(bind_listener(directory / SOCKET, self._multi_user), group)
            self._open.add(group)
            self._link_supervisor_lock(directory)
        log.info("share socket of group %s open at %s", group, directory / SOCKET)
        return directory

    def close(self, group: str) -> bool:
        """Close ``group``'s share socket and remove it (and its directory, unless something is
        mounted there or left in it); False when it was not open. Its clients stay connected."""
        directory = share_directory(self.root.parent, group)
        with self._lock:
            if group not in self._open:
                return False
            self._open.discard(group)
            self._unlisten(group)
            (directory / SOCKET).unlink(missing_ok=True)
            supervisor_lock_path(directory).unlink(missing_ok=True)
        try:
            directory.rmdir()
        except OSError as exc:  # a container's mount, say: the socket is gone, so it is not opened again
            log.info("share directory %s kept: %s", directory, exc.strerror)
        log.info("share socket of group %s closed", group)
        return True

    def _link_supervisor_lock(self, directory: Path) -> None:
        """Put the control daemon's lock file in ``directory`` too (a hard link, put in place at once),
        or take away a link left from a daemon before when none supervises now."""
        lock, link = supervisor_lock_path(self.root.parent), supervisor_lock_path(directory)
        staged = link.with_name(f".{link.name}.{os.getpid()}")
        try:
            staged.unlink(missing_ok=True)
            os.link(lock, staged)
            os.rename(staged, link)
        except FileNotFoundError:  # not supervised
            link.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("the control daemon's lock is not in %s (its sessions will not wait for a restart): %s",
                        directory, exc)

    def reopen_left(self) -> list[str]:
        """Open every share whose directory still holds its socket (an arbiter before this one opened
        it); the groups opened. A name that is not a share name, or past MAX_SHARES, is skipped."""
        try:
            entries = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        opened = []
        for name in entries:
            if not _NAME.fullmatch(name) or not (self.root / name / SOCKET).exists():
                continue
            try:
                self.open(name)
                opened.append(name)
            except (InvalidSubmission, OSError) as exc:
                log.warning("share socket of group %s not opened again: %s", printable(name), exc)
        return opened
