"""Non-semantic instructions (libshare/arbiter/programs/nonsemantic.py): kept for a device that takes them,
taken out before admission for one that does not, and never a way past the validator."""

from __future__ import annotations

import shutil
import struct
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


def test_malformed_modules_are_refused_or_left_to_the_validator_never_an_error_of_ours():
    """The pass reads a client's module before admission: a cut instruction, an OpExtInst or an OpName with
    no operands, and an import name that is not a string each end in InvalidSubmission or in a module the
    validator then judges, never in another exception."""
    header = [0x07230203, 0x00010300, 0, 100, 0]
    name = list(struct.unpack("<6I", b"NonSemantic.Anything".ljust(24, b"\0")))
    imported = [(2 + len(name)) << 16 | 11, 7, *name]
    cases = {
        "an OpExtInst without operands": header + imported + [1 << 16 | 12],
        "an OpExtInst of two operands": header + imported + [3 << 16 | 12, 1, 2],
        "an OpName without operands": header + imported + [4 << 16 | 12, 1, 8, 7] + [1 << 16 | 5],
        "an import whose name runs out": header + [3 << 16 | 11, 7, 0x4E4F4E41],
        "an instruction past the end": header + imported + [9 << 16 | 12, 1],
    }
    for what, words in cases.items():
        try:
            out = without_nonsemantic(struct.pack(f"<{len(words)}I", *words))
        except InvalidSubmission:
            continue
        assert b"NonSemantic" not in out, what
