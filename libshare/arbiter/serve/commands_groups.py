"""The control commands for groups: a group's memory limit, priority, compute share and owner,
and its share socket.

A group is a name clients give at hello (or the share socket they came through gives
them). Its name has 1 to 64 characters, and each kind of group setting (a memory limit, a
priority, a compute share, an owner) holds at most ``MAX_GROUPS`` groups: past that a new
group is refused until one is removed (a stream of new names once grew the arbiter by
13 MB/s), while a group that has the setting may change it. ``none`` (``unlimited`` for a
memory limit) removes a group's setting. Scheduler settings change on the control thread
(``scheduled``). A group's share socket (``open_share``, share_sockets.py) belongs to an
arbiter that serves a pipe directory.
"""

from __future__ import annotations

from libshare.arbiter.policy import limits as _limits
from libshare.arbiter.policy.scheduler import percentage, priority_name
from libshare.arbiter.serve import commands_args as _args
from libshare.arbiter.serve.share_sockets import share_name
from libshare.errors import InvalidSubmission, ServerNotReady
from libshare.protocol.control import decimal, printable

MAX_GROUPS = 1024  # groups with a setting of one kind (a memory limit, a priority, a compute share, an owner)


class Groups:
    """The commands for groups and their share sockets (see the module's docstring)."""

    def __init__(self, arbiter):
        self.arbiter = arbiter

    def set_group_mem_limit(self, args: list[str]) -> str:
        _args.expect(args, 2, "set_group_mem_limit")
        group = _args.group(args[0])
        value = _limits.parse_limit(args[1])
        if value is None:
            self.arbiter.limits.groups.pop(group, None)
        else:
            _room_for(self.arbiter.limits.groups, group, "set_group_mem_limit GROUP unlimited")
            self.arbiter.limits.groups[group] = value
        return _limits.format_size(value)

    def get_group_mem_limit(self, args: list[str]) -> str:
        _args.expect(args, 1, "get_group_mem_limit")
        return _limits.format_size(self.arbiter.limits.groups.get(_args.group(args[0])))

    def set_group_priority(self, args: list[str]) -> str:
        _args.expect(args, 2, "set_group_priority")
        scheduler, group = self.arbiter.drainer.scheduler, _args.group(args[0])
        if args[1].strip().lower() == "none":  # the members' own priorities again
            _args.scheduled(self.arbiter, scheduler.group_priority.pop, group, None)
            return "none"
        return _args.scheduled(self.arbiter, _set_group_setting, scheduler.group_priority, group, priority_name,
                               args[1], "set_group_priority GROUP none")

    def set_group_active_thread_percentage(self, args: list[str]) -> str:
        _args.expect(args, 2, "set_group_active_thread_percentage")
        scheduler, group = self.arbiter.drainer.scheduler, _args.group(args[0])
        if args[1].strip().lower() == "none":  # no group ceiling: each member's own share again
            _args.scheduled(self.arbiter, scheduler.group_share.pop, group, None)
            return "none"
        return str(_args.scheduled(self.arbiter, _set_group_setting, scheduler.group_share, group, percentage,
                                   args[1], "set_group_active_thread_percentage GROUP none"))

    def set_group_owner(self, args: list[str]) -> str:
        _args.expect(args, 2, "set_group_owner")
        owners, group = self.arbiter.group_owners, _args.group(args[0])
        if args[1].strip().lower() == "none":
            owners.pop(group, None)
            return "none"
        uid = decimal(args[1].strip(), (1 << 32) - 2)  # -1 (4294967295) is no uid
        if uid is None:
            raise InvalidSubmission(f"a uid is a number from 0 to 4294967294 (got {printable(args[1][:40])!r})")
        _room_for(owners, group, "set_group_owner GROUP none")
        owners[group] = uid
        return str(uid)

    def get_group_owner(self, args: list[str]) -> str:
        _args.expect(args, 1, "get_group_owner")
        return str(self.arbiter.group_owners.get(_args.group(args[0]), "none"))

    # ---------------------------------------------------------------- share sockets

    def open_share(self, args: list[str]) -> str:
        _args.expect(args, 1, "open_share")
        return str(self._shares().open(share_name(args[0])))

    def close_share(self, args: list[str]) -> str:
        _args.expect(args, 1, "close_share")
        return "closed" if self._shares().close(share_name(args[0])) else "not open"

    def get_share_list(self, args: list[str]) -> str:
        _args.expect(args, 0, "get_share_list")
        return "\n".join(self._shares().names())

    def _shares(self):
        if self.arbiter.shares is None:
            raise ServerNotReady("share sockets belong to an arbiter that serves a pipe directory (a daemon)")
        return self.arbiter.shares


def _set_group_setting(table: dict, group: str, parse, text: str, removal: str):
    """``table[group] = parse(text)`` (on the control thread), when the table has room for ``group``."""
    value = parse(text)
    _room_for(table, group, removal)
    table[group] = value
    return value


def _room_for(table: dict, group: str, removal: str) -> None:
    """Refuse a new ``group`` in a table of group settings that holds MAX_GROUPS already."""
    if group not in table and len(table) >= MAX_GROUPS:
        raise InvalidSubmission(f"{MAX_GROUPS} groups have this setting already; remove one first ({removal})")
