"""The server side of the operator's control commands (the table is in libshare/protocol/control.py).

Each command is a method ``_NAME(args) -> output text`` that raises a LibshareError
to refuse. Commands that change state are taken only from the arbiter's own uid or
root (the uid comes from SO_PEERCRED). Every command and its result go to the
``libshare.control`` log, with what the peer wrote escaped (:func:`printable`).

A control frame is checked against :data:`FIELDS` by the arbiter's gate before it
gets here (_gate.py holds control connections between commands; a worker thread runs
each command through :meth:`Commands.answer`). ``ps`` prints nothing a client wrote
as is: names and command lines are escaped, so an argv with newlines or terminal
escapes cannot add rows or rewrite the screen. Queries are open to every uid that
can reach the socket (in multi-user mode, every user), so ``ps`` shows a client of
another uid to a user who is neither root nor the arbiter's uid as MPS's client list
would: its pid, id, device and state, never its name, command line or usage.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from libshare.protocol import wire as protocol
from libshare.protocol.control import COMMANDS, decimal, printable
from libshare._proc import MAX_PID
from libshare.arbiter.policy import limits as _limits
from libshare.errors import AccessDenied, InvalidSubmission, LibshareError, ProtocolError, ServerNotReady
from libshare.arbiter.policy.scheduler import mode_name, percentage, priority_name
from libshare.arbiter.serve.share_sockets import share_name

log = logging.getLogger("libshare.control")

_TERMINATE_WAIT = 30.0  # seconds terminate_client waits for the client's running work to end
_MAX_ARGS, _MAX_ARG = 16, 4096

FIELDS = {"op": (protocol.choice("control"), True),
          "command": (protocol.text(64), True),
          "args": (protocol.texts(_MAX_ARGS, _MAX_ARG), False)}
"""The schema of a control frame (see _protocol.check_fields)."""


_TEST_HOOKS = ("inject_fault", "inject_crash")  # commands only an arbiter with LIBSHARE_TEST_HOOKS=1 runs


class Commands:
    """Runs control commands against one arbiter."""

    def __init__(self, arbiter):
        self.arbiter = arbiter

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
        handler = getattr(self, f"_{name}", None) if command or name in _TEST_HOOKS else None
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

    # ---------------------------------------------------------------- helpers

    def _check_server_pid(self, args: list[str], usage: str) -> None:
        if len(args) > 1:
            raise InvalidSubmission(f"usage: {usage}")
        if args and _pid(args[0]) != os.getpid():
            raise InvalidSubmission(f"no arbiter with pid {args[0]} here (this one is pid {os.getpid()})")

    def _clients_of(self, pid: int, viewer: int | None = None) -> list:
        """The connected clients of process ``pid``; with ``viewer`` (a uid other than root and the
        arbiter's), only that uid's: another user's client is not there for it, as in ``ps``."""
        clients = [c for c in list(self.arbiter.drainer.clients.values()) if c.pid == pid and not c.closing
                   and (viewer is None or protocol.trusted_uid(viewer) or c.uid == viewer)]
        if not clients:
            raise InvalidSubmission(f"no client with pid {pid} is connected")
        return clients

    # ---------------------------------------------------------------- queries

    def _get_server_list(self, args: list[str]) -> str:
        return str(os.getpid())

    def _get_server_status(self, args: list[str]) -> str:
        self._check_server_pid(args, COMMANDS["get_server_status"].usage)
        return self.arbiter.state

    def _get_client_list(self, args: list[str]) -> str:
        self._check_server_pid(args, COMMANDS["get_client_list"].usage)
        return "\n".join(str(pid) for pid in sorted({c["pid"] for c in self.arbiter.snapshot()["clients"]}))

    def _get_device_client_list(self, args: list[str]) -> str:
        self._check_server_pid(args, COMMANDS["get_device_client_list"].usage)
        snapshot = self.arbiter.snapshot()
        device = snapshot["server"]["device"]
        pids = sorted({c["pid"] for c in snapshot["clients"]})
        return "\n".join([f"{device['index']} {device['uuid']} {device['name']}", *map(str, pids)])

    def _ps(self, args: list[str], uid: int) -> str:
        if args and (len(args) != 2 or args[0] != "-p"):
            raise InvalidSubmission(f"usage: {COMMANDS['ps'].usage}")
        only = _pid(args[1]) if args else None
        snapshot = self.arbiter.snapshot()
        owners = None if protocol.trusted_uid(uid) else self._owners()
        device = snapshot["server"]["device"]
        where = f"{device['index']}:{device['uuid'][:8]}"
        rows = [_PS_HEADER]
        for c in snapshot["clients"]:
            if only is not None and c["pid"] != only:
                continue
            if owners is not None and c.get("uid", owners.get(c["client_id"])) != uid:  # another user's
                rows.append((str(c["pid"]), str(c["client_id"]), "-", where, printable(str(c["state"])),
                             *["-"] * 5, "(another user's client)"))
                continue
            rows.append((str(c["pid"]), str(c["client_id"]), printable(c["name"][:24], spaces=False) or "-",
                         where, printable(str(c["state"])), printable(str(c["priority"])),
                         str(c["submitted"]), f"{c['device_ns'] / 1e6:.1f}ms",
                         _bytes(c["memory_bytes"]), _limits.format_size(c["mem_limit"]),
                         printable(c["cmdline"][:80]) or "-"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(_PS_HEADER) - 1)]
        refused = [] if only is not None else self.arbiter.drainer.quarantine.describe(uid, refused_only=True)
        return "\n".join([*("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
                            for row in rows), *(f"QUARANTINED {line}" for line in refused)])

    def _owners(self) -> dict[int, int]:
        """The uid of each client, by client id (read on the control thread, like the snapshot)."""
        drainer = self.arbiter.drainer
        try:
            return drainer.call(lambda: {c.id: c.uid for c in drainer.clients.values()})
        except LibshareError:  # stopped: nothing is shown as the peer's own
            return {}

    def _get_quarantine(self, args: list[str], uid: int) -> str:
        self._expect(args, 0, "get_quarantine")
        return "\n".join(self.arbiter.drainer.quarantine.describe(uid))

    # ---------------------------------------------------------------- actions

    def _terminate_client(self, args: list[str]) -> str:
        if len(args) not in (1, 2):
            raise InvalidSubmission(f"usage: {COMMANDS['terminate_client'].usage}")
        self._check_server_pid(args[:-1], COMMANDS["terminate_client"].usage)
        return self._terminate(self._clients_of(_pid(args[-1])), f"client pid {args[-1]}")

    def _terminate_group(self, args: list[str]) -> str:
        """Terminate every client of a group (the Slurm epilog: a process that outlives its job)."""
        self._expect(args, 1, "terminate_group")
        group = _group(args[0])
        clients = [c for c in list(self.arbiter.drainer.clients.values()) if c.group == group and not c.closing]
        return self._terminate(clients, f"group {printable(group)}") if clients else "none"

    def _terminate(self, clients: list, what: str) -> str:
        """Terminate ``clients`` and wait until each is gone; what was done, line by line."""
        drainer = self.arbiter.drainer
        for client in clients:
            drainer.call(drainer.terminate, client)
        deadline = time.monotonic() + _TERMINATE_WAIT
        while any(c.id in drainer.clients for c in clients):
            if time.monotonic() > deadline:
                raise LibshareError(f"{what} still has work running after {_TERMINATE_WAIT:.0f} s")
            time.sleep(0.01)
        return "\n".join(f"terminated {c.describe()}" for c in clients)

    def _clear_quarantine(self, args: list[str]) -> str:
        self._expect(args, 1, "clear_quarantine")
        return "\n".join(self.arbiter.drainer.quarantine.clear(args[0]))

    def _restart(self, args: list[str]) -> str:
        self._expect(args, 0, "restart")
        if self.arbiter.on_restart is None:
            raise ServerNotReady("restart needs the control daemon, which starts the new arbiter: run the "
                                 "arbiter with libshare-control -d (or -f), or stop it and start a new one")
        self.arbiter.on_restart()
        return f"arbiter pid {os.getpid()} hands over to a new arbiter once it is ready"

    def _reload(self, args: list[str]) -> str:
        self._expect(args, 0, "reload")
        return self.arbiter.config.reload("reload command")

    def _get_config(self, args: list[str]) -> str:
        self._expect(args, 0, "get_config")
        return self.arbiter.config.describe()

    def _quit(self, args: list[str]) -> str:
        if args and (len(args) != 2 or args[0] != "-t"):
            raise InvalidSubmission(f"usage: {COMMANDS['quit'].usage}")
        self.arbiter.quit_timeout = _seconds(args[1]) if args else 10.0
        self.arbiter.quit_requested.set()
        return f"arbiter pid {os.getpid()} is shutting down"

    def _inject_crash(self, args: list[str]) -> str:
        """Test hook: crash (SIGSEGV) as a driver would while the engine handles a client's descriptor."""
        if not self.arbiter.test_hooks:
            raise AccessDenied("inject_crash is a test hook: start the arbiter with LIBSHARE_TEST_HOOKS=1")
        if len(args) != 1:
            raise InvalidSubmission("usage: inject_crash PID")
        client = self._clients_of(_pid(args[0]))[0]
        from libshare.arbiter.drain import emergency as _emergency

        log.error("test hook: crashing while %s's descriptor is processed", client.describe())
        _emergency.set_busy(client.slot + 1)
        os.kill(os.getpid(), signal.SIGSEGV)
        return "crashing"  # (the signal may land on another thread after this reply)

    def _inject_fault(self, args: list[str]) -> str:
        """Test hook: put the server in FAULT as a lost device would (naming a client pid as offender)."""
        if not self.arbiter.test_hooks:
            raise AccessDenied("inject_fault is a test hook: start the arbiter with LIBSHARE_TEST_HOOKS=1")
        offender = self._clients_of(_pid(args[0]))[0] if args else None
        drainer = self.arbiter.drainer
        drainer.call(drainer.enter_fault, "a fault injected by a test hook", offender)
        return self.arbiter.state

    # ---------------------------------------------------------------- memory limits (see _limits.py)

    def _device(self, text: str) -> None:
        device = self.arbiter.device
        _limits.same_device(text, device.index, device.uuid)

    def _set_default_device_pinned_mem_limit(self, args: list[str]) -> str:
        self._expect(args, 2, "set_default_device_pinned_mem_limit")
        self._device(args[0])
        self.arbiter.limits.default = _limits.parse_limit(args[1])
        return _limits.format_size(self.arbiter.limits.default)

    def _get_default_device_pinned_mem_limit(self, args: list[str]) -> str:
        self._expect(args, 1, "get_default_device_pinned_mem_limit")
        self._device(args[0])
        return _limits.format_size(self.arbiter.limits.default)

    def _set_device_pinned_mem_limit(self, args: list[str]) -> str:
        """With the arbiter's pid: the server limit (MPS); with a client's: that client's, live."""
        self._expect(args, 3, "set_device_pinned_mem_limit")
        pid = _pid(args[0])
        clients = self._clients_of(pid) if pid != os.getpid() else []
        self._device(args[1])
        value = _limits.parse_limit(args[2])
        if pid == os.getpid():
            self.arbiter.limits.server = value
        for client in clients:
            client.mem_limit = value  # checked by the next alloc (on the control thread)
        return _limits.format_size(value)

    def _get_device_pinned_mem_limit(self, args: list[str], uid: int) -> str:
        """The server's limit, or a client's limit followed by the level it comes from."""
        self._expect(args, 2, "get_device_pinned_mem_limit")
        pid = _pid(args[0])
        self._device(args[1])
        limits = self.arbiter.limits
        if pid == os.getpid():
            return _limits.format_size(limits.server if limits.server is not None else limits.default)
        limit = limits.client_limit(self._clients_of(pid, viewer=uid)[0])
        return "unlimited" if limit is None else f"{_limits.format_size(limit.value)} ({limit.level})"

    def _set_group_mem_limit(self, args: list[str]) -> str:
        self._expect(args, 2, "set_group_mem_limit")
        group = _group(args[0])
        value = _limits.parse_limit(args[1])
        if value is None:
            self.arbiter.limits.groups.pop(group, None)
        else:
            _room_for(self.arbiter.limits.groups, group, "set_group_mem_limit GROUP unlimited")
            self.arbiter.limits.groups[group] = value
        return _limits.format_size(value)

    def _get_group_mem_limit(self, args: list[str]) -> str:
        self._expect(args, 1, "get_group_mem_limit")
        return _limits.format_size(self.arbiter.limits.groups.get(_group(args[0])))


    # ---------------------------------------------------------------- priorities and compute share

    def _scheduled(self, fn, *args):
        """Run ``fn`` on the control thread, where the scheduler lives; ValueError becomes a clear refusal."""
        def guarded():
            try:
                return fn(*args)
            except ValueError as exc:
                raise InvalidSubmission(str(exc)) from None
        return self.arbiter.drainer.call(guarded)

    def _expect(self, args: list[str], count: int, name: str) -> None:
        if len(args) != count:
            raise InvalidSubmission(f"usage: {COMMANDS[name].usage}")

    def _set_default_client_priority(self, args: list[str]) -> str:
        self._expect(args, 1, "set_default_client_priority")
        scheduler = self.arbiter.drainer.scheduler
        self._scheduled(lambda: setattr(scheduler, "default_priority", priority_name(args[0])))
        return scheduler.default_priority

    def _get_default_client_priority(self, args: list[str]) -> str:
        self._expect(args, 0, "get_default_client_priority")
        return self.arbiter.drainer.scheduler.default_priority

    def _set_client_priority(self, args: list[str]) -> str:
        self._expect(args, 2, "set_client_priority")
        clients = self._clients_of(_pid(args[0]))
        priority = self._scheduled(priority_name, args[1])
        for client in clients:
            client.priority = priority  # read by the next drain pass
            client.own_priority = client.operator_priority = True
        return priority

    def _set_group_priority(self, args: list[str]) -> str:
        self._expect(args, 2, "set_group_priority")
        scheduler, group = self.arbiter.drainer.scheduler, _group(args[0])
        if args[1].strip().lower() == "none":  # the members' own priorities again
            self._scheduled(scheduler.group_priority.pop, group, None)
            return "none"
        return self._scheduled(self._set_group_setting, scheduler.group_priority, group, priority_name, args[1],
                               "set_group_priority GROUP none")

    def _set_group_owner(self, args: list[str]) -> str:
        self._expect(args, 2, "set_group_owner")
        owners, group = self.arbiter.group_owners, _group(args[0])
        if args[1].strip().lower() == "none":
            owners.pop(group, None)
            return "none"
        uid = decimal(args[1].strip(), (1 << 32) - 2)  # -1 (4294967295) is no uid
        if uid is None:
            raise InvalidSubmission(f"a uid is a number from 0 to 4294967294 (got {printable(args[1][:40])!r})")
        _room_for(owners, group, "set_group_owner GROUP none")
        owners[group] = uid
        return str(uid)

    def _get_group_owner(self, args: list[str]) -> str:
        self._expect(args, 1, "get_group_owner")
        return str(self.arbiter.group_owners.get(_group(args[0]), "none"))

    def _open_share(self, args: list[str]) -> str:
        self._expect(args, 1, "open_share")
        return str(self._shares().open(share_name(args[0])))

    def _close_share(self, args: list[str]) -> str:
        self._expect(args, 1, "close_share")
        return "closed" if self._shares().close(share_name(args[0])) else "not open"

    def _get_share_list(self, args: list[str]) -> str:
        self._expect(args, 0, "get_share_list")
        return "\n".join(self._shares().names())

    def _shares(self):
        if self.arbiter.shares is None:
            raise ServerNotReady("share sockets belong to an arbiter that serves a pipe directory (a daemon)")
        return self.arbiter.shares

    def _set_default_active_thread_percentage(self, args: list[str]) -> str:
        self._expect(args, 1, "set_default_active_thread_percentage")
        scheduler = self.arbiter.drainer.scheduler
        self._scheduled(lambda: setattr(scheduler, "default_share", percentage(args[0])))
        return str(scheduler.default_share)

    def _get_default_active_thread_percentage(self, args: list[str]) -> str:
        self._expect(args, 0, "get_default_active_thread_percentage")
        return str(self.arbiter.drainer.scheduler.default_share)

    def _set_active_thread_percentage(self, args: list[str]) -> str:
        self._expect(args, 2, "set_active_thread_percentage")
        if _pid(args[0]) == os.getpid():  # the MPS meaning: the server's clients from now on
            return self._set_default_active_thread_percentage(args[1:])
        clients = self._clients_of(_pid(args[0]))
        scheduler = self.arbiter.drainer.scheduler

        def apply():
            for client in clients:
                usage = scheduler.usage(client)
                usage.share, usage.own_share = min(percentage(args[1]), client.requested_share), True
            return scheduler.share_of(clients[0])
        return str(self._scheduled(apply))

    def _get_active_thread_percentage(self, args: list[str], uid: int) -> str:
        self._expect(args, 1, "get_active_thread_percentage")
        if _pid(args[0]) == os.getpid():
            return str(self.arbiter.drainer.scheduler.default_share)
        client = self._clients_of(_pid(args[0]), viewer=uid)[0]
        return str(self._scheduled(self.arbiter.drainer.scheduler.share_of, client))

    def _set_group_active_thread_percentage(self, args: list[str]) -> str:
        self._expect(args, 2, "set_group_active_thread_percentage")
        scheduler, group = self.arbiter.drainer.scheduler, _group(args[0])
        if args[1].strip().lower() == "none":  # no group ceiling: each member's own share again
            self._scheduled(scheduler.group_share.pop, group, None)
            return "none"
        return str(self._scheduled(self._set_group_setting, scheduler.group_share, group, percentage, args[1],
                                   "set_group_active_thread_percentage GROUP none"))

    @staticmethod
    def _set_group_setting(table: dict, group: str, parse, text: str, removal: str):
        """``table[group] = parse(text)`` (on the control thread), when the table has room for ``group``."""
        value = parse(text)
        _room_for(table, group, removal)
        table[group] = value
        return value

    def _set_scheduling_mode(self, args: list[str]) -> str:
        self._expect(args, 1, "set_scheduling_mode")
        scheduler = self.arbiter.drainer.scheduler
        self._scheduled(lambda: setattr(scheduler, "mode", mode_name(args[0])))
        return scheduler.mode

    def _get_scheduling_mode(self, args: list[str]) -> str:
        self._expect(args, 0, "get_scheduling_mode")
        return self.arbiter.drainer.scheduler.mode


# What they show depends on the peer's uid: another user's client is hidden from a peer that is
# neither root nor the arbiter's uid, as MPS hides it.
_BY_VIEWER = ("ps", "get_quarantine", "get_device_pinned_mem_limit", "get_active_thread_percentage")

_PS_HEADER = ("PID", "ID", "NAME", "DEVICE", "STATE", "PRIORITY", "DISPATCHES", "DEVICE_TIME", "MEMORY",
              "MEM_LIMIT", "COMMAND")


def _group(text: str) -> str:
    if not text or len(text) > 64:
        raise InvalidSubmission(f"a group name has 1 to 64 characters (got {printable(text[:80])!r})")
    return text


_MAX_GROUPS = 1024  # groups with a setting of one kind (a memory limit, a priority, a compute share)


def _room_for(table: dict, group: str, removal: str) -> None:
    """Refuse a new ``group`` in a table of group settings that holds _MAX_GROUPS already."""
    if group not in table and len(table) >= _MAX_GROUPS:
        raise InvalidSubmission(f"{_MAX_GROUPS} groups have this setting already; remove one first ({removal})")


def _pid(text: str) -> int:
    pid = decimal(text, MAX_PID)
    if not pid:
        raise InvalidSubmission(f"not a pid: {printable(text[:40])!r}")
    return pid


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise InvalidSubmission(f"not a number of seconds in 0..3600: {text!r}")
    return value


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
