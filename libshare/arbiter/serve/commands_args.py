"""Reading a control command's arguments, and the lookups its handlers share.

A command's arguments are text a peer wrote: each reader here refuses what it cannot take
with InvalidSubmission, quoting the peer's text escaped and cut short (:func:`printable`).
A pid is a plain ASCII decimal (``decimal``: "²" and "١٢٣" are not pids), a group name has
1 to 64 characters. The lookups read the arbiter's clients as the handlers of every part
(commands_*.py) need them, and run scheduler changes on the control thread.
"""

from __future__ import annotations

import os

from libshare._proc import MAX_PID
from libshare.errors import InvalidSubmission
from libshare.protocol import wire as protocol
from libshare.protocol.control import COMMANDS, decimal, printable
from libshare.protocol.control import group_name as group  # noqa: F401 - (the configuration file checks one too)


def expect(args: list[str], count: int, name: str) -> None:
    """Refuse ``args`` unless there are ``count`` of them, with the usage of command ``name``."""
    if len(args) != count:
        raise InvalidSubmission(f"usage: {COMMANDS[name].usage}")


def check_server_pid(args: list[str], usage: str) -> None:
    """Refuse an optional server pid (MPS's) that is not this arbiter's."""
    if len(args) > 1:
        raise InvalidSubmission(f"usage: {usage}")
    if args and pid(args[0]) != os.getpid():
        raise InvalidSubmission(f"no arbiter with pid {args[0]} here (this one is pid {os.getpid()})")


def pid(text: str) -> int:
    value = decimal(text, MAX_PID)
    if not value:
        raise InvalidSubmission(f"not a pid: {printable(text[:40])!r}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise InvalidSubmission(f"not a number of seconds in 0..3600: {text!r}")
    return value


def clients_of(arbiter, client_pid: int, viewer: int | None = None) -> list:
    """The connected clients of process ``client_pid``; with ``viewer`` (a uid other than root and
    the arbiter's), only that uid's: another user's client is not there for it, as in ``ps``."""
    clients = [c for c in list(arbiter.drainer.clients.values()) if c.pid == client_pid and not c.closing
               and (viewer is None or protocol.trusted_uid(viewer) or c.uid == viewer)]
    if not clients:
        raise InvalidSubmission(f"no client with pid {client_pid} is connected")
    return clients


def scheduled(arbiter, fn, *args):
    """Run ``fn`` on the control thread, where the scheduler lives; ValueError becomes a clear refusal."""
    def guarded():
        try:
            return fn(*args)
        except ValueError as exc:
            raise InvalidSubmission(str(exc)) from None
    return arbiter.drainer.call(guarded)
