"""Slurm (contrib/slurm) on a real one-node cluster, as tests/slurm runs it:

S1. sbatch to the job's first completed dispatch, on a cold node (no arbiter: the job's
    prolog starts one through libshare.manager) and on a warm one (another job holds shares,
    so the arbiter runs); the wall clock of the submitting process and of the task.
S2. device time that three concurrent jobs with 20, 30 and 50 shares receive while each keeps
    4 busy dispatches in flight for the same window (the groups' compute shares are ceilings
    while others want the device; 20 + 30 + 50 = 100, so each should get its own).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

from tests.conftest import vulkan_device_name  # noqa: F401  (a fixture: skips without Vulkan)
from tests.slurm.conftest import running_cluster

RUNS = 3
SHARES = (20, 30, 50)
SECONDS = 6.0


@pytest.fixture
def cluster(tmp_path, vulkan_device_name):  # noqa: F811
    with running_cluster(tmp_path / "slurm") as c:
        yield c


def _first_dispatch(cluster, out, shares: int) -> float:
    worker = f"{sys.executable} -m bench._slurm_workers first {out}"
    t0 = time.time()
    job = cluster.sbatch(f"--gres=libshare:{shares}", "--mem=100M", f"--output={out}/%j.log", f"--wrap={worker}")
    done = cluster.until(f"job {job} made no dispatch", lambda: (out / f"{job}.first").exists()
                  and (out / f"{job}.first").read_text())
    cluster.until(f"job {job} did not end", lambda: job not in cluster.queued())
    return float(done) - t0


def _arbiter_gone(cluster) -> bool:
    return not (cluster.pipe / "control").exists() and not list(cluster.state.glob("*.json"))


def test_sbatch_to_first_dispatch(benchmark, cluster, tmp_path, report_ratio):
    out = tmp_path / "out"
    out.mkdir()

    def series():
        cold, warm = [], []
        for _ in range(RUNS):
            cluster.until("the arbiter did not quit", lambda: _arbiter_gone(cluster))
            cold.append(_first_dispatch(cluster, out, 10))
        holder = cluster.sbatch("--gres=libshare:10", "--mem=100M", f"--output={out}/%j.log",
                                f"--wrap=while [ ! -e {out}/release ]; do sleep 0.1; done")
        cluster.until("the holding job has no group", lambda: (cluster.state / f"{holder}.json").exists())
        for _ in range(RUNS):
            warm.append(_first_dispatch(cluster, out, 10))
        (out / "release").write_text("")
        cluster.until("the holding job did not end", lambda: holder not in cluster.queued())
        return cold, warm

    cold, warm = benchmark.pedantic(series, rounds=1)
    report_ratio(f"S1. Slurm: sbatch to the job's first completed dispatch, cold node (the prolog starts the "
                 f"arbiter): median {np.median(cold):.2f} s [{', '.join(f'{s:.2f}' for s in cold)}]; warm node: "
                 f"median {np.median(warm):.2f} s [{', '.join(f'{s:.2f}' for s in warm)}]")


def test_device_time_shares_of_three_jobs(benchmark, cluster, tmp_path, report_ratio):
    out = tmp_path / "out"
    out.mkdir()

    def run():
        jobs = {}
        for shares in SHARES:
            worker = f"{sys.executable} -m bench._slurm_workers busy {out} {SECONDS}"
            jobs[cluster.sbatch(f"--gres=libshare:{shares}", "--mem=200M", f"--output={out}/%j.log",
                                f"--wrap={worker}")] = shares
        cluster.until("not every job is ready", lambda: all((out / f"{j}.ready").exists() for j in jobs))
        (out / "start").write_text("")
        reports = cluster.until("not every job reported", lambda: all((out / f"{j}.busy").exists() for j in jobs)
                         and {j: json.loads((out / f"{j}.busy").read_text()) for j in jobs}, SECONDS + 120)
        return {shares: reports[j] for j, shares in jobs.items()}

    reports = benchmark.pedantic(run, rounds=1)
    total = sum(r["device_ns"] for r in reports.values())
    got = {shares: r["device_ns"] / total * 100 for shares, r in reports.items()}
    report_ratio("S2. Slurm: device time of three concurrent jobs with " + ", ".join(
        f"{s} shares: {got[s]:.1f}%" for s in SHARES) + f" ({total / 1e9:.2f} device s in {SECONDS:.0f} s)")
    for report in reports.values():
        assert report["count"] > 0 and report["group"].startswith("slurm-")
