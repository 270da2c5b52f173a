"""contrib/slurm on a real one-node Slurm cluster: jobs get a group each, with their share and memory.

Three jobs ask for 20, 30 and 50 of the node's 100 libshare shares (the last with two tasks)
and a fourth asks for none. Their tasks run checked saxpy dispatches and then wait, so that
all of them are connected at once while the test looks at the arbiter; then the jobs end
one after the other. Also: libshare.slurm.parse_job on the output of several Slurm versions.

Forged fields (tests/slurm/_forgery.py): jobs whose name, comment or output path read like the
node's allocation line, beside an honest job. Read through ``squeue --json`` they change nothing;
read from ``scontrol``'s text (a node without ``squeue``) they can only lower the job's grant,
and a forged ``Mem=0`` gets the job refused (cancelled, no group), never an unlimited group.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libshare import slurm as libshare_slurm
from libshare.arbiter.policy.limits import format_size

from tests.conftest import ROOT
from tests.control.conftest import alive
from tests.slurm import _forgery

CAPTURED = Path(__file__).parent / "captured"  # from the Slurm 22.05 of tests/slurm/conftest.py

JOBS = {20: (200, 1), 30: (300, 1), 50: (400, 2)}  # shares: (--mem in MiB, tasks)


def _ctl(cluster, *args: str) -> str:
    """``libshare-control ARGS`` at the cluster's pipe directory (as the node's operator would run it)."""
    result = subprocess.run([sys.executable, "-m", "libshare.control", *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=60,
                            env={**cluster.env, "LIBSHARE_PIPE_DIRECTORY": str(cluster.pipe)})
    assert result.returncode == 0, f"libshare-control {' '.join(args)}: {result.stderr}"
    return result.stdout


def test_jobs_get_their_group_share_and_memory_and_the_arbiter_quits_after_the_last(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    jobs = {}  # job id: (shares, mem MiB, tasks)
    for shares, (mem, tasks) in JOBS.items():
        job = slurm.sbatch(f"--gres=libshare:{shares}", f"--mem={mem}M", f"--ntasks={tasks}",
                           f"--output={out}/%j.log",
                           f"--wrap=srun {sys.executable} -m tests.slurm._client {out} {mem}")
        jobs[job] = (shares, mem, tasks)
    plain = slurm.sbatch("--mem=100M", f"--output={out}/%j.log", "--wrap=env")

    reports = slurm.until("not every task reported", lambda: (
        [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
        if len(list(out.glob("*.json"))) == sum(t for _, _, t in jobs.values()) else None))

    # each task: in its job's group, at the node's arbiter, computed right, held to its job's memory
    arbiters = set()
    for report in reports:
        job = report["job"]
        shares, mem, _ = jobs[job]
        assert report["LIBSHARE_GROUP"] == f"slurm-{job}", report
        assert report["LIBSHARE_PIPE_DIRECTORY"] == str(slurm.pipe) and report["LIBSHARE_MODE"] == "daemon"
        assert report["dispatches"] == 32
        assert f"set_group_mem_limit slurm-{job}" in report["over_limit"], report["over_limit"]
        record = json.loads((slurm.state / f"{job}.json").read_text())
        assert record["share"] == str(shares)  # the arbiter's answer to set_group_active_thread_percentage
        arbiters.add(record["arbiter"])
    assert len(arbiters) == 1  # one arbiter for the node, started by the first prolog
    arbiter = arbiters.pop()
    assert (slurm.state / "arbiter").read_text() == str(arbiter) and alive(arbiter)
    assert slurm.pipe.stat().st_mode & 0o777 == 0o711  # --multi-user (LIBSHARE_SLURM_MULTI_USER=1)
    assert sum(t for _, _, t in jobs.values()) == 4 and len({r["pid"] for r in reports}) == 4

    # what the arbiter says: every task a client, every job's group limit
    assert _ctl(slurm, "get_server_list").split() == [str(arbiter)]
    clients = _ctl(slurm, "get_client_list").split()
    ps = _ctl(slurm, "ps")
    for report in reports:
        assert str(report["pid"]) in clients
        assert f"slurm-{report['job']}-task{report['task']}" in ps, ps
    for job, (shares, mem, _) in jobs.items():
        assert _ctl(slurm, "get_group_mem_limit", f"slurm-{job}").strip() == format_size(mem << 20)
        owner = slurm.job_field(job, "UserId")  # "name(uid)": only that user's clients may join the group
        assert _ctl(slurm, "get_group_owner", f"slurm-{job}").strip() == owner[owner.index("(") + 1:-1], owner
    server_log = (slurm.libshare_log / "server.log").read_text()
    for report in reports:
        assert f"pid {report['pid']}" in server_log and f"group slurm-{report['job']}" in server_log

    # a job without shares: no group, no variables, nothing recorded
    slurm.until("the job without shares did not end", lambda: plain not in slurm.queued())
    plain_env = (out / f"{plain}.log").read_text()
    assert "SLURM_JOB_ID" in plain_env and "LIBSHARE_GROUP" not in plain_env
    assert not (slurm.state / f"{plain}.json").exists()

    # the jobs end one after the other: the arbiter serves until the last has gone
    order = sorted(jobs, key=lambda j: jobs[j][0])
    for index, job in enumerate(order):
        (out / f"go.{job}").write_text("")
        slurm.until(f"job {job} did not end", lambda: job not in slurm.queued())
        slurm.until(f"job {job}'s epilog did not run", lambda: not (slurm.state / f"{job}.json").exists())
        assert slurm.job_field(job, "ExitCode") == "0:0", (out / f"{job}.log").read_text()
        for task in range(jobs[job][2]):
            assert (out / f"{job}.{task}.done").read_text() == "33"
        if index < len(order) - 1:
            assert alive(arbiter), slurm.diagnose()
            assert _ctl(slurm, "get_group_mem_limit", f"slurm-{job}").strip() == "unlimited"
            assert _ctl(slurm, "get_group_owner", f"slurm-{job}").strip() == "none"
            assert _ctl(slurm, "get_server_list").split() == [str(arbiter)]
    slurm.until("the arbiter did not quit after the last job", lambda: not alive(arbiter), 60)
    assert not (slurm.pipe / "control").exists() and not (slurm.state / "arbiter").exists()
    assert not list(slurm.state.glob("*.json")) and not list(slurm.state.glob("*.env"))
    log = (slurm.libshare_log / "slurm.log").read_text()
    assert log.count("(started)") == 1 and log.count("(running)") == 2, log
    assert f"quitting arbiter pid {arbiter}" in log


SLURM_22_05 = """\
JobId=7 JobName=wrap
   TRES=cpu=2,mem=400M,node=1,billing=2
   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*
   JOB_GRES=libshare:50
     Nodes=vm CPU_IDs=0-1 Mem=400 GRES=libshare(CNT:50)
   MinCPUsNode=1 MinMemoryNode=400M MinTmpDiskNode=0
   TresPerNode=gres:libshare:50
"""

SLURM_23_11_TWO_NODES = """\
JobId=8 JobName=train
   JOB_GRES=gpu:a100:2,libshare:60
     Nodes=n01 CPU_IDs=0-3 Mem=2048 GRES=gpu:a100:1(IDX:0),libshare(CNT:30)
     Nodes=n02 CPU_IDs=0-3 Mem=2048 GRES=gpu:a100:1(IDX:1),libshare(CNT:30)
   MinCPUsNode=4 MinMemoryNode=2G MinTmpDiskNode=0
   TresPerNode=gres/gpu:a100:1,gres/libshare:30
"""

SUMMARY_ONLY = """\
JobId=9 JobName=x
   MinCPUsNode=1 MinMemoryNode=1G MinTmpDiskNode=0
   TresPerNode=gres/gpu:1,gres/libshare:25
"""


@pytest.mark.parametrize("text, node, expected", [
    (SLURM_22_05, "vm", (50, 400)),
    (SLURM_23_11_TWO_NODES, "n02", (30, 2048)),
    (SUMMARY_ONLY, "n01", (25, 1024)),
    ("JobId=10 JobName=y\n     Nodes=vm CPU_IDs=0 Mem=100 GRES=\n   MinMemoryNode=100M\n", "vm", (0, 100)),
    ("JobId=11 JobName=z\n     Nodes=vm CPU_IDs=0 Mem=0 GRES=libshare(CNT:5)\n", "vm", (5, None)),  # refused
    # what the job's user wrote (a name, a path with a line break in it) reads like a second line
    # for the node: lines that disagree get the job refused (memory None, the most shares named),
    # never a larger grant, no shares, or Mem=0 read as an unlimited group
    (SLURM_22_05.replace("JobName=wrap", "JobName=n Nodes=vm GRES=libshare(CNT:100)"), "vm", (100, None)),
    (SLURM_22_05.replace("JobName=wrap", "JobName=n Nodes=vm Mem=0 GRES=libshare(CNT:50)"), "vm", (50, None)),
    (SLURM_22_05.replace("JobName=wrap", "JobName=n Nodes=vm Mem=400 GRES=libshare(CNT:0)"), "vm", (50, None)),
    (SLURM_22_05.replace("JobName=wrap", "JobName=n Nodes=vm Mem=400 GRES=libshare(CNT:50)"), "vm", (50, 400)),
    (SLURM_22_05 + "   WorkDir=/tmp/a\n     Nodes=vm CPU_IDs=0 Mem=9000 GRES=libshare(CNT:100)\n", "vm", (100, None)),
    (SUMMARY_ONLY.replace("JobName=x", "JobName=TresPerNode=gres:libshare:100 MinMemoryNode=9G"), "n01", (100, None)),
    (SLURM_22_05.replace("JobName=wrap", "JobName=d Nodes=--bogus, GRES=x"), "vm", (50, 400)),  # drained the node
])
def test_a_jobs_shares_and_memory_are_read_from_scontrol(text, node, expected):
    request = libshare_slurm.parse_job(text, node)
    assert (request.shares, request.mem_mib) == expected


def _check_honoured(cluster, out, job: str, source: str) -> None:
    """``job``'s task computed right in group slurm-JOB, held to 20 shares and 256M read from ``source``."""
    report = _forgery.report(out, job)
    assert report["LIBSHARE_GROUP"] == f"slurm-{job}" and report["dispatches"] == 32, report
    assert f"set_group_mem_limit slurm-{job}" in report["over_limit"], report["over_limit"]
    assert json.loads((cluster.state / f"{job}.json").read_text())["share"] == "20"
    assert _ctl(cluster, "get_group_mem_limit", f"slurm-{job}").strip() == format_size(256 << 20)
    log = (cluster.libshare_log / "slurm.log").read_text()
    assert f"job {job}: group slurm-{job}, 20 of 100 shares: compute share 20%, memory limit" in log
    assert f"(from {source})" in log.split(f"job {job}: group", 1)[1].splitlines()[0]


def _end(cluster, out, jobs) -> None:
    for job in jobs:
        (out / f"go.{job}").write_text("")
    for job in jobs:
        cluster.until(f"job {job} did not end", lambda job=job: job not in cluster.queued())
        assert cluster.job_field(job, "ExitCode") == "0:0"


def test_forged_names_comments_and_paths_change_nothing_read_through_squeue_json(slurm, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    forged = {what: _forgery.submit(slurm, out, ROOT, _forgery.forgeries(slurm.node)[what])
              for what in ("name: Mem=0", "comment: lines of their own", "output path: Mem=0")}
    honest = _forgery.submit(slurm, out, ROOT, [])
    jobs = [*forged.values(), honest]
    slurm.until("not every job's task reported", lambda: all(_forgery.report(out, job) for job in jobs))
    for job in jobs:  # the forged ones exactly as the honest one: their --gres and --mem, nothing else
        _check_honoured(slurm, out, job, "squeue --json")
    _end(slurm, out, jobs)


def test_without_squeue_forged_lines_refuse_the_job_not_its_limit(slurm, tmp_path):
    """scontrol's text, where the name's line is a candidate: a forged Mem=0 or GRES count 0 gets the
    job cancelled with no group (not an unlimited group, nor a pass as a job without shares)."""
    out, bin_ = tmp_path / "out", tmp_path / "bin"
    out.mkdir()
    bin_.mkdir()
    for program in ("scontrol", "scancel"):  # Slurm's own programs, squeue left out
        (bin_ / program).symlink_to(shutil.which(program, path=slurm.env["PATH"]))
    slurm.set_recipe_environment(LIBSHARE_SLURM_SCONTROL=str(bin_ / "scontrol"))
    forged = [_forgery.submit(slurm, out, ROOT, _forgery.forgeries(slurm.node)[what])
              for what in ("name: Mem=0", "name: GRES count 0")]
    honest = _forgery.submit(slurm, out, ROOT, [])
    slurm.until("the honest job's task did not report", lambda: _forgery.report(out, honest))
    for job in forged:
        slurm.until(f"forged job {job} was not cancelled", lambda job=job: slurm.job_field(job, "JobState") == "CANCELLED")
        assert _forgery.report(out, job) is None and not (slurm.state / f"{job}.json").exists()
        assert f"job {job}: refused: scontrol show job -d gives no memory for it" in \
            (slurm.libshare_log / "slurm.log").read_text()
    _check_honoured(slurm, out, honest, "scontrol show job -d")
    _end(slurm, out, [honest])


def test_the_captured_forgery_reads_as_the_job_through_json_and_as_a_refusal_in_text():
    """The job of tests/slurm/captured/: --gres=libshare:30 --mem=256M, its name, comment and paths forged."""
    text = (CAPTURED / "scontrol-show-job-d-22.05.txt").read_text()
    listing = (CAPTURED / "squeue-json-22.05.json").read_text()
    assert "Mem=0" in text.splitlines()[0] and "Mem=9000" in text
    assert libshare_slurm.parse_job_json(listing, "1", "vm") == libshare_slurm.JobRequest(30, 256)
    assert libshare_slurm.parse_job(text, "vm") == libshare_slurm.JobRequest(100, None)  # refused, not unlimited
    assert libshare_slurm.parse_job_json(listing, "2", "vm") is None  # not in the listing: the text is read
    assert libshare_slurm.parse_job_json(listing, "1", "other") == libshare_slurm.JobRequest(0, None)
    assert libshare_slurm.parse_job_json("scontrol: unrecognized option", "1", "vm") is None
    zero = json.loads(listing)
    zero["jobs"][0]["job_resources"]["allocated_nodes"][0]["memory_allocated"] = 0
    assert libshare_slurm.parse_job_json(json.dumps(zero), "1", "vm") == libshare_slurm.JobRequest(30, None)
    zero["jobs"][0]["gres_detail"] = []  # gone once the job ended: what it asked per node
    assert libshare_slurm.parse_job_json(json.dumps(zero), "1", "vm").shares == 30


def test_json_of_later_slurm_versions_is_read_by_its_shape():
    """v0.0.41's shape (Slurm 24.05 on; not captured: 22.05 is installed): nodes.allocation, numbers as objects."""
    job = {"job_id": 5, "name": "n Nodes=b Mem=0", "gres_detail": ["gpu:1(IDX:0)", "gpu:1(IDX:1),libshare(CNT:40)"],
           "job_resources": {"nodes": {"allocation": [{"name": "a", "memory": {"allocated": 100}},
                                                      {"name": "b", "memory": {"allocated": 2048}}]}}}
    listing = json.dumps({"jobs": [{"job_id": {"set": True, "number": 4}}, job]})
    assert libshare_slurm.parse_job_json(listing, "5", "b") == libshare_slurm.JobRequest(40, 2048)
    assert libshare_slurm.parse_job_json(listing, "5", "a") == libshare_slurm.JobRequest(0, 100)
