"""The server side of the operator's control commands (their names, usage and help are in
libshare/protocol/commands.toml, read as ``COMMANDS`` by libshare/protocol/control.py).

A control frame is checked against :data:`FIELDS` by the arbiter before it gets here (the
gate, gate.py, holds control connections between commands, and a worker thread runs each
command through :meth:`Commands.answer`). :meth:`Commands.run` is the one entry: it finds
the command's handler in one table, ``Commands.handlers`` (command name -> handler), takes
commands that change state (``changes_state`` in ``COMMANDS``, and the test hooks) only
from the arbiter's own uid or root (the uid comes from SO_PEERCRED), and writes every
command and its result to the ``libshare.control`` log, with what the peer wrote escaped
(:func:`printable`). A handler is ``handler(args) -> output text`` (``handler(args, uid)``
for the commands whose answer depends on the peer's uid, ``_BY_VIEWER``) and raises a
LibshareError to refuse.

The handlers are methods of four objects, one per kind of command, each in a module of its
own with its part of this essay: :class:`~libshare.arbiter.serve.commands_status.Status`
(commands that read state: the server, its clients, ``ps``, the quarantine, the
configuration), :class:`~libshare.arbiter.serve.commands_limits.Limits` (memory limits,
priorities, compute shares and the scheduling mode of the server and its clients),
:class:`~libshare.arbiter.serve.commands_groups.Groups` (a group's settings and owner, share
sockets) and :class:`~libshare.arbiter.serve.commands_lifetime.Lifetime` (terminating clients,
the quarantine's strikes, restart, quit, reload, the test hooks). Their arguments are read by
commands_args.py. Queries are open to every uid that can reach the socket (in multi-user
mode, every user); what a user who is neither root nor the arbiter's uid sees of another
uid's clients is what MPS would show.
"""

from __future__ import annotations

import logging
import os

from libshare.arbiter.serve.commands_groups import Groups
from libshare.arbiter.serve.commands_lifetime import Lifetime
from libshare.arbiter.serve.commands_limits import Limits
from libshare.arbiter.serve.commands_status import Status
from libshare.errors import AccessDenied, LibshareError, ProtocolError
from libshare.protocol import wire as protocol
from libshare.protocol.control import COMMANDS, printable

log = logging.getLogger("libshare.control")

_MAX_ARGS, _MAX_ARG = 16, 4096

FIELDS = {"op": (protocol.choice("control"), True),
          "command": (protocol.text(64), True),
          "args": (protocol.texts(_MAX_ARGS, _MAX_ARG), False)}
"""The schema of a control frame (see ``protocol.check_fields``)."""


_TEST_HOOKS = ("inject_fault", "inject_crash", "inject_device_lost")  # commands only an arbiter with LIBSHARE_TEST_HOOKS=1 runs

# What they show depends on the peer's uid: another user's client is hidden from a peer that is
# neither root nor the arbiter's uid, as MPS hides it.
_BY_VIEWER = ("ps", "get_quarantine", "get_device_pinned_mem_limit", "get_active_thread_percentage")


class Commands:
    """Runs control commands against one arbiter."""

    def __init__(self, arbiter):
        self.arbiter = arbiter
        status, limits, groups, lifetime = Status(arbiter), Limits(arbiter), Groups(arbiter), Lifetime(arbiter)
        self.handlers = {
            # reading state
            "get_server_list": status.get_server_list,
            "get_server_status": status.get_server_status,
            "get_client_list": status.get_client_list,
            "get_device_client_list": status.get_device_client_list,
            "ps": status.ps,
            "get_quarantine": status.get_quarantine,
            "get_config": status.get_config,
            # the server's and clients' limits
            "set_default_device_pinned_mem_limit": limits.set_default_device_pinned_mem_limit,
            "get_default_device_pinned_mem_limit": limits.get_default_device_pinned_mem_limit,
            "set_device_pinned_mem_limit": limits.set_device_pinned_mem_limit,
            "get_device_pinned_mem_limit": limits.get_device_pinned_mem_limit,
            "set_default_client_priority": limits.set_default_client_priority,
            "get_default_client_priority": limits.get_default_client_priority,
            "set_client_priority": limits.set_client_priority,
            "set_default_active_thread_percentage": limits.set_default_active_thread_percentage,
            "get_default_active_thread_percentage": limits.get_default_active_thread_percentage,
            "set_active_thread_percentage": limits.set_active_thread_percentage,
            "get_active_thread_percentage": limits.get_active_thread_percentage,
            "set_scheduling_mode": limits.set_scheduling_mode,
            "get_scheduling_mode": limits.get_scheduling_mode,
            # groups and share sockets
            "set_group_mem_limit": groups.set_group_mem_limit,
            "get_group_mem_limit": groups.get_group_mem_limit,
            "set_group_priority": groups.set_group_priority,
            "set_group_active_thread_percentage": groups.set_group_active_thread_percentage,
            "set_group_owner": groups.set_group_owner,
            "get_group_owner": groups.get_group_owner,
            "open_share": groups.open_share,
            "close_share": groups.close_share,
            "get_share_list": groups.get_share_list,
            # lifetime
            "terminate_client": lifetime.terminate_client,
            "terminate_group": lifetime.terminate_group,
            "clear_quarantine": lifetime.clear_quarantine,
            "restart": lifetime.restart,
            "hand_over": lifetime.hand_over,
            "quit": lifetime.quit,
            "reload": lifetime.reload,
            "inject_crash": lifetime.inject_crash,
            "inject_fault": lifetime.inject_fault,
            "inject_device_lost": lifetime.inject_device_lost,
        }
        """The handler of each command: every name in ``COMMANDS``, and the test hooks."""

    def answer(self, fields: dict, pid: int, uid: int) -> dict:
        """The reply to one control frame's ``fields`` from the peer (pid, uid); a command that fails
        on a bug of ours is answered too (ProtocolError naming the exception) and logged."""
        try:
            protocol.check_fields(fields, FIELDS, "control")
            output = self.run(fields["command"], fields.get("args", []), pid, uid)
        except LibshareError as exc:
            return protocol.error_reply(exc)
        except Exception as exc:
            log.exception("pid %d: control command %s failed", pid, protocol.short(fields.get("command")))
            return protocol.error_reply(ProtocolError(f"the arbiter failed on this command: {type(exc).__name__}"))
        return {"ok": True, "output": output}

    def run(self, name, args, pid: int, uid: int) -> str:
        """Run command ``name`` with ``args`` for the peer (pid, uid); return its output."""
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args) or len(args) > _MAX_ARGS:
            raise ProtocolError(f"control arguments must be a list of at most {_MAX_ARGS} strings")
        command = COMMANDS.get(name) if isinstance(name, str) else None
        handler = self.handlers.get(name) if command or name in _TEST_HOOKS else None
        if handler is None:
            raise ProtocolError(f"unknown command {protocol.short(name)}; the commands are: {', '.join(COMMANDS)}")
        if (command is None or command.changes_state) and not protocol.trusted_uid(uid):
            raise AccessDenied(f"{name} changes the arbiter's state: only uid {os.getuid()} or root may")
        line = printable(" ".join([name, *args]))
        try:
            output = handler(args, uid) if name in _BY_VIEWER else handler(args)
        except LibshareError as exc:
            log.warning("pid %d: %s: failed: %s", pid, line, exc)
            raise
        log.info("pid %d: %s: ok", pid, line)
        return output
