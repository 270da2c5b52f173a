"""Benchmark session: the figures' summary ("libshare ratios") and the run's JSON file.

Every figure (bench/_compare.py) is printed at the end of the run, and the run's figures are
written as JSON to ``--bench-results PATH``, else ``$LIBSHARE_BENCH_RESULTS``, else
``bench/results/<device kind>-<date>-<time>.json`` (``-`` writes none). ``python -m bench.plot``
draws such files.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import _compare

RESULTS_ENV = "LIBSHARE_BENCH_RESULTS"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
_STARTED: dict = {}


def pytest_addoption(parser):
    parser.addoption("--bench-results", default=None, metavar="PATH",
                     help=f"where to write this run's figures as JSON (default ${RESULTS_ENV}, else "
                          "bench/results/<device kind>-<date>-<time>.json; '-' writes none)")


def pytest_sessionstart(session):
    _STARTED.update(time=datetime.datetime.now().astimezone(), load=os.getloadavg(), clock=time.monotonic(),
                    stolen=stolen_seconds())


def stolen_seconds() -> float | None:
    """CPU seconds a hypervisor has taken from this machine's cores since boot (/proc/stat's steal
    column, summed over the cores), or None where the kernel does not say. A virtual machine's
    neighbours move every figure: the run's share of it is written with the figures."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError):
        return None


@pytest.fixture
def report_ratio():
    """Record a line printed with the figures after the benchmark table (a figure goes through
    bench/_compare.py instead: it has a median, a range and a target)."""
    return _compare.note


def pytest_terminal_summary(terminalreporter):
    if _compare.LINES:
        terminalreporter.section("libshare ratios")
        for line in _compare.LINES:
            terminalreporter.write_line(line.line() if isinstance(line, _compare.Figure) else line)
    stolen = _stolen_during_run()
    if stolen is not None:
        terminalreporter.write_line(f"CPU time the hypervisor took from this machine during the run: {stolen:.1f} s")
    path = _write_results(terminalreporter.config)
    if path is not None:
        terminalreporter.write_line(f"figures written to {path}")


def _stolen_during_run() -> float | None:
    """CPU seconds the hypervisor took since the session started (stolen_seconds), or None."""
    now, then = stolen_seconds(), _STARTED.get("stolen")
    return round(now - then, 2) if now is not None and then is not None else None


def device() -> dict:
    """The Vulkan device the benches' arbiters open (LIBSHARE_DEVICE, else the first), asked in a
    child process: its name and whether it is a CPU device (lavapipe)."""
    probe = ("import json; from tests.conftest import device_under_test as d; n, cpu = d(); "
             "print(json.dumps({'name': n, 'cpu': cpu}))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parent.parent,
                              capture_output=True, text=True, timeout=120)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - the file is still written, without a device
        return {"name": None, "cpu": None, "error": repr(exc)}


def kind(found: dict) -> str:
    """A file-name word for the device: "lavapipe", or the GPU's name in lower case with dashes."""
    name = found.get("name") or "unknown"
    if found.get("cpu") or "llvmpipe" in name.lower():
        return "lavapipe"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def _commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS_DIR.parent.parent,
                              capture_output=True, text=True, timeout=10)
        return done.stdout.strip() or None
    except OSError:
        return None


def _write_results(config) -> Path | None:
    if not _compare.FIGURES:
        return None
    where = config.getoption("--bench-results") or os.environ.get(RESULTS_ENV)
    if where == "-":
        return None
    found = device()
    started = _STARTED.get("time") or datetime.datetime.now().astimezone()
    if where:
        path = Path(where)
    else:
        path = RESULTS_DIR / f"{kind(found)}-{started:%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    run = {
        "device": found.get("name"), "device_kind": kind(found), "cpu_device": found.get("cpu"),
        "host": socket.gethostname(), "cores": os.cpu_count(), "machine": platform.machine(),
        "python": platform.python_version(), "commit": _commit(),
        "started": started.isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - _STARTED["clock"], 1) if "clock" in _STARTED else None,
        "blocks": _compare.blocks(), "load_at_start": _STARTED.get("load"), "load_at_end": os.getloadavg(),
        "stolen_seconds": _stolen_during_run(),
        "figures": [f.as_json() for f in _compare.FIGURES],
    }
    path.write_text(json.dumps(run, indent=1) + "\n")
    return path
