"""A Vulkan application's device through its arbiter's death (docs/icd.md, "Surviving a restart").

Real processes on lavapipe: an unmodified program (_restart.py) under libshare-run, its arbiter
SIGKILLed between two submissions of the same command buffer. Under a control daemon
(``libshare-control -d``) the device moves to the new arbiter: the submission runs there (numpy
checks it) over the same host-visible memory (and device-local memory on lavapipe, where it is shared
memory too; on a GPU a device holding it is lost); a submission the arbiter never took (pushed while
it was stopped, then killed) is pushed again to the new one and runs there, while one it took and
was running at the kill loses the device (it may have run in part); with no control daemon the
death is VK_ERROR_DEVICE_LOST at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from libshare._proc import stat_fields
from tests.arbiter.conftest import wait_until
from tests.arbiter.test_reattach import Daemon, exited
from tests.icd.conftest import environment, libshare_run
from tests.icd.test_commands import N, SCALE, step  # noqa: F401 (the fixture)

RESTART = Path(__file__).resolve().parent / "_restart.py"
ADD = 7  # as _restart.py


class App:
    """_restart.py under libshare-run: its first line read, then told to go on."""

    def __init__(self, pipe_dir: Path, mode: str, spv: Path):
        self.process = subprocess.Popen(libshare_run("--name", "restart", "--", sys.executable, str(RESTART), mode,
                                                     str(spv)), env=environment(pipe_dir), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line, self.process.communicate(timeout=60)[1][-3000:]
        self.first = json.loads(line)

    def step(self) -> dict:
        """Tell it to go on, and read the line it prints next."""
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, self.process.communicate(timeout=60)[1][-3000:]
        return json.loads(line)

    def go_on(self) -> tuple[dict, str]:
        """The second line and the program's stderr (it must exit 0)."""
        out, err = self.process.communicate("go\n", timeout=120)
        assert self.process.returncode == 0, err[-3000:]
        return json.loads(out.splitlines()[0]), err


def expected(a: np.ndarray) -> list[int]:
    return (a * SCALE + ADD).astype(np.uint32).tolist()


def first_ran(app: App) -> None:
    assert (app.first["end"], app.first["submit"]) == ("ok", "ok"), app.first
    assert app.first["B"] == expected(np.arange(N, dtype=np.uint32))


def kill_and_replace(daemon: Daemon) -> int:
    """SIGKILL the arbiter serving now; the pid of the one the daemon starts in its place."""
    old = daemon.arbiter()
    os.kill(old, signal.SIGKILL)
    assert exited(old, 60)
    return wait_until(lambda: (lambda pid: pid if pid not in (None, old) else None)(daemon.arbiter()), 60,
                      "a new arbiter")


@pytest.mark.parametrize("mode", ["survive", "control"])
def test_a_device_moves_to_the_new_arbiter_and_its_command_buffer_runs_there(tmp_path, vulkan_device_name, step,
                                                                             mode):
    """The move made by a submission (survive), or by vkEndCommandBuffer's load_list (control)."""
    daemon = Daemon(tmp_path / "pipe")
    try:
        app = App(daemon.pipe, mode, step)
        first_ran(app)
        new = kill_and_replace(daemon)
        second, err = app.go_on()
        assert (second["submit"], second["again"]) == ("ok", "ok"), err[-3000:]
        a = np.arange(N, dtype=np.uint32) * 5 + 1  # written before the restart: the same pages read
        assert second["B"] == expected(a)
        assert second["C"] == (np.arange(N, dtype=np.uint32) ^ 0x5A5A).tolist()  # kept over the restart
        assert f"the device moved to pid {new}" in err
        assert (second["later end"], second["later"]) == ("ok", "ok")  # made on the new arbiter, ids above the kept
        assert second["C later"] == (np.array(second["B"], np.uint32) * SCALE + ADD + 1).astype(np.uint32).tolist()
    finally:
        daemon.stop()


def test_device_local_memory_moves_on_a_cpu_device_and_is_lost_on_a_gpu(tmp_path, vulkan_device_name, step,
                                                                        vulkan_device_is_cpu):
    """On lavapipe the device-local type is shared memory (memory.c): its pages outlive the arbiter,
    and what a fill wrote there before the kill is copied out after it. On a GPU it died: lost."""
    daemon = Daemon(tmp_path / "pipe")
    try:
        app = App(daemon.pipe, "device", step)
        first_ran(app)
        new = kill_and_replace(daemon)
        second, err = app.go_on()
        if vulkan_device_is_cpu:
            assert (second["submit"], second["again"], second["copy"]) == ("ok",) * 3, err[-3000:]
            assert f"the device moved to pid {new}" in err
            assert second["D"] == [0x0D0D0D0D] * 1024  # filled before the kill
            assert second["B"] == expected(np.arange(N, dtype=np.uint32) * 5 + 1)
        else:
            assert (second["submit"], second["again"]) == ("VkErrorDeviceLost",) * 2, second
            assert "device-local memory died with it" in err
        assert second["C"] == (np.arange(N, dtype=np.uint32) ^ 0x5A5A).tolist()  # the host's pages stay
    finally:
        daemon.stop()


def test_work_the_dead_arbiter_never_took_is_pushed_again_to_the_new_one(tmp_path, vulkan_device_name, step):
    """A submission pushed while the arbiter is stopped stays in the ring's lane, untaken; the
    arbiter is killed: the fence's wait moves the device and the work runs on the new arbiter."""
    daemon = Daemon(tmp_path / "pipe")
    try:
        app = App(daemon.pipe, "flight", step)
        first_ran(app)
        old = daemon.arbiter()
        os.kill(old, signal.SIGSTOP)  # once every thread stopped, it takes nothing from the ring
        try:
            wait_until(lambda: stopped(old), 60, "every thread of the arbiter stopped")
            assert app.step() == {"submit": ["ok"]}  # so this submission stays in the lane
        finally:
            os.kill(old, signal.SIGKILL)
        assert exited(old, 60)
        new = wait_until(lambda: (lambda pid: pid if pid not in (None, old) else None)(daemon.arbiter()), 60,
                         "a new arbiter")
        second, err = app.go_on()
        assert (second["wait"], second["submit"], second["again"]) == ("ok",) * 3, err[-3000:]
        assert f"the device moved to pid {new}" in err
        assert second["B"] == expected(np.arange(N, dtype=np.uint32) * 5 + 1)  # it ran, on the same pages
        assert second["C"] == (np.arange(N, dtype=np.uint32) ^ 0x5A5A).tolist()
    finally:
        daemon.stop()


def stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T in its /proc stat)."""
    return all((stat_fields(pid, int(tid)) or ["T"])[0] in ("T", "t") for tid in os.listdir(f"/proc/{pid}/task"))


def submitted(pipe: Path, pid: int) -> int:
    """The descriptors the arbiter took from process ``pid``'s sessions (ps's SUBMITTED), summed."""
    table = subprocess.run([sys.executable, "-m", "libshare.control", "--pipe-directory", str(pipe), "ps", "-p",
                            str(pid)], capture_output=True, text=True, timeout=60).stdout
    return sum(int(row.split()[6]) for row in table.splitlines()[1:] if row.split()[:1] == [str(pid)])


def test_work_the_dead_arbiter_took_and_never_answered_loses_the_device(tmp_path, vulkan_device_name, step):
    """A long command buffer the arbiter took (ps counts it) and runs when it is killed may have run
    in part: its fence's wait, and every later submission, answer VK_ERROR_DEVICE_LOST."""
    daemon = Daemon(tmp_path / "pipe")
    try:
        app = App(daemon.pipe, "taken", step)
        first_ran(app)
        pid = app.process.pid
        before = submitted(daemon.pipe, pid)
        assert app.step() == {"submit": ["ok", "ok"]}
        wait_until(lambda: submitted(daemon.pipe, pid) > before, 60, "the arbiter taking the long command buffer")
        kill_and_replace(daemon)
        second, err = app.go_on()
        assert (second["wait"], second["submit"], second["again"]) == ("VkErrorDeviceLost",) * 3, second
        assert "work it had taken unanswered" in err and "moved to pid" not in err
        assert second["C"] == (np.arange(N, dtype=np.uint32) ^ 0x5A5A).tolist()
    finally:
        daemon.stop()


def test_a_hand_over_with_work_in_flight_moves_the_device_and_loses_nothing(tmp_path, vulkan_device_name, step):
    """``libshare-control restart`` while the arbiter runs a long command buffer with another behind
    it: the old arbiter finishes what it took, or answers it LS_EMOVED and the driver pushes it
    again; the fence's wait answers, and the device goes on on the new arbiter."""
    daemon = Daemon(tmp_path / "pipe")
    try:
        app = App(daemon.pipe, "taken", step)
        first_ran(app)
        old = daemon.arbiter()
        assert app.step() == {"submit": ["ok", "ok"]}
        assert "hands over" in daemon.run("restart")
        assert exited(old, 120)
        new = daemon.arbiter()
        second, err = app.go_on()
        assert (second["wait"], second["submit"], second["again"]) == ("ok",) * 3, err[-3000:]
        assert f"the device moved to pid {new}" in err
        assert second["B"] == expected(np.arange(N, dtype=np.uint32) * 5 + 1)
    finally:
        daemon.stop()


def test_an_unsupervised_arbiter_s_death_loses_the_device_without_a_wait(daemon, step):
    process, pipe_dir = daemon
    app = App(pipe_dir, "survive", step)
    first_ran(app)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    second, err = app.go_on()
    assert (second["submit"], second["again"]) == ("VkErrorDeviceLost",) * 2, second
    assert "moved to pid" not in err and "no arbiter took over" not in err  # no dial: refused before it
