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
from dataclasses import dataclass
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


COMMANDS: dict[str, Command] = {c.name: c for c in [
    Command("get_server_list", "get_server_list",
            "Print the PID of the arbiter serving this pipe directory (one line, or nothing)."),
    Command("get_server_status", "get_server_status [PID]",
            "Print the arbiter's state: INITIALIZING, ACTIVE or FAULT."),
    Command("get_client_list", "get_client_list [PID]",
            "Print the PIDs of the connected client processes, one per line."),
    Command("get_device_client_list", "get_device_client_list [PID]",
            "Print the device (index, UUID and name) followed by the PIDs of its clients."),
    Command("ps", "ps [-p PID]",
            "A table of the clients: pid, client id, name, device, state, priority, dispatches, "
            "device time, memory in use, memory limit, command line. -p PID: only that client process. "
            "Characters that are not printable are escaped. To users other than root and the "
            "arbiter's, another user's client shows only its pid, id, device and state. Below the "
            "table, a QUARANTINED line for each process and module the arbiter refuses (get_quarantine)."),
    Command("terminate_client", "terminate_client [SERVER_PID] CLIENT_PID",
            "Cancel the client's queued work, let its running work end, reclaim its buffers and "
            "programs; the client sees a sticky ClientTerminated error. Other clients are not affected.",
            changes_state=True),
    Command("terminate_group", "terminate_group GROUP",
            "terminate_client for every client of GROUP (none: it has none).", changes_state=True),
    Command("restart", "restart",
            "Replace the running arbiter with a fresh one (after an upgrade of libshare or of the driver): "
            "it stops taking work, lets running work end and hands over; every client moves to the new "
            "arbiter and sees a pause, not an error. Needs the control daemon (libshare-control -d or -f).",
            changes_state=True),
    Command("quit", "quit [-t SECONDS]",
            "Shut the arbiter down: stop accepting, let running work end (at most SECONDS, "
            "default 10), tell the clients, release the device, remove the socket and lock.",
            changes_state=True),
    Command("set_default_active_thread_percentage", "set_default_active_thread_percentage PERCENT",
            "Ceiling on the share of device time each new client may use while others want the device.",
            changes_state=True),
    Command("get_default_active_thread_percentage", "get_default_active_thread_percentage",
            "Print the default compute share of new clients, in percent."),
    Command("set_active_thread_percentage", "set_active_thread_percentage PID PERCENT",
            "With a client's PID: change its compute share, live (unlike MPS); with the arbiter's "
            "PID: the share of clients that connect from now on.",
            changes_state=True),
    Command("get_active_thread_percentage", "get_active_thread_percentage PID",
            "Print a client's compute share (or, with the arbiter's PID, the default), in percent."),
    Command("set_default_device_pinned_mem_limit", "set_default_device_pinned_mem_limit DEV VALUE",
            "Default device memory limit of each client, like 900M or 2G (binary units), plain bytes, "
            "or unlimited. DEV is the arbiter's device index or UUID. Applies to allocations not yet made.",
            changes_state=True),
    Command("get_default_device_pinned_mem_limit", "get_default_device_pinned_mem_limit DEV",
            "Print the default device memory limit of each client."),
    Command("set_device_pinned_mem_limit", "set_device_pinned_mem_limit PID DEV VALUE",
            "With the arbiter's PID: the server limit, which overrides the default (MPS). With a "
            "client's PID: that client's limit, live (unlike MPS), overriding both. A client's "
            "LIBSHARE_DEVICE_MEM_LIMIT only lowers its limit. A lowered limit frees nothing but "
            "refuses the next allocation past it.", changes_state=True),
    Command("get_device_pinned_mem_limit", "get_device_pinned_mem_limit PID DEV",
            "Print the server's limit (arbiter's PID), or a client's limit and the level it comes "
            "from: default, server or client."),
    Command("set_group_mem_limit", "set_group_mem_limit GROUP VALUE",
            "Limit the device memory of all clients of a group together (connect(group=...) or "
            "LIBSHARE_GROUP), like 4G, or unlimited; on top of each client's own limit, live.",
            changes_state=True),
    Command("get_group_mem_limit", "get_group_mem_limit GROUP",
            "Print a group's device memory limit."),
    Command("set_default_client_priority", "set_default_client_priority PRIORITY",
            "Priority of new clients: low, normal, high, realtime (MPS 0 = normal, 1 = low).",
            changes_state=True),
    Command("get_default_client_priority", "get_default_client_priority",
            "Print the priority given to new clients."),
    Command("set_client_priority", "set_client_priority PID PRIORITY",
            "Change a running client's priority (live).", changes_state=True),
    Command("set_group_priority", "set_group_priority GROUP PRIORITY|none",
            "Priority of every client of a group, now and later (overrides the clients' own); none: "
            "the members' own priorities again.",
            changes_state=True),
    Command("set_group_owner", "set_group_owner GROUP UID|none",
            "In multi-user mode, only clients of UID (and root and the arbiter's uid) may join GROUP, and a "
            "client of UID must name one of UID's groups; none: anyone may join it again.",
            changes_state=True),
    Command("get_group_owner", "get_group_owner GROUP", "Print the uid that owns GROUP, or none."),
    Command("open_share", "open_share GROUP",
            "Open GROUP's share socket, PIPE/shares/GROUP/control, and print its directory: every client that "
            "connects through it joins GROUP whatever it asks, may ask for no priority above the default, and "
            "may send no control command (a container's pipe directory; see the Kubernetes plugin). Like group "
            "limits, it belongs to this arbiter: open it again on the next one (the plugin does).",
            changes_state=True),
    Command("close_share", "close_share GROUP",
            "Close GROUP's share socket and remove it; its clients stay connected.", changes_state=True),
    Command("get_share_list", "get_share_list", "Print the groups whose share socket is open, one per line."),
    Command("set_group_active_thread_percentage", "set_group_active_thread_percentage GROUP PERCENT|none",
            "Ceiling on the share of device time a whole group may use while others want the device; none: "
            "no ceiling for the group.",
            changes_state=True),
    Command("set_scheduling_mode", "set_scheduling_mode MODE",
            "throughput (batch greedily) or fairshare (share device time by measured GPU time); live.",
            changes_state=True),
    Command("get_scheduling_mode", "get_scheduling_mode", "Print the scheduling mode."),
    Command("reload", "reload",
            "Read the configuration file again (--config FILE; SIGHUP does the same) and apply what changed, "
            "to running clients too (unlike MPS): group limits and priorities, the default memory limit, "
            "the scheduling mode and the watchdog at once, the default priority and compute share to "
            "clients that connect from now on; max_clients only at the next start. A key taken out of the "
            "file goes back to its default. A bad file is refused with its line and the reason, and the "
            "configuration in force stays.", changes_state=True),
    Command("get_config", "get_config",
            "Print the configuration in force, as TOML, with where each value comes from: the file, the "
            "default (or the arbiter's LIBSHARE_* environment), or a control command since."),
    Command("get_quarantine", "get_quarantine",
            "Print every client process and SPIR-V module (by SHA-256) that was under way when an arbiter "
            "on this pipe directory died, with its strikes and what it was doing; at 2 strikes it is "
            "refused (a process at hello, a module for every client). To users other than root and "
            "the arbiter's, another user's process shows only its pid."),
    Command("clear_quarantine", "clear_quarantine PID|DIGEST|all",
            "Forget the strikes of a client process (by pid), of a module (its SHA-256, or its first 8 "
            "or more hex digits), or of everything: they may connect and load again.",
            changes_state=True),
]}


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
