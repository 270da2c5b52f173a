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

import numpy as np
import pytest

from tests.conftest import stop_process
from tests.arbiter.conftest import start_client
from tests.icd.conftest import compiled, environment, libshare_run, probe

COMMANDS = Path(__file__).resolve().parent / "_commands.py"
DISPATCHES = Path(__file__).resolve().parent / "_dispatches.py"
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
    """A session's lists hold 65536 commands together (LIST_COMMANDS_PER_CLIENT, serve/requests.py): 64
    command buffers of 1024, the 65th refused until one is freed; 300 short ones live at once."""
    _process, pipe_dir = daemon
    seen = run_commands(pipe_dir, "quota")
    assert seen["ended"] == 64 and seen["first refused"] == 64, seen
    assert seen["after a free"] == "ok", seen
    assert seen["short ended"] == 300, seen


def test_a_command_buffer_is_recorded_again_without_the_pools_reset_flag_but_never_while_pending(daemon):
    """Kompute begins its sequences' command buffers again, from a pool without RESET_COMMAND_BUFFER_BIT:
    each new recording is what runs (the fills' values read back), and a pending one is never reset."""
    _process, pipe_dir = daemon
    seen = run_commands(pipe_dir, "rerecord")
    assert seen["begun again"] == ["ok"] * 3, seen
    assert seen["filled"] == [[5] * 4, [9] * 4, [13] * 4], seen
    assert seen["reset"] == "ok" and seen["after the reset"] == [13, 21, 21, 13], seen
    assert seen["one-time again"] == [0, 21, 21, 0], seen  # the memory zeroed between: the fill ran again
    assert seen["rounded fill and empty region"] == [0x33, 0x33, 0, 0x33], seen  # as lavapipe: 10 bytes fill 2 words
    assert seen["begun while pending"] == INVALID and seen["reset while pending"] == INVALID, seen
    assert seen["begun once done"] == "ok", seen


def test_hostile_recording_ends_in_vulkan_errors_beside_an_honest_client(daemon):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 5, 20)  # checks every result against numpy
    try:
        seen = run_commands(pipe_dir, "hostile")
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)
    assert {key: value for key, value in seen.items() if key != "stderr"} == {
        "copy past a buffer": INVALID, "copy of size 0": "ok", "fill not of words": INVALID,
        "fill past a buffer": INVALID, "update past 65536 bytes": INVALID, "wrong buffer": INVALID,
        "unbound buffer": INVALID, "dispatch with no pipeline": INVALID,
        "indirect dispatch with no pipeline": INVALID, "wrong pipeline": INVALID, "graphics bind point": INVALID,
        "push constants past 128 bytes": INVALID, "secondary not executable": INVALID,
        "destroyed buffer": INVALID, "ended": "ok", "ended twice": INVALID, "pool reset": "ok",
        "begin after the pool reset": "ok",
        "still there": "ok", "honest": "ok"}, seen
    assert "a command buffer is invalid: vkCmdCopyBuffer" in seen["stderr"]  # each failure said once, on stderr


STEP = """#version 450
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint SCALE = 1;
layout(set = 0, binding = 0) buffer Src { uint src[]; };
layout(set = 0, binding = 1) buffer Dst { uint dst[]; };
layout(push_constant) uniform Push { uint add; uint n; } p;
void main()
{
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n)
        dst[i] = src[i] * SCALE + p.add;
}
"""
"""dst = src * SCALE + add, in uint32 (numpy's wrap-around is the device's)."""
N, SCALE = 1024, 3  # as _dispatches.py


@pytest.fixture
def step(tmp_path):
    return compiled(tmp_path, "step", STEP)


def run_dispatches(pipe_dir: Path, mode: str, spv: Path) -> dict:
    return probe(libshare_run("--name", "dispatches", "--", sys.executable, str(DISPATCHES), mode, str(spv)),
                 environment(pipe_dir))


def step_once(a: np.ndarray, b: np.ndarray, k: int) -> None:
    """The k-th dispatch of a chain: A -> B for an even k, B -> A for an odd one, adding k."""
    if k % 2 == 0:
        b[:] = a * SCALE + k
    else:
        a[:] = b * SCALE + k


def test_a_chain_of_dispatches_copies_fills_and_updates_replays_as_numpy_says(daemon, step):
    _process, pipe_dir = daemon
    seen = run_dispatches(pipe_dir, "chain", step)
    assert (seen["end"], seen["submit"], seen["secondary end"], seen["primary end"], seen["primary submit"],
            seen["long end"], seen["long submit"]) == ("ok",) * 7, seen
    a, b, c = np.arange(N, dtype=np.uint32), np.zeros(N, np.uint32), np.zeros(N, np.uint32)
    for submitted in seen["rounds"]:  # the same command buffer, submitted three times: each from the last
        for k in range(120):
            step_once(a, b, k)
            if k % 10 == 9:
                c[k // 10:k // 10 + 16] = a[:16]
                c[100 + k:104 + k] = k
                a[2 * k:2 * k + 4] = k
        assert [np.array_equal(np.array(got, np.uint32), want) for got, want in zip(submitted, (a, b, c))] == \
            [True] * 3
    for _ in range(2):  # the secondary, executed twice: B = A * 3 + 5, then A = B
        b[:] = a * SCALE + 5
        a[:] = b
    assert np.array_equal(np.array(seen["after secondary"][0], np.uint32), a)
    assert np.array_equal(np.array(seen["after secondary"][1], np.uint32), b)
    for k in range(1100):  # more than a list's 1024 commands: two lists, in order
        step_once(a, b, k)
    assert np.array_equal(np.array(seen["after long"][0], np.uint32), a)
    assert np.array_equal(np.array(seen["after long"][1], np.uint32), b)


def test_push_constants_and_dynamic_offsets_change_results(daemon, step):
    _process, pipe_dir = daemon
    seen = run_dispatches(pipe_dir, "dynamic", step)
    assert (seen["end"], seen["submit"]) == ("ok", "ok"), seen
    a = np.arange(N, dtype=np.uint32)
    assert np.array_equal(np.array(seen["output"], np.uint32), np.concatenate([a * SCALE + 7, a * SCALE + 11]))


def test_indirect_dispatches_synchronization2_events_and_a_dispatch_base(daemon, step):
    _process, pipe_dir = daemon
    seen = run_dispatches(pipe_dir, "extras", step)
    assert (seen["end"], seen["submit"]) == ("ok", "ok"), seen
    assert seen["events before"] == ["VkEventReset", "VkEventSet"], seen  # the host set the second
    assert seen["events after"] == ["VkEventSet", "VkEventReset"], seen  # applied when the submission was answered
    b = np.arange(N, dtype=np.uint32) * SCALE + 9  # the indirect dispatch's (N / 64 groups), then copied back
    assert np.array_equal(np.array(seen["output"][1], np.uint32), b)
    assert np.array_equal(np.array(seen["output"][0], np.uint32), b)
    assert (seen["base end"], seen["base submit"]) == ("ok", "ok"), seen
    c = np.zeros(N, np.uint32)
    c[2 * 64:5 * 64] = b[2 * 64:5 * 64] * SCALE + 4  # workgroups 2..4 alone (vkCmdDispatchBase)
    assert np.array_equal(np.array(seen["based"], np.uint32), c)


def test_recordings_of_the_same_content_share_lists_and_groups_the_arbiter_holds(daemon, step):
    """100 command buffers recorded alike, held at once, end: more than a session's 64 lists unless
    the driver shares one list (and so one bind group) among them (libshare/icd/cache.c). A primary
    still runs after the secondary it inlined is freed (the primary holds its group), and a dispatch
    recorded again over memory allocated after the old one was freed writes the new memory."""
    _process, pipe_dir = daemon
    seen = run_dispatches(pipe_dir, "shared", step)
    a = np.arange(N, dtype=np.uint32)
    assert (seen["alike ended"], seen["alike submitted"]) == (100, "ok"), seen
    assert np.array_equal(np.array(seen["alike"], np.uint32), a * SCALE + 1)
    assert (seen["primary end"], seen["primary submitted"]) == ("ok", "ok"), seen
    assert np.array_equal(np.array(seen["primary"], np.uint32), a * SCALE + 5)
    for (answers, words), add in zip(seen["again"], (7, 9)):
        assert answers == ["ok", "ok"], seen["again"]
        assert np.array_equal(np.array(words, np.uint32), a * SCALE + add)


def test_hostile_dispatches_and_submissions_end_in_errors_beside_an_honest_client(daemon, step):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 5, 20)  # checks every result against numpy
    try:
        seen = run_dispatches(pipe_dir, "hostile", step)
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)
    assert (seen["unwritten descriptor"], seen["no set bound"], seen["dispatch base past the limit"]) == \
        (INVALID,) * 3, seen
    assert (seen["submitted"], seen["submitted again while pending"], seen["first waited"]) == \
        ("ok", INVALID, "ok"), seen
    assert seen["not a command buffer"] == INVALID, seen  # found among the device's, never followed
    assert seen["freed end"] == "ok" and seen["freed submit"] == "VkErrorDeviceLost", seen


ARRAYS = Path(__file__).resolve().parent / "_arrays.py"


def test_a_runtime_array_of_buffers_takes_its_bindings_descriptor_count(daemon, tmp_path):
    """The driver sends a runtime array's descriptorCount as its length (libshare/icd/pipeline.c)."""
    from tests.arbiter.test_runtime_arrays import PICK, _expected
    spv = compiled(tmp_path, "pick", PICK, "vulkan1.1")
    _process, pipe_dir = daemon
    seen = probe(libshare_run("--name", "arrays", "--", sys.executable, str(ARRAYS), str(spv)), environment(pipe_dir))
    assert (seen["pipeline"], seen["end"], seen["submit"], seen["wait"]) == ("ok",) * 4, seen
    assert seen["no descriptors"] == seen["40 descriptors"] == "VkErrorUnknown", seen  # LS_ICD_INVALID
    assert "given length 0" in seen["stderr"] and "given length 40" in seen["stderr"]  # the arbiter's refusals
    got = [np.array(words, np.uint32) for words in seen["buffers"]]
    assert all(np.array_equal(a, b) for a, b in zip(got[:3], _expected(3)))
    assert got[3][0] == 3 and not got[3][1:].any()


PUSHED = Path(__file__).resolve().parent / "_pushed.py"


def test_push_descriptors_add_up_and_run_as_numpy_and_the_direct_driver_say(daemon, step):
    """VK_KHR_push_descriptor, which the driver makes of descriptor sets it resolves when recording: two
    pushes that add up, a push through a template, then an ordinary set at the same number, in one
    command buffer submitted twice; what the driver refuses of push layouts (Vulkan leaves it undefined)."""
    _process, pipe_dir = daemon
    seen = probe(libshare_run("--name", "pushed", "--", sys.executable, str(PUSHED), "run", str(step)),
                 environment(pipe_dir))
    assert (seen["listed"], seen["most"], seen["end"], seen["submit"], seen["again"]) == \
        (True, 32, "ok", "ok", "ok"), seen
    a = np.arange(N, dtype=np.uint32)
    b, c = a * SCALE + 1, a * SCALE + 2  # the second push replaced binding 1 only: binding 0 still A
    d = b * SCALE + 3
    e = d * SCALE + 4
    assert [np.array_equal(np.array(got, np.uint32), want) for got, want in zip(seen["buffers"], (a, b, c, d, e))] \
        == [True] * 5, seen["stderr"][-2000:]
    direct = probe([sys.executable, str(PUSHED), "run", str(step)], environment(pipe_dir))
    if direct["listed"]:  # (lavapipe offers it; so does every desktop GPU's driver)
        assert direct["buffers"] == seen["buffers"]
    refused = probe(libshare_run("--name", "pushed", "--", sys.executable, str(PUSHED), "refusals", str(step)),
                    environment(pipe_dir))
    assert {k: v for k, v in refused.items() if k != "stderr"} == {
        "allocate": INVALID, "dynamic": INVALID, "two push sets": INVALID, "push into a plain set": INVALID}, refused
    assert "that set's layout is not of push descriptors" in refused["stderr"]
