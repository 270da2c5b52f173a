"""A one-node Slurm cluster on this machine, with contrib/slurm/'s recipe installed, for one test.

Debian's slurm-wlm and munge are installed with apt-get when missing (the test is skipped
only when that is impossible and LIBSHARE_REQUIRE_SLURM is unset). munged, slurmctld and
slurmd run in the foreground as this process's children, on free ports, with every file
(configuration, key, state, spool, logs) under the test's temporary directory: no system
service is used or touched. No cgroups: ProctrackType=proctrack/linuxproc and
TaskPlugin=task/none. Everything started is stopped afterwards, on failure too: jobs are
cancelled, the daemons terminated, and any process left whose environment names this
cluster's SLURM_CONF (job steps, tasks) is killed, then the arbiter of the pipe directory.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests._wait import wait_until
from tests.conftest import ROOT, stop_process
from tests.control.conftest import kill_hard

PACKAGES = ("slurm-wlm", "munge")
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
CONTRIB = ROOT / "contrib" / "slurm"
INSTALLED_AT = "/etc/slurm/libshare"  # where contrib/slurm/slurm.conf.libshare expects the scripts


def _fail_or_skip(message: str) -> None:
    if os.environ.get("LIBSHARE_REQUIRE_SLURM") == "1":
        pytest.fail(message)
    pytest.skip(message)


def _missing() -> list[str]:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin"
    return [p for p in PROGRAMS if shutil.which(p, path=path) is None]


def ensure_slurm() -> None:
    """Install Debian's slurm-wlm and munge with apt-get if any of their programs is missing."""
    if not _missing():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        _fail_or_skip(f"Slurm is not installed ({', '.join(_missing())} missing) and cannot be: "
                      f"{'no apt-get' if os.geteuid() == 0 else 'not root'}; "
                      f"run: sudo apt-get install -y {' '.join(PACKAGES)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode:  # stale package lists: update once and try again
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode or _missing():
        _fail_or_skip(f"apt-get could not install {' '.join(PACKAGES)} (status {result.returncode}): "
                      f"{(result.stderr or result.stdout)[-2000:]}")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait(what: str, ready, timeout: float, diagnose=lambda: "") -> None:
    wait_until(ready, timeout, what, interval=0.1, fail=lambda message: pytest.fail(f"{message}\n{diagnose()}"))


def tail(path: Path, lines: int = 25) -> str:
    try:
        return f"--- {path.name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"--- {path.name}: (none)"


class Cluster:
    """The running cluster: its configuration, the libshare directories its recipe uses, commands."""

    def __init__(self, root: Path):
        self.root = root
        self.etc = root / "etc"  # slurm.conf, gres.conf, and the recipe's scripts with their .env
        self.log = root / "log"  # the daemons' logs
        self.pipe = root / "libshare" / "pipe"
        self.libshare_log = root / "libshare" / "log"
        self.state = root / "libshare" / "state"
        self.conf = self.etc / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(self.conf),
                    "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin"}
        for name in [n for n in self.env if n.startswith(("SLURM_", "LIBSHARE_")) and n != "SLURM_CONF"]:
            del self.env[name]  # nothing of an enclosing job or arbiter leaks into ours
        self.processes: list[subprocess.Popen] = []

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> str:
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode:
            pytest.fail(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}\n{self.diagnose()}")
        return result.stdout

    def sbatch(self, *args: str) -> str:
        return self.run("sbatch", "--parsable", f"--chdir={ROOT}", *args).strip().split(";")[0]

    def until(self, what: str, ready, timeout: float = 120.0):
        """Poll ``ready()`` until it returns something true (returned); fail with the logs after ``timeout`` s."""
        return wait_until(ready, timeout, what, fail=lambda message: pytest.fail(f"{message}\n{self.diagnose()}"))

    def queued(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").split()

    def job_field(self, job_id: str, field: str) -> str | None:
        out = self.run("scontrol", "show", "job", job_id, check=False)
        for word in out.split():
            if word.startswith(field + "="):
                return word.split("=", 1)[1]
        return None

    def diagnose(self) -> str:
        return "\n".join([tail(self.log / "slurmctld.log"), tail(self.log / "slurmd.log"),
                          tail(self.libshare_log / "slurm.log"), tail(self.libshare_log / "server.log"),
                          tail(self.libshare_log / "arbiter.stderr"),
                          self.run("sinfo", "-N", "-l", check=False, timeout=20)])

    def start(self) -> None:
        for directory in (self.etc, self.log, self.root / "state", self.root / "spool", self.root / "munge"):
            directory.mkdir(parents=True)
        (self.root / "munge").chmod(0o755)  # the socket's directory: every job user reaches munged
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._install_recipe()
        ctld_port, slurmd_port = _free_ports(2)
        munge_socket = self.root / "munge" / "munge.socket"
        fragment = (CONTRIB / "slurm.conf.libshare").read_text().replace(INSTALLED_AT, str(self.etc))
        self.conf.write_text(f"""\
ClusterName=libsharetest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={self.root / "state"}
SlurmdSpoolDir={self.root / "spool"}
SlurmctldPidFile={self.root / "slurmctld.pid"}
SlurmdPidFile={self.root / "slurmd.pid"}
SlurmctldLogFile={self.log / "slurmctld.log"}
SlurmdLogFile={self.log / "slurmd.log"}
# no cgroups: processes are tracked by their parents, tasks are not confined
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
# the node's CPUs and memory as configured here, not as detected (three jobs on 2 cores)
SlurmdParameters=config_overrides
MinJobAge=600
{fragment}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs=8 RealMemory=8000 Gres=libshare:100 State=UNKNOWN
PartitionName=libshare Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        shutil.copy(CONTRIB / "gres.conf.libshare", self.etc / "gres.conf")
        self._spawn("munged", "munged", "-F", "--force", f"--socket={munge_socket}", f"--key-file={key}",
                    f"--pid-file={self.root / 'munge' / 'munged.pid'}", f"--log-file={self.log / 'munged.log'}",
                    f"--seed-file={self.root / 'munge' / 'munged.seed'}")
        _wait("munged has no socket", munge_socket.exists, 30, lambda: tail(self.log / "munged.log"))
        self._spawn("slurmctld", "slurmctld", "-D", "-i", "-f", str(self.conf))
        self._spawn("slurmd", "slurmd", "-D", "-f", str(self.conf))
        _wait("the node is not idle", self._idle, 90, self.diagnose)

    def _install_recipe(self) -> None:
        """contrib/slurm's scripts, and their settings pointed at this test's directories."""
        for name in ("prolog", "epilog", "task-prolog"):
            shutil.copy(CONTRIB / name, self.etc / name)
        settings = {"LIBSHARE_PYTHON": sys.executable, "LIBSHARE_PIPE_DIRECTORY": str(self.pipe),
                    "LIBSHARE_LOG_DIRECTORY": str(self.libshare_log), "LIBSHARE_SLURM_STATE": str(self.state)}
        lines = []
        for line in (CONTRIB / "libshare-slurm.env").read_text().splitlines():
            name = line.split("=", 1)[0]
            lines.append(f"{name}={settings[name]}" if name in settings else line)
        (self.etc / "libshare-slurm.env").write_text("\n".join(lines) + "\n")

    def set_recipe_environment(self, **variables: str) -> None:
        """Add exported ``variables`` to the recipe's libshare-slurm.env: every prolog, epilog and
        task prolog started from then on has them (PYTHONPATH: the libshare they import)."""
        with open(self.etc / "libshare-slurm.env", "a") as env:
            env.writelines(f"{name}={shlex.quote(value)}\nexport {name}\n" for name, value in variables.items())

    def _spawn(self, name: str, *argv: str) -> None:
        with open(self.log / f"{name}.out", "ab") as out:
            process = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, cwd=self.root)
        self.processes.append(process)

    def _idle(self) -> bool:
        for process in self.processes:
            if process.poll() is not None:
                pytest.fail(f"{process.args[0]} exited with {process.returncode}\n"
                            f"{tail(self.log / (process.args[0] + '.out'))}\n{self.diagnose()}")
        state = self.run("sinfo", "-h", "-N", "-o", "%T", check=False, timeout=20).split()
        return state == ["idle"]

    def stop(self) -> None:
        if self.processes and all(p.poll() is None for p in self.processes):
            self.run("scancel", "--full", "--user=root", check=False, timeout=30)
            wait_until(lambda: not self.run("squeue", "-h", check=False, timeout=20).strip(), 30, "the queue to empty",
                       interval=0.2, fail=lambda _: None)  # what is left is killed below
        for process in reversed(self.processes):
            stop_process(process, timeout=15)
        for pid in self._ours():  # steps and tasks that outlived slurmd
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            kill_hard(int((self.pipe / "arbiter.pid").read_text()))
        except (FileNotFoundError, ValueError):
            pass

    def _ours(self) -> list[int]:
        marker = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if marker in (entry / "environ").read_bytes().split(b"\0"):
                        pids.append(int(entry.name))
                except OSError:
                    pass
        return pids


@contextmanager
def running_cluster(root: Path):
    """A running one-node cluster with the libshare recipe in ``root`` (everything stopped afterwards)."""
    ensure_slurm()
    cluster = Cluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(tmp_path, vulkan_device_name):
    """A running one-node cluster with the libshare recipe."""
    with running_cluster(tmp_path / "slurm") as cluster:
        yield cluster
