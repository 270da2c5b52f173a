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

A share socket belongs to one arbiter, as the group's limits do: the next one (after a crash
or ``restart``) starts without either, and the plugin, which sees the new arbiter, sets the
limits and then opens the socket again. Meanwhile a contained session that lost its arbiter
dials the socket until it answers (the welcome told it whether a control daemon supervises
the arbiter: the container cannot see the daemon's lock), so it never meets the group
without its limits. A new arbiter never reopens sockets from what it finds on disk: those
would answer before the limits are set, and would keep open a share whose group was given to
another container while the arbiter was down.

Through a share socket the group's owner rules still apply, to root as well (hello.py, check_group_allowed:
in multi-user mode the socket is reachable by every local user, not only by the container),
and one share serves at most a quarter of ``--max-clients`` at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path

from libshare.protocol.control import printable
# A share's paths are protocol/paths.py's: the Kubernetes plugin computes them too.
from libshare.protocol.paths import SHARES, SOCKET, share_directory, share_name  # noqa: F401
from libshare.protocol.wire import unix_address
from libshare.errors import AccessDenied, InvalidSubmission

log = logging.getLogger("libshare.arbiter")

MAX_SHARES = 256  # share sockets open at once (each is a descriptor of the arbiter's)

__all__ = ["SHARES", "SOCKET", "MAX_SHARES", "share_name", "share_directory", "bind_listener",
           "check_share_hello", "ShareSockets"]


def bind_listener(path: Path, multi_user: bool) -> socket.socket:
    """A Unix socket listening at ``path`` (replacing whatever is there): 0600, or 0666 in multi-user
    mode, where the arbiter checks each peer's uid itself. It is bound under a hidden name and
    renamed into place once it listens, so whoever sees ``path`` can connect."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    unready = path.with_name(f".{path.name}.{os.getpid()}")
    unready.unlink(missing_ok=True)
    old_umask = os.umask(0o177)
    try:
        with unix_address(unready) as address:
            listener.bind(address)
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
            try:
                directory.rmdir()
            except OSError as exc:  # a container's mount, say
                log.info("share directory %s kept: %s", directory, exc.strerror)
        log.info("share socket of group %s closed", group)
        return True
