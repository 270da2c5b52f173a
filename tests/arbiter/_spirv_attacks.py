"""Hostile SPIR-V for the program-isolation tests and ``tools/attack_programs.py``.

Three kinds of module, all made at test time (nothing hostile is checked in):

* **Refused features.** :func:`feature_attacks` builds one module per capability,
  extension, addressing model or storage class a compute kernel over its bound
  storage buffers does not need: GLSL through ``glslangValidator`` where GLSL can
  say it (``GL_EXT_buffer_reference``), hand-patched words of a shipped shader where
  it cannot (``Kernel``, ``Linkage``, ``Physical64``...). Each carries the text the
  arbiter's refusal must contain.
* **Mutants.** :class:`Mutator` derives module ``i`` of seed ``s`` from the shipped
  shaders with its own ``random.Random(f"{s}:{i}")``, so one failing mutant is
  rebuilt alone from ``(seed, index)`` and its description says what was changed.
* **Slow modules.** :func:`slow_compile_glsl` is a small valid kernel whose forced
  unrolling makes the driver work for seconds; a ``salt`` makes each run's module
  new to Mesa's on-disk shader cache, which would otherwise hide the cost.

Run as ``python -m tests.arbiter._spirv_attacks DIRECTORY`` it writes every feature
attack and a few mutants there as ``.spv`` files, for ``spirv-val`` or a debugger.
"""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import libshare

SHIPPED = ("saxpy", "vadd", "sum", "matmul", "busy")
"""The shipped shaders the mutator starts from."""

HEADER_WORDS = 5

# Opcodes used by the patchers.
OP_NOP, OP_NAME, OP_STRING, OP_EXTENSION, OP_MEMORY_MODEL, OP_ENTRY_POINT = 0, 5, 7, 10, 14, 15
OP_EXECUTION_MODE, OP_CAPABILITY, OP_TYPE_INT, OP_CONSTANT = 16, 17, 21, 43
OP_FUNCTION, OP_DECORATE, OP_EXECUTION_MODE_ID = 54, 71, 331

# Capabilities, addressing models and storage classes by SPIR-V name.
CAPABILITIES = {"Addresses": 4, "Linkage": 5, "Kernel": 6, "VariablePointersStorageBuffer": 4441,
                "VariablePointers": 4442, "PhysicalStorageBufferAddresses": 5347}
ADDRESSING = {"Logical": 0, "Physical32": 1, "Physical64": 2, "PhysicalStorageBuffer64": 5348}
MEMORY_MODELS = {"Simple": 0, "GLSL450": 1, "OpenCL": 2, "Vulkan": 3}
DECORATION_LINKAGE_ATTRIBUTES, LINKAGE_EXPORT = 41, 0
POINTER_DECORATIONS = {5355, 5356}  # RestrictPointer, AliasedPointer (they need PhysicalStorageBufferAddresses)

GLSLANG = "glslangValidator"


def have_tools() -> str | None:
    """None when glslangValidator is on PATH, else what to install."""
    return None if shutil.which(GLSLANG) else "glslangValidator not found (apt install glslang-tools)"


def shipped(name: str) -> bytes:
    """The precompiled SPIR-V of shipped shader ``name``."""
    return libshare.shaders.path(name).read_bytes()


def compile_glsl(source: str, directory: Path, name: str) -> bytes:
    """Compile GLSL compute ``source`` to SPIR-V (Vulkan 1.1) in ``directory``; return the module."""
    directory.mkdir(parents=True, exist_ok=True)
    src, out = directory / f"{name}.comp", directory / f"{name}.spv"
    src.write_text(source)
    done = subprocess.run([GLSLANG, "-V", "--target-env", "vulkan1.1", "-o", str(out), str(src)],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"glslangValidator failed on {name}: {done.stdout}{done.stderr}")
    return out.read_bytes()


# ------------------------------------------------------------------ words

def words(module: bytes) -> list[int]:
    """The module as little-endian 32-bit words (its length must be a multiple of 4)."""
    return list(struct.unpack(f"<{len(module) // 4}I", module))


def assemble(code: list[int]) -> bytes:
    """Words back into bytes."""
    return struct.pack(f"<{len(code)}I", *code)


def instruction(opcode: int, *operands: int) -> list[int]:
    """One instruction's words."""
    return [(len(operands) + 1) << 16 | opcode, *operands]


def string(text: str) -> list[int]:
    """A nul-terminated literal string packed into words."""
    raw = text.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


@dataclass
class Instruction:
    """One instruction of a well-formed module: where it starts, its opcode and its words."""

    pos: int
    opcode: int
    code: list[int]


def instructions(code: list[int]) -> Iterator[Instruction]:
    """The instructions of a well-formed module (the shipped shaders and what glslang makes)."""
    pos = HEADER_WORDS
    while pos < len(code):
        count = code[pos] >> 16
        if count == 0 or pos + count > len(code):
            raise ValueError(f"malformed instruction at word {pos}")
        yield Instruction(pos, code[pos] & 0xFFFF, code[pos:pos + count])
        pos += count


def edit(module: bytes, change: Callable[[list[Instruction]], list[Instruction]], bound: int | None = None) -> bytes:
    """Rebuild ``module`` from ``change(its instructions)``, with a new id bound if given."""
    code = words(module)
    header = code[:HEADER_WORDS]
    if bound is not None:
        header[3] = bound
    body = change(list(instructions(code)))
    return assemble(header + [word for each in body for word in each.code])


def _insert_after(body: list[Instruction], opcodes: set[int], new: list[list[int]]) -> list[Instruction]:
    """``new`` instructions after the last of ``opcodes`` (the module's layout sections)."""
    last = max(i for i, each in enumerate(body) if each.opcode in opcodes)
    return body[:last + 1] + [Instruction(-1, code[0] & 0xFFFF, code) for code in new] + body[last + 1:]


def with_capability(module: bytes, capability: str, extension: str | None = None) -> bytes:
    """``module`` declaring one more capability (and extension, when given)."""
    new = [instruction(OP_CAPABILITY, CAPABILITIES[capability])]
    if extension:
        new.append(instruction(OP_EXTENSION, *string(extension)))
    return edit(module, lambda body: _insert_after(body, {OP_CAPABILITY}, new))


def with_extension(module: bytes, extension: str) -> bytes:
    """``module`` declaring one more extension."""
    new = [instruction(OP_EXTENSION, *string(extension))]
    return edit(module, lambda body: _insert_after(body, {OP_CAPABILITY, OP_EXTENSION}, new))


def with_memory_model(module: bytes, addressing: str, memory: str | None = None) -> bytes:
    """``module`` with its OpMemoryModel's addressing model (and memory model) replaced."""
    def change(body):
        for each in body:
            if each.opcode == OP_MEMORY_MODEL:
                each.code = instruction(OP_MEMORY_MODEL, ADDRESSING[addressing],
                                        MEMORY_MODELS[memory] if memory else each.code[2])
        return body
    return edit(module, change)


def without(module: bytes, keep: Callable[[Instruction], bool]) -> bytes:
    """``module`` without the instructions ``keep`` refuses."""
    return edit(module, lambda body: [each for each in body if keep(each)])


def header(module: bytes, index: int, value: int) -> bytes:
    """``module`` with header word ``index`` (0 magic, 1 version, 2 generator, 3 id bound, 4 schema) set."""
    code = words(module)
    code[index] = value & 0xFFFFFFFF
    return assemble(code)


def id_bound(module: bytes) -> int:
    return words(module)[3]


def distinct(module: bytes, n: int) -> bytes:
    """A valid module that differs from ``module`` only by an ``OpString "distinct n"`` (a new digest,
    the same kernel): the cheapest way to make many different programs."""
    bound = id_bound(module)
    new = [instruction(OP_STRING, bound, *string(f"distinct {n}"))]
    layout = {OP_ENTRY_POINT, OP_EXECUTION_MODE, OP_EXECUTION_MODE_ID}
    return edit(module, lambda body: _insert_after(body, layout, new), bound=bound + 1)


def padded(module: bytes, nbytes: int) -> bytes:
    """A valid module of about ``nbytes``: ``module`` with as many extra 32-bit constants as fit.

    This is the shape of a module that is big for real (every constant is an id the
    compiler reads), not padding a size check could skip.
    """
    code = words(module)
    uint = next((each.code[1] for each in instructions(code)
                 if each.opcode == OP_TYPE_INT and each.code[2:] == [32, 0]), None)
    if uint is None:
        raise ValueError("module declares no 32-bit unsigned int type")
    count = max(0, (nbytes - len(module)) // 16)
    bound = id_bound(module)
    new = [instruction(OP_CONSTANT, uint, bound + i, i) for i in range(count)]

    def change(body):
        at = next(i for i, each in enumerate(body) if each.opcode == OP_TYPE_INT and each.code[1] == uint)
        return body[:at + 1] + [Instruction(-1, OP_CONSTANT, c) for c in new] + body[at + 1:]
    return edit(module, change, bound=bound + count)


# ------------------------------------------------------------------ refused features

@dataclass(frozen=True)
class Attack:
    """A module the arbiter must refuse, and the texts one of which its refusal must contain."""

    name: str
    module: bytes
    expect: tuple[str, ...]
    why: str


BUFFER_REFERENCE_GLSL = """#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
// Reads and writes memory at an address the client puts in its push constants:
// another client's buffer, the arbiter's heap, or (a small address) a SIGSEGV.
// (uvec2, not uint64_t: the refusal must be for the address, not for Int64.)
layout(local_size_x = 1) in;
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint w[]; };
layout(std430, set = 0, binding = 0) buffer Out { uint leaked[]; };
layout(push_constant) uniform Push { uvec2 address; uint value; } pc;
void main() {
    Words target = Words(pc.address);
    leaked[0] = target.w[0];
    target.w[0] = pc.value;
}
"""

IMAGE_GLSL = """#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0, r32f) uniform image2D picture;
void main() { imageStore(picture, ivec2(0), vec4(1.0)); }
"""

SAMPLER_GLSL = """#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) uniform sampler2D texture_;
layout(std430, set = 0, binding = 1) buffer Out { vec4 texel; };
void main() { texel = textureLod(texture_, vec2(0.5), 0.0); }
"""

HONEST_FANCY_GLSL = """#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require
// What honest kernels use beyond saxpy: shared memory, barriers, atomics, subgroup sums.
// out.reversed[i] is x reversed within each workgroup of 64; out.total counts invocations.
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uint total; uint unused; float reversed[]; };
shared float tile[64];
void main() {
    uint i = gl_GlobalInvocationID.x, l = gl_LocalInvocationID.x;
    tile[l] = x[i];
    barrier();
    reversed[i] = tile[63 - l] + (subgroupAdd(1.0) - float(gl_SubgroupSize));
    atomicAdd(total, 1u);
}
"""


def buffer_reference(directory: Path) -> bytes:
    """The GL_EXT_buffer_reference kernel (PhysicalStorageBufferAddresses) of issue 11."""
    return compile_glsl(BUFFER_REFERENCE_GLSL, directory, "buffer_reference")


def feature_attacks(directory: Path) -> list[Attack]:
    """One module per refused capability, extension, addressing model and storage class."""
    saxpy = shipped("saxpy")
    bda = buffer_reference(directory)
    psb_cap = CAPABILITIES["PhysicalStorageBufferAddresses"]

    def not_psb(each: Instruction) -> bool:  # the storage class stays: its pointer type and variables
        return not ((each.opcode == OP_CAPABILITY and each.code[1] == psb_cap) or each.opcode == OP_EXTENSION
                    or (each.opcode == OP_DECORATE and each.code[2] in POINTER_DECORATIONS))

    entry_modes = {OP_ENTRY_POINT, OP_EXECUTION_MODE, OP_EXECUTION_MODE_ID}
    library = edit(with_capability(saxpy, "Linkage"), lambda body: _export_main(
        [each for each in body if each.opcode not in entry_modes]))
    return [
        Attack("buffer_reference", bda, ("capability PhysicalStorageBufferAddresses",),
               "GLSL GL_EXT_buffer_reference: loads and stores through an address from push constants"),
        Attack("psb_extension_only", with_extension(saxpy, "SPV_KHR_physical_storage_buffer"),
               ("extension SPV_KHR_physical_storage_buffer",), "saxpy declaring the extension alone"),
        Attack("psb_ext_extension_only", with_extension(saxpy, "SPV_EXT_physical_storage_buffer"),
               ("extension SPV_EXT_physical_storage_buffer",), "the EXT spelling of the same extension"),
        Attack("psb_capability_only", with_capability(saxpy, "PhysicalStorageBufferAddresses"),
               ("capability PhysicalStorageBufferAddresses",), "saxpy declaring the capability alone"),
        Attack("psb_addressing_model_only", with_memory_model(saxpy, "PhysicalStorageBuffer64"),
               ("addressing model PhysicalStorageBuffer64",), "saxpy with the addressing model alone"),
        Attack("psb_storage_class_only", with_memory_model(without(bda, not_psb), "Logical"),
               ("storage class PhysicalStorageBuffer",),
               "the buffer_reference kernel with its capability, extension and addressing model removed"),
        Attack("variable_pointers", with_capability(saxpy, "VariablePointers", "SPV_KHR_variable_pointers"),
               ("capability VariablePointers", "extension SPV_KHR_variable_pointers"),
               "pointers chosen at run time (OpSelect/OpPhi of pointers)"),
        Attack("variable_pointers_storage_buffer",
               with_capability(saxpy, "VariablePointersStorageBuffer", "SPV_KHR_variable_pointers"),
               ("capability VariablePointersStorageBuffer", "extension SPV_KHR_variable_pointers"),
               "the storage-buffer-only form of variable pointers"),
        Attack("linkage_capability", with_capability(saxpy, "Linkage"), ("capability Linkage",),
               "saxpy declaring Linkage"),
        Attack("linkage_library", library, ("capability Linkage", "entry point"),
               "a library module: Linkage, main exported, no entry point"),
        Attack("addresses_capability", with_capability(saxpy, "Addresses"), ("capability Addresses",),
               "saxpy declaring Addresses"),
        Attack("physical64_addressing", with_memory_model(saxpy, "Physical64"), ("addressing model Physical64",),
               "saxpy with the Physical64 addressing model (no Addresses capability)"),
        Attack("physical32_addressing", with_memory_model(saxpy, "Physical32"), ("addressing model Physical32",),
               "saxpy with the Physical32 addressing model"),
        Attack("opencl_kernel", with_memory_model(with_capability(saxpy, "Kernel"), "Physical64", "OpenCL"),
               ("capability Kernel",), "saxpy dressed as an OpenCL kernel: Kernel, Physical64, OpenCL"),
        Attack("kernel_capability", with_capability(saxpy, "Kernel"), ("capability Kernel",),
               "saxpy declaring Kernel"),
        Attack("image", compile_glsl(IMAGE_GLSL, directory, "image"),
               ("image", "storage class UniformConstant", "capability"), "a storage image"),
        Attack("sampler", compile_glsl(SAMPLER_GLSL, directory, "sampler"),
               ("image", "sampler", "storage class UniformConstant", "capability"), "a combined image sampler"),
    ]


def _export_main(body: list[Instruction]) -> list[Instruction]:
    """Decorate %main (the function the entry point named) LinkageAttributes "main" Export."""
    main = next(each.code[2] for each in body if each.opcode == OP_FUNCTION)
    decoration = instruction(OP_DECORATE, main, DECORATION_LINKAGE_ATTRIBUTES, *string("main"), LINKAGE_EXPORT)
    first_annotation = next(i for i, each in enumerate(body) if each.opcode == OP_DECORATE)
    return body[:first_annotation] + [Instruction(-1, OP_DECORATE, decoration)] + body[first_annotation:]


# ------------------------------------------------------------------ modules that killed the arbiter

SAXPY_FLIPS_THAT_SEGFAULTED = ((804, 0x4D), (318, 0x44), (1049, 0x5D), (130, 0xE5), (1156, 0x8D), (807, 0x0E))
"""(byte offset, xor mask) single-byte changes of saxpy.spv each of which, alone in a fresh
process, made Mesa 22.3 segfault in ``vkCreateComputePipelines`` (about 1 in 33 random flips
did), found against saxpy.spv as of commit 7438237. Should saxpy.spv change they are still
damaged modules, only no longer these ones."""


def known_killers() -> list[tuple[str, bytes]]:
    """Modules that hurt the arbiter before issue 11 (Mesa 22.3, lavapipe), as (what, module).

    Checked one by one in a fresh process against commit 7438237: the id bounds of 2^31
    and more, the byte flips, the truncations and matmul with id bound 16 segfault in
    ``vkCreateComputePipelines``; an id bound of 4 (below the ids the module uses, so Mesa
    writes past its value array) corrupts the heap, and glibc aborts the process later
    ("corrupted double-linked list", "corrupted size vs. prev_size" several hundred loads
    on); bounds 5 and 16 of saxpy got a LibshareError with VK_ERROR_UNKNOWN.
    """
    saxpy, matmul, busy = shipped("saxpy"), shipped("matmul"), shipped("busy")
    cases = [(f"saxpy with id bound 0x{bound:08x}", header(saxpy, 3, bound))
             for bound in (0xFFFFFFFF, 0xFFFFFFFE, 0x80000000, 0x7FFFFFFF)]
    cases += [(f"{name} with id bound {bound} (below its ids: a heap overflow)", header(module, 3, bound))
              for name, module in (("saxpy", saxpy), ("matmul", matmul)) for bound in (4, 5, 16)]
    for at, mask in SAXPY_FLIPS_THAT_SEGFAULTED:
        flipped = bytearray(saxpy)
        flipped[at] ^= mask
        cases.append((f"saxpy with byte {at} ^ 0x{mask:02x}", bytes(flipped)))
    cases += [(f"matmul truncated to {size} bytes", matmul[:size]) for size in (2012, 1828)]
    cases += [("busy truncated to 1588 bytes", busy[:1588])]
    return cases


# ------------------------------------------------------------------ slow modules

def slow_compile_glsl(unroll: int, salt: int) -> str:
    """A valid storage-buffer kernel with an ``unroll`` x ``unroll`` forced-unroll loop nest.

    The module stays about 2 KiB whatever ``unroll`` is; the work is the driver's. On
    lavapipe (Mesa 22.3) ``vkCreateComputePipelines`` unrolls it in NIR (``unroll=256``:
    about 4 s and 300 MiB), and llvmpipe compiles the machine code lazily, at the first
    dispatch (``unroll=48``: about 5 s; ``64``: 12 s). ``salt`` goes into the code so
    that each run's module is new to Mesa's on-disk shader cache.
    """
    return f"""#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer X {{ float x[]; }};
layout(push_constant) uniform Push {{ uint n; float a; }} pc;
void main() {{
    uint i = gl_GlobalInvocationID.x;
    float acc = x[i % pc.n] + {salt & 0xFFFFFF}.0;
    [[unroll]] for (int j = 0; j < {unroll}; j++) {{
        [[unroll]] for (int k = 0; k < {unroll}; k++) {{
            acc = acc * pc.a + sin(acc + float(j * {unroll} + k));
        }}
    }}
    x[i % pc.n] = acc;
}}
"""


def slow_compile(directory: Path, unroll: int, salt: int) -> bytes:
    """:func:`slow_compile_glsl` compiled to SPIR-V."""
    return compile_glsl(slow_compile_glsl(unroll, salt), directory, f"slow_{unroll}_{salt}")


# ------------------------------------------------------------------ mutants

INTERESTING = (0, 1, 2, 3, 4, 5, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x3FFFFF, 0x400000,
               0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)
"""Word values that break parsers: zero, small counts, sign and width edges."""


class Mutator:
    """Mutated shipped shaders: :meth:`mutant` ``(i)`` depends only on the seed and ``i``."""

    def __init__(self, seed: int, bases: tuple[str, ...] = SHIPPED):
        self.seed = seed
        self.bases = {name: shipped(name) for name in bases}

    def mutant(self, index: int) -> tuple[str, bytes]:
        """Mutant ``index``: (what was done, the module)."""
        rng = random.Random(f"{self.seed}:{index}")
        name = rng.choice(sorted(self.bases))
        data = bytearray(self.bases[name])
        steps = [name]
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            kind = rng.choice(self._KINDS)
            steps.append(getattr(self, f"_{kind}")(rng, data))
        return "; ".join(steps), bytes(data)

    def mutants(self, count: int, start: int = 0) -> Iterator[tuple[int, str, bytes]]:
        for index in range(start, start + count):
            yield (index, *self.mutant(index))

    _KINDS = ("flip", "flip", "flip", "truncate", "header", "header", "replace", "replace",
              "word_count", "opcode", "duplicate", "delete", "swap", "splice", "extend")

    def _flip(self, rng: random.Random, data: bytearray) -> str:
        if not data:
            return "flip (empty)"
        done = []
        for _ in range(rng.choice((1, 1, 1, 2, 4))):
            at, mask = rng.randrange(len(data)), rng.randrange(1, 256)
            data[at] ^= mask
            done.append(f"{at}^0x{mask:02x}")
        return "flip bytes " + ",".join(done)

    def _truncate(self, rng: random.Random, data: bytearray) -> str:
        keep = rng.randrange(len(data) + 1)
        if rng.random() < 0.7:
            keep -= keep % 4
        del data[keep:]
        return f"truncate to {keep} bytes"

    def _header(self, rng: random.Random, data: bytearray) -> str:
        if len(data) < 4 * HEADER_WORDS:
            return "header (too short)"
        index = rng.choice((1, 2, 3, 3, 3, 4))
        value = rng.choice(INTERESTING + (rng.getrandbits(32), rng.randrange(1 << 16), 0x00010000 | rng.randrange(256) << 8))
        struct.pack_into("<I", data, 4 * index, value)
        return f"header word {index} = 0x{value:08x}"

    def _replace(self, rng: random.Random, data: bytearray) -> str:
        count = len(data) // 4
        if count <= HEADER_WORDS:
            return "replace (no body)"
        at = rng.randrange(HEADER_WORDS, count)
        old = struct.unpack_from("<I", data, 4 * at)[0]
        value = rng.choice(INTERESTING + (rng.getrandbits(32), old + 1, old - 1 & 0xFFFFFFFF, old ^ 1 << rng.randrange(32)))
        struct.pack_into("<I", data, 4 * at, value & 0xFFFFFFFF)
        return f"word {at} 0x{old:08x} -> 0x{value & 0xFFFFFFFF:08x}"

    def _spans(self, data: bytearray) -> list[tuple[int, int]]:
        """(start word, word count) of the instructions, as far as they parse."""
        code = struct.unpack(f"<{len(data) // 4}I", bytes(data[:len(data) // 4 * 4]))
        spans, pos = [], HEADER_WORDS
        while pos < len(code):
            count = code[pos] >> 16
            if count == 0 or pos + count > len(code):
                break
            spans.append((pos, count))
            pos += count
        return spans

    def _instruction(self, rng: random.Random, data: bytearray) -> tuple[int, int] | None:
        """A random instruction's (first word, word count), or None when the module has none."""
        spans = self._spans(data)
        return rng.choice(spans) if spans else None

    def _word_count(self, rng: random.Random, data: bytearray) -> str:
        if not (picked := self._instruction(rng, data)):
            return "word count (no instructions)"
        pos, _ = picked
        old = struct.unpack_from("<I", data, 4 * pos)[0]
        count = rng.choice((0, 1, 2, 0xFFFF, rng.randrange(1, 64)))
        struct.pack_into("<I", data, 4 * pos, count << 16 | old & 0xFFFF)
        return f"instruction at word {pos}: word count {old >> 16} -> {count}"

    def _opcode(self, rng: random.Random, data: bytearray) -> str:
        if not (picked := self._instruction(rng, data)):
            return "opcode (no instructions)"
        pos, _ = picked
        old = struct.unpack_from("<I", data, 4 * pos)[0]
        opcode = rng.choice((rng.randrange(0, 400), rng.randrange(0, 0x10000), 0, 0xFFFF, 4400 + rng.randrange(2000)))
        struct.pack_into("<I", data, 4 * pos, old & 0xFFFF0000 | opcode)
        return f"instruction at word {pos}: opcode {old & 0xFFFF} -> {opcode}"

    def _duplicate(self, rng: random.Random, data: bytearray) -> str:
        if not (picked := self._instruction(rng, data)):
            return "duplicate (no instructions)"
        pos, count = picked
        data[4 * (pos + count):4 * (pos + count)] = data[4 * pos:4 * (pos + count)]
        return f"duplicate instruction at word {pos}"

    def _delete(self, rng: random.Random, data: bytearray) -> str:
        if not (picked := self._instruction(rng, data)):
            return "delete (no instructions)"
        pos, count = picked
        del data[4 * pos:4 * (pos + count)]
        return f"delete instruction at word {pos}"

    def _swap(self, rng: random.Random, data: bytearray) -> str:
        spans = self._spans(data)
        if len(spans) < 2:
            return "swap (fewer than 2 instructions)"
        (a, na), (b, nb) = sorted(rng.sample(spans, 2))
        first, second = bytes(data[4 * a:4 * (a + na)]), bytes(data[4 * b:4 * (b + nb)])
        middle = bytes(data[4 * (a + na):4 * b])
        data[4 * a:4 * (b + nb)] = second + middle + first
        return f"swap instructions at words {a} and {b}"

    def _splice(self, rng: random.Random, data: bytearray) -> str:
        """An instruction of another shipped shader, inserted at an instruction boundary."""
        other = self.bases[rng.choice(sorted(self.bases))]
        donor = [(p, c) for p, c in self._spans(bytearray(other))]
        spans = self._spans(data)
        if not donor or not spans:
            return "splice (nothing to splice)"
        pos, count = rng.choice(donor)
        at = rng.choice(spans)[0]
        data[4 * at:4 * at] = other[4 * pos:4 * (pos + count)]
        return f"splice a foreign instruction (its word {pos}) at word {at}"

    def _extend(self, rng: random.Random, data: bytearray) -> str:
        """Random words, or one huge declared instruction, at the end."""
        if rng.random() < 0.5:
            extra = [rng.getrandbits(32) for _ in range(rng.randrange(1, 16))]
            data += struct.pack(f"<{len(extra)}I", *extra)
            return f"append {len(extra)} random words"
        data += struct.pack("<I", 0xFFFF << 16 | rng.choice((OP_NOP, OP_STRING, OP_CONSTANT, OP_NAME)))
        return "append an instruction that claims 65535 words"


# ------------------------------------------------------------------ a command for looking at them

def main(directory: str) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for attack in feature_attacks(out / "glsl"):
        (out / f"{attack.name}.spv").write_bytes(attack.module)
        print(f"{attack.name}.spv: {attack.why}; refusal names {' or '.join(attack.expect)}")
    mutator = Mutator(0)
    for index, description, module in mutator.mutants(5):
        (out / f"mutant_0_{index}.spv").write_bytes(module)
        print(f"mutant_0_{index}.spv: {description}")


if __name__ == "__main__":
    main(*sys.argv[1:])
