"""Client processes for bench/test_scheduler_bench.py.

``python -m bench._scheduler_workers PIPE_DIR NAME PRIORITY KIND N ITERATIONS DEPTH SECONDS``

Connects to the daemon of PIPE_DIR as NAME (PRIORITY, if not empty), loads its program, runs one
dispatch (the pipeline is built before any window) and prints ``ready``. Then, for each line on
stdin, a window of SECONDS:

- ``busy``: keeps DEPTH busy.comp dispatches of N invocations and ITERATIONS rounds in flight and
  books the device time of those that complete inside the window;
- ``tiny``: round trips of a 64-float saxpy, one at a time with a 2 ms pause between (an
  interactive client), each timed.

After the window it waits for its work to end and prints one JSON line: ``name``, ``device_ns``,
``count`` (those booked), ``latencies`` (seconds, ``tiny`` only), and ``completed``, ``cut`` and
``pieces`` (the session's dispatches completed, those run in pieces, and their pieces, in this
window and the wait after it). The end of stdin ends it.
"""

from __future__ import annotations

import json
import struct
import sys
import time

import numpy as np

import libshare
from bench._helpers import keep_in_flight


def main(pipe_dir: str, name: str, priority: str, kind: str, n: str, iterations: str, depth: str,
         seconds: str) -> None:
    n_, iterations_, depth_, seconds_ = int(n), int(iterations), int(depth), float(seconds)
    s = libshare.connect(mode="daemon", pipe_directory=pipe_dir, name=name, priority=priority or None)
    if kind == "busy":
        program = s.load_program(libshare.shaders.path("busy"))
        data = s.array(n_, np.uint32)
        push = struct.pack("II", n_, iterations_)

        def go():
            return s.dispatch(program, (-(-n_ // 64), 1, 1), [data], push)
    else:  # tiny: 64-float saxpy, one workgroup
        program = s.load_program(libshare.shaders.path("saxpy"))
        x, y = s.array(64), s.array(64)
        push = struct.pack("If", 64, 1.0)

        def go():
            return s.dispatch(program, 1, [x, y], push)
    go().wait(30)
    print("ready", flush=True)
    before = s.stats()
    for _ in sys.stdin:
        device_ns, count, latencies = 0, 0, []
        end = time.perf_counter() + seconds_
        if kind == "busy":  # keep `depth` dispatches in flight; book those that complete inside the window
            device_ns, count = keep_in_flight(go, depth_, end)
        else:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                ticket = go().wait(30)
                latencies.append(time.perf_counter() - t0)
                device_ns += ticket.device_ns or 0
                count += 1
                time.sleep(0.002)
        s.wait_idle(120)
        stats = s.stats()
        print(json.dumps({"name": name, "device_ns": device_ns, "count": count, "latencies": latencies,
                          "completed": stats["completed"] - before["completed"],
                          "cut": stats["cut"] - before["cut"], "pieces": stats["pieces"] - before["pieces"]}),
              flush=True)
        before = stats
    s.close()


if __name__ == "__main__":
    main(*sys.argv[1:9])
