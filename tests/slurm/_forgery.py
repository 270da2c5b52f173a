"""Slurm jobs whose own words forge Slurm's: for tests/slurm/test_slurm.py and tools/attack_slurm.py.

A job's user writes its name, comment, working directory and output path, and ``scontrol show
job -d`` prints them unquoted, line breaks included. Each forgery here is sbatch options that
make those fields read like the node's allocation line (``Nodes=NODE Mem=... GRES=...``) or
the request's summary (``MinMemoryNode=``, ``TresPerNode=``). :func:`submit` starts a job
whose task is tests/slurm/_client.py: it reports its group and whether an allocation past its
``--mem`` succeeded, and waits for OUT/go.JOBID.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HONEST = "honest"


def forgeries(node: str) -> dict[str, list[str]]:
    """sbatch options of each forgery by name; ``{out}`` stands for the jobs' output directory."""
    line = f"Nodes={node} CPU_IDs=0"
    return {
        "name: Mem=0": [f"--job-name=n Nodes={node} Mem=0 GRES=libshare(CNT:20)"],
        "name: more shares and memory": [f"--job-name=n Nodes={node} Mem=9000 GRES=libshare(CNT:100)"],
        "comment: lines of their own": [
            f"--comment=c MinMemoryNode=0 TresPerNode=gres:libshare:100\n     {line} Mem=0 GRES=libshare(CNT:100)"],
        "output path: Mem=0": [f"--output={{out}}/o Nodes={node} Mem=0 GRES=libshare(CNT:100)"],
        "work dir: Mem=0": [f"--chdir={{out}}/w Nodes={node} Mem=0 GRES=libshare(CNT:20)"],
        "name: GRES count 0": [f"--job-name=n Nodes={node} Mem=256 GRES=libshare(CNT:0)"],
    }


def submit(cluster, out: Path, tree: Path, options: list[str], shares: int = 20, mem: int = 256) -> str:
    """Submit a job asking ``shares`` shares and ``mem`` MiB, with ``options`` (a forgery's); its task
    runs tests/slurm/_client.py from ``tree`` (the libshare its prolog imports too). The job id."""
    options = [o.replace("{out}", str(out)) for o in options]
    for option in options:
        if option.startswith("--chdir="):
            Path(option.split("=", 1)[1]).mkdir(parents=True, exist_ok=True)
    defaults = [f"--chdir={out}"] * (not any(o.startswith("--chdir=") for o in options)) + \
        [f"--output={out}/%j.log"] * (not any(o.startswith("--output=") for o in options))
    return cluster.run("sbatch", "--parsable", *defaults, f"--gres=libshare:{shares}", f"--mem={mem}M", *options,
                       f"--wrap=cd {tree} && srun {sys.executable} -m tests.slurm._client {out} {mem}",
                       ).strip().split(";")[0]


def report(out: Path, job: str) -> dict | None:
    """The report of ``job``'s task 0, once written."""
    path = out / f"{job}.0.json"
    return json.loads(path.read_text()) if path.exists() else None
