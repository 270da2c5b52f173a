"""Slurm: a node's device offered as a count of libshare shares (the recipe is in contrib/slurm/).

The node offers ``Gres=libshare:100`` (gres.conf ``Name=libshare Count=100``, no File); a job
asks for some with ``--gres=libshare:N``. Slurm's ``Prolog`` (root, on the node, before the
job's first task) runs ``python -m libshare.slurm prolog``, which

* reads the job's count of shares on this node and its memory there from Slurm (which passes
  neither to a prolog's environment): see *Reading the job* below,
* takes a lease on the node's arbiter through :mod:`libshare.manager`, which starts it when
  none answers (the arbiter outlives the prolog: it runs in a session of its own),
* makes the libshare group ``slurm-JOBID``: compute share N% of the device
  (``set_group_active_thread_percentage``, scaled when the node offers another count than
  100) and a memory limit of the job's memory on the node (``set_group_mem_limit``),
  owned by the job's user (``set_group_owner``: in multi-user mode no other user's client
  may join it, and the job user's clients must name one of its groups),
* writes the job's ``export NAME=value`` lines (LIBSHARE_PIPE_DIRECTORY, LIBSHARE_MODE,
  LIBSHARE_LOG_DIRECTORY, LIBSHARE_DEVICE, LIBSHARE_GROUP) to STATE/JOBID.env, which the
  ``TaskProlog`` prints so that Slurm adds them to every task's environment.

The ``Epilog`` runs ``python -m libshare.slurm epilog``: it forgets the job, terminates its
group's clients (a process that outlived the job, under ``proctrack/linuxproc``, would keep the
group, limits lifted), lifts its group's memory limit, and when no job of the node holds shares any more, quits the arbiter, if a
prolog started it (one an operator started, such as a ``--multi-user`` arbiter under
systemd, is used and never quit, as the manager does). Prologs and epilogs are separate
processes, so the count of jobs lives in the state directory (one file per job, under an
``flock``), not in the manager's memory. Jobs that ask for no shares are left alone.

Reading the job. What Slurm says about a job holds what the job's user wrote: its name,
comment, working directory, output paths. In ``scontrol show job -d`` text those are printed
unquoted, line breaks included, so a name such as ``n Nodes=vm Mem=0 GRES=libshare(CNT:30)``
reads like the node's allocation line. The prolog therefore asks ``squeue --json`` first
(Slurm 21.08 and later, beside ``scontrol`` or on PATH; ``scontrol --json`` only exists from
23.02): there the job's name and paths are strings of their own and the node's memory and
gres are separate fields (``job_resources`` and ``gres_detail``, read by
:func:`parse_job_json`). ``squeue`` ignores ``--jobs`` with ``--json`` on some versions, so the
job is picked out by its id. Only when that yields nothing known does it read the text
(:func:`parse_job`), where every line that reads like the node's allocation counts and, since
Slurm prints one per node, candidates that disagree are a forgery and refused. In both, a
memory that is missing or zero is not "unlimited": the prolog refuses the job (it gives no group, logs why in ``slurm.log`` and
cancels the job with ``scancel``), and never fails itself for it, which would drain the node.

Settings, from the environment (contrib/slurm/libshare-slurm.env sets them for the scripts):
LIBSHARE_PIPE_DIRECTORY (default /run/libshare), LIBSHARE_LOG_DIRECTORY (default
/var/log/libshare; ``slurm.log`` there records every prolog and epilog), LIBSHARE_DEVICE,
LIBSHARE_SLURM_STATE (default /run/libshare-slurm), LIBSHARE_SLURM_GRES (the gres name,
default ``libshare``), LIBSHARE_SLURM_SHARES (the node's count, default 100),
LIBSHARE_SLURM_MULTI_USER (1: start the arbiter with ``--multi-user``, so that jobs of every
user may connect; needed unless jobs run as the arbiter's uid), LIBSHARE_SLURM_SCONTROL
(default: ``scontrol`` on PATH or in /usr/bin; ``squeue`` and ``scancel`` are
taken from beside it).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from libshare import manager, settings as _settings
from libshare.protocol.control import ControlConnection, decimal
from libshare._proc import running  # a prolog's child is reparented to init, which may never reap it
from libshare.manager import _server_pid
from libshare.daemon.logs import log_handler
from libshare.errors import ArbiterLost, ArbiterUnavailable, LibshareError

__all__ = ["JobRequest", "group_name", "parse_job", "parse_job_json", "prolog", "epilog"]

log = logging.getLogger("libshare.slurm")

_QUIT_WAIT = 30.0


def group_name(job_id: str) -> str:
    """The libshare group of a Slurm job."""
    return f"slurm-{job_id}"


@dataclass(frozen=True)
class JobRequest:
    """What a job holds on one node: its count of shares and its memory (MiB; None when Slurm
    does not say, or says zero: the prolog then refuses the job rather than guess)."""

    shares: int
    mem_mib: int | None


_HOSTLIST = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.\-\[\],]*")


def _gres_count(gres: str) -> re.Pattern:
    """The count of gres ``gres`` in a gres detail (``gpu:a100:1(IDX:0,2),libshare(CNT:30)``)."""
    return re.compile(rf"(?:^|,){re.escape(gres)}(?::[^,(:]+)*\(CNT:(\d+)\)")


def _per_node_request(tres: str, gres: str) -> list[int]:
    """The counts of ``gres`` a TresPerNode value asks for (``gres:libshare:30``, ``gres/libshare:30``)."""
    return [int(m.group(1)) for m in
            re.finditer(rf"(?:^|,)gres[:/]{re.escape(gres)}(?::[^,:\s]+)*?:(\d+)(?=,|$)", tres)]


def _number(value) -> int | None:
    """A count from Slurm's JSON: a plain integer, or ``{"set": true, "number": N}`` (v0.0.40 on)."""
    if isinstance(value, dict) and value.get("set") and not value.get("infinite"):
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _allocated_nodes(resources) -> list[tuple[str, int | None]] | None:
    """(node, memory MiB) of each node of a job's ``job_resources``, in the job's node order:
    ``allocated_nodes`` with ``nodename`` and ``memory_allocated`` (v0.0.38, v0.0.39), or
    ``nodes.allocation`` with ``name`` and ``memory.allocated`` (v0.0.41 on); None for another shape."""
    if not isinstance(resources, dict):
        return None
    nodes = resources.get("allocated_nodes")
    if isinstance(nodes, list) and all(isinstance(n, dict) and "nodename" in n for n in nodes):
        return [(str(n["nodename"]), _number(n.get("memory_allocated"))) for n in nodes]
    nodes = resources.get("nodes")
    nodes = nodes.get("allocation") if isinstance(nodes, dict) else None
    if isinstance(nodes, list) and all(isinstance(n, dict) and "name" in n for n in nodes):
        return [(str(n["name"]), _number((n.get("memory") or {}).get("allocated"))) for n in nodes]
    return None


def parse_job_json(text: str, job_id: str, node: str, gres: str = "libshare") -> JobRequest | None:
    """Job ``job_id``'s request on ``node`` from ``squeue --json`` (or ``scontrol --json show job``)
    output; None when the text does not describe that job in a shape known here.

    Only Slurm's own fields are read: the node's allocated memory from ``job_resources``, its
    gres from ``gres_detail`` (one entry per node, in the job's node order; ``tres_per_node``
    when there is none). The job's name, comment and paths are strings of their own and read by
    nobody. A memory of 0 is None, as in :class:`JobRequest`.
    """
    try:
        jobs = json.loads(text).get("jobs")
    except (ValueError, AttributeError):
        return None
    wanted = decimal(job_id, 1 << 62)
    job = next((j for j in jobs if isinstance(j, dict) and _number(j.get("job_id")) == wanted), None) \
        if isinstance(jobs, list) and wanted is not None else None
    nodes = _allocated_nodes(job.get("job_resources")) if job else None
    if nodes is None:
        return None
    index = next((i for i, (name, _) in enumerate(nodes) if name == node), None)
    if index is None:
        return JobRequest(0, None)  # nothing of the job on this node
    details = job.get("gres_detail")
    if isinstance(details, list) and index < len(details):
        found = _gres_count(gres).search(str(details[index]))
        shares = int(found.group(1)) if found else 0
    else:
        shares = min(_per_node_request(str(job.get("tres_per_node") or ""), gres), default=0)
    return JobRequest(shares, nodes[index][1] or None)


def _hostnames(expression: str, scontrol: str) -> list[str]:
    """The hosts of a Slurm host list (``n[01-02]``); none for text that is not one (it may come
    from a line the job's own name or paths made: see :func:`parse_job`)."""
    if not _HOSTLIST.fullmatch(expression):
        return []
    if not re.search(r"[\[,]", expression):
        return [expression]
    out = subprocess.run([scontrol, "show", "hostnames", expression], capture_output=True, text=True,
                         timeout=30, check=False).stdout
    return out.split()


def parse_job(text: str, node: str, gres: str = "libshare", scontrol: str = "scontrol") -> JobRequest:
    """The job's request on ``node`` from ``scontrol show job -d`` text (Slurm 22.05 to 24.x), the
    prolog's fallback where ``squeue --json`` says nothing (:func:`parse_job_json`).

    The per-node lines (``Nodes=n[1-2] CPU_IDs=0 Mem=300 GRES=libshare(CNT:30)``) say what the
    node was given; without one for ``node``, ``TresPerNode`` (``gres:libshare:30`` or
    ``gres/libshare:30``) and ``MinMemoryNode`` say what was asked per node.

    The text holds what the job's user wrote too (its name, comment, paths), unquoted, which can
    look like any of those fields, even on lines of their own. So every candidate counts, and
    unless they all agree the job is refused (:func:`_least`): a forged field cannot raise the
    job's grant, lower it to nothing, or make a ``Mem=0`` read as "unlimited". A host list is
    read only when it looks like one (``Nodes=--bogus,`` would make ``scontrol`` fail, and a
    failed prolog drains the node).
    """
    count = _gres_count(gres)
    given = []
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "Nodes" not in fields or "GRES" not in fields and "Mem" not in fields:
            continue
        if node not in _hostnames(fields["Nodes"], scontrol):
            continue
        found = count.search(fields.get("GRES", ""))
        given.append(JobRequest(int(found.group(1)) if found else 0, decimal(fields.get("Mem") or "", 1 << 62)))
    if given:
        return _least(given)
    per_node = [n for m in re.finditer(r"TresPerNode=(\S*)", text) for n in _per_node_request(m.group(1), gres)]
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
    mems = [int(int(m.group(1)) * scale[m.group(2)]) for m in re.finditer(r"MinMemoryNode=(\d+)([KMGT]?)", text)]
    return _least([JobRequest(shares, mem) for shares in per_node or [0] for mem in mems or [None]])


def _least(requests: list[JobRequest]) -> JobRequest:
    """The one request that ``requests`` (candidates from the text) agree on. Slurm prints one line
    per node: candidates that disagree mean the job's own words forged one, and the result is a
    refusal (memory None, with the most shares any candidate names, so that even a forged count
    of 0 is refused rather than passed over as a job without shares); so is a memory of 0."""
    if len({r.shares for r in requests}) > 1 or len({r.mem_mib for r in requests}) > 1:
        return JobRequest(max(r.shares for r in requests), None)
    return JobRequest(requests[0].shares, requests[0].mem_mib or None)


@dataclass(frozen=True)
class _Settings:
    pipe_directory: Path
    log_directory: Path
    device: str | None
    state: Path
    gres: str
    node_shares: int
    multi_user: bool
    scontrol: str

    @classmethod
    def from_environment(cls, env=os.environ) -> _Settings:
        def setting(name: str):
            return _settings.value(name, env=env)

        scontrol = setting("slurm_scontrol") or shutil.which(
            "scontrol", path=env.get("PATH", "") + os.pathsep + "/usr/bin:/usr/local/bin") or "scontrol"
        # a node's arbiter serves every job: its directories default to the system's, not a user's
        return cls(_settings.configured("pipe_directory", env) or Path("/run/libshare"),
                   _settings.configured("log_directory", env) or Path("/var/log/libshare"),
                   setting("device"), setting("slurm_state"), setting("slurm_gres"), setting("slurm_shares"),
                   setting("slurm_multi_user"), scontrol)


class _State:
    """The node's jobs that hold shares: STATE/JOBID.json (and JOBID.env for the task prolog)."""

    def __init__(self, directory: Path):
        self.directory = directory

    @contextmanager
    def locked(self):
        self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)

    def jobs(self) -> list[str]:
        return sorted(p.stem for p in self.directory.glob("*.json"))

    def _write(self, name: str, text: str) -> None:
        path = self.directory / name
        temporary = path.with_name(f".{name}.tmp")
        temporary.write_text(text)
        temporary.chmod(0o644)
        temporary.replace(path)

    def add(self, job_id: str, record: dict, environment: dict[str, str]) -> None:
        self._write(f"{job_id}.json", json.dumps(record))
        self._write(f"{job_id}.env", "".join(f"export {k}={v}\n" for k, v in environment.items()))

    def remove(self, job_id: str) -> dict | None:
        record = None
        try:
            record = json.loads((self.directory / f"{job_id}.json").read_text())
        except (FileNotFoundError, ValueError):
            pass
        for suffix in (".env", ".json"):
            (self.directory / f"{job_id}{suffix}").unlink(missing_ok=True)
        return record

    @property
    def owned(self) -> int | None:
        """The pid of the arbiter a prolog started (the epilog of the last job quits it)."""
        try:
            return int((self.directory / "arbiter").read_text())
        except (FileNotFoundError, ValueError):
            return None

    @owned.setter
    def owned(self, pid: int | None) -> None:
        if pid is None:
            (self.directory / "arbiter").unlink(missing_ok=True)
        else:
            self._write("arbiter", str(pid))


def _beside(scontrol: str, program: str) -> str:
    """Slurm's ``program`` from the directory of ``scontrol`` (on PATH when that has none)."""
    return str(Path(scontrol).with_name(program)) if os.sep in scontrol else program


def _job_request(job_id: str, settings: _Settings, node: str) -> tuple[JobRequest, str]:
    """The job's request on ``node`` and where it was read: ``squeue --json``, else the text of
    ``scontrol show job -d`` (see the module's essay)."""
    squeue = [_beside(settings.scontrol, "squeue"), "--json", "--all", f"--jobs={job_id}"]
    try:
        out = subprocess.run(squeue, capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:  # no squeue here: the text is all there is
        log.info("job %s: %s: %s", job_id, squeue[0], exc)
    else:
        request = parse_job_json(out.stdout, job_id, node, settings.gres) if out.returncode == 0 else None
        if request is not None:
            return request, "squeue --json"
        log.info("job %s: squeue --json says nothing known of it (status %d): reading scontrol's text",
                 job_id, out.returncode)
    out = subprocess.run([settings.scontrol, "show", "job", "-d", job_id], capture_output=True, text=True,
                         timeout=60, check=False)
    if out.returncode:
        raise LibshareError(f"{settings.scontrol} show job -d {job_id} failed: {out.stderr.strip()}")
    return parse_job(out.stdout, node, settings.gres, settings.scontrol), "scontrol show job -d"


def _refuse(job_id: str, node: str, source: str, settings: _Settings) -> None:
    """Refuse a job whose memory on ``node`` Slurm does not give: no group, a line in the log, and
    the job cancelled (a failed prolog would drain the node, for what a job's user can cause)."""
    log.error("job %s: refused: %s gives no memory for it on %s (zero, missing, or lines that disagree: its "
              "name, comment or paths forge them), and a group without one would be unlimited; it needs --mem, "
              "memory as a consumable resource (SelectTypeParameters=CR_*_Memory) and no Slurm fields in what "
              "its user writes. Cancelling it.", job_id, source, node)
    scancel = [_beside(settings.scontrol, "scancel"), job_id]
    out = subprocess.run(scancel, capture_output=True, text=True, timeout=60, check=False)
    if out.returncode:
        raise LibshareError(f"{' '.join(scancel)} failed ({out.returncode}): {out.stderr.strip()}")


def _quit(pipe_directory: Path, pid: int) -> None:
    try:
        with ControlConnection(pipe_directory, timeout=10.0) as connection:
            connection.run("quit")
    except (ArbiterUnavailable, ArbiterLost):
        pass
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and running(pid):
            log.warning("arbiter pid %d still runs %.0f s after quit: sending %s", pid, _QUIT_WAIT, sig.name)
            os.kill(pid, sig)
        deadline = time.monotonic() + _QUIT_WAIT
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not running(pid):
            return


def prolog(job_id: str, node: str, env=os.environ) -> dict[str, str] | None:
    """Give job ``job_id`` its group on ``node``'s arbiter; its tasks' environment, or None without shares
    or when refused (no memory for it on ``node``: the job is cancelled, see the module's essay)."""
    settings = _Settings.from_environment(env)
    request, source = _job_request(job_id, settings, node)
    if request.shares <= 0:
        log.info("job %s: no %s shares on %s, nothing to do", job_id, settings.gres, node)
        return None
    if request.mem_mib is None:
        _refuse(job_id, node, source, settings)
        return None
    group = group_name(job_id)
    percent = max(1, min(100, round(request.shares * 100 / settings.node_shares)))
    with _State(settings.state).locked() as state:
        held = state.owned
        lease = manager.acquire(settings.device, settings.pipe_directory, settings.log_directory,
                                multi_user=settings.multi_user)
        # The lease is never released here: this process ends, the arbiter stays; the epilog of
        # the node's last job quits it (STATE/arbiter says whether a prolog started it).
        if lease.started:
            state.owned = lease.pid
        elif held != lease.pid:
            state.owned = None  # someone else's arbiter: used, never quit
        try:
            with ControlConnection(settings.pipe_directory, timeout=30.0) as connection:
                share = connection.run("set_group_active_thread_percentage", group, str(percent)).strip()
                limit = connection.run("set_group_mem_limit", group, f"{request.mem_mib}M").strip()
                if env.get("SLURM_JOB_UID", "").isdigit():  # only the job's user joins it (multi-user mode)
                    connection.run("set_group_owner", group, env["SLURM_JOB_UID"])
            environment = {**lease.environment, "LIBSHARE_GROUP": group}
            state.add(job_id, {"group": group, "shares": request.shares, "share": share, "mem_limit": limit,
                               "arbiter": lease.pid}, environment)
        except BaseException:
            _stop_if_unused(state, settings)
            raise
    log.info("job %s: group %s, %d of %d shares: compute share %s%%, memory limit %s (from %s); arbiter pid %d (%s)",
             job_id, group, request.shares, settings.node_shares, share, limit, source, lease.pid,
             "started" if lease.started else "running")
    return environment


def epilog(job_id: str, env=os.environ) -> None:
    """Forget job ``job_id``; quit the arbiter a prolog started once no job holds shares."""
    settings = _Settings.from_environment(env)
    with _State(settings.state).locked() as state:
        record = state.remove(job_id)
        if record is None:
            return
        try:
            with ControlConnection(settings.pipe_directory, timeout=30.0) as connection:
                connection.run("terminate_group", record["group"])  # a process that outlived its job
                connection.run("set_group_mem_limit", record["group"], "unlimited")
                connection.run("set_group_owner", record["group"], "none")
        except LibshareError as exc:
            log.info("job %s: could not lift the memory limit of %s: %s", job_id, record["group"], exc)
        log.info("job %s: ended; %d job(s) left with shares", job_id, len(state.jobs()))
        _stop_if_unused(state, settings)


def _stop_if_unused(state: _State, settings: _Settings) -> None:
    if state.jobs():
        return
    owned = state.owned
    if owned is not None and _server_pid(settings.pipe_directory) == owned:
        log.info("no job holds shares: quitting arbiter pid %d", owned)
        _quit(settings.pipe_directory, owned)
    state.owned = None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in ("prolog", "epilog"):
        print("usage: python -m libshare.slurm prolog|epilog  (run by Slurm's Prolog and Epilog)", file=sys.stderr)
        return 2
    settings = _Settings.from_environment()
    settings.log_directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    handler = log_handler(settings.log_directory / "slurm.log")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if decimal(job_id, 1 << 62) is None:
        log.error("%s: SLURM_JOB_ID is %r, not a job id", argv[0], job_id)
        return 1
    try:
        if argv[0] == "prolog":
            prolog(job_id, os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0])
        else:
            epilog(job_id)
    except Exception as exc:  # noqa: BLE001  (logged; a non-zero status makes Slurm drain the node)
        log.exception("job %s: %s failed: %s", job_id, argv[0], exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
