"""SPIR-V capabilities by name, the device features each needs, and the SPIR-V version a device runs.

The whitelist (:mod:`libshare.arbiter.programs.spirv`) says which capabilities libshare admits
at all. Whether *this* device may run a module that declares one is a second question, which
Vulkan answers: a kernel may use ``Float16`` only on a VkDevice created with ``shaderFloat16``,
``Int64Atomics`` only with ``shaderBufferInt64Atomics`` or ``shaderSharedInt64Atomics``,
``GroupNonUniformBallot`` only where the device's subgroups support ballots, and so on. A driver
handed a module that uses a feature the device was not created with may run it (lavapipe does),
miscompile it or crash: the module is invalid Vulkan. So:

* the arbiter creates its device with every optional feature the device has that is safe to
  share (``device/_instance.py``: 8/16-bit storage, Float16, Int8, Int16, Int64 and its atomics,
  Float64, float atomics, integer dot products, the Vulkan memory model, non-uniform indexing of
  arrays of buffers; never
  ``bufferDeviceAddress``), and lists them, with the subgroup operations it supports in the
  compute stage and its float-controls properties, in ``device.features``;
* :func:`check_device_features` refuses a module that declares a capability whose feature is not
  in that set, naming the capability and the feature ("capability Float16 needs the device
  feature shaderFloat16, which <device> lacks"), or a float-controls execution mode the device
  does not support for that width (``DenormPreserve`` on 16-bit floats needs
  ``shaderDenormPreserveFloat16``), or a SPIR-V version above the device's (1.3 on Vulkan 1.1,
  1.5 on 1.2, 1.6 on 1.3), naming both versions;
* :func:`target_env` is the environment ``spirv-val`` validates for: the device's API version.

Where a capability is met by any of several features (``Int64Atomics``: buffer or shared), any
one suffices here; which storage class an atomic may use with which feature is for the SPIR-V
validator and the driver. Subgroup operations on 8/16/64-bit types need
``shaderSubgroupExtendedTypes``, which the device is created with where it has it; no capability
names it, so it is not checked here.

The tables
----------
:data:`CAPABILITY_NAMES` names every capability of the SPIR-V grammar (where several names share a
number, the grammar's first), so that every refusal names a capability by name.
:data:`FEATURES_NEEDED` gives, for each capability of the whitelist, the names that satisfy it,
any one sufficing, from the Vulkan registry's ``<spirvcapabilities>`` (vk.xml): a feature of a
``VkPhysicalDevice*Features`` struct, a ``VK_TRUE`` property (float controls), a subgroup operation
(``subgroupBallot``: ``VK_SUBGROUP_FEATURE_BALLOT_BIT``), a device extension, or ``VK_VERSION_1_x``
(met by the device's API version); image features and vendor extensions, which libshare never
enables, are left out. Both are generated, not written: ``python -m
libshare.arbiter.programs.capabilities`` prints them from the grammar (Debian's ``spirv-headers``,
``/usr/include/spirv/unified1/spirv.core.grammar.json``) and the registry (``libvulkan-dev``,
``/usr/share/vulkan/registry/vk.xml``); tests/arbiter/test_device_features.py checks that they match
whenever both are installed.
"""

from __future__ import annotations

import struct
import sys

from libshare.errors import InvalidSubmission

__all__ = ["CAPABILITY_NAMES", "FEATURES_NEEDED", "capability_name", "check_device_features", "generated_tables",
           "max_spirv_version", "spirv_version", "target_env"]

_OP_EXECUTION_MODE, _OP_CAPABILITY = 16, 17
# Float-controls execution modes (operand: the float width) and the property prefix each needs.
_FLOAT_MODES = {4459: "DenormPreserve", 4460: "DenormFlushToZero", 4461: "SignedZeroInfNanPreserve",
                4462: "RoundingModeRTE", 4463: "RoundingModeRTZ"}
_SUBGROUP_BITS = {
    "VK_SUBGROUP_FEATURE_BASIC_BIT": "subgroupBasic", "VK_SUBGROUP_FEATURE_VOTE_BIT": "subgroupVote",
    "VK_SUBGROUP_FEATURE_ARITHMETIC_BIT": "subgroupArithmetic", "VK_SUBGROUP_FEATURE_BALLOT_BIT": "subgroupBallot",
    "VK_SUBGROUP_FEATURE_SHUFFLE_BIT": "subgroupShuffle",
    "VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT": "subgroupShuffleRelative",
    "VK_SUBGROUP_FEATURE_CLUSTERED_BIT": "subgroupClustered", "VK_SUBGROUP_FEATURE_QUAD_BIT": "subgroupQuad",
}
"""The names ``device.features`` gives the subgroup operations the device supports in the compute stage."""

# ---- generated: python -m libshare.arbiter.programs.capabilities (see "The tables") ----
CAPABILITY_NAMES: dict[int, str] = {
    0: "Matrix", 1: "Shader", 2: "Geometry", 3: "Tessellation", 4: "Addresses", 5: "Linkage", 6: "Kernel",
    7: "Vector16", 8: "Float16Buffer", 9: "Float16", 10: "Float64", 11: "Int64", 12: "Int64Atomics", 13: "ImageBasic",
    14: "ImageReadWrite", 15: "ImageMipmap", 17: "Pipes", 18: "Groups", 19: "DeviceEnqueue", 20: "LiteralSampler",
    21: "AtomicStorage", 22: "Int16", 23: "TessellationPointSize", 24: "GeometryPointSize", 25: "ImageGatherExtended",
    27: "StorageImageMultisample", 28: "UniformBufferArrayDynamicIndexing", 29: "SampledImageArrayDynamicIndexing",
    30: "StorageBufferArrayDynamicIndexing", 31: "StorageImageArrayDynamicIndexing", 32: "ClipDistance",
    33: "CullDistance", 34: "ImageCubeArray", 35: "SampleRateShading", 36: "ImageRect", 37: "SampledRect",
    38: "GenericPointer", 39: "Int8", 40: "InputAttachment", 41: "SparseResidency", 42: "MinLod", 43: "Sampled1D",
    44: "Image1D", 45: "SampledCubeArray", 46: "SampledBuffer", 47: "ImageBuffer", 48: "ImageMSArray",
    49: "StorageImageExtendedFormats", 50: "ImageQuery", 51: "DerivativeControl", 52: "InterpolationFunction",
    53: "TransformFeedback", 54: "GeometryStreams", 55: "StorageImageReadWithoutFormat",
    56: "StorageImageWriteWithoutFormat", 57: "MultiViewport", 58: "SubgroupDispatch", 59: "NamedBarrier",
    60: "PipeStorage", 61: "GroupNonUniform", 62: "GroupNonUniformVote", 63: "GroupNonUniformArithmetic",
    64: "GroupNonUniformBallot", 65: "GroupNonUniformShuffle", 66: "GroupNonUniformShuffleRelative",
    67: "GroupNonUniformClustered", 68: "GroupNonUniformQuad", 69: "ShaderLayer", 70: "ShaderViewportIndex",
    71: "UniformDecoration", 4165: "CoreBuiltinsARM", 4422: "FragmentShadingRateKHR", 4423: "SubgroupBallotKHR",
    4427: "DrawParameters", 4428: "WorkgroupMemoryExplicitLayoutKHR",
    4429: "WorkgroupMemoryExplicitLayout8BitAccessKHR", 4430: "WorkgroupMemoryExplicitLayout16BitAccessKHR",
    4431: "SubgroupVoteKHR", 4433: "StorageBuffer16BitAccess", 4434: "UniformAndStorageBuffer16BitAccess",
    4435: "StoragePushConstant16", 4436: "StorageInputOutput16", 4437: "DeviceGroup", 4439: "MultiView",
    4441: "VariablePointersStorageBuffer", 4442: "VariablePointers", 4445: "AtomicStorageOps",
    4447: "SampleMaskPostDepthCoverage", 4448: "StorageBuffer8BitAccess", 4449: "UniformAndStorageBuffer8BitAccess",
    4450: "StoragePushConstant8", 4464: "DenormPreserve", 4465: "DenormFlushToZero", 4466: "SignedZeroInfNanPreserve",
    4467: "RoundingModeRTE", 4468: "RoundingModeRTZ", 4471: "RayQueryProvisionalKHR", 4472: "RayQueryKHR",
    4478: "RayTraversalPrimitiveCullingKHR", 4479: "RayTracingKHR", 5008: "Float16ImageAMD",
    5009: "ImageGatherBiasLodAMD", 5010: "FragmentMaskAMD", 5013: "StencilExportEXT", 5015: "ImageReadWriteLodAMD",
    5016: "Int64ImageEXT", 5055: "ShaderClockKHR", 5249: "SampleMaskOverrideCoverageNV",
    5251: "GeometryShaderPassthroughNV", 5254: "ShaderViewportIndexLayerEXT", 5255: "ShaderViewportMaskNV",
    5259: "ShaderStereoViewNV", 5260: "PerViewAttributesNV", 5265: "FragmentFullyCoveredEXT", 5266: "MeshShadingNV",
    5282: "ImageFootprintNV", 5283: "MeshShadingEXT", 5284: "FragmentBarycentricKHR",
    5288: "ComputeDerivativeGroupQuadsNV", 5291: "FragmentDensityEXT", 5297: "GroupNonUniformPartitionedNV",
    5301: "ShaderNonUniform", 5302: "RuntimeDescriptorArray", 5303: "InputAttachmentArrayDynamicIndexing",
    5304: "UniformTexelBufferArrayDynamicIndexing", 5305: "StorageTexelBufferArrayDynamicIndexing",
    5306: "UniformBufferArrayNonUniformIndexing", 5307: "SampledImageArrayNonUniformIndexing",
    5308: "StorageBufferArrayNonUniformIndexing", 5309: "StorageImageArrayNonUniformIndexing",
    5310: "InputAttachmentArrayNonUniformIndexing", 5311: "UniformTexelBufferArrayNonUniformIndexing",
    5312: "StorageTexelBufferArrayNonUniformIndexing", 5340: "RayTracingNV", 5341: "RayTracingMotionBlurNV",
    5345: "VulkanMemoryModel", 5346: "VulkanMemoryModelDeviceScope", 5347: "PhysicalStorageBufferAddresses",
    5350: "ComputeDerivativeGroupLinearNV", 5353: "RayTracingProvisionalKHR", 5357: "CooperativeMatrixNV",
    5363: "FragmentShaderSampleInterlockEXT", 5372: "FragmentShaderShadingRateInterlockEXT",
    5373: "ShaderSMBuiltinsNV", 5378: "FragmentShaderPixelInterlockEXT", 5379: "DemoteToHelperInvocation",
    5381: "RayTracingOpacityMicromapEXT", 5383: "ShaderInvocationReorderNV", 5390: "BindlessTextureNV",
    5568: "SubgroupShuffleINTEL", 5569: "SubgroupBufferBlockIOINTEL", 5570: "SubgroupImageBlockIOINTEL",
    5579: "SubgroupImageMediaBlockIOINTEL", 5582: "RoundToInfinityINTEL", 5583: "FloatingPointModeINTEL",
    5584: "IntegerFunctions2INTEL", 5603: "FunctionPointersINTEL", 5604: "IndirectReferencesINTEL", 5606: "AsmINTEL",
    5612: "AtomicFloat32MinMaxEXT", 5613: "AtomicFloat64MinMaxEXT", 5616: "AtomicFloat16MinMaxEXT",
    5617: "VectorComputeINTEL", 5619: "VectorAnyINTEL", 5629: "ExpectAssumeKHR",
    5696: "SubgroupAvcMotionEstimationINTEL", 5697: "SubgroupAvcMotionEstimationIntraINTEL",
    5698: "SubgroupAvcMotionEstimationChromaINTEL", 5817: "VariableLengthArrayINTEL",
    5821: "FunctionFloatControlINTEL", 5824: "FPGAMemoryAttributesINTEL", 5837: "FPFastMathModeINTEL",
    5844: "ArbitraryPrecisionIntegersINTEL", 5845: "ArbitraryPrecisionFloatingPointINTEL",
    5886: "UnstructuredLoopControlsINTEL", 5888: "FPGALoopControlsINTEL", 5892: "KernelAttributesINTEL",
    5897: "FPGAKernelAttributesINTEL", 5898: "FPGAMemoryAccessesINTEL", 5904: "FPGAClusterAttributesINTEL",
    5906: "LoopFuseINTEL", 5908: "FPGADSPControlINTEL", 5910: "MemoryAccessAliasingINTEL",
    5916: "FPGAInvocationPipeliningAttributesINTEL", 5920: "FPGABufferLocationINTEL",
    5922: "ArbitraryPrecisionFixedPointINTEL", 5935: "USMStorageClassesINTEL", 5939: "RuntimeAlignedAttributeINTEL",
    5943: "IOPipesINTEL", 5945: "BlockingPipesINTEL", 5948: "FPGARegINTEL", 6016: "DotProductInputAll",
    6017: "DotProductInput4x8Bit", 6018: "DotProductInput4x8BitPacked", 6019: "DotProduct", 6020: "RayCullMaskKHR",
    6025: "BitInstructions", 6026: "GroupNonUniformRotateKHR", 6033: "AtomicFloat32AddEXT",
    6034: "AtomicFloat64AddEXT", 6089: "LongConstantCompositeINTEL", 6094: "OptNoneINTEL",
    6095: "AtomicFloat16AddEXT", 6114: "DebugInfoModuleINTEL", 6141: "SplitBarrierINTEL",
    6400: "GroupUniformArithmeticKHR",
}
FEATURES_NEEDED: dict[int, tuple[str, ...]] = {
    0: ("VK_VERSION_1_0",),  # Matrix
    1: ("VK_VERSION_1_0",),  # Shader
    9: ("shaderFloat16",),  # Float16
    10: ("shaderFloat64",),  # Float64
    11: ("shaderInt64",),  # Int64
    12: ("shaderBufferInt64Atomics", "shaderSharedInt64Atomics"),  # Int64Atomics
    22: ("shaderInt16",),  # Int16
    39: ("shaderInt8",),  # Int8
    46: ("VK_VERSION_1_0",),  # SampledBuffer
    47: ("VK_VERSION_1_0",),  # ImageBuffer
    61: ("subgroupBasic",),  # GroupNonUniform
    62: ("subgroupVote",),  # GroupNonUniformVote
    63: ("subgroupArithmetic",),  # GroupNonUniformArithmetic
    64: ("subgroupBallot",),  # GroupNonUniformBallot
    65: ("subgroupShuffle",),  # GroupNonUniformShuffle
    66: ("subgroupShuffleRelative",),  # GroupNonUniformShuffleRelative
    67: ("subgroupClustered",),  # GroupNonUniformClustered
    68: ("subgroupQuad",),  # GroupNonUniformQuad
    4423: ("VK_EXT_shader_subgroup_ballot",),  # SubgroupBallotKHR
    4431: ("VK_EXT_shader_subgroup_vote",),  # SubgroupVoteKHR
    4433: ("storageBuffer16BitAccess",),  # StorageBuffer16BitAccess
    4434: ("uniformAndStorageBuffer16BitAccess",),  # UniformAndStorageBuffer16BitAccess
    4435: ("storagePushConstant16",),  # StoragePushConstant16
    4448: ("storageBuffer8BitAccess",),  # StorageBuffer8BitAccess
    4449: ("uniformAndStorageBuffer8BitAccess",),  # UniformAndStorageBuffer8BitAccess
    4450: ("storagePushConstant8",),  # StoragePushConstant8
    4464: (  # DenormPreserve
        "shaderDenormPreserveFloat16",
        "shaderDenormPreserveFloat32",
        "shaderDenormPreserveFloat64",
    ),
    4465: (  # DenormFlushToZero
        "shaderDenormFlushToZeroFloat16",
        "shaderDenormFlushToZeroFloat32",
        "shaderDenormFlushToZeroFloat64",
    ),
    4466: (  # SignedZeroInfNanPreserve
        "shaderSignedZeroInfNanPreserveFloat16",
        "shaderSignedZeroInfNanPreserveFloat32",
        "shaderSignedZeroInfNanPreserveFloat64",
    ),
    4467: (  # RoundingModeRTE
        "shaderRoundingModeRTEFloat16",
        "shaderRoundingModeRTEFloat32",
        "shaderRoundingModeRTEFloat64",
    ),
    4468: (  # RoundingModeRTZ
        "shaderRoundingModeRTZFloat16",
        "shaderRoundingModeRTZFloat32",
        "shaderRoundingModeRTZFloat64",
    ),
    5301: ("VK_VERSION_1_2", "VK_EXT_descriptor_indexing"),  # ShaderNonUniform
    5306: ("shaderUniformBufferArrayNonUniformIndexing",),  # UniformBufferArrayNonUniformIndexing
    5308: ("shaderStorageBufferArrayNonUniformIndexing",),  # StorageBufferArrayNonUniformIndexing
    5345: ("vulkanMemoryModel",),  # VulkanMemoryModel
    5346: ("vulkanMemoryModelDeviceScope",),  # VulkanMemoryModelDeviceScope
    5612: ("shaderBufferFloat32AtomicMinMax", "shaderSharedFloat32AtomicMinMax"),  # AtomicFloat32MinMaxEXT
    5613: ("shaderBufferFloat64AtomicMinMax", "shaderSharedFloat64AtomicMinMax"),  # AtomicFloat64MinMaxEXT
    5616: ("shaderBufferFloat16AtomicMinMax", "shaderSharedFloat16AtomicMinMax"),  # AtomicFloat16MinMaxEXT
    6016: ("shaderIntegerDotProduct",),  # DotProductInputAll
    6017: ("shaderIntegerDotProduct",),  # DotProductInput4x8Bit
    6018: ("shaderIntegerDotProduct",),  # DotProductInput4x8BitPacked
    6019: ("shaderIntegerDotProduct",),  # DotProduct
    6033: ("shaderBufferFloat32AtomicAdd", "shaderSharedFloat32AtomicAdd"),  # AtomicFloat32AddEXT
    6034: ("shaderBufferFloat64AtomicAdd", "shaderSharedFloat64AtomicAdd"),  # AtomicFloat64AddEXT
    6095: ("shaderBufferFloat16AtomicAdd", "shaderSharedFloat16AtomicAdd"),  # AtomicFloat16AddEXT
}
# ---- end of generated ----


def capability_name(number: int) -> str:
    """The capability's name in the SPIR-V grammar, or ``number N`` for a number it does not define."""
    return CAPABILITY_NAMES.get(number, f"number {number}")


def spirv_version(spirv: bytes) -> tuple[int, int]:
    """(major, minor) of the module's header (a module :func:`~.spirv.reflect` read, in either byte order)."""
    order = "little" if spirv[:4] == b"\x03\x02\x23\x07" else "big"
    word = int.from_bytes(spirv[4:8], order)
    return (word >> 16) & 0xFF, (word >> 8) & 0xFF


def max_spirv_version(api_version: tuple[int, int]) -> tuple[int, int]:
    """The highest SPIR-V version a device of Vulkan ``api_version`` accepts (1.0, 1.3, 1.5, 1.6)."""
    return {(1, 0): (1, 0), (1, 1): (1, 3), (1, 2): (1, 5)}.get(tuple(api_version[:2]), (1, 6))


def target_env(device) -> str:
    """``spirv-val``'s ``--target-env`` for ``device``: its Vulkan API version (vulkan1.1 at least)."""
    major, minor = max(tuple(device.api_version[:2]), (1, 1))
    return f"vulkan{major}.{min(minor, 3) if major == 1 else 3}"


def check_device_features(spirv: bytes, device) -> None:
    """Refuse a module (one :func:`~.spirv.reflect` admitted) that ``device`` cannot run as declared: a SPIR-V
    version above the device's, a capability none of whose features ``device.features`` has, a float-controls
    execution mode the device lacks for its width. Raises InvalidSubmission naming what is missing."""
    version, most = spirv_version(spirv), max_spirv_version(device.api_version)
    if version > most:
        api = ".".join(map(str, device.api_version[:2]))
        raise InvalidSubmission(f"refused SPIR-V: the module is SPIR-V {version[0]}.{version[1]}; {device.name} "
                                f"(Vulkan {api}) runs SPIR-V up to {most[0]}.{most[1]}")
    capabilities, modes = _declared(spirv)
    for number in capabilities:
        needed = FEATURES_NEEDED.get(number)
        if needed is not None and not any(_has(device, name) for name in needed):
            raise _lacks(device, f"capability {capability_name(number)}", needed)
    for mode, width in modes:
        needed = (f"shader{_FLOAT_MODES[mode]}Float{width}",)
        if not _has(device, needed[0]):
            raise _lacks(device, f"execution mode {_FLOAT_MODES[mode]} on {width}-bit floats", needed)


def _has(device, name: str) -> bool:
    if name.startswith("VK_VERSION_"):
        return tuple(device.api_version[:2]) >= tuple(int(part) for part in name[11:].split("_"))
    return name in device.features


def _lacks(device, what: str, needed: tuple[str, ...]) -> InvalidSubmission:
    versions = [name[11:].replace("_", ".") for name in needed if name.startswith("VK_VERSION_")]
    features = [name for name in needed if not name.startswith("VK_VERSION_")]
    wants = [f"Vulkan {version}" for version in versions]
    if features:
        wants.append(("the device feature " if len(features) == 1 else "one of the device features ")
                     + " or ".join(features))
    return InvalidSubmission(f"refused SPIR-V: {what} needs {' or '.join(wants)}, which {device.name} lacks")


def _declared(spirv: bytes) -> tuple[list[int], list[tuple[int, int]]]:
    """The module's OpCapability numbers and its float-controls (mode, width) pairs; the module passed
    reflection, so its instructions fit (a malformed one ends the scan, and the validator refuses it)."""
    order = "<" if spirv[:4] == b"\x03\x02\x23\x07" else ">"
    words = struct.unpack(f"{order}{len(spirv) // 4}I", spirv[:len(spirv) // 4 * 4])
    capabilities, modes, pos = [], [], 5
    while pos < len(words):
        count, opcode = words[pos] >> 16, words[pos] & 0xFFFF
        if count == 0 or pos + count > len(words):
            break
        if opcode == _OP_CAPABILITY and count >= 2:
            capabilities.append(words[pos + 1])
        elif opcode == _OP_EXECUTION_MODE and count >= 4 and words[pos + 2] in _FLOAT_MODES:
            modes.append((words[pos + 2], words[pos + 3]))
        pos += count
    return capabilities, modes


# ------------------------------------------------------------------------------------- generation

GRAMMAR = "/usr/include/spirv/unified1/spirv.core.grammar.json"
REGISTRY = "/usr/share/vulkan/registry/vk.xml"


def generated_tables(grammar: str = GRAMMAR, registry: str = REGISTRY) -> tuple[dict[int, str], dict]:
    """(names, features needed) as :data:`CAPABILITY_NAMES` and :data:`FEATURES_NEEDED` should be, read from
    the SPIR-V grammar and the Vulkan registry; needs are listed for the whitelist's capabilities."""
    import json
    from xml.etree import ElementTree

    from libshare.arbiter.programs.spirv import ALLOWED_CAPABILITIES  # here: spirv.py imports this module

    with open(grammar) as file:
        kinds = json.load(file)["operand_kinds"]
    enumerants = next(kind for kind in kinds if kind["kind"] == "Capability")["enumerants"]
    names: dict[int, str] = {}
    numbers: dict[str, int] = {}
    for enumerant in enumerants:
        names.setdefault(enumerant["value"], enumerant["enumerant"])
        numbers[enumerant["enumerant"]] = enumerant["value"]
    needed: dict[int, tuple[str, ...]] = {}
    for element in ElementTree.parse(registry).getroot().iter("spirvcapability"):
        number = numbers.get(element.get("name"))
        if number not in ALLOWED_CAPABILITIES:
            continue
        found = needed.setdefault(number, ())
        for enable in element.iter("enable"):
            name = _enable_name(enable.attrib)
            if name and name not in found and "Image" not in name:
                found += (name,)
        needed[number] = found
    return dict(sorted(names.items())), dict(sorted(needed.items()))


def _enable_name(attributes: dict[str, str]) -> str | None:
    """The name ``device.features`` (or the API version) gives one ``<enable>`` of vk.xml; None for one libshare
    never enables (vendor extensions, properties it does not read)."""
    if "version" in attributes:
        return attributes["version"]
    if "extension" in attributes:
        return None if attributes["extension"].startswith(("VK_AMD_", "VK_NV_")) else attributes["extension"]
    if "feature" in attributes:
        return attributes["feature"]
    if attributes.get("member") == "subgroupSupportedOperations":
        return _SUBGROUP_BITS.get(attributes.get("value", ""))
    if attributes.get("value") == "VK_TRUE":
        return attributes.get("member")
    return None


def _print_tables() -> None:
    """Print both tables as Python (arguments: the grammar's and the registry's paths, if not the defaults)."""
    names, needed = generated_tables(*sys.argv[1:3])
    print("CAPABILITY_NAMES: dict[int, str] = {")
    line = "   "
    for number, name in names.items():
        item = f' {number}: "{name}",'
        if len(line) + len(item) > 118:
            print(line)
            line = "   "
        line += item
    print(line + "\n}")
    print("FEATURES_NEEDED: dict[int, tuple[str, ...]] = {")
    for number, wants in needed.items():
        quoted = [f'"{want}"' for want in wants]
        entry = f"    {number}: ({quoted[0]},),  # {names[number]}" if len(quoted) == 1 else \
            f"    {number}: ({', '.join(quoted)}),  # {names[number]}"
        if len(entry) > 118:
            entry = f"    {number}: (  # {names[number]}\n" + "".join(f"        {want},\n" for want in quoted) + "    ),"
        print(entry)
    print("}")


if __name__ == "__main__":
    _print_tables()
