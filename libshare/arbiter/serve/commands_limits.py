"""The control commands that set and read the limits of the server and its clients: memory
limits (see policy/limits.py), priorities, compute shares and the scheduling mode.

Where MPS takes a server pid, the arbiter's own pid names the server's setting, a client's
pid that client's (changed live: the next alloc checks a memory limit, the next drain pass
reads a priority). A memory limit's DEV must name the arbiter's device, by index or UUID.
Scheduler settings change on the control thread only (``scheduled``), where the scheduler
lives; a value it refuses is answered with its reason.
A group's settings are in commands_groups.py.
"""

from __future__ import annotations

import os

from libshare.arbiter.policy import limits as _limits
from libshare.arbiter.policy.scheduler import mode_name, percentage, priority_name
from libshare.arbiter.serve import commands_args as _args


class Limits:
    """The commands that set and read the server's and its clients' limits (see the module's docstring)."""

    def __init__(self, arbiter):
        self.arbiter = arbiter

    # ---------------------------------------------------------------- memory limits

    def _device(self, text: str) -> None:
        device = self.arbiter.device
        _limits.same_device(text, device.index, device.uuid)

    def set_default_device_pinned_mem_limit(self, args: list[str]) -> str:
        _args.expect(args, 2, "set_default_device_pinned_mem_limit")
        self._device(args[0])
        self.arbiter.limits.default = _limits.parse_limit(args[1])
        return _limits.format_size(self.arbiter.limits.default)

    def get_default_device_pinned_mem_limit(self, args: list[str]) -> str:
        _args.expect(args, 1, "get_default_device_pinned_mem_limit")
        self._device(args[0])
        return _limits.format_size(self.arbiter.limits.default)

    def set_device_pinned_mem_limit(self, args: list[str]) -> str:
        """With the arbiter's pid: the server limit (MPS); with a client's: that client's, live."""
        _args.expect(args, 3, "set_device_pinned_mem_limit")
        pid = _args.pid(args[0])
        clients = _args.clients_of(self.arbiter, pid) if pid != os.getpid() else []
        self._device(args[1])
        value = _limits.parse_limit(args[2])
        if pid == os.getpid():
            self.arbiter.limits.server = value
        for client in clients:
            client.mem_limit = value  # checked by the next alloc (on the control thread)
        return _limits.format_size(value)

    def get_device_pinned_mem_limit(self, args: list[str], uid: int) -> str:
        """The server's limit, or a client's limit followed by the level it comes from."""
        _args.expect(args, 2, "get_device_pinned_mem_limit")
        pid = _args.pid(args[0])
        self._device(args[1])
        limits = self.arbiter.limits
        if pid == os.getpid():
            return _limits.format_size(limits.server if limits.server is not None else limits.default)
        limit = limits.client_limit(_args.clients_of(self.arbiter, pid, viewer=uid)[0])
        return "unlimited" if limit is None else f"{_limits.format_size(limit.value)} ({limit.level})"

    # ---------------------------------------------------------------- priorities

    def set_default_client_priority(self, args: list[str]) -> str:
        return self._set_scheduler(args, "set_default_client_priority", "default_priority", priority_name)

    def get_default_client_priority(self, args: list[str]) -> str:
        return self._get_scheduler(args, "get_default_client_priority", "default_priority")

    def set_client_priority(self, args: list[str]) -> str:
        _args.expect(args, 2, "set_client_priority")
        clients = _args.clients_of(self.arbiter, _args.pid(args[0]))
        priority = _args.scheduled(self.arbiter, priority_name, args[1])
        for client in clients:
            client.priority = priority  # read by the next drain pass
            client.own_priority = client.operator_priority = True
        return priority

    # ---------------------------------------------------------------- compute shares and the mode

    def set_default_active_thread_percentage(self, args: list[str]) -> str:
        _args.expect(args, 1, "set_default_active_thread_percentage")
        scheduler = self.arbiter.drainer.scheduler
        _args.scheduled(self.arbiter, lambda: setattr(scheduler, "default_share", percentage(args[0])))
        return str(scheduler.default_share)

    def get_default_active_thread_percentage(self, args: list[str]) -> str:
        _args.expect(args, 0, "get_default_active_thread_percentage")
        return str(self.arbiter.drainer.scheduler.default_share)

    def set_active_thread_percentage(self, args: list[str]) -> str:
        _args.expect(args, 2, "set_active_thread_percentage")
        if _args.pid(args[0]) == os.getpid():  # the MPS meaning: the server's clients from now on
            return self.set_default_active_thread_percentage(args[1:])
        clients = _args.clients_of(self.arbiter, _args.pid(args[0]))
        scheduler = self.arbiter.drainer.scheduler

        def apply():
            for client in clients:
                usage = scheduler.usage(client)
                usage.share, usage.own_share = min(percentage(args[1]), client.requested_share), True
            return scheduler.share_of(clients[0])
        return str(_args.scheduled(self.arbiter, apply))

    def get_active_thread_percentage(self, args: list[str], uid: int) -> str:
        _args.expect(args, 1, "get_active_thread_percentage")
        if _args.pid(args[0]) == os.getpid():
            return str(self.arbiter.drainer.scheduler.default_share)
        client = _args.clients_of(self.arbiter, _args.pid(args[0]), viewer=uid)[0]
        return str(_args.scheduled(self.arbiter, self.arbiter.drainer.scheduler.share_of, client))

    def set_scheduling_mode(self, args: list[str]) -> str:
        return self._set_scheduler(args, "set_scheduling_mode", "mode", mode_name)

    def get_scheduling_mode(self, args: list[str]) -> str:
        return self._get_scheduler(args, "get_scheduling_mode", "mode")

    def _set_scheduler(self, args: list[str], command: str, attribute: str, parse) -> str:
        """Set the scheduler's ``attribute`` to ``parse(args[0])`` under the scheduling lock."""
        _args.expect(args, 1, command)
        scheduler = self.arbiter.drainer.scheduler
        _args.scheduled(self.arbiter, lambda: setattr(scheduler, attribute, parse(args[0])))
        return getattr(scheduler, attribute)

    def _get_scheduler(self, args: list[str], command: str, attribute: str) -> str:
        """The scheduler's ``attribute``."""
        _args.expect(args, 0, command)
        return getattr(self.arbiter.drainer.scheduler, attribute)
