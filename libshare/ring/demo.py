"""Ring demo: two processes exchange a million descriptors through one region and print the rate.

Run ``python -m libshare.ring.demo [--count N] [--batch B]``. The parent creates
the region and consumes; a child process attaches through the inherited memfd,
pushes numbered descriptors in batches and waits for their completions. The
parent checks that every descriptor arrived once and in order.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from libshare.ring import CQE_DTYPE, DESC_DTYPE, Region


def _progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = width * done // total
    rate = done / max(time.monotonic() - started, 1e-9)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done:>9}/{total} {rate / 1e6:6.2f} M/s")
    sys.stderr.flush()


def run_child(fd: int, count: int, batch: int) -> None:
    """Producer side: push ``count`` numbered descriptors, then wait until all are completed."""
    region = Region.attach(fd)
    region.peers.watch(os.getppid())
    producer = region.lanes.producer()
    descs = np.zeros(batch, DESC_DTYPE)
    descs["opcode"] = 1
    cqe = np.empty(region.cq_entries, CQE_DTYPE)
    completed = 0
    for start in range(0, count, batch):
        n = min(batch, count - start)
        descs["ticket"][:n] = np.arange(start, start + n)
        producer.push(descs[:n], timeout=30)
        completed += region.completions.take_into(cqe)
    while completed < count:
        region.completions.wait(1, timeout=30)
        completed += region.completions.take_into(cqe)
    region.close()


def run_parent(count: int, batch: int) -> float:
    """Consumer side: drain, check order, post completions; return descriptors per second."""
    with Region.create(lanes=2, lane_entries=1024, cq_entries=4096) as region:
        region.peers.announce_consumer()
        child = subprocess.Popen(
            [sys.executable, "-m", "libshare.ring.demo", "--child", str(region.fd),
             "--count", str(count), "--batch", str(batch)],
            pass_fds=(region.fd,),
        )
        region.peers.watch(child.pid)
        out = np.empty(1024, DESC_DTYPE)
        cqe = np.zeros(1024, CQE_DTYPE)
        received, started, next_report = 0, None, 0
        while received < count:
            region.lanes.wait(timeout=30)
            started = started or time.monotonic()
            n = region.lanes.pop_into(out)
            tickets = out["ticket"][:n]
            if not np.array_equal(tickets, np.arange(received, received + n, dtype=np.uint64)):
                raise SystemExit(f"order broken after {received} descriptors")
            cqe["ticket"][:n] = tickets
            posted = 0
            while posted < n:
                posted += region.completions.post(cqe[posted:n])
            received += n
            if received >= next_report:
                _progress(received, count, started)
                next_report += count // 50
        elapsed = time.monotonic() - started
        _progress(received, count, started)
        sys.stderr.write("\n")
        if child.wait(timeout=60) != 0:
            raise SystemExit("the producer process failed")
        return count / elapsed


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run the parent (or, with --child, the producer)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        run_child(args.child, args.count, args.batch)
        return
    rate = run_parent(args.count, args.batch)
    print(f"{args.count} descriptors of 256 bytes, batches of {args.batch}, two processes: "
          f"{rate / 1e6:.2f} M descriptors/s, all received once and in order")


if __name__ == "__main__":
    main()
