"""The Vulkan driver's command pools and command buffers under an unmodified program.

tests/icd/_commands.py (the ``vulkan`` bindings, through the real loader and ``libshare-run``, against a
real arbiter with lavapipe behind it) records copies, fills, updates, barriers and secondary command
buffers, which vkEndCommandBuffer loads as the arbiter's command lists (the arbiter checks every
command: its acceptance is what vkEndCommandBuffer answers); a command buffer of 1500 commands is two
lists; the arbiter's bound on a session's lists refuses the 65th with VK_ERROR_OUT_OF_DEVICE_MEMORY
until one is freed; and hostile recording ends in a Vulkan error for that program only, beside an
honest client whose results are checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import stop_process
from tests.arbiter.conftest import start_client
from tests.icd.conftest import environment, libshare_run, probe

COMMANDS = Path(__file__).resolve().parent / "_commands.py"
INVALID = "VkErrorUnknown"  # VK_ERROR_UNKNOWN: invalid input the driver detected


def run_commands(pipe_dir: Path, *args: str, **env: str) -> dict:
    return probe(libshare_run("--name", "commands", "--", sys.executable, str(COMMANDS), *args),
                 environment(pipe_dir, **env))


def test_transfers_long_and_secondary_command_buffers_are_loaded_as_lists(daemon):
    _process, pipe_dir = daemon
    seen = run_commands(pipe_dir, "lists")
    assert {key: value for key, value in seen.items() if key != "stderr"} == {
        "transfers": "ok", "1500 commands": "ok", "empty": "ok", "secondary": "ok", "executes": "ok",
        "reset": "ok", "pool reset": "ok", "after pool reset": "ok"}, seen


def test_a_sessions_list_bound_refuses_with_out_of_device_memory_until_one_is_freed(daemon):
    _process, pipe_dir = daemon
    seen = run_commands(pipe_dir, "quota")
    assert seen["ended"] == 64 and seen["first refused"] == 64, seen  # LISTS_PER_CLIENT, serve/requests.py
    assert seen["after a free"] == "ok", seen


def test_hostile_recording_ends_in_vulkan_errors_beside_an_honest_client(daemon):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 5, 20)  # checks every result against numpy
    try:
        seen = run_commands(pipe_dir, "hostile")
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)
    assert {key: value for key, value in seen.items() if key != "stderr"} == {
        "copy past a buffer": INVALID, "copy of size 0": INVALID, "fill not of words": INVALID,
        "fill past a buffer": INVALID, "update past 65536 bytes": INVALID, "wrong buffer": INVALID,
        "unbound buffer": INVALID, "dispatch with no pipeline": INVALID,
        "indirect dispatch with no pipeline": INVALID, "wrong pipeline": INVALID, "graphics bind point": INVALID,
        "push constants past 128 bytes": INVALID, "secondary not executable": INVALID,
        "destroyed buffer": INVALID, "ended": "ok", "ended twice": INVALID, "reset without the flag": INVALID,
        "begin again without the flag": INVALID, "pool reset": "ok", "begin after the pool reset": "ok",
        "still there": "ok", "honest": "ok"}, seen
    assert "a command buffer is invalid: vkCmdCopyBuffer" in seen["stderr"]  # each failure said once, on stderr
