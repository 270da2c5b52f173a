"""The operator's configuration file applied to a running arbiter: at start, on ``reload`` and SIGHUP.

Reading and checking the file (its keys, their checks, the line of a bad one) is
libshare/daemon/config_file.py's, which the control daemon uses too. Here each key is applied
by running the control command that sets it (``Commands.run``, so control.log records each
change too); the watchdog, which has no command, is set through the same ``Planner.watchdog``
(``drainer.planner``) as at start, on the control thread. The default priority and compute
share reach, beyond new clients (what their commands do, as in MPS), the running clients that
took the default (``Scheduler.follow_defaults``; a client that asked for its own, in its
environment or by a command, keeps it).

A bad file refuses the whole file, and the configuration in force stays (at start: the
arbiter does not start). Whatever reading the file raises is such a refusal, with its reason:
the reload path (the SIGHUP thread, the ``reload`` command) outlives any file. Applying compares each value with the one in force and runs the
commands for those that differ only, so a reload of an unchanged file changes nothing, and a
value a control command changed since goes back to the file's. A key taken out of the file
goes back to its default (what the arbiter had before the file was applied: LIBSHARE_* in its
environment, or the built-in one); a group taken out loses its limits and priority.
``max_clients`` sizes the arbiter's tables and descriptor budget when it starts: a change to it
is reported and takes effect at the next start (``libshare-control restart`` starts a new
arbiter, which reads the file). ``get_config`` prints what is in force and where each value
comes from.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from libshare.daemon import config_file as _schema
from libshare.daemon.config_file import Values, read
from libshare.errors import ConfigError
from libshare.settings import format_size

__all__ = ["Config", "DEFAULTS", "GROUP"]

log = logging.getLogger("libshare.control")


def _run(arbiter, command: str, *args) -> None:
    """Apply a setting as the operator's command would (checked, logged to control.log)."""
    arbiter.commands.run(command, [str(a) for a in args], os.getpid(), os.getuid())


def _default(command: str):
    """Apply a default through its command (which reaches new clients), then to the running clients
    that took the default (which a reload reaches, unlike MPS)."""
    def apply(arbiter, group: str, value) -> None:
        _run(arbiter, command, value)
        drainer = arbiter.drainer
        drainer.call(lambda: drainer.scheduler.follow_defaults(list(drainer.clients.values())))
    return apply


def _set_watchdog(arbiter, group: str, seconds: float) -> None:
    drainer = arbiter.drainer
    drainer.call(setattr, drainer.planner, "watchdog", seconds or None)


@dataclass(frozen=True)
class Applied:
    """How one key of the file is read from and applied to a running arbiter."""

    get: Callable[[Any, str], Any]
    """The value in force in ``arbiter`` (for a group, or "" for [defaults])."""
    set: Callable[[Any, str, Any], None] | None
    """Applies a value (through its control command); None: only at start."""
    reaches: str = "running clients"
    unset: Any = None
    """A group's value while nobody set it."""


def _scheduler(arbiter):
    return arbiter.drainer.scheduler


DEFAULTS = {
    "active_thread_percentage": Applied(lambda a, g: _scheduler(a).default_share,
                                        _default("set_default_active_thread_percentage"),
                                        "running clients that took the default"),
    "device_mem_limit": Applied(lambda a, g: a.limits.default,
                                lambda a, g, v: _run(a, "set_default_device_pinned_mem_limit", a.device.index,
                                                     format_size(v))),
    "priority": Applied(lambda a, g: _scheduler(a).default_priority, _default("set_default_client_priority"),
                        "running clients that took the default"),
    "scheduling": Applied(lambda a, g: _scheduler(a).mode, lambda a, g, v: _run(a, "set_scheduling_mode", v)),
    "max_clients": Applied(lambda a, g: a.max_clients, None, "the next start"),
    "watchdog_seconds": Applied(lambda a, g: a.drainer.planner.watchdog or 0.0, _set_watchdog),
}
"""How each key of [defaults] is applied (the keys are the file's: config_file.DEFAULTS)."""

GROUP = {
    "active_thread_percentage": Applied(lambda a, g: _scheduler(a).group_share.get(g, 100),
                                        lambda a, g, v: _run(a, "set_group_active_thread_percentage", g, v),
                                        unset=100),
    "mem_limit": Applied(lambda a, g: a.limits.groups.get(g),
                         lambda a, g, v: _run(a, "set_group_mem_limit", g, format_size(v))),
    "priority": Applied(lambda a, g: _scheduler(a).group_priority.get(g),
                        lambda a, g, v: _run(a, "set_group_priority", g, v or "none")),
}
"""How each key of a [groups.NAME] table is applied (the keys are config_file.GROUP's)."""


# -------------------------------------------------------------------- the configuration in force

@dataclass
class Config:
    """The configuration of one arbiter: its file, what the file set, and the defaults before it."""

    arbiter: Any
    path: Path | None = None
    """The file (--config), or None."""
    _file: Values = field(default_factory=dict)
    _defaults: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self._defaults = {key: applied.get(self.arbiter, "") for key, applied in DEFAULTS.items()}

    def start(self, path: Path, values: Values) -> str:
        """Apply the file at ``path``, read (and checked) as ``values`` when the arbiter started."""
        with self._lock:
            self.path = Path(path)
            return self._apply(values, "at start")

    def reload(self, why: str) -> str:
        """Read the file again and apply what changed; :class:`ConfigError` (nothing changed) if it is bad."""
        with self._lock:
            if self.path is None:
                log.warning("configuration not reloaded (%s): the arbiter has no configuration file", why)
                raise ConfigError("this arbiter has no configuration file: start it with --config FILE")
            try:
                values = read(self.path)
            except Exception as exc:  # read refuses with ConfigError; anything else is refused the same way
                reason = exc if isinstance(exc, ConfigError) else f"{self.path}: {type(exc).__name__}: {exc}"
                log.error("configuration not reloaded (%s): %s; the configuration in force stays", why, reason)
                raise ConfigError(f"{reason}; the configuration in force stays") from None
            return self._apply(values, why)

    def _apply(self, values: Values, why: str) -> str:
        changes = []
        for group, key in [*values, *(k for k in self._file if k not in values)]:
            schema, applied = _key(group, key)
            wanted = values.get((group, key), applied.unset if group else self._defaults[key])
            current = applied.get(self.arbiter, group)
            if wanted == current:
                continue
            name = f"groups.{_schema.toml_key(group)}.{key}" if group else f"defaults.{key}"
            if applied.set is None:
                changes.append(f"{name}: {schema.show(current)} stays in force until the next start "
                               f"(libshare-control restart), which takes {schema.show(wanted)}")
                continue
            applied.set(self.arbiter, group, wanted)
            changes.append(f"{name}: {schema.show(current)} -> {schema.show(wanted)} (applies to {applied.reaches})")
        self._file = dict(values)
        summary = "; ".join(changes) or "no change"
        log.info("configuration from %s applied (%s): %s", self.path, why, summary)
        return "\n".join([f"configuration from {self.path} applied", *changes] if changes
                         else [f"configuration from {self.path}: no change"])

    def describe(self) -> str:
        """The configuration in force as TOML, each value followed by where it comes from."""
        arbiter = self.arbiter
        origin = f"file {self.path}" if self.path else "no configuration file (start with --config FILE)"
        lines = [f"# configuration in force in arbiter pid {os.getpid()}; {origin}", "[defaults]"]
        lines += [self._line("", key) for key in _schema.DEFAULTS]
        scheduler = _scheduler(arbiter)
        groups = {g for g, _ in self._file if g} | set(list(scheduler.group_share)) | \
            set(list(scheduler.group_priority)) | set(list(arbiter.limits.groups))
        for group in sorted(groups):
            shown = [self._line(group, key) for key, applied in GROUP.items()
                     if (group, key) in self._file or applied.get(arbiter, group) != applied.unset]
            if shown:
                lines += ["", f"[groups.{_schema.toml_key(group)}]", *shown]
        return "\n".join(lines)

    def _line(self, group: str, key: str) -> str:
        schema, applied = _key(group, key)
        value = applied.get(self.arbiter, group)
        entry = (group, key)
        if entry in self._file and self._file[entry] == value:
            source = "file"
        elif entry in self._file and applied.set is None:
            source = f"at start; the file's {schema.show(self._file[entry])} takes effect at the next start"
        elif entry in self._file:
            source = f"control command since (the file says {schema.show(self._file[entry])})"
        elif value == (applied.unset if group else self._defaults[key]):
            source = "default"
        else:
            source = "control command"
        if applied.set is None:
            source += " (only at start)" if source == "file" or source == "default" else ""
        return f"{key} = {schema.show(value)}  # {source}"


def _key(group: str, key: str) -> tuple[_schema.Key, Applied]:
    """The file's key ``key`` (of a group's table, or of [defaults] when ``group`` is ""): its schema
    and how it is applied."""
    return (_schema.GROUP[key], GROUP[key]) if group else (_schema.DEFAULTS[key], DEFAULTS[key])
