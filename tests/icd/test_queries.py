"""The Vulkan driver's timestamp query pools under an unmodified program.

tests/icd/_queries.py (the ``vulkan`` bindings, through the real loader and ``libshare-run``, against a
real arbiter with lavapipe behind it) makes pools (timestamps alone offered), reads a new pool's results
(unavailable: VK_NOT_READY, or zeros with PARTIAL; availability 0), records resets, timestamps and
results copied (64- and 32-bit, with availability) into command buffers whose lists the arbiter
accepts (it checks every command: LS_OP_FILL, LS_OP_TIMESTAMP, LS_OP_COPY), and finds wrong use an
error of that program alone, beside an honest client whose results are checked. Submitted, the
timestamps around a chain of copies, and between the dispatches of a chain, increase, and WAIT_BIT, the
host's reads (64- and 32-bit) and the copied results agree; tests/icd/queries.c does the same in C, it and the driver under the sanitizers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.conftest import stop_process
from tests.arbiter.conftest import start_client
from tests.icd.conftest import environment, libshare_run, probe
from tests.icd.test_c_program import SANITIZE, sanitized_driver, sanitized_run
from tests.icd.test_commands import N, step, step_once  # noqa: F401 (step: the fixture of step.comp)

QUERIES = Path(__file__).resolve().parent / "_queries.py"
INVALID = "VkErrorUnknown"  # VK_ERROR_UNKNOWN: invalid input the driver detected
ABSENT = "VkErrorFeatureNotPresent"


def run_queries(pipe_dir: Path, *args: str) -> dict:
    return probe(libshare_run("--name", "queries", "--", sys.executable, str(QUERIES), *args), environment(pipe_dir))


def test_timestamp_pools_recorded_and_read_and_wrong_use_refused_beside_an_honest_client(daemon):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 5, 20)  # checks every result against numpy
    try:
        seen = run_queries(pipe_dir, "pools")
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)
    left = [0xABABABABABABABAB, 0xABABABAB]  # a word vkGetQueryPoolResults left alone (64- and 32-bit)
    assert seen.pop("new, waiting for none") == ["VkNotReady", [left[0]] * 8], seen  # unavailable: left alone
    assert seen.pop("new, with availability") == ["VkNotReady", [left[0], 0, left[0], 0]], seen
    assert seen.pop("new, partial") == ["ok", [0] * 4], seen  # 32-bit: value 0, availability 0, twice
    assert "vkCmdResetQueryPool: a wrong pool, or queries outside it" in seen.pop("stderr")
    assert seen == {
        "occlusion": ABSENT, "pipeline statistics": ABSENT, "no queries": INVALID, "recorded": "ok",
        "secondary": "ok", "reset past the pool": INVALID, "reset of none": INVALID,
        "timestamp past the pool": INVALID, "timestamp into a wrong pool": INVALID,
        "copy of queries past the pool": INVALID, "copy past the buffer": INVALID, "copy misaligned": INVALID,
        "copy with a stride of 0": INVALID, "copy with a stride too small": INVALID, "begin query": ABSENT,
        "end query": ABSENT, "results of a wrong pool": INVALID, "results past the pool": INVALID,
        "results into too little": INVALID, "results misaligned": INVALID, "results of a destroyed pool": INVALID,
        "timestamp into a destroyed pool": INVALID, "honest": "ok"}, seen


def test_timestamps_around_a_chain_of_copies_increase_and_every_way_to_read_them_agrees(daemon):
    _process, pipe_dir = daemon
    seen = run_queries(pipe_dir, "submitted")
    assert seen["ended"] == "ok" and seen["never written"] == "VkNotReady", seen
    assert seen["waited at once"] == seen["runs"][0]["waited"], seen  # WAIT_BIT before the fence: the same
    last = 0
    for run in seen["runs"]:
        assert (run["submit"], run["fence"], run["waited"][0]) == ("ok", "ok", "ok"), run
        words = run["waited"][1]  # WAIT_BIT with availability
        stamps, available = words[0::2], words[1::2]
        assert available == [1, 1, 1, 1] and last < stamps[0] < stamps[1] < stamps[2] < stamps[3], run
        assert run["64-bit"] == ["ok", stamps], run
        assert run["32-bit"] == ["ok", [word for stamp in stamps for word in (stamp & 0xFFFFFFFF, 1)]], run
        assert run["copied 64-bit"] == words, run  # vkCmdCopyQueryPoolResults, recorded after the chain
        assert run["copied 32-bit"] == run["32-bit"][1] and run["copied alone"] == stamps, run
        assert run["chain"] == [0x0102030401020304], run  # the copies ran, each after the one before
        last = stamps[3]  # the second submission's stamps come after the first's



def test_timestamps_between_a_chain_of_dispatches_increase_as_the_chain_runs(daemon, step):
    _process, pipe_dir = daemon
    seen = probe(libshare_run("--name", "queries", "--", sys.executable, str(QUERIES), "dispatches", str(step)),
                 environment(pipe_dir))
    assert (seen["end"], seen["submit"], seen["read"][0]) == ("ok", "ok", "ok"), seen
    words = seen["read"][1]
    stamps = words[0::2]
    assert words[1::2] == [1] * 5 and 0 < stamps[0] and all(x < y for x, y in zip(stamps, stamps[1:])), words
    assert seen["copied"] == words, seen  # vkCmdCopyQueryPoolResults after the chain: the same stamps
    a, b = np.arange(N, dtype=np.uint32), np.zeros(N, np.uint32)
    for k in range(40):
        step_once(a, b, k)
    assert seen["a"] == a.tolist() and seen["b"] == b.tolist()  # the chain ran, in order, around the stamps

QUERIES_C = Path(__file__).resolve().parent / "queries.c"
SANITIZED_SEEN = [  # what queries.c prints: VkResults (-8 FEATURE_NOT_PRESENT, -13 UNKNOWN, 1 NOT_READY), checks 1
    "occlusion -8", "pool 0", "end 0", "submit 0", "waited 0", "stamps 1", "fence 0", "copied 1", "copied_32 1",
    "filled 1", "narrow 0", "narrow_value 1", "unwritten 1", "left_alone 1", "unwritten_wait 1", "partial 0",
    "partial_zeros 1", "too_small -13", "past_pool -13", "null_data -13", "wrong_pool -13", "destroyed -13"]


def test_a_sanitized_c_program_and_driver_read_timestamps_every_way(tmp_path, daemon):
    """queries.c and the driver, both under AddressSanitizer and UndefinedBehaviorSanitizer: WAIT_BIT before
    the fence, the copies in the buffer, 32-bit reads and wrong use, without a memory error."""
    _process, pipe_dir = daemon
    manifest = sanitized_driver(tmp_path)
    program = tmp_path / "queries"
    subprocess.run(["cc", "-O1", "-g", *SANITIZE, "-o", str(program), str(QUERIES_C), "-lvulkan"], check=True)
    assert sanitized_run(program, environment(pipe_dir, VK_DRIVER_FILES=str(manifest))) == SANITIZED_SEEN
