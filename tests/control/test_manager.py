"""libshare.manager: one daemon per pipe directory, counted leases, quit after the last, under threads."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading

import pytest

from libshare.protocol import control as _control
from libshare import manager
from libshare.errors import StartFailed

from tests.conftest import ROOT
from tests.control.conftest import alive, wait_dead


def _starts(dirs) -> list[str]:
    """Pids of the arbiters that logged their start in this test's control.log."""
    return re.findall(r"arbiter pid (\d+) starting", (dirs.log / "control.log").read_text())


def _in_threads(count: int, work) -> None:
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            work(index)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the test's thread below)
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if failures:
        raise failures[0]


def test_concurrent_leases_share_one_daemon_that_quits_after_the_last(dirs, vulkan_device_name):
    holding = threading.Barrier(16)
    leases: list[manager.Lease] = [None] * 16

    def hold(index: int) -> None:
        leases[index] = manager.acquire(pipe_directory=dirs.pipe, log_directory=dirs.log)
        holding.wait(60)  # all sixteen hold a lease at once
        assert _control.run("get_server_list", pipe_directory=dirs.pipe).split() == [str(leases[index].pid)]
        holding.wait(60)
        leases[index].release()

    _in_threads(16, hold)
    pids = {lease.pid for lease in leases}
    assert len(pids) == 1 and _starts(dirs) == [str(pid) for pid in pids]
    assert sum(lease.started for lease in leases) == 16  # each lease reports the manager's own daemon
    assert wait_dead(pids.pop(), 5)  # release() returned after the daemon exited
    assert not dirs.socket.exists() and not dirs.lock.exists()


def test_churning_leases_never_see_two_daemons(dirs, vulkan_device_name):
    def churn(index: int) -> None:
        rng = random.Random(index)
        for _ in range(4):
            with manager.acquire(pipe_directory=dirs.pipe, log_directory=dirs.log) as lease:
                for _ in range(1 + rng.randrange(3)):  # holds the lease for a varying stretch of requests
                    assert _control.run("get_server_status", pipe_directory=dirs.pipe).strip() == "ACTIVE"
                assert dirs.server_pid() == lease.pid

    _in_threads(6, churn)
    log = (dirs.log / "control.log").read_text()
    assert "did not start" not in log, log  # no daemon was ever started beside a running one
    assert _starts(dirs) and all(not alive(int(pid)) for pid in _starts(dirs))
    assert not dirs.socket.exists() and not dirs.lock.exists()


def test_an_arbiter_already_running_is_used_but_never_quit(dirs, daemon):
    with manager.acquire(pipe_directory=dirs.pipe, log_directory=dirs.log) as lease:
        assert lease.pid == daemon and not lease.started
    assert alive(daemon) and _control.run("get_server_status", pipe_directory=dirs.pipe).strip() == "ACTIVE"


def test_environment_attaches_workloads_to_the_arbiter(dirs, vulkan_device_name):
    script = ("import os, libshare\n"
              "from libshare.protocol import control as _control\n"
              "with libshare.connect(name='workload'):  # LIBSHARE_MODE=daemon: no embedded fallback\n"
              "    assert str(os.getpid()) in _control.run('get_client_list').split()\n"
              "print('ok')\n")
    with manager.acquire(device=0, pipe_directory=dirs.pipe, log_directory=dirs.log) as lease:
        env = {**os.environ, **lease.environment}
        assert lease.environment == {"LIBSHARE_PIPE_DIRECTORY": str(dirs.pipe), "LIBSHARE_MODE": "daemon",
                                     "LIBSHARE_LOG_DIRECTORY": str(dirs.log), "LIBSHARE_DEVICE": "0"}
        child = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                               text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout == "ok\n"
    assert "workload" in (dirs.log / "server.log").read_text()


def test_a_pipe_directory_serves_one_device(dirs, vulkan_device_name):
    with manager.acquire(device="0", pipe_directory=dirs.pipe, log_directory=dirs.log):
        with pytest.raises(ValueError, match="one arbiter serves one device"):
            manager.acquire(device="1", pipe_directory=dirs.pipe, log_directory=dirs.log)
        with manager.acquire(pipe_directory=dirs.pipe, log_directory=dirs.log) as any_device:
            assert any_device.device == "0"  # the device the arbiter serves


def test_a_failed_start_leaves_no_lease_behind(dirs, vulkan_device_name):
    with pytest.raises(StartFailed, match="no-such-device"):
        manager.acquire(device="no-such-device", pipe_directory=dirs.pipe, log_directory=dirs.log)
    with manager.acquire(device="0", pipe_directory=dirs.pipe, log_directory=dirs.log) as lease:
        assert lease.started and alive(lease.pid)
    assert wait_dead(lease.pid, 5)


def test_release_is_idempotent(dirs, vulkan_device_name):
    first = manager.acquire(pipe_directory=dirs.pipe, log_directory=dirs.log)
    second = manager.acquire(pipe_directory=dirs.pipe, log_directory=dirs.log)
    first.release()
    first.release()  # must not count twice: the second lease still holds the daemon
    assert alive(second.pid)
    manager.release(second)
    assert wait_dead(second.pid, 5)
