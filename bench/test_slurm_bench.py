"""Slurm (contrib/slurm) on a real one-node cluster, as tests/slurm runs it; figures in the summary.

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default) and is
printed as the median over blocks with its range.

S1. sbatch to the job's first completed dispatch, on a cold node (no arbiter: the job's
    prolog starts one through libshare.manager) and on a warm one (another job holds shares,
    so the arbiter runs), one of each per block, alternated; the wall clock of the submitting
    process and of the task.
S2. device time that three concurrent jobs with 20, 30 and 50 shares receive while each keeps
    4 busy dispatches in flight for the same ``SECONDS`` window, one window per block (the
    groups' compute shares are ceilings while others want the device; 20 + 30 + 50 = 100, so
    each should get its own, within 5 points).
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from bench._compare import blocks, interleave, record, within
from tests.conftest import vulkan_device_name  # noqa: F401  (a fixture: skips without Vulkan)
from tests.slurm.conftest import running_cluster

SHARES = (20, 30, 50)
SECONDS = 3.0


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


def test_sbatch_to_first_dispatch(benchmark, cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holders = []

    def cold() -> float:
        cluster.until("the arbiter did not quit", lambda: _arbiter_gone(cluster))
        return _first_dispatch(cluster, out, 10)

    def warm() -> float:
        release = out / f"release.{len(holders)}"
        holder = cluster.sbatch("--gres=libshare:10", "--mem=100M", f"--output={out}/%j.log",
                                f"--wrap=while [ ! -e {release} ]; do sleep 0.1; done")
        holders.append(holder)
        try:
            cluster.until("the holding job has no group", lambda: (cluster.state / f"{holder}.json").exists())
            return _first_dispatch(cluster, out, 10)
        finally:
            release.write_text("")
            cluster.until("the holding job did not end", lambda: holder not in cluster.queued())

    values = benchmark.pedantic(interleave, args=({"cold": cold, "warm": warm},), rounds=1)
    method = ("sbatch of a job whose task makes one checked saxpy dispatch, to the wall-clock time it completed; "
              "on a cold node (no arbiter: the prolog starts one) and on a warm one (another job holds shares), "
              "one of each per block, alternated")
    record("S1. Slurm: sbatch to the job's first completed dispatch, cold node", values["cold"], "s", method=method)
    record("S1. Slurm: sbatch to the job's first completed dispatch, warm node", values["warm"], "s", method=method)


def test_device_time_shares_of_three_jobs(benchmark, cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    count = blocks()
    jobs = {}
    for shares in SHARES:
        worker = f"{sys.executable} -m bench._slurm_workers busy {out} {SECONDS} {count}"
        jobs[cluster.sbatch(f"--gres=libshare:{shares}", "--mem=200M", f"--output={out}/%j.log",
                            f"--wrap={worker}")] = shares
    cluster.until("not every job is ready", lambda: all((out / f"{j}.ready").exists() for j in jobs))

    def run() -> list[dict]:
        reports = []
        for block in range(count):
            (out / f"start.{block}").write_text("")
            got = cluster.until("not every job reported", lambda: all((out / f"{j}.busy.{block}").exists()
                                                                       for j in jobs)
                                and {j: json.loads((out / f"{j}.busy.{block}").read_text()) for j in jobs},
                                SECONDS + 120)
            reports.append({shares: got[j] for j, shares in jobs.items()})
        return reports

    reports = benchmark.pedantic(run, rounds=1)
    cluster.until("not every job ended", lambda: not any(j in cluster.queued() for j in jobs))
    for block in reports:
        for report in block.values():
            assert report["count"] > 0 and report["group"].startswith("slurm-")
    for shares in SHARES:
        record(f"S2. Slurm: device time of the job with {shares} shares, of three with 20, 30 and 50", [
            100.0 * block[shares]["device_ns"] / sum(r["device_ns"] for r in block.values()) for block in reports],
            "%", target=within(shares - 5, shares + 5),
            method=f"three concurrent jobs with 20, 30 and 50 shares, each keeping 4 busy dispatches in flight for "
                   f"the same {SECONDS:g} s window, one window per block; each job's fraction of their device time")
