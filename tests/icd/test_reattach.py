"""A Vulkan application's device through its arbiter's death (docs/icd.md, "Surviving a restart").

Real processes on lavapipe: an unmodified program (_restart.py) under libshare-run, its arbiter
SIGKILLed between two submissions of the same command buffer. Under a control daemon
(``libshare-control -d``) the device moves to the new arbiter: the submission runs there (numpy
checks it) over the same host-visible memory (and device-local memory on lavapipe, where it is shared
memory too; on a GPU a device holding it is lost); a device whose submission was in flight (pushed
while the arbiter was stopped, then killed) is lost; with no control daemon the death is
VK_ERROR_DEVICE_LOST at once.
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


def test_work_in_flight_at_the_death_loses_the_device(tmp_path, vulkan_device_name, step):
    daemon = Daemon(tmp_path / "pipe")
    try:
        app = App(daemon.pipe, "flight", step)
        first_ran(app)
        old = daemon.arbiter()
        os.kill(old, signal.SIGSTOP)  # it takes nothing from the ring now: the next submission stays in flight
        try:
            assert app.step() == {"submit": "ok"}
        finally:
            os.kill(old, signal.SIGKILL)
        assert exited(old, 60)
        second, err = app.go_on()
        # It may have run: its fence's wait, and every later submission, answer DEVICE_LOST.
        assert (second["wait"], second["submit"], second["again"]) == ("VkErrorDeviceLost",) * 3, second
        assert "moved to pid" not in err
        assert second["C"] == (np.arange(N, dtype=np.uint32) ^ 0x5A5A).tolist()
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
