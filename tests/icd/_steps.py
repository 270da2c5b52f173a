"""The ``steps`` mode of the application programs (_taichi_app.py, _ncnn_app.py): step times.

After its first run, an application in this mode prints ``stepping`` and then, for each line of
standard input holding a count K, runs its step K times and prints the median seconds of one
step. bench/test_icd_bench.py times an application so, through libshare's driver and directly.
It knows nothing of libshare.
"""

from __future__ import annotations

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
