"""Buffer views and texel buffers through the driver (libshare/icd/view.c) under an unmodified program.

tests/icd/_texels.py (the ``vulkan`` bindings, through the real loader and ``libshare-run``, against a
real arbiter with lavapipe behind it) reads a uniform texel buffer through a view that starts inside
its buffer and writes a storage texel buffer; the formats the arbiter's device makes views of report
their texel buffer features, and vkCreateBufferView refuses what the arbiter could not make. A set
naming a destroyed view, or a view whose memory was freed, fails its command buffer's recording:
nothing reaches the device. Under a control daemon the views live through the arbiter's SIGKILL: the
new arbiter makes them again under their ids, and the same set runs there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.arbiter.test_reattach import Daemon
from tests.icd.conftest import compiled, environment, libshare_run, probe
from tests.icd.test_reattach import kill_and_replace

PROGRAM = Path(__file__).resolve().parent / "_texels.py"
KERNEL = """#version 450
layout(local_size_x = 64) in;
layout(binding = 0) uniform samplerBuffer src;
layout(binding = 1, r32f) uniform writeonly imageBuffer dst;
void main() {
    int i = int(gl_GlobalInvocationID.x);
    imageStore(dst, i, vec4(texelFetch(src, i).x * 2.0 + 1.0));
}
"""
N, SRC_AT, PAGE = 256, 256, 4096  # _texels.py's


def expected() -> np.ndarray:
    src = np.arange(PAGE // 4, dtype=np.float32)  # _texels.py fills src's buffer so
    return src[SRC_AT // 4:SRC_AT // 4 + N] * 2 + 1  # the view starts SRC_AT bytes in


@pytest.fixture
def kernel(tmp_path) -> Path:
    return compiled(tmp_path, "texels", KERNEL)


@pytest.fixture
def seen(daemon, kernel) -> dict:
    _process, pipe_dir = daemon
    return probe(libshare_run("--name", "texels", "--", sys.executable, str(PROGRAM), str(kernel)),
                 environment(pipe_dir))


def test_a_kernel_reads_and_writes_texel_buffers_through_buffer_views(seen):
    assert np.array_equal(np.array(seen["output"], np.float32), expected()), seen["stderr"][-2000:]
    assert seen["beyond"] == [-7.0], seen["beyond"]  # dst past the dispatch's texels: untouched
    assert np.array_equal(np.array(seen["template"], np.float32), expected())  # the set written by a template


def test_the_texel_formats_of_the_arbiters_device_report_their_buffer_features(seen):
    assert seen["features"] == {"r32f": [True, True], "rgba8": [True, True], "r8_unorm": [False, False]}, seen


def test_a_view_the_arbiter_could_not_make_is_refused(seen):
    assert seen["alignment"] > 1, seen  # lavapipe's: 16, so a misaligned offset exists
    assert seen["refused"] == {"format": "VkErrorUnknown", "range": "VkErrorUnknown", "offset": "VkErrorUnknown",
                               "unbound": "VkErrorUnknown"}, seen["refused"]


def test_a_dispatch_through_a_destroyed_view_or_one_whose_memory_was_freed_fails_its_recording(seen):
    assert seen["destroyed"] == "VkErrorUnknown", seen
    assert seen["freed"] == "VkErrorUnknown", seen
    assert seen["stderr"].count("a texel buffer's view was destroyed, or its memory freed") == 2, seen["stderr"]


def test_views_live_through_the_arbiters_death_under_a_control_daemon(tmp_path, vulkan_device_name, kernel):
    daemon = Daemon(tmp_path / "pipe")
    try:
        app = subprocess.Popen(libshare_run("--name", "texels", "--", sys.executable, str(PROGRAM), str(kernel),
                                            "again"), env=environment(daemon.pipe), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = json.loads(app.stdout.readline() or "{}")
        assert np.array_equal(np.array(first.get("output"), np.float32), expected()), first
        new = kill_and_replace(daemon)
        out, err = app.communicate("go\n", timeout=120)
        assert app.returncode == 0, err[-3000:]
        assert f"the device moved to pid {new}" in err, err[-3000:]
        assert np.array_equal(np.array(json.loads(out.splitlines()[0])["again"], np.float32), expected()), err[-3000:]
    finally:
        daemon.stop()
