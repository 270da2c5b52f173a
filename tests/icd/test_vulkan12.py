"""Vulkan 1.2 through the driver (libshare/icd/features.c, physical.c) under an unmodified program.

tests/icd/_vulkan12.py (the ``vulkan`` bindings, through the real loader and ``libshare-run``, against a
real arbiter with lavapipe behind it) sees a Vulkan 1.2 device that reports the 1.2 features the
arbiter's device was created with (float16, int8, 8-bit storage) and not those it keeps off (buffer
device addresses, descriptor indexing: vkCreateDevice refuses them); it makes a device asking for them
through VkPhysicalDeviceVulkan11Features and Vulkan12Features and runs a kernel that reads int8 and
float16 buffers (numpy checks it); every Vulkan 1.2 core command resolves; vkResetQueryPool resets a
query from the host; timeline semaphores work when turned on as a Vulkan 1.2 feature, without their
extension (as wgpu does); a feature structure's tail padding is not read as a feature asked for; the
driver names itself libshare and reports the conformance version of the arbiter's driver, as the same
program finds it without libshare (wgpu hides an adapter that reports none).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.icd.conftest import compiled, environment, libshare_run, probe

PROGRAM = Path(__file__).resolve().parent / "_vulkan12.py"
KERNEL = """#version 450
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_atomic_float : require
#extension GL_EXT_shader_atomic_float2 : require
#extension GL_EXT_debug_printf : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer A { int8_t a[]; };
layout(std430, binding = 1) readonly buffer B { float16_t b[]; };
layout(std430, binding = 2) buffer C { float c[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    c[i] = float(a[i]) * float(b[i]) + 1.0;
    atomicAdd(c[256 + i % 8], 1.0);
    atomicMax(c[264], float(i));
    if (i == 0u)
        debugPrintfEXT("c[0] = %f", c[0]);  // a non-semantic instruction: VK_KHR_shader_non_semantic_info
}
"""


@pytest.fixture
def kernel(tmp_path) -> Path:
    return compiled(tmp_path, "mixed", KERNEL, "vulkan1.2")


def test_a_vulkan_1_2_program_gets_its_features_and_runs_an_int8_and_float16_kernel(daemon, kernel):
    _process, pipe_dir = daemon
    seen = probe(libshare_run("--name", "vulkan12", "--", sys.executable, str(PROGRAM), str(kernel)),
                 environment(pipe_dir))
    assert seen["version"] == [1, 2], seen
    direct = probe([sys.executable, str(PROGRAM), "--driver"], environment(pipe_dir))
    assert seen["driver"] == ["libshare", direct["driver"][1]] and direct["driver"][0] != "libshare", (seen, direct)
    assert seen["features"] == {"shaderFloat16": True, "shaderInt8": True, "storageBuffer8BitAccess": True,
                                "scalarBlockLayout": True, "uniformBufferStandardLayout": True,
                                "shaderBufferFloat32AtomicAdd": True, "shaderBufferFloat32AtomicMinMax": True,
                                "shaderIntegerDotProduct": True,
                                "shaderZeroInitializeWorkgroupMemory": True,
                                "bufferDeviceAddress": False}, seen  # the block layouts: the arbiter's admission
    assert seen["refused"] == {"bufferDeviceAddress": "VkErrorFeatureNotPresent",
                               "descriptorIndexing": "VkErrorFeatureNotPresent"}, seen
    assert seen["device"] == "ok" and seen["missing"] == [], seen
    a = (np.arange(256) % 16 - 8).astype(np.float32)
    b = ((np.arange(256) % 8) / 4).astype(np.float16).astype(np.float32)
    assert np.array_equal(np.array(seen["output"][:256], np.float32), a * b + np.float32(1)), seen["stderr"][-2000:]
    assert seen["output"][256:264] == [32.0] * 8, seen["output"][256:]  # 256 invocations' float atomic adds, 8 ways
    assert seen["output"][264] == 255.0, seen["output"][256:]  # their float atomic max
    assert seen["reset"] == [["ok", 1], ["VkNotReady", 0]], seen  # written; then reset from the host
    assert seen["timeline"] == [3, 5, 7], seen
    assert seen["padded"] == "ok", seen
    plain, vulkan12, indexing = seen["after bind"]  # (they were 0: every layout with a buffer was past them)
    assert plain > 0 and vulkan12 >= plain and indexing >= plain, seen["after bind"]


PROMOTED = Path(__file__).resolve().parent / "_promoted.py"


def test_extensions_vulkan_1_1_absorbed_are_offered_by_their_names_with_robustness2(daemon):
    """A program that enables VK_KHR_get_memory_requirements2, bind_memory2, dedicated_allocation,
    maintenance1, maintenance2, maintenance3 and spirv_1_4 (Taichi enables the first three when listed,
    ncnn all but the last) and VK_EXT_robustness2 finds the KHR-named commands; robustBufferAccess2 is the arbiter's device's, its access size
    alignments the coarsest the limits allow (4 and 256)."""
    _process, pipe_dir = daemon
    seen = probe(libshare_run("--name", "promoted", "--", sys.executable, str(PROMOTED)), environment(pipe_dir))
    assert seen["device"] == "ok", seen["stderr"][-2000:]
    size, alignment, size2, alignment2, prefers, requires = seen["requirements"]
    assert (size2, alignment2, prefers, requires) == (size, alignment, False, False) and size >= 1000, seen
    assert (seen["bound"], seen["trimmed"], seen["supported"]) == ("ok", True, True), seen
    assert seen["robustness2"] == [True, 4, 256], seen
