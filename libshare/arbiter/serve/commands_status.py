"""The control commands that read the arbiter's state: its pid and state, its clients, ``ps``,
the quarantine and the configuration in force.

They are open to every uid that can reach the socket (in multi-user mode, every user), and
read what they show through the control thread (``Arbiter.snapshot``). ``ps`` prints
nothing a client wrote as is: names and command lines are escaped, so an argv with newlines
or terminal escapes cannot add rows or rewrite the screen. To a user who is neither root nor
the arbiter's uid, ``ps`` shows a client of another uid as MPS's client list would: its pid,
id, device and state, never its name, command line or usage; ``get_quarantine`` likewise
shows such a user another uid's process by its pid and strikes only.
"""

from __future__ import annotations

import os

from libshare.arbiter.policy import limits as _limits
from libshare.arbiter.serve import commands_args as _args
from libshare.errors import InvalidSubmission, LibshareError
from libshare.protocol import wire as protocol
from libshare.protocol.control import COMMANDS, printable

_PS_HEADER = ("PID", "ID", "NAME", "DEVICE", "STATE", "PRIORITY", "DISPATCHES", "DEVICE_TIME", "MEMORY",
              "MEM_LIMIT", "COMMAND")


class Status:
    """The commands that read state (see the module's docstring)."""

    def __init__(self, arbiter):
        self.arbiter = arbiter

    def get_server_list(self, args: list[str]) -> str:
        return str(os.getpid())

    def get_server_status(self, args: list[str]) -> str:
        _args.check_server_pid(args, COMMANDS["get_server_status"].usage)
        return self.arbiter.state

    def get_client_list(self, args: list[str]) -> str:
        _args.check_server_pid(args, COMMANDS["get_client_list"].usage)
        return "\n".join(str(pid) for pid in sorted({c["pid"] for c in self.arbiter.snapshot()["clients"]}))

    def get_device_client_list(self, args: list[str]) -> str:
        _args.check_server_pid(args, COMMANDS["get_device_client_list"].usage)
        snapshot = self.arbiter.snapshot()
        device = snapshot["server"]["device"]
        pids = sorted({c["pid"] for c in snapshot["clients"]})
        return "\n".join([f"{device['index']} {device['uuid']} {device['name']}", *map(str, pids)])

    def ps(self, args: list[str], uid: int) -> str:
        if args and (len(args) != 2 or args[0] != "-p"):
            raise InvalidSubmission(f"usage: {COMMANDS['ps'].usage}")
        only = _args.pid(args[1]) if args else None
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

    def get_quarantine(self, args: list[str], uid: int) -> str:
        _args.expect(args, 0, "get_quarantine")
        return "\n".join(self.arbiter.drainer.quarantine.describe(uid))

    def get_config(self, args: list[str]) -> str:
        _args.expect(args, 0, "get_config")
        return self.arbiter.config.describe()


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
