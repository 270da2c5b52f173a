"""The control commands that end clients or the arbiter, or let a refused one come back:
terminating clients, the quarantine's strikes, restart, hand_over, quit, reload, and the test hooks.

``terminate_client`` and ``terminate_group`` terminate through the control thread (the
containment's verdict, as for a fault) and wait until each client is gone, at most 30 s,
so that the operator's next command sees it gone. ``restart`` asks the control daemon
for a new arbiter, which takes over once it is ready (refused when no control daemon
supervises: nothing would happen); ``hand_over`` is how a new control daemon adopts an
arbiter that has none (libshare/daemon/supervisor.py, "Adopting"); ``quit`` shuts the arbiter down,
letting running work end (at most 10 s unless ``-t``). ``reload`` reads the operator's
``--config`` file again and applies what changed (config.py), each key through the
command that sets it. The test hooks
(``inject_crash``, ``inject_fault``, ``inject_device_lost``) run only in an arbiter started with
LIBSHARE_TEST_HOOKS=1, and are not in the command table the CLI shows.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from libshare.arbiter.serve import commands_args as _args
from libshare.errors import (
    AccessDenied,
    InvalidSubmission,
    LibshareError,
    ServerNotReady,
)
from libshare.protocol.control import COMMANDS, printable

log = logging.getLogger("libshare.control")

_TERMINATE_WAIT = 30.0  # seconds terminate_client waits for the client's running work to end


class Lifetime:
    """The commands that end clients or the arbiter (see the module's docstring)."""

    def __init__(self, arbiter):
        self.arbiter = arbiter

    def terminate_client(self, args: list[str]) -> str:
        if len(args) not in (1, 2):
            raise InvalidSubmission(f"usage: {COMMANDS['terminate_client'].usage}")
        _args.check_server_pid(args[:-1], COMMANDS["terminate_client"].usage)
        return self._terminate(_args.clients_of(self.arbiter, _args.pid(args[-1])), f"client pid {args[-1]}")

    def terminate_group(self, args: list[str]) -> str:
        """Terminate every client of a group (the Slurm epilog: a process that outlives its job)."""
        _args.expect(args, 1, "terminate_group")
        group = _args.group(args[0])
        clients = [c for c in list(self.arbiter.drainer.clients.values()) if c.group == group and not c.closing]
        return self._terminate(clients, f"group {printable(group)}") if clients else "none"

    def _terminate(self, clients: list, what: str) -> str:
        """Terminate ``clients`` and wait until each is gone; what was done, line by line."""
        drainer = self.arbiter.drainer
        for client in clients:
            drainer.call(drainer.containment.terminate, client)
        deadline = time.monotonic() + _TERMINATE_WAIT
        while any(c.id in drainer.clients for c in clients):
            if time.monotonic() > deadline:
                raise LibshareError(f"{what} still has work running after {_TERMINATE_WAIT:.0f} s")
            time.sleep(0.01)
        return "\n".join(f"terminated {c.describe()}" for c in clients)

    def clear_quarantine(self, args: list[str]) -> str:
        _args.expect(args, 1, "clear_quarantine")
        return "\n".join(self.arbiter.drainer.quarantine.clear(args[0]))

    def restart(self, args: list[str]) -> str:
        _args.expect(args, 0, "restart")
        if self.arbiter.on_restart is None:
            raise ServerNotReady("restart needs the control daemon, which starts the new arbiter: run the "
                                 "arbiter with libshare-control -d (or -f), or stop it and start a new one")
        self.arbiter.on_restart()
        return f"arbiter pid {os.getpid()} hands over to a new arbiter once it is ready"

    def hand_over(self, args: list[str]) -> str:
        _args.expect(args, 0, "hand_over")
        if self.arbiter.on_restart is not None:
            raise ServerNotReady("a control daemon supervises this arbiter: use restart")
        if self.arbiter.on_hand_over is None:
            raise ServerNotReady("this arbiter cannot hand over (an embedded one lives in its client's process)")
        self.arbiter.on_hand_over()
        return f"arbiter pid {os.getpid()} hands over to the arbiter that takes its lock next"

    def quit(self, args: list[str]) -> str:
        if args and (len(args) != 2 or args[0] != "-t"):
            raise InvalidSubmission(f"usage: {COMMANDS['quit'].usage}")
        self.arbiter.quit_timeout = _args.seconds(args[1]) if args else 10.0
        self.arbiter.quit_requested.set()
        return f"arbiter pid {os.getpid()} is shutting down"

    def reload(self, args: list[str]) -> str:
        _args.expect(args, 0, "reload")
        return self.arbiter.config.reload("reload command")

    # ---------------------------------------------------------------- test hooks

    def inject_crash(self, args: list[str]) -> str:
        """Test hook: crash (SIGSEGV) as a driver would while the engine handles a client's descriptor."""
        if not self.arbiter.test_hooks:
            raise AccessDenied("inject_crash is a test hook: start the arbiter with LIBSHARE_TEST_HOOKS=1")
        if len(args) != 1:
            raise InvalidSubmission("usage: inject_crash PID")
        client = _args.clients_of(self.arbiter, _args.pid(args[0]))[0]
        from libshare.arbiter.drain import emergency as _emergency

        log.error("test hook: crashing while %s's descriptor is processed", client.describe())
        _emergency.set_busy(client.slot + 1)
        os.kill(os.getpid(), signal.SIGSEGV)
        return "crashing"  # (the signal may land on another thread after this reply)

    def inject_fault(self, args: list[str]) -> str:
        """Test hook: put the server in FAULT as a lost device would (naming a client pid as offender)."""
        if not self.arbiter.test_hooks:
            raise AccessDenied("inject_fault is a test hook: start the arbiter with LIBSHARE_TEST_HOOKS=1")
        offender = _args.clients_of(self.arbiter, _args.pid(args[0]))[0] if args else None
        drainer = self.arbiter.drainer
        drainer.call(drainer.containment.enter_fault, "a fault injected by a test hook", offender)
        return self.arbiter.state

    def inject_device_lost(self, args: list[str]) -> str:
        """Test hook: report the device lost, as a GPU driver's VK_ERROR_DEVICE_LOST does (a supervised
        arbiter hands over at once: see drain/containment.py)."""
        if not self.arbiter.test_hooks:
            raise AccessDenied("inject_device_lost is a test hook: start the arbiter with LIBSHARE_TEST_HOOKS=1")
        _args.expect(args, 0, "inject_device_lost")
        drainer = self.arbiter.drainer
        drainer.post(drainer.containment.device_failed, "the device was lost (VK_ERROR_DEVICE_LOST, injected by "
                     "a test hook)")
        return self.arbiter.state
