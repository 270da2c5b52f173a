"""Four processes share one device: this process hosts the arbiter, children connect to it.

With a daemon running (``python -m libshare.arbiter``), pass ``--daemon`` and every process
connects to it instead.
"""

import multiprocessing
import sys
import tempfile

import numpy as np

import libshare
from libshare import workloads


def worker(kernel: str, pipe_dir: str | None, seed: int) -> None:
    mode = "daemon"
    with libshare.connect(name=f"worker-{kernel}", mode=mode, pipe_directory=pipe_dir) as session:
        job = workloads.prepare(kernel, session, np.random.default_rng(seed), {})
        tickets = [job.dispatch() for _ in range(50)]
        for ticket in tickets:
            ticket.wait(timeout=60)
        job.check()
        print(f"pid {multiprocessing.current_process().pid} {kernel}: 50 dispatches, result right")


def main() -> None:
    kernels = ["saxpy", "vadd", "sum", "matmul"]
    with tempfile.TemporaryDirectory() as private:
        pipe_dir = None if "--daemon" in sys.argv else private
        arbiter = None
        if pipe_dir is not None:
            from libshare.arbiter import Arbiter
            from pathlib import Path

            arbiter = Arbiter()
            arbiter.serve(Path(private) / "control")
        context = multiprocessing.get_context("spawn")
        processes = [context.Process(target=worker, args=(k, pipe_dir, i)) for i, k in enumerate(kernels)]
        for p in processes:
            p.start()
        for p in processes:
            p.join()
        if arbiter is not None:
            arbiter.close()
        sys.exit(max(p.exitcode for p in processes))


if __name__ == "__main__":
    main()
