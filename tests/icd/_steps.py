"""The ``steps`` and ``again`` modes of the application programs (_taichi_app.py, _ncnn_app.py).

After its first run, an application in the ``steps`` mode prints ``stepping`` and then, for each
line of standard input holding a count K, runs its step K times and prints the median seconds of
one step: bench/test_icd_bench.py times an application so, through libshare's driver and
directly. In the ``again`` mode it prints ``again`` and then, for each line of standard input, runs
once more and prints what it computed as one JSON line: tests/icd/test_applications.py kills the
arbiter between two lines. It knows nothing of libshare.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Callable


def steps(step: Callable[[], object]) -> None:
    """Answer each count on stdin with the median seconds of that many calls of ``step``."""
    print("stepping", flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        print(statistics.median(times), flush=True)


def again(run: Callable[[], dict]) -> None:
    """Answer each line on stdin with ``run()``'s results as one JSON line."""
    print("again", flush=True)
    for _ in sys.stdin:
        print(json.dumps(run()), flush=True)
