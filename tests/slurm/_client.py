"""A Slurm task's libshare client: checked saxpy dispatches, a try past its group's memory limit,
a report in OUT/JOBID.PROCID.json, then a wait for OUT/go.JOBID before it disconnects (so that the
test sees every job's clients at once), and OUT/JOBID.PROCID.done with its dispatch count."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

import libshare
from tests._wait import wait_until

_WAIT = 150.0


def main() -> None:
    out, mem_mib = Path(sys.argv[1]), int(sys.argv[2])
    job, task = os.environ["SLURM_JOB_ID"], os.environ.get("SLURM_PROCID", "0")
    report = {"pid": os.getpid(), "job": job, "task": task,
              **{k: v for k, v in os.environ.items() if k.startswith("LIBSHARE_")}}
    with libshare.connect(name=f"slurm-{job}-task{task}") as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        n = 1 << 14
        x, y = session.array(n, np.float32), session.array(n, np.float32)
        dispatches = 0
        for i in range(32):
            x[:] = np.arange(n, dtype=np.float32) + i
            y[:] = 1.0
            session.dispatch(saxpy, groups=n // 64, buffers=[x, y], push=struct.pack("If", n, 2.0)).wait(60)
            if not np.array_equal(y, 2.0 * x + 1.0):
                raise SystemExit(f"job {job} task {task}: dispatch {i} computed wrong")
            dispatches += 1
        report["dispatches"] = dispatches
        try:  # past the job's memory (--mem), which is its group's limit
            session.array((mem_mib << 20) + (1 << 20), np.uint8)
            report["over_limit"] = "allowed"
        except libshare.QuotaExceeded as exc:
            report["over_limit"] = str(exc)
        (out / f".{job}.{task}.json").write_text(json.dumps(report))
        (out / f".{job}.{task}.json").rename(out / f"{job}.{task}.json")
        def no_go(message: str):
            raise SystemExit(f"job {job} task {task}: {message}")

        wait_until((out / f"go.{job}").exists, _WAIT, "the test's go", fail=no_go)  # the test's word
        # still connected and correct after the other jobs came and went
        x[:] = 3.0
        y[:] = 1.0
        session.dispatch(saxpy, groups=n // 64, buffers=[x, y], push=struct.pack("If", n, 2.0)).wait(60)
        if not np.all(y == 7.0):
            raise SystemExit(f"job {job} task {task}: the last dispatch computed wrong")
    (out / f"{job}.{task}.done").write_text(str(dispatches + 1))


if __name__ == "__main__":
    main()
