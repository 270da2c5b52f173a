"""The corpus of real compute shaders (tests/corpus/): reflection, inputs, and runs through a
private Vulkan device and through libshare, compared byte for byte.

The corpus is a set of SPIR-V modules compiled from public projects as those projects compile
them (tests/corpus/build.py made them; tests/corpus/<project>/SOURCES.md says from what), with a
manifest (tests/corpus/manifest.json) that says for each what one run needs: its bindings and
their sizes and element types, push-constant fields and values, workgroup counts, and the
specialization constants the project sets. Given a shader, this module

* fills each binding with seeded bytes that are valid for its element type (small floats that
  are exact in every float width the buffer is read as, small non-negative integers that are safe
  as indices), the same bytes for every run of that shader (:func:`inputs`);
* runs it on a device of its own (:class:`Direct`: the ``vulkan`` package, every optional feature
  the device has enabled, robust buffer access as libshare has it, optionally under the Khronos
  validation layer, whose messages it records per shader);
* runs it through a libshare session (:func:`run_libshare`: embedded or a daemon), recording
  whether the arbiter accepted the module, its refusal message, and the load time;
* compares the bytes of every binding after the run (:func:`compare`).

``python -m tools.corpus [--daemon DIR] [--validate] [NAME...]`` prints the table and the
acceptance per project; ``--json FILE`` writes the records.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import itertools
import json
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"
MANIFEST = CORPUS / "manifest.json"

# ------------------------------------------------------------------------------------------ reflection

_CAPABILITIES = {
    0: "Matrix", 1: "Shader", 4: "Addresses", 5: "Linkage", 6: "Kernel", 8: "Float16Buffer", 9: "Float16",
    10: "Float64", 11: "Int64", 12: "Int64Atomics", 13: "ImageBasic", 22: "Int16", 25: "ImageGatherExtended",
    28: "UniformBufferArrayDynamicIndexing", 29: "SampledImageArrayDynamicIndexing",
    30: "StorageBufferArrayDynamicIndexing", 31: "StorageImageArrayDynamicIndexing", 39: "Int8", 46: "SampledBuffer",
    47: "ImageBuffer", 49: "StorageImageExtendedFormats", 50: "ImageQuery", 55: "StorageImageReadWithoutFormat",
    56: "StorageImageWriteWithoutFormat", 61: "GroupNonUniform", 62: "GroupNonUniformVote",
    63: "GroupNonUniformArithmetic", 64: "GroupNonUniformBallot", 65: "GroupNonUniformShuffle",
    66: "GroupNonUniformShuffleRelative", 67: "GroupNonUniformClustered", 68: "GroupNonUniformQuad",
    4433: "StorageBuffer16BitAccess", 4434: "UniformAndStorageBuffer16BitAccess", 4435: "StoragePushConstant16",
    4436: "StorageInputOutput16", 4441: "VariablePointersStorageBuffer", 4442: "VariablePointers",
    4448: "StorageBuffer8BitAccess", 4449: "UniformAndStorageBuffer8BitAccess", 4450: "StoragePushConstant8",
    5301: "ShaderNonUniform", 5302: "RuntimeDescriptorArray", 5345: "VulkanMemoryModel",
    5346: "VulkanMemoryModelDeviceScope", 5347: "PhysicalStorageBufferAddresses", 6016: "DotProductInputAll",
    6017: "DotProductInput4x8Bit", 6018: "DotProductInput4x8BitPacked", 6019: "DotProduct",
    6022: "CooperativeMatrixKHR", 6026: "GroupNonUniformRotateKHR", 6033: "AtomicFloat32AddEXT",
    6034: "AtomicFloat64AddEXT", 6095: "AtomicFloat16AddEXT",
}
_SIZES = {"f16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8,
          "u64": 8, "bool": 4}
_NUMPY = {"f16": "<f2", "f32": "<f4", "f64": "<f8", "i8": "i1", "u8": "u1", "i16": "<i2", "u16": "<u2",
          "i32": "<i4", "u32": "<u4", "i64": "<i8", "u64": "<u8", "bool": "<u4"}
_STRUCT = {"f16": "e", "f32": "f", "f64": "d", "i8": "b", "u8": "B", "i16": "h", "u16": "H", "i32": "i",
           "u32": "I", "i64": "q", "u64": "Q", "bool": "I"}


def words(spirv: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(spirv) // 4}I", spirv))


def instructions(spirv: bytes):
    """(opcode, operands) of each instruction after the 5-word header."""
    w = words(spirv)
    pos = 5
    while pos < len(w):
        count, opcode = w[pos] >> 16, w[pos] & 0xFFFF
        yield opcode, w[pos + 1:pos + count]
        pos += max(count, 1)


def _string(ops) -> str:
    raw = b"".join(struct.pack("<I", x) for x in ops)
    return raw.split(b"\0", 1)[0].decode()


class Module:
    """What a run needs to know about a compute module: its resources, push-constant fields,
    specialization constants, workgroup size, capabilities and SPIR-V version."""

    def __init__(self, spirv: bytes):
        self.version = (words(spirv)[1] >> 16 & 0xFF, words(spirv)[1] >> 8 & 0xFF)
        self.names, self.member_names, self.types, self.decorations = {}, {}, {}, {}
        self.member_decorations, self.constants, self.variables = {}, {}, []
        self.capabilities, self.extensions, self.local_size, self.spec = [], [], None, {}
        self.workgroup_size_id = None
        for opcode, ops in instructions(spirv):
            self._record(opcode, ops)
        for target, decos in self.decorations.items():
            if 1 in decos and target in self.constants and self.constants[target][0] == "spec":
                _, type_id, value = self.constants[target]
                self.spec[decos[1][0]] = {"type": self.scalar_kind(type_id), "default": value}

    def _record(self, opcode: int, ops) -> None:
        if opcode == 17:
            self.capabilities.append(_CAPABILITIES.get(ops[0], f"capability {ops[0]}"))
        elif opcode == 10:
            self.extensions.append(_string(ops))
        elif opcode == 16 and ops[1] == 17:
            self.local_size = tuple(ops[2:5])
        elif opcode == 5:
            self.names[ops[0]] = _string(ops[1:])
        elif opcode == 6:
            self.member_names[(ops[0], ops[1])] = _string(ops[2:])
        elif opcode in (20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 32):
            self.types[ops[0]] = (opcode, tuple(ops[1:]))
        elif opcode == 43:
            self.constants[ops[1]] = ("const", ops[0], self._value(ops[0], ops[2:]))
        elif opcode == 50:
            self.constants[ops[1]] = ("spec", ops[0], self._value(ops[0], ops[2:]))
        elif opcode in (48, 49):
            self.constants[ops[1]] = ("spec", ops[0], opcode == 48)
        elif opcode in (44, 51):
            self.constants[ops[1]] = ("composite", ops[0], tuple(ops[2:]))
        elif opcode == 59:
            self.variables.append((ops[1], ops[0], ops[2]))
        elif opcode == 71:
            self.decorations.setdefault(ops[0], {})[ops[1]] = tuple(ops[2:])
            if ops[1] == 11 and ops[2] == 25:
                self.workgroup_size_id = ops[0]
        elif opcode == 72:
            self.member_decorations.setdefault((ops[0], ops[1]), {})[ops[2]] = tuple(ops[3:])

    def _value(self, type_id: int, ops):
        kind = self.scalar_kind(type_id)
        raw = b"".join(struct.pack("<I", x) for x in ops)[:_SIZES[kind]]
        if kind in ("f16",):
            return float(np.frombuffer(raw[:2], "<f2")[0])
        return struct.unpack("<" + _STRUCT[kind], raw.ljust(_SIZES[kind], b"\0"))[0]

    def scalar_kind(self, type_id: int) -> str:
        opcode, ops = self.types[type_id]
        if opcode == 20:
            return "bool"
        if opcode == 22:
            return f"f{ops[0]}"
        if opcode == 21:
            return f"{'i' if ops[1] else 'u'}{ops[0]}"
        raise ValueError(f"type %{type_id} is not a scalar")

    def workgroup_size(self) -> tuple[int, int, int]:
        """The local size, the WorkgroupSize built-in's (its defaults) taking precedence."""
        if self.workgroup_size_id is not None:
            parts = self.constants[self.workgroup_size_id][2]
            return tuple(int(self.constants[p][2]) for p in parts)
        return self.local_size or (1, 1, 1)

    def local_size_ids(self) -> list[int | None]:
        """The SpecId behind each WorkgroupSize component (None: a plain constant)."""
        if self.workgroup_size_id is None:
            return [None, None, None]
        parts = self.constants[self.workgroup_size_id][2]
        return [self.decorations.get(p, {}).get(1, (None,))[0] for p in parts]

    # ---- layouts

    def fields(self, type_id: int, base: int = 0, matrix_stride: int | None = None) -> list[tuple[int, str]]:
        """(offset, scalar kind) of each scalar in a value of ``type_id`` at ``base``."""
        opcode, ops = self.types[type_id]
        if opcode in (20, 21, 22):
            return [(base, self.scalar_kind(type_id))]
        if opcode == 23:
            inner = self.fields(ops[0])
            size = _SIZES[inner[0][1]]
            return [(base + i * size, inner[0][1]) for i in range(ops[1])]
        if opcode == 24:
            column = self.fields(ops[0])
            stride = matrix_stride or len(column) * _SIZES[column[0][1]]
            return [(base + c * stride + o, k) for c in range(ops[1]) for o, k in column]
        if opcode == 28:
            length = self.length(ops[1])
            stride = self.decorations.get(type_id, {}).get(6, (None,))[0]
            inner = self.fields(ops[0])
            stride = stride or self.size(ops[0])
            return [(base + i * stride + o, k) for i in range(length) for o, k in inner]
        if opcode == 30:
            out = []
            for m, member in enumerate(ops):
                deco = self.member_decorations.get((type_id, m), {})
                if self.types[member][0] == 29:
                    continue
                out += self.fields(member, base + deco.get(35, (0,))[0], deco.get(7, (None,))[0])
            return out
        raise ValueError(f"type %{type_id} (opcode {opcode}) has no buffer layout")

    def length(self, const_id: int) -> int:
        """An array's length: its constant's value (a specialization constant's default), or 1 for
        a length computed from constants (OpSpecConstantOp)."""
        found = self.constants.get(const_id)
        return int(found[2]) if found and found[0] in ("const", "spec") else 1

    def size(self, type_id: int) -> int:
        found = self.fields(type_id)
        return max((o + _SIZES[k] for o, k in found), default=0)

    def block(self, struct_id: int) -> dict:
        """A buffer block: its fixed fields, and its runtime array (base, stride, element fields)."""
        _, members = self.types[struct_id]
        out = {"fixed": self.fields(struct_id), "array": None}
        for m, member in enumerate(members):
            opcode, ops = self.types[member]
            if opcode == 29:
                base = self.member_decorations.get((struct_id, m), {}).get(35, (0,))[0]
                stride = self.decorations.get(member, {}).get(6, (None,))[0] or self.size(ops[0])
                out["array"] = {"base": base, "stride": stride, "fields": self.fields(ops[0])}
        return out

    def resources(self) -> list[dict]:
        """Each descriptor resource: set, binding, kind (storage, uniform, image, sampler...), count,
        and for buffers every typed view declared on it (several views of one binding are allowed)."""
        found: dict[tuple[int, int], dict] = {}
        for var, pointer, storage in self.variables:
            if storage not in (0, 2, 12):
                continue
            pointee = self.types[pointer][1][1]
            count = 1
            opcode, ops = self.types[pointee]
            if opcode in (28, 29):
                count = self.length(ops[1]) if opcode == 28 else 0
                pointee = ops[0]
                opcode, ops = self.types[pointee]
            decos = self.decorations.get(var, {})
            key = (decos.get(34, (0,))[0], decos.get(33, (0,))[0])
            if opcode == 30:
                buffer_block = 3 in self.decorations.get(pointee, {})
                kind = "storage" if storage == 12 or buffer_block else "uniform"
                entry = found.setdefault(key, {"set": key[0], "binding": key[1], "kind": kind, "count": count,
                                               "views": []})
                entry["views"].append({"name": self.names.get(var, ""), **self.block(pointee)})
            else:
                kind = {25: "image", 26: "sampler", 27: "sampled_image"}.get(opcode, f"opcode {opcode}")
                if opcode == 25:  # Dim Buffer (5): a texel buffer; Sampled 2: a storage image
                    kind = ("storage_texel_buffer" if ops[5] == 2 else "uniform_texel_buffer") if ops[1] == 5 \
                        else ("storage_image" if ops[5] == 2 else "sampled_image")
                found.setdefault(key, {"set": key[0], "binding": key[1], "kind": kind, "count": count, "views": []})
        return [found[k] for k in sorted(found)]

    def push_fields(self) -> list[dict]:
        """The push-constant block's scalars: name (dotted for nested members), offset and kind."""
        for var, pointer, storage in self.variables:
            if storage == 9:
                struct_id = self.types[pointer][1][1]
                return self._named_fields(struct_id, 0, "")
        return []

    def _named_fields(self, struct_id: int, base: int, prefix: str) -> list[dict]:
        out = []
        for m, member in enumerate(self.types[struct_id][1]):
            deco = self.member_decorations.get((struct_id, m), {})
            offset = base + deco.get(35, (0,))[0]
            name = prefix + self.member_names.get((struct_id, m), f"m{m}")
            if self.types[member][0] == 30:
                out += self._named_fields(member, offset, name + ".")
                continue
            scalars = self.fields(member, offset, deco.get(7, (None,))[0])
            for i, (o, k) in enumerate(scalars):
                out.append({"name": name if len(scalars) == 1 else f"{name}[{i}]", "offset": o, "kind": k})
        return out


# ------------------------------------------------------------------------------------------ the manifest


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def entries(names=None) -> list[dict]:
    found = load_manifest()["shaders"]
    return [e for e in found if not names or e["name"] in names or e["project"] in names]


def spirv_of(entry: dict) -> bytes:
    return (CORPUS / entry["spv"]).read_bytes()


# ------------------------------------------------------------------------------------------ inputs


def _values(rng: np.random.Generator, kind: str, count: int) -> np.ndarray:
    """``count`` valid values of ``kind``: floats k/32 for k in [-64, 64) (exact in f16, f32 and f64),
    integers 0..7 (in bounds as indices of every small buffer, no overflow)."""
    if kind[0] == "f":
        return (rng.integers(-64, 64, count) / 32.0).astype(_NUMPY[kind])
    return rng.integers(0, 8, count).astype(_NUMPY[kind])


def _fill_view(entry_name: str, binding: dict) -> dict | None:
    """The view whose types fill a binding: one with floats if any (its values then read as
    finite numbers through the others), else the first."""
    views = binding.get("views") or []
    for view in views:
        kinds = {k for _, k in (view["array"]["fields"] if view["array"] else view["fixed"])}
        if any(k[0] == "f" for k in kinds):
            return view
    return views[0] if views else None


def inputs(entry: dict) -> list[bytes]:
    """The initial bytes of each of the entry's bindings (in manifest order), seeded by its name."""
    rng = np.random.default_rng(zlib.crc32(entry["name"].encode()))
    out = []
    for binding in entry["bindings"]:
        size = binding.get("bytes", 0)  # (images: none; the runs refuse them)
        data = np.zeros(size, np.uint8)
        view = _fill_view(entry["name"], binding)
        if binding.get("fill") == "zero" or view is None:
            out.append(data.tobytes())
            continue
        array = view["array"]
        if array and array["stride"] > 0:
            count = max((size - array["base"]) // array["stride"], 0)
            for offset, kind in array["fields"]:
                width = _SIZES[kind]
                values = _values(rng, kind, count).view(np.uint8).reshape(count, width)
                starts = array["base"] + offset + np.arange(count) * array["stride"]
                ok = starts + width <= size
                for b in range(width):
                    data[starts[ok] + b] = values[ok, b]
        for offset, kind in view["fixed"]:
            if offset + _SIZES[kind] <= size:
                data[offset:offset + _SIZES[kind]] = _values(rng, kind, 1).view(np.uint8)
        for offset, kind, value in binding.get("set_fields", ()):  # values the run needs (sizes, counts)
            data[offset:offset + _SIZES[kind]] = np.frombuffer(struct.pack("<" + _STRUCT[kind], value), np.uint8)
        out.append(data.tobytes())
    return out


def push_bytes(entry: dict) -> bytes:
    push = entry.get("push") or {}
    data = bytearray(push.get("size", 0))
    for field in push.get("fields", ()):
        kind, value = field["kind"], field["value"]
        if kind == "f16":
            raw = np.array([value], "<f2").tobytes()
        else:
            raw = struct.pack("<" + _STRUCT[kind], int(value) if kind[0] != "f" else float(value))
        data[field["offset"]:field["offset"] + len(raw)] = raw
    return bytes(data)


def constants_of(entry: dict) -> dict[int, object]:
    """The specialization constants the project sets, {id: value} (typed by the module)."""
    return {int(k): v["value"] for k, v in (entry.get("constants") or {}).items()}


def _constant_bytes(entry: dict) -> tuple[list[tuple[int, int, int]], bytes]:
    entries_, data = [], b""
    for key, spec in sorted((entry.get("constants") or {}).items(), key=lambda kv: int(kv[0])):
        kind, value = spec["type"], spec["value"]
        if kind == "bool":
            raw = struct.pack("<I", 1 if value else 0)
        elif kind == "f16":
            raw = np.array([value], "<f2").tobytes()
        else:
            raw = struct.pack("<" + _STRUCT[kind], float(value) if kind[0] == "f" else int(value))
        entries_.append((int(key), len(data), len(raw)))
        data += raw
    return entries_, data


# ------------------------------------------------------------------------------------------ results


@dataclasses.dataclass
class Outcome:
    """One run of one shader: accepted or refused (and why), the bytes of each binding after it,
    how long the load took, and what the validation layer said."""

    accepted: bool
    refusal: str = ""
    outputs: list[bytes] | None = None
    load_s: float = 0.0
    messages: list[str] = dataclasses.field(default_factory=list)


def compare(entry: dict, direct: list[bytes], other: list[bytes]) -> str:
    """"" when every binding holds the same bytes (or, where the manifest states a tolerance, the
    same values within it); else which binding differs and by how much."""
    tolerance = entry.get("tolerance")
    for binding, a, b in zip(entry["bindings"], direct, other):
        if a == b:
            continue
        where = f"set {binding['set']} binding {binding['binding']}"
        kind = binding.get("compare_as", "f32")
        if tolerance is not None and kind[0] == "f":
            x, y = np.frombuffer(a, _NUMPY[kind]).astype(np.float64), np.frombuffer(b, _NUMPY[kind]).astype(np.float64)
            worst = float(np.nanmax(np.abs(x - y) / np.maximum(np.abs(x), 1.0)))
            if worst <= tolerance:
                continue
            return f"{where}: values differ by up to {worst:.3g} (tolerance {tolerance})"
        diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
        return f"{where}: {len(diff)} bytes differ, the first at byte {diff[0]}"
    return ""


def spirv_val(entry: dict) -> str:
    """spirv-val's complaint for the entry's target environment ("" when valid)."""
    tool = shutil.which("spirv-val")
    if tool is None:
        return "spirv-val not installed"
    result = subprocess.run([tool, "--target-env", entry["target_env"], str(CORPUS / entry["spv"])],
                            capture_output=True, text=True, timeout=60, check=False)
    return "" if result.returncode == 0 else (result.stderr or result.stdout).strip().splitlines()[0]


# ------------------------------------------------------------------------------------------ through libshare


def takes_constants(session) -> bool:
    """Whether this tree's Session.load_program takes specialization constants."""
    return "constants" in inspect.signature(session.load_program).parameters


def _load(session, entry: dict):
    """(program, seconds) once loaded into ``session``, or (None, the refusal as an Outcome)."""
    import libshare

    constants = constants_of(entry)
    began = time.perf_counter()
    try:
        if constants and not takes_constants(session):
            raise libshare.InvalidSubmission("specialization constants: Session.load_program takes none")
        program = (session.load_program(spirv_of(entry), constants=constants) if constants
                   else session.load_program(spirv_of(entry)))
    except libshare.LibshareError as exc:
        return None, Outcome(False, f"{type(exc).__name__}: {exc}", load_s=time.perf_counter() - began)
    return program, time.perf_counter() - began


def load_libshare(session, entry: dict) -> Outcome:
    """Load the entry's module into ``session`` (freed again): accepted or refused, and how long."""
    program, found = _load(session, entry)
    if program is None:
        return found
    session.free(program)
    return Outcome(True, load_s=found)


def run_libshare(session, entry: dict, data: list[bytes] | None = None, timeout: float = 120.0) -> Outcome:
    """Load the entry's module into ``session`` and run it once on :func:`inputs` (through a bind group
    past a descriptor's 8 buffers); the program and the buffers are freed before returning."""
    import libshare
    from libshare.ring import C

    data = inputs(entry) if data is None else data
    program, found = _load(session, entry)
    if program is None:
        return found
    load_s = found
    buffers, arrays = [], []
    if any(b["kind"] not in ("storage", "uniform") for b in entry["bindings"]):
        session.free(program)
        return Outcome(True, load_s=load_s)  # accepted; the harness binds buffers only
    try:
        for blob in data:
            buffer = session.alloc(len(blob))
            array = buffer.array(len(blob), np.uint8)
            array[:] = np.frombuffer(blob, np.uint8)
            buffers.append(buffer)
            arrays.append(array)
        try:  # past a descriptor's 8 buffers, through a bind group (freed with its buffers' session objects)
            bound = session.bind_group(program, arrays) if len(arrays) > C.MAX_BUFFERS else arrays
            ticket = session.dispatch(program, groups=tuple(entry["groups"]), buffers=bound, push=push_bytes(entry))
            ticket.wait(timeout)
        except libshare.LibshareError as exc:
            return Outcome(False, f"dispatch: {type(exc).__name__}: {exc}", load_s=load_s)
        return Outcome(True, outputs=[bytes(a) for a in arrays], load_s=load_s)
    finally:
        for buffer in buffers:
            session.free(buffer)
        session.free(program)


# ------------------------------------------------------------------------------------------ a device of its own


class Direct:
    """A private Vulkan device for reference runs: the physical device libshare picks
    (LIBSHARE_DEVICE, else the first), every optional feature it has enabled, robust buffer
    access as libshare has it; with ``validate``, under VK_LAYER_KHRONOS_validation, whose
    warnings and errors each run returns."""

    def __init__(self, validate: bool = False, selector: str | None = None):
        import vulkan as vk

        self.vk, self.ffi, self.lib = vk, vk.ffi, vk.lib
        self.messages: list[str] = []
        layers = ["VK_LAYER_KHRONOS_validation"] if validate else []
        extensions = ["VK_EXT_debug_utils"] if validate else []
        app = vk.VkApplicationInfo(pApplicationName="corpus", apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
        self.instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(
            pApplicationInfo=app, ppEnabledLayerNames=layers, ppEnabledExtensionNames=extensions), None)
        self.messenger = None
        if validate:
            def record(severity, types, data, user):
                self.messages.append(self.ffi.string(data.pMessage).decode(errors="replace"))
                return 0
            self._record = record
            create = vk.vkGetInstanceProcAddr(self.instance, "vkCreateDebugUtilsMessengerEXT")
            self.messenger = create(self.instance, vk.VkDebugUtilsMessengerCreateInfoEXT(
                messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
                | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
                messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
                | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT,
                pfnUserCallback=record), None)
        devices = vk.vkEnumeratePhysicalDevices(self.instance)
        self.physical = devices[int(selector) if selector and selector.isdecimal() else 0]
        self.name = vk.vkGetPhysicalDeviceProperties(self.physical).deviceName
        self._create_device()

    def _create_device(self) -> None:
        vk, ffi, lib = self.vk, self.ffi, self.lib
        available = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(self.physical, None)}
        chain = [ffi.new("VkPhysicalDeviceVulkan11Features*", {"sType": 49}),
                 ffi.new("VkPhysicalDeviceVulkan12Features*", {"sType": 51}),
                 ffi.new("VkPhysicalDeviceVulkan13Features*", {"sType": 53})]
        extensions = []
        if "VK_EXT_robustness2" in available:
            extensions.append("VK_EXT_robustness2")
            chain.append(ffi.new("VkPhysicalDeviceRobustness2FeaturesEXT*",
                                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT}))
        for a, b in itertools.pairwise(chain):
            a.pNext = b
        features = ffi.new("VkPhysicalDeviceFeatures2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                                           "pNext": chain[0]})
        lib.vkGetPhysicalDeviceFeatures2(self.physical, features)  # every feature the device has: enabled
        self._keep = (chain, features)
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        self.family = next(i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
        queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1, pQueuePriorities=[1.0])
        self.device = vk.vkCreateDevice(self.physical, vk.VkDeviceCreateInfo(
            pNext=features, pQueueCreateInfos=[queue_info], ppEnabledExtensionNames=extensions), None)
        self.queue = vk.vkGetDeviceQueue(self.device, self.family, 0)
        self.pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=self.family, flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)

    def _memory_type(self, bits: int) -> int:
        want = self.vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | self.vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        for i in range(self.memory_properties.memoryTypeCount):
            if bits >> i & 1 and self.memory_properties.memoryTypes[i].propertyFlags & want == want:
                return i
        raise RuntimeError("no host-visible coherent memory")

    def run(self, entry: dict, data: list[bytes] | None = None) -> Outcome:
        """Run the entry once on :func:`inputs` (or ``data``); the bytes of each binding after it."""
        vk = self.vk
        data = inputs(entry) if data is None else data
        unsupported = [b for b in entry["bindings"] if b["kind"] not in ("storage", "uniform")]
        if unsupported:
            return Outcome(False, f"direct runs take buffers only, not {unsupported[0]['kind']}")
        del self.messages[:]
        made = []  # (destroy function, handle), undone in reverse
        try:
            began = time.perf_counter()
            pipeline, layout, sets = self._pipeline(entry, made)
            load_s = time.perf_counter() - began
            mapped = self._buffers(entry, data, sets, made)
            self._dispatch(entry, pipeline, layout, sets)
            outputs = [bytes(self.ffi.buffer(pointer, size)) for pointer, size in mapped]
            return Outcome(True, outputs=outputs, load_s=load_s, messages=list(self.messages))
        except vk.VkError as exc:
            return Outcome(False, f"{type(exc).__name__}", messages=list(self.messages))
        finally:
            for destroy, handle in reversed(made):
                destroy(self.device, handle, None)

    def load_time(self, entry: dict) -> float | None:
        """Seconds to create the entry's pipeline (layouts, module, pipeline; destroyed after), or
        None for one the direct runs do not take."""
        if any(b["kind"] not in ("storage", "uniform") for b in entry["bindings"]):
            return None
        made = []
        try:
            began = time.perf_counter()
            self._pipeline(entry, made)
            return time.perf_counter() - began
        finally:
            for destroy, handle in reversed(made):
                destroy(self.device, handle, None)

    def _pipeline(self, entry: dict, made: list):
        vk, ffi = self.vk, self.ffi
        by_set: dict[int, list] = {}
        for b in entry["bindings"]:
            kind = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER if b["kind"] == "storage" else vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
            by_set.setdefault(b["set"], []).append(vk.VkDescriptorSetLayoutBinding(
                binding=b["binding"], descriptorType=kind, descriptorCount=max(b.get("count", 1), 1),
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT))
        set_layouts = []
        for s in range(max(by_set, default=-1) + 1):
            handle = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
                pBindings=by_set.get(s, [])), None)
            made.append((vk.vkDestroyDescriptorSetLayout, handle))
            set_layouts.append(handle)
        push = push_bytes(entry)
        ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=len(push))] \
            if push else []
        layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            pSetLayouts=set_layouts, pPushConstantRanges=ranges), None)
        made.append((vk.vkDestroyPipelineLayout, layout))
        code = spirv_of(entry)
        module = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
        made.append((vk.vkDestroyShaderModule, module))
        map_entries, constant_data = _constant_bytes(entry)
        specialization = None
        if map_entries:
            buffer = ffi.new("char[]", constant_data)
            self._constant_buffer = buffer
            specialization = vk.VkSpecializationInfo(
                pMapEntries=[vk.VkSpecializationMapEntry(constantID=i, offset=o, size=n) for i, o, n in map_entries],
                dataSize=len(constant_data), pData=buffer)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main",
                                                   pSpecializationInfo=specialization)
        pipeline = vk.vkCreateComputePipelines(self.device, None, 1, [vk.VkComputePipelineCreateInfo(
            stage=stage, layout=layout)], None)[0]
        made.append((vk.vkDestroyPipeline, pipeline))
        counts = {}
        for b in entry["bindings"]:
            counts[b["kind"]] = counts.get(b["kind"], 0) + max(b.get("count", 1), 1)
        sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER if k == "storage"
                                         else vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, descriptorCount=n)
                 for k, n in counts.items()] or [vk.VkDescriptorPoolSize(
                     type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1)]
        pool = vk.vkCreateDescriptorPool(self.device, vk.VkDescriptorPoolCreateInfo(
            maxSets=max(len(set_layouts), 1), pPoolSizes=sizes), None)
        made.append((vk.vkDestroyDescriptorPool, pool))
        sets = vk.vkAllocateDescriptorSets(self.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=pool, pSetLayouts=set_layouts)) if set_layouts else []
        return pipeline, layout, sets

    def _buffers(self, entry: dict, data: list[bytes], sets, made: list) -> list:
        vk, ffi = self.vk, self.ffi
        mapped, writes = [], []
        for b, blob in zip(entry["bindings"], data):
            buffer = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(
                size=len(blob), usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT,
                sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
            made.append((vk.vkDestroyBuffer, buffer))
            needs = vk.vkGetBufferMemoryRequirements(self.device, buffer)
            memory = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(
                allocationSize=needs.size, memoryTypeIndex=self._memory_type(needs.memoryTypeBits)), None)
            made.append((vk.vkFreeMemory, memory))
            vk.vkBindBufferMemory(self.device, buffer, memory, 0)
            pointer = vk.vkMapMemory(self.device, memory, 0, len(blob), 0)
            pointer[:] = blob
            mapped.append((ffi.from_buffer(pointer), len(blob)))
            count = max(b.get("count", 1), 1)
            per = len(blob) // count
            infos = [vk.VkDescriptorBufferInfo(buffer=buffer, offset=i * per, range=per) for i in range(count)]
            writes.append(vk.VkWriteDescriptorSet(
                dstSet=sets[b["set"]], dstBinding=b["binding"], descriptorCount=count, pBufferInfo=infos,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER if b["kind"] == "storage"
                else vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER))
        if writes:
            vk.vkUpdateDescriptorSets(self.device, len(writes), writes, 0, None)
        return mapped

    def _dispatch(self, entry: dict, pipeline, layout, sets) -> None:
        vk = self.vk
        command = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            commandPool=self.pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        try:
            vk.vkBeginCommandBuffer(command, vk.VkCommandBufferBeginInfo(
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            vk.vkCmdBindPipeline(command, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline)
            if sets:
                vk.vkCmdBindDescriptorSets(command, vk.VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, len(sets), sets, 0,
                                           None)
            push = push_bytes(entry)
            if push:
                vk.vkCmdPushConstants(command, layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push),
                                      self.ffi.from_buffer(push))
            vk.vkCmdDispatch(command, *entry["groups"])
            barrier = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                         dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)
            vk.vkCmdPipelineBarrier(command, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT,
                                    0, 1, [barrier], 0, None, 0, None)
            vk.vkEndCommandBuffer(command)
            fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
            try:
                vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[command])], fence)
                vk.vkWaitForFences(self.device, 1, [fence], vk.VK_TRUE, 120 * 10**9)
            finally:
                vk.vkDestroyFence(self.device, fence, None)
        finally:
            vk.vkFreeCommandBuffers(self.device, self.pool, 1, [command])

    def close(self) -> None:
        vk = self.vk
        if self.device is None:
            return
        vk.vkDeviceWaitIdle(self.device)
        vk.vkDestroyCommandPool(self.device, self.pool, None)
        vk.vkDestroyDevice(self.device, None)
        if self.messenger is not None:
            vk.vkGetInstanceProcAddr(self.instance, "vkDestroyDebugUtilsMessengerEXT")(self.instance, self.messenger,
                                                                                        None)
        vk.vkDestroyInstance(self.instance, None)
        self.device = None

    def __enter__(self) -> Direct:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ the table

REASONS = (  # (what a refusal message says, the reason it is filed under), first match wins
    ("took longer than", "the vetting compile's time limit"),
    ("crashed the driver", "the driver's compiler crashed"),
    ("specialization constant", "specialization constants"),
    ("texel", "texel buffers"),
    ("image", "images"),
    ("sampler", "images"),
    ("uniform buffer", "uniform buffers"),
    ("buffers (at", "more buffers than a dispatch binds"),
    ("duplicate binding", "several views of one binding"),
    ("arrays of buffers", "arrays of buffers"),
    ("descriptor set", "descriptor sets other than 0"),
    ("not a scalar constant", "sizes from constant expressions"),
    ("gap", "bindings with gaps"),
    ("binding", "bindings"),
    ("capability", "capabilities"),
    ("extension", "extensions"),
    ("storage class", "storage classes"),
    ("spirv-val", "the SPIR-V validator"),
    ("validator", "the SPIR-V validator"),
    ("version", "SPIR-V version"),
    ("push", "push constants"),
    ("shared", "shared memory"),
    ("workgroup", "workgroup size"),
    ("registering", "registering the program"),
    ("dispatch:", "the dispatch"),
)


def reason(refusal: str) -> str:
    """The heading a refusal message is filed under in the acceptance table."""
    text = refusal.lower()
    return next((heading for needle, heading in REASONS if needle in text), "other")


@dataclasses.dataclass
class Record:
    """What the corpus run found for one shader."""

    name: str
    project: str
    spirv_val: str = ""
    direct: str = ""  # "" when the direct run ran, else why not
    deterministic: bool = True
    accepted: bool = False
    refusal: str = ""
    identical: bool | None = None
    difference: str = ""
    load_ms: float = 0.0
    direct_load_ms: float = 0.0
    validation: list[str] = dataclasses.field(default_factory=list)

    @property
    def reason(self) -> str:
        return "" if self.accepted else reason(self.refusal)


def run_one(entry: dict, direct: Direct, session) -> Record:
    """Run ``entry`` twice directly (to see that it is deterministic) and once through ``session``."""
    record = Record(entry["name"], entry["project"], spirv_val=spirv_val(entry))
    data = inputs(entry)
    first = direct.run(entry, data)
    record.validation = first.messages
    if first.accepted:
        record.direct_load_ms = first.load_s * 1e3
        second = direct.run(entry, data)
        record.deterministic = second.accepted and second.outputs == first.outputs
    else:
        record.direct = first.refusal
    mine = run_libshare(session, entry, data)
    record.accepted, record.refusal, record.load_ms = mine.accepted, mine.refusal, mine.load_s * 1e3
    if mine.accepted and first.accepted:
        record.difference = compare(entry, first.outputs, mine.outputs)
        record.identical = not record.difference
    return record


def table(records: list[Record]) -> str:
    """One line per shader, then the acceptance per project and per refusal reason."""
    lines = [f"{'shader':46} {'libshare':9} {'result':10} {'load ms':>8} {'val':>4}  refusal or difference"]
    for r in records:
        result = "n/a" if r.identical is None else ("identical" if r.identical else "DIFFERS")
        if r.identical is False and not r.deterministic:
            result = "nondeterm."
        note = r.refusal if not r.accepted else r.difference or (f"direct: {r.direct}" if r.direct else "")
        lines.append(f"{r.name:46} {'accepted' if r.accepted else 'REFUSED':9} {result:10} {r.load_ms:8.1f} "
                     f"{len(r.validation):4}  {note[:150]}")
    lines.append("")
    projects = sorted({r.project for r in records})
    for p in projects:
        mine = [r for r in records if r.project == p]
        same = sum(bool(r.identical) for r in mine)
        lines.append(f"{p:10} accepted {sum(r.accepted for r in mine):3} of {len(mine):3}, identical {same}")
    total = len(records)
    lines.append(f"{'all':10} accepted {sum(r.accepted for r in records):3} of {total:3}, "
                 f"identical {sum(bool(r.identical) for r in records)}")
    lines.append("")
    by_reason: dict[str, list[str]] = {}
    for r in records:
        if not r.accepted:
            by_reason.setdefault(r.reason, []).append(r.name)
    for heading, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"refused for {heading} ({len(names)}): {', '.join(names)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import libshare

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="shaders or projects (all when none)")
    parser.add_argument("--daemon", metavar="PIPE_DIR", help="run through the arbiter at PIPE_DIR, not embedded")
    parser.add_argument("--validate", action="store_true", help="direct runs under VK_LAYER_KHRONOS_validation")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    chosen = entries(args.names)
    mode = {"mode": "daemon", "pipe_directory": args.daemon} if args.daemon else {"mode": "embedded"}
    with Direct(validate=args.validate) as direct, libshare.connect(name="corpus", **mode) as session:
        records = [run_one(e, direct, session) for e in chosen]
    print(table(records))
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in records], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
