"""A second process for the ring tests: attaches to a region by inherited fd and plays one role.

Run as ``python -m tests.ring._peer ROLE FD ARGS...``; the roles are the functions below.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

from libshare.ring import DESC_DTYPE, Region
from libshare.ring._binding import ffi, lib


def descriptors(producer_id: int, start: int, count: int) -> np.ndarray:
    """Descriptors numbered start..start+count-1 for one producer (program = producer id)."""
    d = np.zeros(count, DESC_DTYPE)
    d["ticket"] = np.arange(start, start + count, dtype=np.uint64)
    d["program"] = producer_id
    d["opcode"] = 1
    return d


def produce(region: Region, producer_id: str, total: str, batch: str = "64") -> None:
    """Push ``total`` numbered descriptors in batches, waiting for space as needed."""
    producer, total, batch = region.lanes.producer(), int(total), int(batch)
    for start in range(0, total, batch):
        producer.push(descriptors(int(producer_id), start, min(batch, total - start)), timeout=60)


def half_push_then_die(region: Region, producer_id: str, published: str) -> None:
    """Publish some descriptors, reserve one more slot, write half of it, and SIGKILL ourselves."""
    producer = region.lanes.producer()
    producer.push(descriptors(int(producer_id), 0, int(published)), timeout=10)
    slots = ffi.new("struct ls_desc **")
    assert lib.ls_reserve(producer._handle, 1, slots) == 1
    slots[0].ticket = 999_999
    os.kill(os.getpid(), signal.SIGKILL)


def echo(region: Region, count: str, spin_seconds: str = "0.00002") -> None:
    """Answer each descriptor with a completion carrying its ticket (the far side of a ping-pong)."""
    from libshare.ring import CQE_DTYPE

    region.peers.announce_consumer()
    out = np.empty(64, DESC_DTYPE)
    ptr = ffi.from_buffer("char[]", out)
    cqe = np.zeros(64, CQE_DTYPE)
    left = int(count)
    while left > 0:
        region.lanes.wait(timeout=10, spin=float(spin_seconds))
        n = region.lanes.pop_into(out, ptr)
        cqe["ticket"][:n] = out["ticket"][:n]
        region.completions.post(cqe[:n])
        left -= n


def main(argv: list[str]) -> None:
    role, fd, *args = argv
    region = Region.attach(int(fd))
    region.peers.watch(os.getppid())
    globals()[role](region, *args)
    region.close()


if __name__ == "__main__":
    main(sys.argv[1:])
