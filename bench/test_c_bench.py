"""C programs on libshare, side by side with Python and with direct Vulkan in C; ratios in the summary.

1. tiny saxpy round trip (64 floats, one workgroup, waited before the next):
   direct Vulkan in C (bench/c/vulkan_round_trip.c: prerecorded command buffer,
   submit + fence) vs libshare from C (bench/c/libshare_round_trip.c) vs libshare
   from Python, both through the same untimed daemon; the C client also embedded.
2. the two paths of libshare.so: the hot path (ls_dispatch, pure C on the ring)
   against Session.dispatch in Python, and the control path (ls_stats,
   ls_alloc + ls_free_buffer through the embedded Python) against the same calls
   made from Python.
3. eight C processes doing the tiny round trip for 3 s, released together: libshare clients
   through one daemon vs direct Vulkan programs that each open their own device, aggregate
   dispatches/s (the C twin of bench/test_arbiter_bench.py's "eight processes"). Target >= 1.0x.

Figures 1 and 2 are medians of 15 timed batches; the C programs time themselves.
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
from bench.test_arbiter_bench import arbiter_dir  # noqa: F401 - the untimed daemon fixture
from tests.conftest import ROOT
from tests.test_c_bindings import compile_c

C_BENCH = ROOT / "bench" / "c"
SAXPY = libshare.shaders.path("saxpy")
NS: dict[str, float] = {}


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
    figures = {prefix + name: float(ns) for name, ns in (line.split() for line in done.stdout.splitlines())}
    NS.update(figures)
    return figures


def median_ns(fn, batch: int, rounds: int = 15, after=None) -> float:
    """Median over ``rounds`` of the nanoseconds per call of ``fn`` called ``batch`` times.

    ``after`` runs untimed after each batch (to drain what the batch queued).
    """
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter_ns() - start) / batch)
        if after is not None:
            after()
    return sorted(times)[rounds // 2]


def ratio(report_ratio, label: str, numerator: str, denominator: str) -> None:
    if numerator in NS and denominator in NS:
        report_ratio(f"{label}: {NS[numerator] / NS[denominator]:.2f}x; {numerator} {NS[numerator] / 1e3:.2f} us, "
                     f"{denominator} {NS[denominator] / 1e3:.2f} us")


def test_round_trip_vulkan_c(benchmark, programs):
    benchmark.pedantic(run_c, args=(programs["vulkan"],), rounds=1)


def test_round_trip_libshare_c(benchmark, programs, arbiter_dir, tmp_path):
    daemon = dict(os.environ, LIBSHARE_MODE="daemon", LIBSHARE_PIPE_DIRECTORY=str(arbiter_dir))
    benchmark.pedantic(run_c, args=(programs["libshare"], daemon), rounds=1)
    embedded = dict(os.environ, LIBSHARE_MODE="embedded")
    run_c(programs["libshare"], embedded, prefix="embedded ")


def test_python_paths(benchmark, arbiter_dir, report_ratio):
    with libshare.connect(mode="daemon", pipe_directory=arbiter_dir) as session:
        program = session.load_program(SAXPY)
        x, y = session.array(64), session.array(64)
        push = struct.pack("If", 64, 1.0)

        def dispatch():
            return session.dispatch(program, 1, [x, y], push)

        def pipelined():
            for _ in range(100):
                dispatch()
            session.wait_idle(10)

        def alloc_free():
            session.free(session.alloc(4096))

        benchmark(lambda: dispatch().wait(10))
        NS["py_round_trip"] = benchmark.stats.stats.median * 1e9
        NS["py_dispatch"] = median_ns(dispatch, 200, after=lambda: session.wait_idle(10))
        NS["py_pipelined"] = median_ns(pipelined, 10)
        NS["py_stats"] = median_ns(session.stats, 50)
        NS["py_alloc_free"] = median_ns(alloc_free, 20)
    for name in ("c_pipelined", "py_pipelined"):
        if name in NS:
            NS[name + " per dispatch"] = NS[name] / 100
    ratio(report_ratio, "C1. round trip, libshare from C (daemon) / direct Vulkan in C", "c_round_trip",
          "vulkan_round_trip")
    ratio(report_ratio, "C1. round trip, libshare from Python (daemon) / direct Vulkan in C", "py_round_trip",
          "vulkan_round_trip")
    ratio(report_ratio, "C1. round trip, libshare from Python / from C", "py_round_trip", "c_round_trip")
    ratio(report_ratio, "C1. round trip, C client with its arbiter embedded / direct Vulkan in C",
          "embedded c_round_trip", "vulkan_round_trip")
    ratio(report_ratio, "C2. hot path: one dispatch call, Python / C", "py_dispatch", "c_dispatch")
    ratio(report_ratio, "C2. pipelined per dispatch, Python / C", "py_pipelined per dispatch",
          "c_pipelined per dispatch")
    ratio(report_ratio, "C2. control path: stats request, C through embedded Python / Python", "c_stats", "py_stats")
    ratio(report_ratio, "C2. control path: alloc + free, C through embedded Python / Python", "c_alloc_free",
          "py_alloc_free")


def run_eight_c(binary: Path, env: dict | None = None, seconds: float = 3.0) -> float:
    """Eight copies of a C benchmark in its "--for" mode, released together; their summed rates."""
    workers = [subprocess.Popen([str(binary), str(SAXPY), "--for", str(seconds)], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True) for _ in range(8)]
    try:
        for w in workers:
            assert w.stdout.readline().strip() == "ready", f"{binary.name} failed to set up"
        for w in workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        outputs = [w.communicate(timeout=120)[0] for w in workers]
        assert all(w.returncode == 0 for w in workers), f"{binary.name} failed"
        return sum(float(out.strip()) for out in outputs)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()


def test_eight_c_processes(benchmark, programs, arbiter_dir, report_ratio):
    own = run_eight_c(programs["vulkan"])
    daemon = dict(os.environ, LIBSHARE_MODE="daemon", LIBSHARE_PIPE_DIRECTORY=str(arbiter_dir))
    shared = benchmark.pedantic(run_eight_c, args=(programs["libshare"], daemon), rounds=1)
    report_ratio(f"C3. eight C processes, aggregate tiny dispatches/s: through one arbiter {shared:.0f} vs private "
                 f"device each {own:.0f} = {shared / own:.2f}x (target >= 1.0)")
