"""Fixtures for the daemon and control CLI tests: pipe and log directories, arbiters that always die."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from libshare.protocol import paths as _config
from libshare.protocol.control import ControlConnection
from libshare._proc import running as alive  # a zombie waiting for a parent that never reaps counts as dead
from libshare.errors import LibshareError

from tests._wait import wait_until
from tests.conftest import ROOT, stop_process


def wait_dead(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` is gone; True if it went within ``timeout`` seconds."""
    return wait_until(lambda: not alive(pid), timeout, f"pid {pid} to end", interval=0.02, fail=lambda _: False)


def kill_hard(pid: int) -> None:
    """SIGTERM, then SIGKILL after 20 s: no test leaves an arbiter behind."""
    if not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    if not wait_dead(pid, 20):
        os.kill(pid, signal.SIGKILL)
        wait_dead(pid, 5)


def server_status(pipe_dir: Path) -> str | None:
    """get_server_status's answer, or None when no arbiter answers."""
    try:
        with ControlConnection(pipe_dir, timeout=5) as connection:
            return connection.run("get_server_status").strip()
    except LibshareError:
        return None


def wait_active(pipe_dir: Path, process: subprocess.Popen | None = None, timeout: float = 60) -> None:
    """Wait for the arbiter at ``pipe_dir`` to answer ACTIVE (fail early if ``process`` exits)."""

    def active() -> bool:
        if process is not None and process.poll() is not None:
            said = process.communicate()[1] or ""  # (None: its stderr was not piped)
            pytest.fail(f"the arbiter exited with {process.returncode}: {said[-2000:]}")
        return server_status(pipe_dir) == "ACTIVE"

    wait_until(active, timeout, f"an ACTIVE arbiter at {pipe_dir}", fail=pytest.fail)


def control(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``libshare-control ARGS`` (the module, so a stale console script cannot hide a change)."""
    return subprocess.run([sys.executable, "-m", "libshare.control", *args], input=stdin, text=True,
                          capture_output=True, cwd=ROOT, timeout=timeout)


class Dirs:
    """A test's pipe and log directories, and the options that name them."""

    def __init__(self, root: Path):
        self.pipe = root / "pipe"
        """The pipe directory (created by the arbiter)."""
        self.log = root / "log"
        """The log directory (created by the arbiter or the CLI)."""
        self.args = ["--pipe-directory", str(self.pipe), "--log-directory", str(self.log)]
        """The options that point an arbiter or the CLI at them."""

    @property
    def socket(self) -> Path:
        """The control socket."""
        return _config.socket_path(self.pipe)

    @property
    def lock(self) -> Path:
        """The PID lock file."""
        return _config.lock_path(self.pipe)

    def server_pid(self) -> int | None:
        """The pid written in the lock file, if there is one."""
        return _pid_in(self.lock)

    def control_daemon_pid(self) -> int | None:
        """The pid written in the control daemon's lock file, if there is one."""
        return _pid_in(_config.supervisor_lock_path(self.pipe))


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


@pytest.fixture
def dirs(tmp_path) -> Dirs:
    """Pipe and log directories under tmp_path; any control daemon and arbiter still serving them
    are killed afterwards (the daemon first: it would start a new arbiter)."""
    d = Dirs(tmp_path)
    yield d
    for pid in (d.control_daemon_pid(), d.server_pid()):
        if pid is not None:
            kill_hard(pid)


@pytest.fixture
def foreground(dirs, vulkan_device_name):
    """Start ``python -m libshare.arbiter ARGS`` for the test (killed afterwards); returns the starter."""
    started: list[subprocess.Popen] = []

    def start(*extra: str, wait: bool = True) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", *dirs.args, *extra], cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.append(process)
        if wait:
            wait_active(dirs.pipe, process)
        return process

    yield start
    for process in started:
        stop_process(process)
        process.stderr.close()


@pytest.fixture
def daemon(dirs, vulkan_device_name) -> int:
    """An arbiter started with ``libshare-control -d``; yields its pid (killed afterwards by ``dirs``)."""
    result = control("-d", *dirs.args)
    assert result.returncode == 0, result.stderr
    pid = dirs.server_pid()
    assert pid is not None and alive(pid)
    return pid
