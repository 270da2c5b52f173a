"""Device features follow programs (libshare/arbiter/programs/capabilities.py, device/_instance.py).

The arbiter creates its device with every optional feature the device has that is safe to share, and
admits a module only when each capability it declares has a feature the device was created with. Each
kernel here is GLSL compiled with glslangValidator (or SPIR-V assembled with spirv-as) and run through an
embedded session: on a device with its features it is accepted and its output is checked against numpy;
on one without them it is refused, naming the capability and the feature. Where the test device has every
feature, the refusal is shown by admitting the real module for the real device whose *feature set* lacks
one (the set admission reads, not the device's work). The validation layer, when installed, finds nothing
on the accepted kernels, and finds what the issue found before the device had the features.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.arbiter.device import Device, _instance
from libshare.arbiter.programs import admission, capabilities
from libshare.arbiter.programs.spirv import ALLOWED_CAPABILITIES, reflect
from libshare.errors import InvalidSubmission
from tests.conftest import ROOT

N = 256
LAYER_MANIFEST = Path("/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json")

F16 = """#version 450
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { float16_t a[]; };
layout(binding = 1) buffer B { float16_t b[]; };
void main() { uint i = gl_GlobalInvocationID.x; b[i] = a[i] * float16_t(2.0) + float16_t(0.5); }
"""
I8 = """#version 450
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { int8_t a[]; };
layout(binding = 1) buffer B { int8_t b[]; };
layout(push_constant) uniform P { int8_t k, pad1, pad2, pad3; };  // pushes are whole words
void main() { uint i = gl_GlobalInvocationID.x; b[i] = a[i] * k - int8_t(1); }
"""
I16 = """#version 450
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { int16_t a[]; };
layout(binding = 1) buffer B { int16_t b[]; };
layout(push_constant) uniform P { int16_t k, pad; };  // pushes are whole words
void main() { uint i = gl_GlobalInvocationID.x; b[i] = a[i] * k + int16_t(7); }
"""
I64 = """#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { uint64_t a[]; };
layout(binding = 1) buffer B { uint64_t b[]; };
layout(binding = 2) buffer T { uint64_t total; };
shared uint64_t local_total;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (gl_LocalInvocationIndex == 0) local_total = 0;
    barrier();
    b[i] = a[i] * 3ul + (1ul << 40);
    atomicAdd(local_total, a[i]);
    barrier();
    if (gl_LocalInvocationIndex == 0) atomicAdd(total, local_total);
}
"""
F64 = """#version 450
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { double a[]; };
layout(binding = 1) buffer B { double b[]; };
void main() { uint i = gl_GlobalInvocationID.x; b[i] = a[i] * 2.0lf + 0.25lf; }
"""
SUBGROUPS = """#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { uint a[]; };
layout(binding = 1) buffer B { uvec4 b[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    uint even = subgroupBallotBitCount(subgroupBallot(a[i] % 2u == 0u));
    b[i] = uvec4(subgroupAdd(a[i]), even, gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID, subgroupMax(a[i]));
}
"""
CLUSTERED = """#version 450
#extension GL_KHR_shader_subgroup_clustered : require
layout(local_size_x = 64) in;
layout(binding = 0) buffer B { uint b[]; };
void main() { uint i = gl_GlobalInvocationID.x; b[i] = subgroupClusteredAdd(b[i], 4); }
"""
FLOAT_ATOMICS = """#version 450
#extension GL_EXT_shader_atomic_float : require
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) buffer T { float total; };
void main() { atomicAdd(total, a[gl_GlobalInvocationID.x]); }
"""

# b[i] = a[i] . (a[i] ^ 0x01020304) as four signed bytes (glslang has no GLSL for it yet: SPIR-V assembly)
DOT = """OpCapability Shader
OpCapability DotProduct
OpCapability DotProductInput4x8BitPacked
OpExtension "SPV_KHR_integer_dot_product"
""" + """OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main" %gid
OpExecutionMode %main LocalSize 64 1 1
OpDecorate %gid BuiltIn GlobalInvocationId
OpDecorate %ua ArrayStride 4
OpMemberDecorate %A 0 Offset 0
OpDecorate %A BufferBlock
OpDecorate %a DescriptorSet 0
OpDecorate %a Binding 0
OpDecorate %ia ArrayStride 4
OpMemberDecorate %B 0 Offset 0
OpDecorate %B BufferBlock
OpDecorate %b DescriptorSet 0
OpDecorate %b Binding 1
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%int = OpTypeInt 32 1
%float = OpTypeFloat 32
%uvec3 = OpTypeVector %uint 3
%in_uvec3 = OpTypePointer Input %uvec3
%gid = OpVariable %in_uvec3 Input
%ua = OpTypeRuntimeArray %uint
%A = OpTypeStruct %ua
%p_A = OpTypePointer Uniform %A
%a = OpVariable %p_A Uniform
%ia = OpTypeRuntimeArray %int
%B = OpTypeStruct %ia
%p_B = OpTypePointer Uniform %B
%b = OpVariable %p_B Uniform
%int_0 = OpConstant %int 0
%mask = OpConstant %uint 0x01020304
%p_uint = OpTypePointer Uniform %uint
%p_int = OpTypePointer Uniform %int
%main = OpFunction %void None %fn
%entry = OpLabel
%ids = OpLoad %uvec3 %gid
%i = OpCompositeExtract %uint %ids 0
%pa = OpAccessChain %p_uint %a %int_0 %i
%va = OpLoad %uint %pa
%vb = OpBitwiseXor %uint %va %mask
%dot = OpSDot %int %va %vb PackedVectorFormat4x8Bit
%pb = OpAccessChain %p_int %b %int_0 %i
OpStore %pb %dot
OpReturn
OpFunctionEnd
"""
# The same kernel's frame with float controls instead: b[i] = a[i] + 0.5, under an execution mode
FLOAT_MODE = DOT.replace("""OpCapability DotProduct
OpCapability DotProductInput4x8BitPacked
OpExtension "SPV_KHR_integer_dot_product"
""", """OpCapability {capability}
OpExtension "SPV_KHR_float_controls"
""").replace("OpExecutionMode %main LocalSize 64 1 1", "OpExecutionMode %main LocalSize 64 1 1\n"
             "OpExecutionMode %main {capability} {width}").replace(
    "%vb = OpBitwiseXor %uint %va %mask\n%dot = OpSDot %int %va %vb PackedVectorFormat4x8Bit\n",
    "%fa = OpBitcast %float %va\n%sum = OpFAdd %float %fa %half\n%dot = OpBitcast %int %sum\n").replace(
    "%mask = OpConstant %uint 0x01020304\n", "%half = OpConstant %float 0.5\n")


def compile_glsl(tmp_path: Path, name: str, source: str, env: str = "vulkan1.1") -> bytes:
    """SPIR-V of a compute shader for the Vulkan environment ``env`` (vulkan1.1: SPIR-V 1.3)."""
    if shutil.which("glslangValidator") is None:
        pytest.skip("glslangValidator is not installed (apt-get install glslang-tools)")
    path, out = tmp_path / f"{name}.comp", tmp_path / f"{name}-{env}.spv"
    path.write_text(source)
    subprocess.run(["glslangValidator", "--target-env", env, "-o", str(out), str(path)], check=True,
                   capture_output=True, timeout=60)
    return out.read_bytes()


def assemble(tmp_path: Path, name: str, source: str) -> bytes:
    """SPIR-V 1.3 assembled by spirv-as (SPIRV-Tools, which the arbiter needs for spirv-val)."""
    path, out = tmp_path / f"{name}.spvasm", tmp_path / f"{name}.spv"
    path.write_text(source)
    subprocess.run(["spirv-as", "--target-env", "vulkan1.1", "-o", str(out), str(path)], check=True,
                   capture_output=True, timeout=60)
    return out.read_bytes()


@pytest.fixture(scope="module")
def device(vulkan_device_name):
    """A Device as the arbiter opens it: its features and API version are what admission reads."""
    with Device() as opened:
        yield opened


@pytest.fixture(scope="module")
def session(vulkan_device_name):
    with libshare.connect(mode="embedded") as opened:
        yield opened


# ------------------------------------------------------------------------------------------- the device


def known_features() -> set[str]:
    """Every name the device layer may put in ``device.features``."""
    names = {feature for *_, features in _instance._FEATURE_STRUCTS for feature in features}
    return (names | set(_instance._CORE_FEATURES) | set(_instance._FEATURE_EXTENSIONS)
            | set(_instance._SUBGROUP_OPERATIONS.values()) | set(_instance._FLOAT_CONTROLS))


def test_the_device_is_created_with_the_shareable_features_it_has(device):
    assert device.api_version >= (1, 1)
    assert "robustBufferAccess" in device.features
    assert "bufferDeviceAddress" not in device.features and "bufferDeviceAddress" not in known_features()
    assert device.features <= known_features()
    assert device.zero_workgroup_memory == ("shaderZeroInitializeWorkgroupMemory" in device.features)
    if device.name.startswith("llvmpipe"):  # lavapipe has all of these (vulkaninfo)
        assert device.api_version >= (1, 2)
        assert {"shaderFloat16", "shaderFloat64", "shaderInt8", "shaderInt16", "shaderInt64",
                "storageBuffer8BitAccess", "storageBuffer16BitAccess", "storagePushConstant8",
                "storagePushConstant16", "shaderBufferInt64Atomics", "shaderSharedInt64Atomics",
                "shaderBufferFloat32AtomicAdd", "shaderIntegerDotProduct", "vulkanMemoryModel",
                "subgroupBasic", "subgroupBallot", "subgroupArithmetic", "shaderSubgroupExtendedTypes",
                "robustBufferAccess2", "shaderZeroInitializeWorkgroupMemory"} <= device.features


def test_every_whitelisted_capability_needs_something_the_device_layer_can_enable():
    """capabilities.py's needs and device/_instance.py's features name the same things."""
    assert set(ALLOWED_CAPABILITIES) <= set(capabilities.FEATURES_NEEDED)
    for number, needed in capabilities.FEATURES_NEEDED.items():
        assert needed, capabilities.capability_name(number)
        assert all(name.startswith("VK_VERSION_") or name in known_features() for name in needed), needed
    assert set(capabilities._SUBGROUP_BITS.values()) == set(_instance._SUBGROUP_OPERATIONS.values())
    assert {ALLOWED_CAPABILITIES[n] for n in ALLOWED_CAPABILITIES} == \
        {capabilities.capability_name(n) for n in ALLOWED_CAPABILITIES}


def test_the_tables_are_those_the_grammar_and_the_registry_give():
    if not (Path(capabilities.GRAMMAR).exists() and Path(capabilities.REGISTRY).exists()):
        pytest.skip("the SPIR-V grammar or the Vulkan registry is not installed (apt-get install spirv-headers "
                    "libvulkan-dev); python -m libshare.arbiter.programs.capabilities regenerates the tables")
    assert capabilities.generated_tables() == (capabilities.CAPABILITY_NAMES, capabilities.FEATURES_NEEDED), \
        "regenerate: python -m libshare.arbiter.programs.capabilities"


# ------------------------------------------------------------------------------------- kernels that run


def run_f16(session, program):
    a = session.array(N, np.float16)
    b = session.array(N, np.float16)
    a[:] = (np.arange(N) % 50 - 25) / np.float16(4)
    session.dispatch(program, N // 64, [a, b]).wait(30)
    return b, (a * np.float16(2) + np.float16(0.5)).astype(np.float16)


def run_i8(session, program):
    a, b = session.array(N, np.int8), session.array(N, np.int8)
    a[:] = (np.arange(N) - 128).astype(np.int8)
    session.dispatch(program, N // 64, [a, b], struct.pack("<bxxx", -3)).wait(30)
    return b, (a.astype(np.int32) * -3 - 1).astype(np.int8)  # wraps as int8 arithmetic does


def run_i16(session, program):
    a, b = session.array(N, np.int16), session.array(N, np.int16)
    a[:] = (np.arange(N) * 517 - 30000).astype(np.int16)
    session.dispatch(program, N // 64, [a, b], struct.pack("<hxx", 301)).wait(30)
    return b, (a.astype(np.int64) * 301 + 7).astype(np.int16)


def run_i64(session, program):
    a, b, total = session.array(N, np.uint64), session.array(N, np.uint64), session.array(1, np.uint64)
    a[:] = np.arange(N, dtype=np.uint64) * np.uint64(1 << 33) + np.uint64(5)
    session.dispatch(program, N // 64, [a, b, total]).wait(30)
    got = np.concatenate([b, total])
    return got, np.concatenate([a * np.uint64(3) + np.uint64(1 << 40), [a.sum(dtype=np.uint64)]])


def run_f64(session, program):
    a, b = session.array(N, np.float64), session.array(N, np.float64)
    a[:] = np.arange(N) * (1 << 30) + 0.125  # more digits than a float holds
    session.dispatch(program, N // 64, [a, b]).wait(30)
    return b, a * 2.0 + 0.25


def run_subgroups(session, program):
    a, b = session.array(N, np.uint32), session.array((N, 4), np.uint32)
    a[:] = (np.arange(N) * 7919) % 1000
    session.dispatch(program, N // 64, [a, b]).wait(30)
    expected = np.zeros((N, 4), np.uint32)
    for subgroup in np.unique(b[:, 2]):  # whichever invocations the device put in one subgroup
        members = b[:, 2] == subgroup
        expected[members] = (a[members].sum(), np.count_nonzero(a[members] % 2 == 0), subgroup, a[members].max())
    return b, expected


def run_float_atomics(session, program):
    a, total = session.array(N, np.float32), session.array(1, np.float32)
    a[:] = np.arange(N) % 17  # small integers: any order of the additions gives the exact sum
    session.dispatch(program, N // 64, [a, total]).wait(30)
    return total, np.array([a.sum()], np.float32)


def run_dot(session, program):
    a, b = session.array(N, np.uint32), session.array(N, np.int32)
    a[:] = (np.arange(N, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)
    session.dispatch(program, N // 64, [a, b]).wait(30)
    left = a.view(np.int8).reshape(N, 4).astype(np.int32)
    right = (a ^ np.uint32(0x01020304)).view(np.int8).reshape(N, 4).astype(np.int32)
    return b, (left * right).sum(axis=1).astype(np.int32)


KERNELS = {  # name: (source, glsl or assembly, run, a feature it needs)
    "float16": (F16, "glsl", run_f16, "shaderFloat16"),
    "int8": (I8, "glsl", run_i8, "shaderInt8"),
    "int16": (I16, "glsl", run_i16, "shaderInt16"),
    "int64": (I64, "glsl", run_i64, "shaderSharedInt64Atomics"),
    "float64": (F64, "glsl", run_f64, "shaderFloat64"),
    "subgroups": (SUBGROUPS, "glsl", run_subgroups, "subgroupBallot"),
    "float_atomics": (FLOAT_ATOMICS, "glsl", run_float_atomics, "shaderBufferFloat32AtomicAdd"),
    "dot_product": (DOT, "assembly", run_dot, "shaderIntegerDotProduct"),
}


def module_of(tmp_path: Path, name: str) -> bytes:
    source, kind, _, _ = KERNELS[name]
    return compile_glsl(tmp_path, name, source) if kind == "glsl" else assemble(tmp_path, name, source)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_kernel_whose_features_the_device_has_is_accepted_and_computes(tmp_path, session, device, name):
    module = module_of(tmp_path, name)
    _, _, run, feature = KERNELS[name]
    if feature not in device.features:  # another device: refused by name (lavapipe has every one)
        with pytest.raises(InvalidSubmission, match=f"needs .*{feature}.*which {device.name}"):
            session.load_program(module)
        return
    program = session.load_program(module)
    got, expected = run(session, program)
    np.testing.assert_array_equal(got, expected)
    session.free(program)


@pytest.mark.parametrize(("name", "removed", "message"), [
    ("float16", {"shaderFloat16"}, "capability Float16 needs the device feature shaderFloat16, which {} lacks"),
    ("float16", {"storageBuffer16BitAccess"},
     "capability StorageBuffer16BitAccess needs the device feature storageBuffer16BitAccess, which {} lacks"),
    ("int8", {"shaderInt8"}, "capability Int8 needs the device feature shaderInt8"),
    ("int8", {"storagePushConstant8"}, "capability StoragePushConstant8 needs the device feature storagePushConstant8"),
    ("int16", {"shaderInt16"}, "capability Int16 needs the device feature shaderInt16"),
    ("int64", {"shaderBufferInt64Atomics", "shaderSharedInt64Atomics"},
     "capability Int64Atomics needs one of the device features shaderBufferInt64Atomics or shaderSharedInt64Atomics"),
    ("float64", {"shaderFloat64"}, "capability Float64 needs the device feature shaderFloat64"),
    ("subgroups", {"subgroupBallot"}, "capability GroupNonUniformBallot needs the device feature subgroupBallot"),
    ("subgroups", {"subgroupArithmetic"},
     "capability GroupNonUniformArithmetic needs the device feature subgroupArithmetic"),
    ("float_atomics", {"shaderBufferFloat32AtomicAdd", "shaderSharedFloat32AtomicAdd"},
     ("capability AtomicFloat32AddEXT needs one of the device features shaderBufferFloat32AtomicAdd or "
      "shaderSharedFloat32AtomicAdd")),
    ("dot_product", {"shaderIntegerDotProduct"},
     "capability DotProduct(Input4x8BitPacked)? needs the device feature shaderIntegerDotProduct"),
])
def test_a_capability_whose_feature_the_device_lacks_is_refused_by_name(tmp_path, device, monkeypatch, name,
                                                                        removed, message):
    """The real module, admitted for the real device whose feature set lacks ``removed`` (as a device without
    them reports): refused before spirv-val or a driver sees it, naming the capability and the feature."""
    module = module_of(tmp_path, name)
    if not set(KERNELS[name][3:]) <= device.features:
        pytest.skip(f"{device.name} lacks {KERNELS[name][3]}: the test above shows the refusal")
    admission.admit(module, device)  # with the device's features
    monkeypatch.setattr(device, "features", device.features - removed)
    with pytest.raises(InvalidSubmission, match=message.format(re.escape(device.name))):
        admission.admit(module, device)


def test_clustered_subgroups_run_where_the_device_has_them_and_are_refused_by_name_where_not(
        tmp_path, session, device):
    """lavapipe's subgroups have no clustered operations (VK_SUBGROUP_FEATURE_CLUSTERED_BIT): a real refusal."""
    module = compile_glsl(tmp_path, "clustered", CLUSTERED)
    if "subgroupClustered" not in device.features:
        with pytest.raises(InvalidSubmission, match="capability GroupNonUniformClustered needs the device feature "
                                                    "subgroupClustered, which"):
            session.load_program(module)
        return
    program = session.load_program(module)
    b = session.array(N, np.uint32)
    b[:] = np.arange(N)
    session.dispatch(program, N // 64, [b]).wait(30)
    np.testing.assert_array_equal(b, np.repeat(np.arange(N).reshape(-1, 4).sum(axis=1), 4))


# ------------------------------------------------------------------------------- float controls, version


@pytest.mark.parametrize(("capability", "width"), [("RoundingModeRTE", 32), ("DenormPreserve", 32),
                                                   ("RoundingModeRTZ", 32), ("SignedZeroInfNanPreserve", 32)])
def test_a_float_controls_mode_needs_its_property_for_its_width(tmp_path, session, device, monkeypatch, capability,
                                                                 width):
    module = assemble(tmp_path, f"{capability}{width}", FLOAT_MODE.format(capability=capability, width=width))
    needed = f"shader{capability}Float{width}"
    if needed not in device.features:  # lavapipe: no denorm preservation, no round-to-zero
        with pytest.raises(InvalidSubmission, match=f"capability {capability} needs one of the device features "
                                                    f"shader{capability}Float16 or"):
            session.load_program(module)
        return
    program = session.load_program(module)
    a, b = session.array(N, np.float32), session.array(N, np.float32)
    a[:] = np.arange(N)
    session.dispatch(program, N // 64, [a, b]).wait(30)
    np.testing.assert_array_equal(b, a + np.float32(0.5))
    session.free(program)
    others = {f"shader{capability}Float{w}" for w in (16, 64)} & device.features
    monkeypatch.setattr(device, "features", (device.features - {needed}) | others | {f"shader{capability}Float16"})
    with pytest.raises(InvalidSubmission, match=f"execution mode {capability} on 32-bit floats needs the device "
                                                f"feature {needed}"):
        admission.admit(module, device)


def test_spirv_follows_the_device_api_version(tmp_path, session, device, monkeypatch):
    """SPIR-V 1.5 (what llama.cpp's ggml kernels are built as, for Vulkan 1.2) on a Vulkan 1.2+ device: validated
    for that environment and run; on a Vulkan 1.1 device refused, naming both versions."""
    assert capabilities.target_env(device) == "vulkan{}.{}".format(*min(device.api_version, (1, 3)))
    module = compile_glsl(tmp_path, "float64", F64, env="vulkan1.2")
    assert capabilities.spirv_version(module) == (1, 5)
    if device.api_version < (1, 2) or "shaderFloat64" not in device.features:
        pytest.skip(f"{device.name} runs Vulkan {device.api_version}, without SPIR-V 1.5 or doubles")
    program = session.load_program(module)
    got, expected = run_f64(session, program)
    np.testing.assert_array_equal(got, expected)
    if device.api_version >= (1, 3):  # SPIR-V 1.6
        assert session.load_program(compile_glsl(tmp_path, "float64", F64, env="vulkan1.3")).local_size == (64, 1, 1)
    monkeypatch.setattr(device, "api_version", (1, 1))  # as a Vulkan 1.1 device reports
    with pytest.raises(InvalidSubmission, match=r"the module is SPIR-V 1\.5; .*\(Vulkan 1\.1\) runs SPIR-V up to 1\.3"):
        admission.admit(module, device)
    assert capabilities.target_env(device) == "vulkan1.1"
    admission.admit(compile_glsl(tmp_path, "float64", F64), device)  # SPIR-V 1.3 still is


def test_a_capability_off_the_whitelist_is_refused_by_its_name(tmp_path):
    """Every capability number has its grammar name in a refusal (ImageQuery is 50)."""
    module = compile_glsl(tmp_path, "float64", F64)
    words = list(struct.unpack(f"<{len(module) // 4}I", module))
    with pytest.raises(InvalidSubmission, match="capability ImageQuery is not allowed"):
        reflect(struct.pack(f"<{len(words) + 2}I", *words[:5], 2 << 16 | 17, 50, *words[5:]))
    assert capabilities.capability_name(5347) == "PhysicalStorageBufferAddresses"
    assert capabilities.capability_name(123456) == "number 123456"


# ---------------------------------------------------------------------------------- the validation layer


def test_the_validation_layer_finds_nothing_on_the_accepted_kernels(tmp_path):
    """Each kernel above, run through an embedded arbiter in a child whose Vulkan loader inserts
    VK_LAYER_KHRONOS_validation, gets no validation error; with the optional features off (the device as it
    was created before) and admission told nothing of them, the same run gets the VUIDs the issue found."""
    if not LAYER_MANIFEST.exists():
        pytest.skip("the Vulkan validation layer is not installed (apt-get install vulkan-validationlayers)")
    for name in KERNELS:
        (tmp_path / f"{name}.bin").write_bytes(module_of(tmp_path, name))
    rte = FLOAT_MODE.format(capability="RoundingModeRTE", width=32)
    (tmp_path / "rounding.bin").write_bytes(assemble(tmp_path, "rounding", rte))
    clean = _run_layered(tmp_path, features=True)
    assert "Validation Error" not in clean and f"accepted {len(KERNELS) + 1} of" in clean, clean[-4000:]
    before = _run_layered(tmp_path, features=False)
    assert "VUID-RuntimeSpirv" in before or "VUID-VkShaderModuleCreateInfo-pCode" in before, before[-4000:]


def _run_layered(folder: Path, features: bool) -> str:
    env = {**os.environ, "VK_INSTANCE_LAYERS": "VK_LAYER_KHRONOS_validation", "LIBSHARE_MODE": "embedded"}
    result = subprocess.run([sys.executable, "-m", "tests.arbiter.test_device_features", str(folder),
                             "features" if features else "none"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    return result.stdout + result.stderr


def _layered_child(folder: Path, features: bool) -> None:
    """Load and dispatch every module of ``folder`` once on zeroed buffers (the child of the test above)."""
    if not features:  # the device as libshare created it before: robustness and zeroing only
        _instance._CORE_FEATURES = ("robustBufferAccess",)
        _instance._FEATURE_STRUCTS = _instance._FEATURE_STRUCTS[:2]
        capabilities.FEATURES_NEEDED.clear()
    accepted = 0
    with libshare.connect(mode="embedded") as session:
        for path in sorted(folder.glob("*.bin")):
            try:
                program = session.load_program(path.read_bytes())
            except InvalidSubmission as exc:
                print(f"{path.stem}: refused: {exc}", flush=True)
                continue
            buffers = [session.array(4 * N, np.uint32) for _ in range(program.bindings)]
            session.dispatch(program, N // 64, buffers, bytes(program.push_size)).wait(60)
            accepted += 1
    print(f"accepted {accepted} of {len(list(folder.glob('*.bin')))}", flush=True)


if __name__ == "__main__":
    _layered_child(Path(sys.argv[1]), sys.argv[2] == "features")


PUSH_132 = """#version 450
layout(local_size_x = 64) in;
layout(push_constant) uniform Push { uint words[33]; } p;
layout(binding = 0) buffer Out { uint y[]; };
void main() { y[gl_GlobalInvocationID.x] = p.words[32]; }
"""


def test_push_constants_past_what_a_descriptor_carries_are_refused_on_a_device_that_allows_more(
        tmp_path, device, monkeypatch):
    """A GPU may allow 256 bytes of push constants (lavapipe allows 128); a descriptor carries 128, and the
    engine pushes from it: a program declaring more is refused by admission and by pipeline creation."""
    module = compile_glsl(tmp_path, "push132", PUSH_132)
    monkeypatch.setattr(device, "max_push_constants_size", 256)
    monkeypatch.setattr(device.instance, "max_push_constants_size", 256)
    with pytest.raises(InvalidSubmission, match="132 bytes of push constants; the device allows 256 and a "
                                                "descriptor carries 128"):
        admission.admit(module, device)
    with pytest.raises(InvalidSubmission, match="push_size must be a multiple of 4 up to 128"):
        device.create_pipeline(module, 1, 132)
