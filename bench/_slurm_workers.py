"""A Slurm task for bench/test_slurm_bench.py: ``first OUT`` or ``busy OUT SECONDS BLOCKS``.

first: one checked saxpy dispatch; writes OUT/JOBID.first with the wall-clock time it completed.
busy:  warms up, writes OUT/JOBID.ready, then for each block B from 0 to BLOCKS - 1 waits for
OUT/start.B, keeps 4 busy dispatches in flight for SECONDS and writes OUT/JOBID.busy.B with the
device time of those that completed.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

import libshare
from bench._helpers import keep_in_flight

BUSY_ITERATIONS = 512  # about 0.8 ms of lavapipe time per dispatch of 4096 items


def first(session, out: Path, job: str) -> None:
    saxpy = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(64, np.float32), session.array(64, np.float32)
    x[:] = 2.0
    y[:] = 1.0
    session.dispatch(saxpy, 1, [x, y], struct.pack("If", 64, 3.0)).wait(60)
    done = time.time()
    assert np.all(y == 7.0)
    (out / f"{job}.first").write_text(repr(done))


def busy(session, out: Path, job: str, seconds: float, blocks: int) -> None:
    n = 4096
    program = session.load_program(libshare.shaders.path("busy"))
    data = session.array(n, np.uint32)
    go = lambda: session.dispatch(program, (n // 64, 1, 1), [data], struct.pack("II", n, BUSY_ITERATIONS))  # noqa: E731
    go().wait(60)
    (out / f"{job}.ready").write_text("")
    for block in range(blocks):
        deadline = time.monotonic() + 120
        while not (out / f"start.{block}").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"no start of block {block} after 120 s")
            time.sleep(0.01)
        device_ns, count = keep_in_flight(go, 4, time.perf_counter() + seconds)
        session.wait_idle(120)
        (out / f"{job}.busy.{block}").write_text(json.dumps({"device_ns": device_ns, "count": count,
                                                            "group": os.environ.get("LIBSHARE_GROUP")}))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    job = os.environ["SLURM_JOB_ID"]
    with libshare.connect(name=f"bench-{job}") as session:
        if mode == "first":
            first(session, out, job)
        else:
            busy(session, out, job, float(sys.argv[3]), int(sys.argv[4]))


if __name__ == "__main__":
    main()
