"""The operator's control commands: their table, and how a command reaches the arbiter.

A control command travels on the arbiter's socket like a session's requests: the frame
``{"op": "control", "command": NAME, "args": [...]}`` answered by ``{"ok": true,
"output": TEXT}`` or ``{"ok": false, "error": CLASS, "message": TEXT}``. A control
connection sends no hello and may send any number of commands. This module imports
no Vulkan, so ``libshare-control`` stays a light client.

Names and meanings follow ``nvidia-cuda-mps-control``. Where MPS takes a server PID,
libshare accepts it and checks that it names the arbiter it is talking to (one arbiter
serves a pipe directory), so scripts written for MPS keep working.
"""

from __future__ import annotations

import select
import socket
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from libshare.protocol import paths as _config, wire as protocol
from libshare import errors

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def decimal(text: str, most: int) -> int | None:
    """The value of ``text`` when it is a plain ASCII decimal numeral from 0 to ``most``, else None
    (``str.isdigit`` also passes "²" and "①", which ``int`` refuses, and ``int`` reads "١٠" and "1_0")."""
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= len(str(most))):
        return None
    value = int(text)
    return value if value <= most else None


def printable(text: str, spaces: bool = True) -> str:
    """``text`` with every character that is not printable escaped (``\\n``, ``\\x1b``, ``\\u2028``),
    and, unless ``spaces``, every space too: what a peer wrote cannot start a line of its own,
    move the cursor, or split a column of ``ps`` (names and command lines come from clients)."""
    if text.isprintable() and (spaces or " " not in text):
        return text
    out = []
    for ch in text:
        if ch.isprintable() and (spaces or ch != " "):
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
    return "".join(out)


def group_name(text: str) -> str:
    """``text`` when it may name a group in a control command or the configuration file (1 to 64
    characters); InvalidSubmission otherwise."""
    if not text or len(text) > 64:
        raise errors.InvalidSubmission(f"a group name has 1 to 64 characters (got {printable(text[:80])!r})")
    return text


@dataclass(frozen=True)
class Command:
    """One control command: its usage line, what it does, and whether it changes state."""

    name: str
    usage: str
    help: str
    changes_state: bool = False


def _load_commands() -> dict[str, Command]:
    """The table in commands.toml, in its order: one place for every command's usage and help."""
    table = tomllib.loads(resources.files(__package__).joinpath("commands.toml").read_text("utf-8"))
    return {name: Command(name, **row) for name, row in table.items()}


COMMANDS: dict[str, Command] = _load_commands()
"""Every control command by name, in the order ``libshare-control help`` lists them."""


class ControlConnection:
    """A connection to the arbiter's control endpoint; send it commands with :meth:`run`.

    The arbiter closes a control connection that idles past its bound (ten minutes; sooner
    when many connections wait on it); :meth:`run` then dials again before it sends.
    """

    def __init__(self, pipe_directory: str | Path | None = None, timeout: float = 30.0):
        directory = _config.pipe_directory(pipe_directory)
        self.socket_path = _config.socket_path(directory)
        """The socket this connection dialled."""
        self._timeout = timeout
        self._sock = self._dial()

    def _dial(self) -> socket.socket:
        try:
            sock = protocol.dial(self.socket_path, self._timeout)
        except errors.LibshareError:  # AccessDenied is an OSError too: it stays what it is
            raise
        except OSError as exc:
            raise errors.ArbiterUnavailable(f"no arbiter answers at {self.socket_path}: {exc}") from exc
        if sock is None:
            raise errors.ArbiterUnavailable(f"no arbiter answers at {self.socket_path}")
        return sock

    def _closed_by_arbiter(self) -> bool:
        """True when the arbiter closed this idle connection (it never speaks unasked otherwise)."""
        poller = select.poll()
        poller.register(self._sock, select.POLLIN | select.POLLHUP)
        return bool(poller.poll(0))

    def run(self, command: str, *args: str) -> str:
        """Run one command and return its output; a refused command raises its LibshareError.

        A connection that idled here may be closed by the arbiter while the command is on its
        way (the gate closes idle control connections without reading them to make room); the
        command was then never run, and it is sent once more on a new connection.
        """
        request = {"op": "control", "command": command, "args": list(args)}
        if self._closed_by_arbiter():
            self._redial()
        try:
            reply = self._exchange(request)
        except (EOFError, OSError):  # ArbiterLost, from a send, is an OSError too
            self._redial()
            try:
                reply = self._exchange(request)
            except (EOFError, OSError) as exc:
                raise errors.ArbiterLost(f"the arbiter closed the control connection: {exc or 'EOF'}") from exc
        if not reply.fields.get("ok"):
            raise errors.remote_error(reply.fields)
        return str(reply.fields.get("output", ""))

    def _redial(self) -> None:
        self._sock.close()
        self._sock = self._dial()

    def _exchange(self, request: dict) -> protocol.Frame:
        protocol.send(self._sock, request)
        return protocol.recv(self._sock)

    def close(self) -> None:
        """Close the connection. Returns once the arbiter has closed its end too (or after a second),
        so that what the arbiter holds, counted right after, no longer includes this connection."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
            self._sock.settimeout(1.0)
            while self._sock.recv(4096):
                pass
        except OSError:
            pass
        finally:
            self._sock.close()

    def __enter__(self) -> ControlConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run(command: str, *args: str, pipe_directory: str | Path | None = None, timeout: float = 30.0) -> str:
    """Send one control command to the arbiter at ``pipe_directory`` and return its output."""
    with ControlConnection(pipe_directory, timeout) as connection:
        return connection.run(command, *args)
