"""The Vulkan driver's data path under an unmodified program: submissions through the ring, fences,
semaphores, events, and the device lost.

tests/icd/_queue.py (the ``vulkan`` bindings, through the real loader and ``libshare-run``, against a
real arbiter with lavapipe behind it) submits work with no command buffer: each submission is a
LS_OP_NOP the arbiter counts among the session's dispatches (``ps``) and answers before its fence
signals; a timeline wait holds a submission until the host signals; vkQueueSubmit2KHR (a driver built
with VK_KHR_synchronization2 offered); terminate_client and the arbiter's SIGKILL make the device lost
(VK_ERROR_DEVICE_LOST, no hang) while an honest client is unaffected; vkDestroyDevice leaves no ring,
descriptor or thread behind; hostile handles and a pending fence reused are VK_ERROR_UNKNOWN beside an
honest client whose results are checked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from libshare.icd import _build
from tests.conftest import ROOT, stop_process
from tests.arbiter.conftest import start_client
from tests.control.conftest import control
from tests.icd.conftest import environment, libshare_run, probe

QUEUE = Path(__file__).resolve().parent / "_queue.py"
INVALID = "VkErrorUnknown"  # VK_ERROR_UNKNOWN: invalid input the driver detected
UNKNOWN = -13  # VK_ERROR_UNKNOWN as a VkResult, from a command called by its pointer
LOST = "VkErrorDeviceLost"


def start_queue(pipe_dir: Path, mode: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(libshare_run("--name", f"queue-{mode}", "--", sys.executable, str(QUEUE), mode),
                            env=environment(pipe_dir, **env), cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def dispatches(pipe_dir: Path, pid: int) -> list[int]:
    """The dispatches column of ``ps`` for each session of process ``pid``."""
    table = control("--pipe-directory", str(pipe_dir), "ps").stdout.splitlines()
    column = table[0].split().index("DISPATCHES") if table else 0
    return [int(line.split()[column]) for line in table[1:] if line.split()[:1] == [str(pid)]]


def test_empty_submissions_go_through_the_ring_and_fences_follow_its_answers(daemon):
    _process, pipe_dir = daemon
    with start_queue(pipe_dir, "honest") as program:
        try:
            seen = json.loads(program.stdout.readline())
            counted = dispatches(pipe_dir, program.pid)  # while the device lives
        finally:
            program.stdin.close()
            program.wait(60)
    assert program.returncode == 0
    assert seen["fences"] == [["ok", "ok", "ok"]] * 6
    assert seen["binary"] == ["ok", "ok", "ok"]
    assert seen["timeline"] == {
        "held": "ok", "fence while held": "VkNotReady", "fence wait while held": "VkTimeout",
        "wait for 7": "VkTimeout", "value": 1, "signal 5": "ok", "wait for 7 after": "ok", "fence": "ok",
        "value after": 7}
    assert seen["event"] == ["VkEventReset", "ok", "VkEventSet", "ok", "VkEventReset"]
    assert seen["idle"] == ["ok", "ok"]
    # the instance's session pushes nothing; the device's pushed a NOP for each submission that had a
    # fence or semaphore to signal: 6 fences, the binary pair, the held one once released
    assert sorted(counted) == [0, 6 + 2 + 1]


@pytest.fixture
def sync2_driver(tmp_path) -> Path:
    """The driver built with VK_KHR_synchronization2 offered, and its manifest's path."""
    library = tmp_path / "sync2_icd.so"
    subprocess.run(["cc", *_build.FLAGS, "-DLS_ICD_OFFERS_SYNC2=1", "-o", str(library), *map(str, _build.SOURCES),
                    "-lcjson", "-lm"], check=True)
    return _build.write_manifest(library, tmp_path / "sync2.json")


def test_vk_queue_submit2_signals_fences_and_timeline_semaphores(daemon, sync2_driver):
    _process, pipe_dir = daemon
    seen = probe([sys.executable, str(QUEUE), "submit2"], environment(pipe_dir, VK_DRIVER_FILES=str(sync2_driver)))
    assert {key: value for key, value in seen.items() if key != "stderr"} == {
        "empty": "ok", "empty fence": "ok", "held": "ok", "fence while held": "VkNotReady", "signal 2": "ok",
        "fence": "ok", "value": 3}


def test_vk_destroy_device_leaves_no_ring_descriptor_or_thread_behind(daemon):
    _process, pipe_dir = daemon
    seen = probe(libshare_run("--name", "queue-leaks", "--", sys.executable, str(QUEUE), "leaks"),
                 environment(pipe_dir))
    # the device's session: its socket, the ring's memfd (mapped once), the doorbell, the arbiter's pidfd
    assert seen["device"]["rings"] == seen["instance"]["rings"] + 1
    assert seen["device"]["fds"] == seen["instance"]["fds"] + 4
    assert seen["device"]["threads"] == seen["instance"]["threads"]  # the driver starts none
    assert seen["destroyed"] == seen["instance"]


def run_until_ready(pipe_dir: Path) -> subprocess.Popen:
    program = start_queue(pipe_dir, "lost")
    assert program.stdout.readline() == "ready\n"
    return program


def finish(program: subprocess.Popen) -> dict:
    out, _err = program.communicate("go\n", timeout=120)
    assert program.returncode == 0
    return json.loads(out.splitlines()[-1])


EVERY_WAIT_LOST = {"wait": LOST, "status": LOST, "queue idle": LOST, "device idle": LOST, "semaphore wait": LOST,
                   "submit again": LOST}


def test_terminate_client_makes_the_device_lost_beside_an_honest_client(daemon):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 5, 20)  # checks every result against numpy
    program = run_until_ready(pipe_dir)
    try:
        control("--pipe-directory", str(pipe_dir), "terminate_client", str(program.pid))
        seen = finish(program)
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(program)
        stop_process(honest)
    assert seen == {"submit": LOST, **EVERY_WAIT_LOST}


def test_the_arbiter_killed_under_a_program_makes_its_waits_device_lost(daemon):
    process, pipe_dir = daemon
    program = run_until_ready(pipe_dir)
    try:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(60)
        seen = finish(program)
    finally:
        stop_process(program)
    # the push may still land in the dead arbiter's ring; the wait for its answer is what notices
    assert seen["submit"] in ("ok", LOST)
    assert {key: value for key, value in seen.items() if key != "submit"} == EVERY_WAIT_LOST


def test_hostile_handles_and_a_pending_fence_reused_are_refused_beside_an_honest_client(daemon):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 5, 20)
    try:
        seen = probe(libshare_run("--name", "queue-hostile", "--", sys.executable, str(QUEUE), "hostile"),
                     environment(pipe_dir))
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)
    assert {key: value for key, value in seen.items() if key != "stderr"} == {
        "wait wrong fence": INVALID, "status of wrong fence": INVALID, "submit wrong fence": INVALID,
        "wait wrong semaphore": INVALID, "signal wrong semaphore": INVALID, "host signal wrong": INVALID,
        "binary never signaled": INVALID, "binary as timeline": INVALID, "held": "ok",
        "pending fence again": INVALID, "pending fence reset": INVALID, "signal 4": "ok",
        "signal back to 2": INVALID, "signaled fence submitted": "ok",
        "signaled fence behind held work": ["ok", "VkNotReady", "ok"], "wrong event": INVALID,
        "idle of no device": UNKNOWN, "idle of no queue": UNKNOWN,
        "still works": ["ok", "ok"]}
