"""Shares: what the device plugin advertises, and what allocating some of them gives a container.

One arbiter owns one device. The plugin cuts it into shares and advertises each share as one
kubelet "device" of its resource; a container that asks for ``libshare.io/vulkan: 3`` gets three
shares, that is, the sum of their compute shares (capped at 100 %) and of their memory as
ceilings that apply to all its processes together (one libshare group per allocation).

Shares are written as ``N`` (N equal shares of 100/N % each, 1 <= N <= 100: ``--shares 100``
gives 100 devices of 1 %), or as a comma-separated list of whole percentages with a ``%`` each,
optionally with the share's memory after a colon (``50%:8G,25%:4G,25%:4G``; ``100%`` is a single
share of the whole device). The percentages of a list add up to at most 100. A memory given per
share (``memory_per_share``) applies to each share without a memory of its own.

Memory is all or nothing: either every share has a memory (its own or ``memory_per_share``) and
an allocation's memory limit is the sum of its shares', or no share has one and no allocation
has a memory limit. A list that mixes the two is refused (:func:`check_memory`): a share
without memory could only mean "no limit", and allocated beside an 8G share it would lift that
share's cap, while 8G promised beside shares without a limit is promised out of nothing.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from libshare.protocol.control import decimal
from libshare.settings import format_size, parse_size
from libshare.errors import InvalidSubmission

__all__ = ["DEFAULT_RESOURCE", "Share", "Allocation", "parse_shares", "parse_memory", "allocate", "check_memory", "group_name",
           "MAX_SHARES"]

DEFAULT_RESOURCE = "libshare.io/vulkan"
MAX_SHARES = 100  # the arbiter's compute share is a whole percentage, at least 1


@dataclass(frozen=True)
class Share:
    """One advertised device: its id, its part of the device's time, and its memory (bytes, or None)."""

    id: str
    percent: Fraction
    memory: int | None = None

    def describe(self) -> str:
        memory = "" if self.memory is None else f", {format_size(self.memory)}"
        return f"{self.id} ({float(self.percent):g} %{memory})"


@dataclass(frozen=True)
class Allocation:
    """What one container's request of ``devices`` gives it."""

    devices: tuple[str, ...]
    group: str
    percent: int  # LIBSHARE_ACTIVE_THREAD_PERCENTAGE and the group's compute share
    memory: int | None  # LIBSHARE_DEVICE_MEM_LIMIT and the group's memory limit; None: no limit

    def environment(self, pipe_directory: Path | str) -> dict[str, str]:
        """The container's LIBSHARE_* variables: the arbiter at ``pipe_directory`` (as the container sees
        it), daemon mode (never an embedded arbiter of its own), its share, memory and group."""
        env = {"LIBSHARE_PIPE_DIRECTORY": str(pipe_directory), "LIBSHARE_MODE": "daemon",
               "LIBSHARE_ACTIVE_THREAD_PERCENTAGE": str(self.percent), "LIBSHARE_GROUP": self.group}
        if self.memory is not None:
            env["LIBSHARE_DEVICE_MEM_LIMIT"] = str(self.memory)
        return env


def parse_memory(text: str) -> int:
    """A memory size ("512M", "2G", bytes); ValueError when it is not one, or is zero."""
    try:
        value = parse_size(text)
    except InvalidSubmission as exc:
        raise ValueError(str(exc)) from None
    if value <= 0:
        raise ValueError(f"a share's memory must be more than 0 bytes (got {text!r})")
    return value


def parse_shares(text: str, memory_per_share: int | None = None) -> list[Share]:
    """The shares ``text`` describes (see the module's docstring); ValueError saying what is wrong."""
    text = text.strip()
    count = decimal(text, 1 << 62)
    if count is not None:
        if not 1 <= count <= MAX_SHARES:
            raise ValueError(f"--shares N takes 1 to {MAX_SHARES} equal shares (each at least 1 %), got {count}")
        return [Share(_device_id(i, count), Fraction(100, count), memory_per_share) for i in range(count)]
    entries = [entry.strip() for entry in text.split(",")]
    if not entries or len(entries) > MAX_SHARES or "" in entries:
        raise ValueError(f"--shares takes a count (like 10) or 1 to {MAX_SHARES} percentages (like 50%,25%,25%), "
                         f"got {text!r}")
    shares = []
    for i, entry in enumerate(entries):
        size, _, memory = entry.partition(":")
        percent = decimal(size[:-1].strip(), 100) if size.endswith("%") else None
        if not percent:
            raise ValueError(f"a share is a whole percentage from 1% to 100%, optionally with its memory "
                             f"(like 25% or 25%:4G), got {entry!r}")
        shares.append(Share(_device_id(i, len(entries)), Fraction(percent),
                            parse_memory(memory) if memory else memory_per_share))
    total = sum(share.percent for share in shares)
    if total > 100:
        raise ValueError(f"the shares add up to {total} % of the device; at most 100 % can be shared out")
    check_memory(shares)
    return shares


def check_memory(shares) -> None:
    """ValueError unless every share has a memory or none has (the module's docstring says why)."""
    without = [share.id for share in shares if share.memory is None]
    if without and len(without) < len(shares):
        shown = ", ".join(without[:5]) + (" ..." if len(without) > 5 else "")
        raise ValueError(f"shares with and without memory are mixed ({shown} without): give every share its "
                         "memory (or --memory-per-share for those without one), or none")


def _device_id(index: int, count: int) -> str:
    return f"share-{index:0{len(str(count - 1))}d}"


def group_name(devices) -> str:
    """The libshare group of a container that was allocated ``devices``: the same for the same set.

    The kubelet's Allocate names devices, never the pod or container: the group is derived from
    the device ids. A device belongs to one running container at a time, so two containers
    running at once never share a group, and every process of one container does.
    """
    digest = hashlib.sha256("\0".join(sorted(devices)).encode()).hexdigest()
    return f"k8s-{digest[:24]}"


def allocate(shares: dict[str, Share], devices) -> Allocation:
    """The allocation of ``devices`` (ids of ``shares``): the sum of their compute shares (at most 100 %)
    and of their memory. ValueError for none, an unknown or a repeated id, and for shares with and
    without memory together (:func:`check_memory`)."""
    devices = list(devices)
    if not devices:
        raise ValueError("the request names no device")
    unknown = sorted({d for d in devices if d not in shares})
    if unknown:
        shown = ", ".join(repr(d[:80]) for d in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise ValueError(f"unknown device id(s) {shown}; this plugin advertises {len(shares)} shares "
                         f"({next(iter(shares))} ...)")
    if len(set(devices)) != len(devices):
        raise ValueError("the request names a device more than once")
    chosen = [shares[d] for d in devices]
    percent = min(100, max(1, math.floor(sum(share.percent for share in chosen))))
    check_memory(chosen)
    memory = None if chosen[0].memory is None else sum(share.memory for share in chosen)
    return Allocation(tuple(sorted(devices)), group_name(devices), percent, memory)
