"""The Vulkan driver (libshare/icd/, docs/icd.md): what an application's start costs through it.

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default), its
sides alternated ABBA, and is printed as the median over blocks with its range.

1. instance start, driver / direct: one worker process per side (bench/_icd_workers.py), started
   once, each block ``STARTS_PER_BLOCK`` rounds of vkCreateInstance, vkEnumeratePhysicalDevices,
   vkGetPhysicalDeviceProperties, vkDestroyInstance, the block value their median. Through the
   driver, a round is a hello to a warm daemon (a session made and ended) and the welcome's device
   description read; direct, it is the real driver's (lavapipe's) instance. Target: <= 1x, an
   application starts no slower through the driver.
2. libshare-run, embedded / daemon: the wall time of ``libshare-run -- probe`` (tests/icd/probe.c,
   compiled here: it enumerates and tries a device) with a helper arbiter of its own against the
   same with a warm daemon, one run a side per block. No target: it says what the embedded mode's
   helper arbiter costs a run (docs/icd.md).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from bench._compare import at_most, compare, interleave, ratio
from libshare.icd import manifest_path
from tests.conftest import ROOT
from tests.arbiter.conftest import run_daemon

STARTS_PER_BLOCK = 20
PROBE_C = ROOT / "tests" / "icd" / "probe.c"


def _env(pipe_dir, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")}
    return {**env, "LIBSHARE_PIPE_DIRECTORY": str(pipe_dir), "PYTHONPATH": str(ROOT), **extra}


@contextlib.contextmanager
def _worker(env):
    with subprocess.Popen([sys.executable, "-m", "bench._icd_workers"], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as worker:
        def block() -> float:
            worker.stdin.write(f"{STARTS_PER_BLOCK}\n")
            worker.stdin.flush()
            return float(worker.stdout.readline())
        try:
            yield block
        finally:
            worker.stdin.close()
            worker.wait(60)


@pytest.mark.vulkan
def test_an_application_starts_through_the_driver(tmp_path):
    with contextlib.contextmanager(run_daemon)(tmp_path / "pipe") as (_process, pipe_dir):
        with _worker(_env(pipe_dir, VK_DRIVER_FILES=str(manifest_path()))) as driver, \
                _worker(_env(tmp_path / "none")) as direct:
            compare("instance start, driver / direct", driver, direct, target=at_most(1.0), a="driver",
                    b="direct", side_unit="ms", side_scale=1e3,
                    method=f"median of {STARTS_PER_BLOCK} create-enumerate-properties-destroy rounds per block")


@pytest.mark.vulkan
def test_libshare_run_embedded_against_daemon(tmp_path):
    program = tmp_path / "probe"
    subprocess.run(["cc", "-O1", "-o", str(program), str(PROBE_C), "-lvulkan"], check=True)
    with contextlib.contextmanager(run_daemon)(tmp_path / "pipe") as (_process, pipe_dir):
        def run(mode: str, directory) -> float:
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "libshare.run", "--mode", mode, "--", str(program)],
                                  cwd=ROOT, env=_env(directory), capture_output=True, text=True, timeout=300)
            assert done.returncode == 0 and done.stdout.startswith("device libshare: "), done.stderr
            return time.perf_counter() - start

        values = interleave({"embedded": lambda: run("embedded", tmp_path / "none"),
                             "daemon": lambda: run("daemon", pipe_dir)})
    ratio("libshare-run, embedded / daemon", values["embedded"], values["daemon"], names=("embedded", "daemon"),
          side_unit="s", side_scale=1.0, method="wall time of libshare-run around a C program that enumerates; "
          "embedded starts a helper arbiter per run")
