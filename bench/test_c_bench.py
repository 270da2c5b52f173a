"""C programs on libshare, side by side with Python and with direct Vulkan in C; figures in the summary.

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default), its
sides alternated, and is printed as the median over blocks with its range.

1. tiny saxpy round trip (64 floats, one workgroup, waited before the next):
   direct Vulkan in C (bench/c/vulkan_round_trip.c: prerecorded command buffer,
   submit + fence) vs libshare from C (bench/c/libshare_round_trip.c) vs libshare
   from Python, both through the same untimed daemon; the C client also embedded.
2. the two paths of libshare.so: the hot path (ls_dispatch, pure C on the ring)
   against Session.dispatch in Python, and the control path (ls_stats,
   ls_alloc + ls_free_buffer through the embedded Python) against the same calls
   made from Python. Target: ls_dispatch <= 0.2 us.
3. eight C processes doing the tiny round trip for ``EIGHT_SECONDS`` per block, released together:
   libshare clients through one daemon vs direct Vulkan programs that each open their own device,
   aggregate dispatches/s (the C twin of bench/test_arbiter_bench.py's "eight processes"); the 16
   processes start once and run a window each time they are told. Target >= 1.0x on lavapipe,
   >= 2x on a GPU.

In 1 and 2 a block runs each C program once (each times itself: the median of 15 timed batches per
figure) and the Python figures (the same batches, timed here), the four in rotated order; each
ratio is of the two sides' figures in the same block.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import libshare
from bench._compare import at_least, at_most, interleave, pick, ratio, record
from bench._helpers import close_workers
from bench.test_arbiter_bench import arbiter_dir  # noqa: F401 - the untimed daemon fixture
from tests.conftest import ROOT, stop_process, vulkan_device_is_cpu  # noqa: F401 - a fixture
from tests.test_c_bindings import compile_c

C_BENCH = ROOT / "bench" / "c"
SAXPY = libshare.shaders.path("saxpy")
EIGHT_SECONDS = 2.0


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    """libshare.so built, both C benchmarks compiled."""
    if shutil.which("cc") is None or not Path("/usr/include/vulkan/vulkan.h").exists():
        pytest.skip("needs cc and the Vulkan headers (apt-get install gcc libvulkan-dev)")
    out = tmp_path_factory.mktemp("c-bench")
    subprocess.run([sys.executable, str(ROOT / "bindings" / "c" / "build.py"), "--out", str(out)], check=True,
                   capture_output=True)
    library = out / "libshare.pc"
    return {"vulkan": compile_c(library, C_BENCH / "vulkan_round_trip.c", out, "-O2", "-lvulkan"),
            "libshare": compile_c(library, C_BENCH / "libshare_round_trip.c", out, "-O2")}


def run_c(binary: Path, env: dict | None = None, prefix: str = "") -> dict[str, float]:
    """Run a C benchmark; its "NAME NS" lines, names prefixed."""
    done = subprocess.run([str(binary), str(SAXPY)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {prefix + name: float(ns) for name, ns in (line.split() for line in done.stdout.splitlines())}


def median_ns(fn, batch: int, rounds: int = 15, after=None) -> float:
    """Median over ``rounds`` of the nanoseconds per call of ``fn`` called ``batch`` times (as the C
    programs time themselves: bench/c/timing.h). ``after`` runs untimed after each batch (to drain
    what the batch queued)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter_ns() - start) / batch)
        if after is not None:
            after()
    return sorted(times)[rounds // 2]


def python_paths(session, program, x, y) -> dict[str, float]:
    """The C program's figures, made from Python with the same batches."""
    push = struct.pack("If", 64, 1.0)

    def dispatch():
        return session.dispatch(program, 1, [x, y], push)

    def pipelined():
        for _ in range(100):
            dispatch()
        session.wait_idle(10)

    def alloc_free():
        session.free(session.alloc(4096))

    return {"py_round_trip": median_ns(lambda: dispatch().wait(10), 200),
            "py_dispatch": median_ns(dispatch, 200, after=lambda: session.wait_idle(10)),
            "py_pipelined": median_ns(pipelined, 10) / 100,
            "py_stats": median_ns(session.stats, 50),
            "py_alloc_free": median_ns(alloc_free, 20)}


PAIRS = [  # (figure, numerator, denominator)
    ("C1. round trip, libshare from C (daemon) / direct Vulkan in C", "c_round_trip", "vulkan_round_trip"),
    ("C1. round trip, libshare from Python (daemon) / direct Vulkan in C", "py_round_trip", "vulkan_round_trip"),
    ("C1. round trip, libshare from Python / from C", "py_round_trip", "c_round_trip"),
    ("C1. round trip, C client with its arbiter embedded / direct Vulkan in C", "embedded c_round_trip",
     "vulkan_round_trip"),
    ("C2. hot path: one dispatch call, Python / C", "py_dispatch", "c_dispatch"),
    ("C2. pipelined per dispatch, Python / C", "py_pipelined", "c_pipelined"),
    ("C2. control path: stats request, C through embedded Python / Python", "c_stats", "py_stats"),
    ("C2. control path: alloc + free, C through embedded Python / Python", "c_alloc_free", "py_alloc_free"),
]


def test_c_and_python_paths(benchmark, programs, arbiter_dir):
    daemon = dict(os.environ, LIBSHARE_MODE="daemon", LIBSHARE_PIPE_DIRECTORY=str(arbiter_dir))
    embedded = dict(os.environ, LIBSHARE_MODE="embedded")
    with libshare.connect(mode="daemon", pipe_directory=arbiter_dir) as session:
        program = session.load_program(SAXPY)
        x, y = session.array(64), session.array(64)
        sides = {"vulkan": lambda: run_c(programs["vulkan"]),
                 "c": lambda: run_c(programs["libshare"], daemon),
                 "embedded": lambda: run_c(programs["libshare"], embedded, prefix="embedded "),
                 "python": lambda: python_paths(session, program, x, y)}
        values = benchmark.pedantic(interleave, args=(sides,), rounds=1)
    per_block = [{k: v for side in values.values() for k, v in side[block].items()}
                 for block in range(len(values["vulkan"]))]
    for block in per_block:
        block["c_pipelined"] /= 100  # the C program prints the time of 100 dispatches and their wait
    method = ("per block, each C program run once (the median of 15 timed batches per figure, bench/c/timing.h) "
              "and the same batches from Python, in rotated order; the ratio of two sides' figures in a block")
    for name, numerator, denominator in PAIRS:
        ratio(name, pick(per_block, numerator), pick(per_block, denominator), names=(numerator, denominator),
              side_scale=1e-3, method=method)
    record("C2. ls_dispatch, one call (C hot path)", pick(per_block, "c_dispatch"), "us", scale=1e-3,
           target=at_most(0.2), method="200 ls_dispatch calls per batch, the lane emptied between batches; "
                                       "median of 15 batches per block, per call")


class EightC:
    """Eight copies of a C benchmark in its "--for" mode, set up once; ``window()`` runs them together."""

    def __init__(self, binary: Path, env: dict | None = None):
        self.name = binary.name
        self.workers = [subprocess.Popen([str(binary), str(SAXPY), "--for", str(EIGHT_SECONDS)], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                        for _ in range(8)]
        for w in self.workers:
            assert w.stdout.readline().strip() == "ready", f"{self.name} failed to set up"

    def window(self) -> float:
        """The eight processes' summed round trips per second over one window."""
        for w in self.workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        rates = [w.stdout.readline().strip() for w in self.workers]
        assert all(rates), f"{self.name} failed"
        return sum(float(r) for r in rates)

    def close(self) -> None:
        close_workers(self.workers, 30, stop_process)
        assert all(w.returncode == 0 for w in self.workers), f"{self.name} failed"


def test_eight_c_processes(benchmark, programs, arbiter_dir, vulkan_device_is_cpu):
    daemon = dict(os.environ, LIBSHARE_MODE="daemon", LIBSHARE_PIPE_DIRECTORY=str(arbiter_dir))
    groups = {}
    try:
        groups["arbiter"] = EightC(programs["libshare"], daemon)
        groups["own"] = EightC(programs["vulkan"])
        values = benchmark.pedantic(interleave, args=({m: g.window for m, g in groups.items()},), rounds=1)
    finally:
        for g in groups.values():
            g.close()
    ratio("C3. eight C processes, aggregate tiny dispatches/s, through one arbiter / private device each",
          values["arbiter"], values["own"], target=at_least(1.0 if vulkan_device_is_cpu else 2.0),
          names=("arbiter", "own devices"),
          side_unit="/s", side_scale=1,
          method=f"8 C processes doing tiny round trips through one daemon (bench/c/libshare_round_trip.c), "
                 f"against 8 direct Vulkan programs with a device each (bench/c/vulkan_round_trip.c), a "
                 f"{EIGHT_SECONDS:g} s window each per block, alternated; all 16 processes set up once")
