"""The operator's configuration file: defaults and groups in TOML, read at start, on ``reload`` and SIGHUP.

``libshare-control -d --config FILE`` (and ``-f``, and ``python -m libshare.arbiter``)
reads a file like this one with :mod:`tomllib`::

    [defaults]
    active_thread_percentage = 50   # set_default_active_thread_percentage
    device_mem_limit = "4G"         # set_default_device_pinned_mem_limit ("unlimited", or bytes)
    priority = "normal"             # set_default_client_priority
    scheduling = "fairshare"        # set_scheduling_mode
    max_clients = 48                # --max-clients (only at start)
    watchdog_seconds = 120          # LIBSHARE_WATCHDOG_SECONDS (0: off)

    [groups.batch]                  # clients that connect with group="batch" (LIBSHARE_GROUP)
    active_thread_percentage = 25   # set_group_active_thread_percentage
    mem_limit = "2G"                # set_group_mem_limit
    priority = "low"                # set_group_priority

Every key is optional; any other key or table is refused. A value is checked by the very
function the control command that sets it uses (:func:`percentage`, :func:`priority_name`,
:func:`mode_name`, :func:`parse_limit`, ...) and applied by running that command
(``Commands.run``, so control.log records each change too); the watchdog, which has no
command, is set through the same ``Drainer.watchdog`` as at start, on the control thread.
The default priority and compute share reach, beyond new clients (what their commands do, as
in MPS), the running clients that took the default (``Scheduler.follow_defaults``; a client
that asked for its own, in its environment or by a command, keeps it).

The whole file is checked before anything is applied: a syntax error (with the line
:mod:`tomllib` gives), an unknown key or a bad value (naming the key and its line) refuses
the file, and the configuration in force stays (at start: the arbiter does not start).
Applying compares each value with the one in force and runs the commands for those that
differ only, so a reload of an unchanged file changes nothing, and a value a control command
changed since goes back to the file's. A key taken out of the file goes back to its default
(what the arbiter had before the file was applied: LIBSHARE_* in its environment, or the
built-in one); a group taken out loses its limits and priority. ``max_clients`` sizes
the arbiter's tables and descriptor budget when it starts: a change to it is reported and
takes effect at the next start (``libshare-control restart`` starts a new arbiter, which
reads the file). ``get_config`` prints what is in force and where each value comes from.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from libshare.errors import InvalidSubmission
from libshare.arbiter.serve.commands import _group
from libshare.arbiter.policy.limits import format_size, parse_limit
from libshare.arbiter.policy.scheduler import mode_name, percentage, priority_name

__all__ = ["Config", "ConfigError", "read", "MAX_CLIENTS", "max_clients_count", "watchdog_seconds"]

log = logging.getLogger("libshare.control")

MAX_CLIENTS = 4096
"""The most clients one arbiter may be sized for."""
_MAX_WATCHDOG = 86400.0


class ConfigError(InvalidSubmission):
    """A configuration file that cannot be used: its line (where known) and the reason."""


def max_clients_count(value: int) -> int:
    """A client count in 1..MAX_CLIENTS; ValueError otherwise."""
    if not 1 <= value <= MAX_CLIENTS:
        raise ValueError(f"max_clients must be in 1..{MAX_CLIENTS} (got {value})")
    return value


def watchdog_seconds(value) -> float:
    """Seconds a submission may run before the server faults (0: no watchdog); ValueError otherwise."""
    seconds = float(value)
    if not 0 <= seconds <= _MAX_WATCHDOG:
        raise ValueError(f"watchdog seconds must be in 0..{_MAX_WATCHDOG:.0f} (0: off), got {value!r}")
    return seconds


def _limit(value) -> int | None:
    return parse_limit(str(value))


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
    drainer.call(setattr, drainer, "watchdog", seconds or None)


@dataclass(frozen=True)
class Setting:
    """One key of the file: the TOML types it takes, its check, and how it is read and applied."""

    key: str
    kinds: tuple[type, ...]
    parse: Callable[[Any], Any]
    """The check the control command applies (ValueError or InvalidSubmission), to a canonical value."""
    get: Callable[[Any, str], Any]
    """The value in force in ``arbiter`` (for a group, or "" for [defaults])."""
    set: Callable[[Any, str, Any], None] | None
    """Applies a value (through its control command); None: only at start."""
    reaches: str = "running clients"
    unset: Any = None
    """A group's value while nobody set it."""
    size: bool = False  # shown as a memory size

    def show(self, value) -> str:
        """``value`` as a TOML literal."""
        if self.size:
            value = format_size(value)
        if value is None:
            return '"none"'
        return json.dumps(value) if isinstance(value, str) else str(value)


def _scheduler(arbiter):
    return arbiter.drainer.scheduler


DEFAULTS = {s.key: s for s in [
    Setting("active_thread_percentage", (int,), percentage, lambda a, g: _scheduler(a).default_share,
            _default("set_default_active_thread_percentage"), "running clients that took the default"),
    Setting("device_mem_limit", (str, int), _limit, lambda a, g: a.limits.default,
            lambda a, g, v: _run(a, "set_default_device_pinned_mem_limit", a.device.index, format_size(v)),
            size=True),
    Setting("priority", (str, int), priority_name, lambda a, g: _scheduler(a).default_priority,
            _default("set_default_client_priority"), "running clients that took the default"),
    Setting("scheduling", (str,), mode_name, lambda a, g: _scheduler(a).mode,
            lambda a, g, v: _run(a, "set_scheduling_mode", v)),
    Setting("max_clients", (int,), max_clients_count, lambda a, g: a.max_clients, None, "the next start"),
    Setting("watchdog_seconds", (int, float), watchdog_seconds, lambda a, g: a.drainer.watchdog or 0.0,
            _set_watchdog),
]}
"""The keys of [defaults]."""

GROUP = {s.key: s for s in [
    Setting("active_thread_percentage", (int,), percentage, lambda a, g: _scheduler(a).group_share.get(g, 100),
            lambda a, g, v: _run(a, "set_group_active_thread_percentage", g, v), unset=100),
    Setting("mem_limit", (str, int), _limit, lambda a, g: a.limits.groups.get(g),
            lambda a, g, v: _run(a, "set_group_mem_limit", g, format_size(v)), size=True),
    Setting("priority", (str, int), priority_name, lambda a, g: _scheduler(a).group_priority.get(g),
            lambda a, g, v: _run(a, "set_group_priority", g, v or "none")),
]}
"""The keys of a [groups.NAME] table."""

Values = dict[tuple[str, str], Any]
"""A checked file: (group, key) to its canonical value; the group is "" for [defaults]."""

_KIND_NAMES = {int: "an integer", float: "a number", str: "a string"}
_TOML_LINE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


# -------------------------------------------------------------------- reading and checking

def read(path: str | Path) -> Values:
    """The checked contents of the file at ``path``; :class:`ConfigError` with line and reason if bad."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {exc}") from None
    return parse(text, str(path))


def parse(text: str, name: str = "<config>") -> Values:
    """The checked contents of TOML ``text`` (``name`` names it in messages)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = str(exc)
        found = _TOML_LINE.search(reason)
        where = f"{name}:{found.group(1)}" if found else name
        if found:
            reason = f"{reason[:found.start()]} (column {found.group(2)})"
        raise ConfigError(f"{where}: TOML syntax error: {reason}") from None

    def refuse(table: list[str], key: str, reason: str):
        line = _line_of(text, table, key)
        raise ConfigError(f"{name}:{line}: {reason}" if line else f"{name}: {reason}")

    values: Values = {}
    for top, content in data.items():
        if top not in ("defaults", "groups"):
            refuse([], top, f"unknown key {top!r}: the tables are [defaults] and [groups.NAME]")
        if not isinstance(content, dict):
            refuse([], top, f"{top} must be a table ([{top}]), got {_toml_type(content)}")
    for key, value in data.get("defaults", {}).items():
        values["", key] = _check(DEFAULTS, ["defaults"], key, value, refuse)
    for group, table in data.get("groups", {}).items():
        try:
            _group(group)
        except InvalidSubmission as exc:
            refuse(["groups"], group, f"[groups.{group}]: {exc}")
        if not isinstance(table, dict):
            refuse(["groups"], group, f"groups.{group} must be a table ([groups.{group}]), got {_toml_type(table)}")
        for key, value in table.items():
            values[group, key] = _check(GROUP, ["groups", group], key, value, refuse)
    return values


def _check(settings: dict[str, Setting], table: list[str], key: str, value, refuse):
    where = "[" + ".".join(_toml_key(part) for part in table) + "]"
    setting = settings.get(key)
    if setting is None:
        refuse(table, key, f"unknown key {key!r} in {where}: the keys are {', '.join(settings)}")
    if isinstance(value, bool) or not isinstance(value, setting.kinds):
        kinds = " or ".join(_KIND_NAMES[k] for k in setting.kinds)
        refuse(table, key, f"{where} {key} must be {kinds}, got {_toml_type(value)}")
    try:
        return setting.parse(value)
    except (ValueError, InvalidSubmission) as exc:
        refuse(table, key, f"{where} {key} = {json.dumps(value)}: {exc}")


def _toml_type(value) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "a table"}
    return names.get(type(value), f"a {type(value).__name__}")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


_HEADER = re.compile(r"\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
_ASSIGNMENT = re.compile(r"\s*((?:\"[^\"]*\"|'[^']*'|[^=#\"'])+?)\s*=")


def _dotted(text: str) -> list[str]:
    return [part.strip("\"'") for part in re.findall(r"\"[^\"]*\"|'[^']*'|[^.\s]+", text)]


def _line_of(text: str, table: list[str], key: str) -> int | None:
    """The line where ``key`` of ``table`` is set (or its table opens), if it can be found."""
    wanted = [*table, key]
    current: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            current = _dotted(header.group(1))
            if current == wanted:
                return number
            continue
        assignment = _ASSIGNMENT.match(line)
        if assignment and [*current, *_dotted(assignment.group(1))] == wanted:
            return number
    return None


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
        self._defaults = {s.key: s.get(self.arbiter, "") for s in DEFAULTS.values()}

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
            except ConfigError as exc:
                log.error("configuration not reloaded (%s): %s; the configuration in force stays", why, exc)
                raise ConfigError(f"{exc}; the configuration in force stays") from None
            return self._apply(values, why)

    def _apply(self, values: Values, why: str) -> str:
        changes = []
        for group, key in [*values, *(k for k in self._file if k not in values)]:
            setting = (GROUP if group else DEFAULTS)[key]
            wanted = values.get((group, key), setting.unset if group else self._defaults[key])
            current = setting.get(self.arbiter, group)
            if wanted == current:
                continue
            name = f"groups.{_toml_key(group)}.{key}" if group else f"defaults.{key}"
            if setting.set is None:
                changes.append(f"{name}: {setting.show(current)} stays in force until the next start "
                               f"(libshare-control restart), which takes {setting.show(wanted)}")
                continue
            setting.set(self.arbiter, group, wanted)
            changes.append(f"{name}: {setting.show(current)} -> {setting.show(wanted)} (applies to {setting.reaches})")
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
        lines += [self._line(s, "") for s in DEFAULTS.values()]
        scheduler = _scheduler(arbiter)
        groups = {g for g, _ in self._file if g} | set(list(scheduler.group_share)) | \
            set(list(scheduler.group_priority)) | set(list(arbiter.limits.groups))
        for group in sorted(groups):
            shown = [self._line(s, group) for s in GROUP.values()
                     if (group, s.key) in self._file or s.get(arbiter, group) != s.unset]
            if shown:
                lines += ["", f"[groups.{_toml_key(group)}]", *shown]
        return "\n".join(lines)

    def _line(self, setting: Setting, group: str) -> str:
        value = setting.get(self.arbiter, group)
        key = (group, setting.key)
        if key in self._file and self._file[key] == value:
            source = "file"
        elif key in self._file and setting.set is None:
            source = f"at start; the file's {setting.show(self._file[key])} takes effect at the next start"
        elif key in self._file:
            source = f"control command since (the file says {setting.show(self._file[key])})"
        elif value == (setting.unset if group else self._defaults[setting.key]):
            source = "default"
        else:
            source = "control command"
        if setting.set is None:
            source += " (only at start)" if source == "file" or source == "default" else ""
        return f"{setting.key} = {setting.show(value)}  # {source}"
