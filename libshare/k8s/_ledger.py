"""The plugin's ledger: the allocations it made, in a state file that outlives the plugin.

The kubelet's Allocate names devices and never says when an allocation ends: the plugin learns
that a group is over only when one of its devices is allocated to another container. So it
keeps every current allocation (:class:`Ledger`): the group each device is in, and the groups
superseded since the arbiter was last told ("lifted": their limits are lifted and their share
sockets closed, _plugin.py). Every arbiter is owed the limits and the share socket of every
current group: a new one (after a crash or ``restart``) starts without them.

A plugin restarts too (a DaemonSet upgrade, an OOM kill, a node drain of the plugin's pod),
while the pods it allocated to keep running. Its ledger is therefore a file, in a directory of
its own beside the kubelet's checkpoint (:func:`state_path`: a restarting kubelet removes every
file of its device-plugin directory but its checkpoint, and leaves directories alone). Each
change is written whole to a temporary file, flushed, renamed over the ledger and the
directory flushed: a crash leaves the old ledger or the new one, never a mix. An Allocate is
answered only once its allocation is on disk (:meth:`Ledger.add` changes nothing when the write
fails), and a plugin that starts reads the file back: it still retires an old group whose
devices are allocated again, and gives the next arbiter the running pods' groups. Lifted
groups are in the file until an arbiter has been told, so a plugin that died between an
Allocate and the ``close_share`` still closes the old socket.

The file is read back like anything read from disk, checked: another resource's ledger, a
file that is not one (too big, not JSON, a wrong field, a group that is not the digest of its
devices, a device in two groups) is ignored with an error in the log, and the plugin starts
with no allocation, as if there were no file. An allocation naming a device that is no longer
advertised (the shares were changed between two runs) is dropped and its group lifted.
Allocations are kept as they were answered (compute share and memory), whatever the shares
are now: that is what the running container was told.

A :class:`Ledger` is not thread-safe: its owner (the plugin's ``_Arbiter``) holds a lock.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from libshare.k8s._shares import Allocation, Share, group_name

__all__ = ["Ledger", "state_path"]

log = logging.getLogger("libshare.k8s")

VERSION = 1
STATE_DIRECTORY = "libshare"  # in the kubelet's device-plugin directory
_MAX_BYTES = 1 << 20  # a ledger of 100 shares is a few KiB
_GROUP = re.compile(r"k8s-[0-9a-f]{24}\Z")  # what group_name() makes


def state_path(kubelet_socket: Path, socket_name: str) -> Path:
    """The ledger of the plugin serving ``socket_name`` beside ``kubelet_socket``: one per plugin
    (one per resource), in a directory the kubelet leaves alone."""
    return kubelet_socket.parent / STATE_DIRECTORY / (socket_name.removesuffix(".sock") + ".json")


class Ledger:
    """The current allocations by group, and the groups lifted since the arbiter was last told."""

    def __init__(self, path: Path, resource: str, shares: dict[str, Share]):
        self.path = path
        self._resource = resource
        self._groups: dict[str, Allocation] = {}
        self.lifted: frozenset[str] = frozenset()
        self._load(shares)

    def allocations(self) -> list[Allocation]:
        """The current allocations, by group name."""
        return [self._groups[group] for group in sorted(self._groups)]

    def add(self, allocations: list[Allocation]) -> None:
        """Record ``allocations``: a group any of whose devices is in one of them is superseded (lifted).
        Written to disk before anything changes here; OSError (and no change) when it cannot be."""
        groups, lifted = dict(self._groups), set(self.lifted)
        for allocation in allocations:
            group_of = {device: a.group for a in groups.values() for device in a.devices}
            for device in allocation.devices:
                old = group_of.get(device)
                if old is not None and old != allocation.group and old in groups:
                    del groups[old]
                    lifted.add(old)
            groups[allocation.group] = allocation
            lifted.discard(allocation.group)
        self._write(groups, lifted)
        self._groups, self.lifted = groups, frozenset(lifted)

    def told(self, lifted) -> None:
        """The arbiter closed and lifted the groups ``lifted``: they leave the ledger (a failed write is
        only logged: the next plugin tells an arbiter again, which changes nothing)."""
        remaining = set(self.lifted) - set(lifted)
        if remaining == self.lifted:
            return
        try:
            self._write(self._groups, remaining)
        except OSError as exc:
            log.warning("the ledger %s was not updated (%s): a later plugin lifts %s again", self.path, exc,
                        ", ".join(sorted(lifted)))
        self.lifted = frozenset(remaining)

    def _write(self, groups: dict[str, Allocation], lifted) -> None:
        text = json.dumps({"version": VERSION, "resource": self._resource, "lifted": sorted(lifted),
                           "allocations": [_entry(groups[group]) for group in sorted(groups)]}, indent=1)
        self.path.parent.mkdir(mode=0o700, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        directory = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def _load(self, shares: dict[str, Share]) -> None:
        try:
            with open(self.path, "rb") as file:
                text = file.read(_MAX_BYTES + 1)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("the ledger %s cannot be read (%s): starting with no allocation", self.path, exc)
            return
        try:
            allocations, lifted = _parse(text, self._resource)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            why = f"no field {exc}" if isinstance(exc, KeyError) else str(exc) or type(exc).__name__
            log.error("the ledger %s is ignored (%s): starting with no allocation", self.path, why)
            return
        for allocation in allocations:
            if all(device in shares for device in allocation.devices):
                self._groups[allocation.group] = allocation
            else:
                log.warning("group %s (%s) is lifted: its devices are no longer all advertised", allocation.group,
                            ",".join(allocation.devices))
                lifted.add(allocation.group)
        self.lifted = frozenset(lifted - set(self._groups))
        log.info("ledger %s: %d allocation(s), %d group(s) to lift", self.path, len(self._groups), len(self.lifted))


def _entry(allocation: Allocation) -> dict:
    return {"devices": list(allocation.devices), "group": allocation.group, "percent": allocation.percent,
            "memory": allocation.memory}


def _parse(text: bytes, resource: str) -> tuple[list[Allocation], set[str]]:
    """The allocations and lifted groups of a ledger's text; ValueError (or TypeError, KeyError) saying
    what is wrong with it."""
    if len(text) > _MAX_BYTES:
        raise ValueError(f"more than {_MAX_BYTES} bytes")
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} ledger")
    if data["resource"] != resource:
        raise ValueError(f"the ledger of {str(data['resource'])[:80]!r}, not of {resource!r}")
    lifted = set(_checked_list(data["lifted"], str))
    allocations, seen = [], set()
    for entry in _checked_list(data["allocations"], dict):
        allocation = _allocation(entry)
        if seen & set(allocation.devices):
            raise ValueError(f"a device of group {allocation.group} is in another group too")
        seen.update(allocation.devices)
        allocations.append(allocation)
    bad = sorted(group for group in lifted if not _GROUP.match(group))
    if bad:
        raise ValueError(f"a lifted group is not one this plugin names: {bad[0][:80]!r}")
    return allocations, lifted


def _checked_list(value, kind) -> list:
    if not isinstance(value, list) or not all(isinstance(item, kind) for item in value):
        raise ValueError(f"a list of {kind.__name__} was expected")
    return value


def _allocation(entry: dict) -> Allocation:
    devices = tuple(_checked_list(entry["devices"], str))
    percent, memory = entry["percent"], entry["memory"]
    if not devices or len(set(devices)) != len(devices) or list(devices) != sorted(devices):
        raise ValueError("an allocation's devices are not a sorted set")
    if entry["group"] != group_name(devices):
        raise ValueError(f"group {str(entry['group'])[:80]!r} is not the group of its devices")
    if type(percent) is not int or not 1 <= percent <= 100:
        raise ValueError(f"group {entry['group']}: a compute share of {percent!r} %")
    if memory is not None and (type(memory) is not int or memory <= 0):
        raise ValueError(f"group {entry['group']}: a memory of {memory!r}")
    return Allocation(devices, entry["group"], percent, memory)
