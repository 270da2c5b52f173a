"""The operator's configuration file: its keys, and reading and checking it.

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

Every key is optional; any other key or table is refused. The keys of ``[defaults]`` are the
settings table's file keys (libshare/settings.py), each checked by its row's parser, the very
check of the control command that sets it (``percentage``, ``priority_name``, ``mode_name``,
``parse_limit``, ...). The whole file is checked before anything is applied: a syntax error
(with the line :mod:`tomllib` gives), an unknown key or a bad value (naming the key and its
line) raises :class:`ConfigError`.

Any failure to read the file is such a refusal, never another exception: the reload path
(SIGHUP, the ``reload`` command) must outlive a hostile file. The file is read only if it is a
regular file of at most :data:`MAX_BYTES` (a FIFO or ``/dev/zero`` would block or fill the
reader); arrays or inline tables nested deeper than :mod:`tomllib`'s recursion allows, and an
integer past Python's digit limit, are refused with that reason. The line of a bad key is
found with patterns that cannot backtrack (a long line costs its length, not its cube).

The control daemon checks the file here before it starts an arbiter, so this module imports
nothing of the arbiter: applying a checked file to a running arbiter is
libshare/arbiter/serve/config.py's.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from libshare import settings as _settings
from libshare.errors import ConfigError, InvalidSubmission
from libshare.protocol.control import group_name
from libshare.settings import format_size, parse_limit_value, percentage, priority_name

__all__ = ["Key", "DEFAULTS", "GROUP", "Values", "MAX_BYTES", "read", "parse", "toml_key"]


@dataclass(frozen=True)
class Key:
    """One key of the file: the TOML types it takes and its check."""

    key: str
    kinds: tuple[type, ...]
    parse: Callable[[Any], Any]
    """The check (ValueError or InvalidSubmission), to a canonical value."""
    size: bool = False  # shown as a memory size

    def show(self, value) -> str:
        """``value`` as a TOML literal."""
        if self.size:
            value = format_size(value)
        if value is None:
            return '"none"'
        return json.dumps(value) if isinstance(value, str) else str(value)


DEFAULTS = {s.file_key: Key(s.file_key, s.file_kinds, s.file_parse or s.parse, s.size)
            for s in _settings.TABLE if s.file_key}
"""The keys of [defaults]: the settings table's file keys, in its order."""

GROUP = {k.key: k for k in [
    Key("active_thread_percentage", (int,), percentage),
    Key("mem_limit", (str, int), parse_limit_value, size=True),
    Key("priority", (str, int), priority_name),
]}
"""The keys of a [groups.NAME] table."""

Values = dict[tuple[str, str], Any]
"""A checked file: (group, key) to its canonical value; the group is "" for [defaults]."""

_KIND_NAMES = {int: "an integer", float: "a number", str: "a string"}
_TOML_LINE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


MAX_BYTES = 1 << 20
"""The largest configuration file read (1 MiB); a larger one is refused."""


def read(path: str | Path) -> Values:
    """The checked contents of the file at ``path``; :class:`ConfigError` with line and reason if bad."""
    try:
        data = _read_bytes(Path(path))
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {exc}") from None
    return parse(text, str(path))


def _read_bytes(path: Path) -> bytes:
    """The bytes of the regular file at ``path``, at most :data:`MAX_BYTES` (OSError otherwise)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO does not block the open
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file: {path}")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 16, MAX_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BYTES:
                raise OSError(f"larger than {MAX_BYTES // 1024} KiB, the most a configuration file may be")
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse(text: str, name: str = "<config>") -> Values:
    """The checked contents of TOML ``text`` (``name`` names it in messages)."""
    data = _load(text, name)

    def refuse(table: list[str], key: str, reason: str):
        line = _line_of(text, table, key)
        raise ConfigError(f"{name}:{line}: {reason}" if line else f"{name}: {reason}")

    values: Values = {}
    for top, content in data.items():
        if top not in ("defaults", "groups"):
            refuse([], top, f"unknown key {_clipped(repr(top))}: the tables are [defaults] and [groups.NAME]")
        if not isinstance(content, dict):
            refuse([], top, f"{top} must be a table ([{top}]), got {_toml_type(content)}")
    for key, value in data.get("defaults", {}).items():
        values["", key] = _check(DEFAULTS, ["defaults"], key, value, refuse)
    for group, table in data.get("groups", {}).items():
        try:
            group_name(group)
        except InvalidSubmission as exc:
            refuse(["groups"], group, f"[groups.{_clipped(toml_key(group))}]: {_clipped(str(exc), 300)}")
        if not isinstance(table, dict):
            refuse(["groups"], group, f"groups.{group} must be a table ([groups.{group}]), got {_toml_type(table)}")
        for key, value in table.items():
            values[group, key] = _check(GROUP, ["groups", group], key, value, refuse)
    return values


def _load(text: str, name: str) -> dict:
    """:func:`tomllib.loads` of ``text``, every failure a :class:`ConfigError` with its reason."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = str(exc)
        found = _TOML_LINE.search(reason)
        where = f"{name}:{found.group(1)}" if found else name
        if found:
            reason = f"{reason[:found.start()]} (column {found.group(2)})"
        raise ConfigError(f"{where}: TOML syntax error: {reason}") from None
    except RecursionError:
        raise ConfigError(f"{name}: arrays or inline tables nested too deeply to read") from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise ConfigError(f"{name}: a value cannot be read: {str(exc)[:200]}") from None


def _check(keys: dict[str, Key], table: list[str], key: str, value, refuse):
    where = "[" + ".".join(toml_key(part) for part in table) + "]"
    setting = keys.get(key)
    if setting is None:
        refuse(table, key, f"unknown key {_clipped(repr(key))} in {where}: the keys are {', '.join(keys)}")
    if isinstance(value, bool) or not isinstance(value, setting.kinds):
        kinds = " or ".join(_KIND_NAMES[k] for k in setting.kinds)
        refuse(table, key, f"{where} {key} must be {kinds}, got {_toml_type(value)}")
    try:
        return setting.parse(value)
    except (ValueError, InvalidSubmission) as exc:
        refuse(table, key, f"{where} {key} = {_clipped(json.dumps(value))}: {_clipped(str(exc), 300)}")


def _clipped(text: str, most: int = 80) -> str:
    """``text``, cut to ``most`` characters (a hostile value does not make a megabyte of message)."""
    return text if len(text) <= most else text[:most] + "..."


def _toml_type(value) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "a table"}
    return names.get(type(value), f"a {type(value).__name__}")


def toml_key(key: str) -> str:
    """``key`` as TOML writes it (quoted unless bare)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


_HEADER = re.compile(r"\s*+\[([^\[\]]++)\]\s*+(?:#.*)?$")  # possessive: no backtracking
_ASSIGNMENT = re.compile(r"\s*+((?:\"[^\"]*+\"|'[^']*+'|[^=#\"']++)++)=")


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
