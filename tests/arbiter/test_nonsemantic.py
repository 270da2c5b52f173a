"""Non-semantic instructions (libshare/arbiter/programs/nonsemantic.py): kept for a device that takes them,
taken out before admission for one that does not, and never a way past the validator."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import libshare
from libshare.arbiter.device import Device
from libshare.arbiter.programs import loading as _programs
from libshare.arbiter.programs.nonsemantic import without_nonsemantic
from libshare.errors import InvalidSubmission

NAME = "VK_KHR_shader_non_semantic_info"
PRINTING = """#version 450
#extension GL_EXT_debug_printf : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer B { uint b[]; };
void main()
{
    uint i = gl_GlobalInvocationID.x;
    b[i] = i * 3u;
    debugPrintfEXT("b[%u] = %u", i, b[i]);
}
"""
# A semantic instruction (OpIAdd) using a non-semantic result, which SPV_KHR_non_semantic_info forbids.
MISUSED = """OpCapability Shader
OpExtension "SPV_KHR_non_semantic_info"
%ns = OpExtInstImport "NonSemantic.Anything"
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main"
OpExecutionMode %main LocalSize 1 1 1
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%one = OpConstant %uint 1
%x = OpExtInst %uint %ns 7 %one
%main = OpFunction %void None %fn
%entry = OpLabel
%y = OpIAdd %uint %x %one
OpReturn
OpFunctionEnd
"""


def test_a_device_without_the_extension_admits_the_module_without_its_non_semantic_instructions(
        vulkan_device_name):
    module = libshare.compile(PRINTING, target_env="vulkan1.1")
    assert b"NonSemantic.DebugPrintf" in module
    with Device() as device:
        assert NAME in device.features  # lavapipe's device is Vulkan 1.3, which absorbed the extension
        kept = _programs.Interfaces().of(module, device)
        assert b"NonSemantic.DebugPrintf" in kept.module and kept.interface.bindings == (0,)
        device.features = device.features - {NAME}  # as a device without it reports
        taken = _programs.Interfaces().of(module, device)
    assert b"NonSemantic" not in taken.module and b"SPV_KHR_non_semantic_info" not in taken.module
    assert taken.interface.bindings == (0,) and len(taken.module) < len(module)  # admitted: spirv-val passed it
    plain = libshare.compile(PRINTING.replace('debugPrintfEXT("b[%u] = %u", i, b[i]);', ""), target_env="vulkan1.1")
    assert without_nonsemantic(plain) == plain


def test_a_non_semantic_result_used_by_the_kernel_is_refused_with_or_without_the_extension(vulkan_device_name, tmp_path):
    if shutil.which("spirv-as") is None:
        pytest.skip("spirv-as is not installed (apt-get install spirv-tools)")
    source = tmp_path / "misused.spvasm"
    source.write_text(MISUSED)
    subprocess.run(["spirv-as", "--target-env", "vulkan1.1", str(source), "-o", str(tmp_path / "misused.spv")],
                   check=True, capture_output=True)
    module = (tmp_path / "misused.spv").read_bytes()
    with Device() as device:
        with pytest.raises(InvalidSubmission, match="spirv-val"):
            _programs.Interfaces().of(module, device)  # the validator sees the misuse
        device.features = device.features - {NAME}
        with pytest.raises(InvalidSubmission, match="spirv-val"):
            _programs.Interfaces().of(module, device)  # taken out, %x is undefined where %y uses it
