"""SPIR-V reflection: the shipped shaders, hand-edited modules and hostile input."""

from __future__ import annotations

import struct
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libshare import shaders
from libshare.arbiter.programs.spirv import ShaderInterface, bound_in_set_zero, reflect, zero_initialized
from libshare.errors import InvalidSubmission

MAGIC = 0x07230203

def _in_set_zero(buffers: int) -> dict:
    """The binding fields of a kernel whose ``buffers`` storage buffers are bindings 0..N-1 of set 0."""
    return {"bindings": tuple(range(buffers)), "resources": tuple((0, k) for k in range(buffers)),
            "arrays": (1,) * buffers}


EXPECTED = {
    "saxpy": ShaderInterface("main", (64, 1, 1), push_constant_size=8, private_bytes=4, **_in_set_zero(2)),
    "vadd": ShaderInterface("main", (64, 1, 1), push_constant_size=4, private_bytes=4, **_in_set_zero(3)),
    "sum": ShaderInterface("main", (64, 1, 1), push_constant_size=4, workgroup_bytes=256, private_bytes=16,
                           **_in_set_zero(2)),  # shared float[64]
    "matmul": ShaderInterface("main", (16, 16, 1), push_constant_size=12, workgroup_bytes=2048, private_bytes=44,
                              **_in_set_zero(3)),  # two shared float[16][16]
    "busy": ShaderInterface("main", (64, 1, 1), push_constant_size=8, private_bytes=84, **_in_set_zero(1)),
}

# Opcodes and enumerants used below (SPIR-V specification, section 3).
OP_EXECUTION_MODE, OP_CONSTANT, OP_VARIABLE, OP_DECORATE, OP_EXECUTION_MODE_ID = 16, 43, 59, 71, 331
DEC_BUILTIN, DEC_BINDING, DEC_DESCRIPTOR_SET = 11, 33, 34
SC_UNIFORM, SC_PRIVATE, SC_PUSH_CONSTANT, SC_STORAGE_BUFFER = 2, 6, 9, 12


MAIN = [0x6E69616D, 0]  # "main" as a nul-terminated literal string


def inst(opcode: int, *operands: int) -> list[int]:
    """One instruction: its word count and opcode, then its operands."""
    return [(len(operands) + 1) << 16 | opcode, *operands]


HEADER = [MAGIC, 0x00010300, 0, 100, 0] + inst(14, 0, 1)  # SPIR-V 1.3, id bound 100; Logical GLSL450
ENTRY_POINT = inst(15, 5, 1, *MAIN)  # OpEntryPoint GLCompute %1 "main"
PROLOGUE = HEADER + ENTRY_POINT + inst(OP_EXECUTION_MODE, 1, 17, 8, 4, 2)  # LocalSize 8 4 2


def spirv(name: str) -> bytes:
    return shaders.path(name).read_bytes()


def words(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def pack(module: list[int], order: str = "<") -> bytes:
    return struct.pack(f"{order}{len(module)}I", *module)


def edit(data: bytes, opcode: int, change: Callable[[list[int]], list[int] | None]) -> bytes:
    """Rewrite the operands of every ``opcode`` instruction through ``change``.

    ``change`` returns new operands (which may change the instruction's length)
    or None to leave the instruction alone.
    """
    module, out, pos = words(data), words(data)[:5], 5
    while pos < len(module):
        count, op = module[pos] >> 16, module[pos] & 0xFFFF
        operands = module[pos + 1:pos + count]
        new = change(list(operands)) if op == opcode else None
        if new is None:
            out += module[pos:pos + count]
        else:
            out += [(len(new) + 1) << 16 | op, *new]
        pos += count
    return pack(out)


def drop_workgroup_size_builtin(data: bytes) -> bytes:
    """Turn ``BuiltIn WorkgroupSize`` into an unrelated decoration, so LocalSize rules."""
    return edit(data, OP_DECORATE, lambda ops: [ops[0], 0, 0] if ops[1:] == [DEC_BUILTIN, 25] else None)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reflects_shipped_shader(name: str) -> None:
    assert reflect(spirv(name)) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_big_endian_module_reflects_the_same(name: str) -> None:
    assert reflect(pack(words(spirv(name)), ">")) == EXPECTED[name]


def test_accepts_bytearray_and_memoryview() -> None:
    assert reflect(bytearray(spirv("saxpy"))) == EXPECTED["saxpy"]
    assert reflect(memoryview(spirv("saxpy"))) == EXPECTED["saxpy"]


def test_rejects_non_bytes() -> None:
    with pytest.raises(TypeError):
        reflect("not bytes")  # type: ignore[arg-type]


def test_workgroup_size_builtin_overrides_local_size_mode() -> None:
    data = edit(spirv("matmul"), OP_EXECUTION_MODE, lambda ops: [ops[0], ops[1], 1, 1, 1])
    assert reflect(data).local_size == (16, 16, 1)
    assert reflect(drop_workgroup_size_builtin(data)).local_size == (1, 1, 1)


def test_a_module_that_reads_num_workgroups_says_so() -> None:
    """Its dispatches never run in pieces, each of which would see its own count (policy/engine_policy.c, "Pieces"):
    a BuiltIn NumWorkgroups on any id or struct member says so, a later BuiltIn on the same id too."""
    num_workgroups, op_member_decorate = 24, 72
    assert not any(reflect(spirv(name)).counts_workgroups for name in EXPECTED)
    assert not reflect(pack(PROLOGUE)).counts_workgroups
    assert reflect(pack(PROLOGUE + inst(OP_DECORATE, 9, DEC_BUILTIN, num_workgroups))).counts_workgroups
    assert reflect(pack(PROLOGUE + inst(op_member_decorate, 9, 0, DEC_BUILTIN, num_workgroups))).counts_workgroups
    twice = inst(OP_DECORATE, 9, DEC_BUILTIN, num_workgroups) + inst(OP_DECORATE, 9, DEC_BUILTIN, 26)
    assert reflect(pack(PROLOGUE + twice)).counts_workgroups


def test_local_size_id_reads_constants_and_spec_constant_defaults() -> None:
    module = HEADER + ENTRY_POINT + (
        inst(OP_EXECUTION_MODE_ID, 1, 38, 3, 4, 4)  # LocalSizeId %3 %4 %4
        + inst(21, 2, 32, 0)  # %2 = OpTypeInt 32 0
        + inst(OP_CONSTANT, 2, 3, 16)  # %3 = OpConstant %2 16
        + inst(50, 2, 4, 2)  # %4 = OpSpecConstant %2 2
    )
    assert reflect(pack(module)).local_size == (16, 2, 2)


def test_no_push_constant_block_gives_size_zero() -> None:
    data = edit(spirv("saxpy"), OP_VARIABLE,
                lambda ops: [ops[0], ops[1], SC_PRIVATE] if ops[2] == SC_PUSH_CONSTANT else None)
    assert reflect(data).push_constant_size == 0


@pytest.mark.parametrize(
    ("opcode", "change", "message"),
    [
        (OP_DECORATE, lambda ops: [ops[0], 0, 0] if ops[1] == DEC_BINDING else None,
         "missing decoration Binding on %"),
        (OP_VARIABLE, lambda ops: [ops[0], ops[1], 0] if ops[2] == SC_STORAGE_BUFFER else None,
         "images and samplers"),
    ],
)
def test_rejects_unsupported_resources(opcode: int, change, message: str) -> None:
    with pytest.raises(InvalidSubmission, match=message):
        reflect(edit(spirv("vadd"), opcode, change))


def test_buffers_in_another_set_are_renumbered_into_set_zero() -> None:
    in_set_one = edit(spirv("vadd"), OP_DECORATE,
                      lambda ops: [ops[0], DEC_DESCRIPTOR_SET, 1] if ops[1] == DEC_DESCRIPTOR_SET else None)
    interface = reflect(in_set_one)
    assert (interface.bindings, interface.resources) == ((0, 1, 2), ((1, 0), (1, 1), (1, 2)))
    moved = bound_in_set_zero(in_set_one)
    assert reflect(moved).resources == ((0, 0), (0, 1), (0, 2))
    assert bound_in_set_zero(spirv("vadd")) == spirv("vadd")  # numbered so already: unchanged


def test_variables_on_one_binding_are_one_buffer_unless_their_kinds_differ() -> None:
    shared = edit(spirv("vadd"), OP_DECORATE, lambda ops: [ops[0], DEC_BINDING, 0] if ops[1] == DEC_BINDING else None)
    assert reflect(shared).resources == ((0, 0),)
    uniform = edit(spirv("vadd"), OP_VARIABLE,  # a Uniform variable of a Block struct: a uniform buffer
                   lambda ops: [ops[0], ops[1], SC_UNIFORM] if ops[2] == SC_STORAGE_BUFFER else None)
    assert reflect(uniform).uniform == frozenset({0, 1, 2})
    first = True

    def one_uniform(ops):
        nonlocal first
        if ops[2] != SC_STORAGE_BUFFER or not first:
            return None
        first = False
        return [ops[0], ops[1], SC_UNIFORM]

    mixed = edit(edit(spirv("vadd"), OP_VARIABLE, one_uniform), OP_DECORATE,
                 lambda ops: [ops[0], DEC_BINDING, 0] if ops[1] == DEC_BINDING else None)
    with pytest.raises(InvalidSubmission, match="two kinds of resource .a (storage|uniform) buffer and a (storage|uniform) buffer"):
        reflect(mixed)


MALFORMED = {
    "empty": (b"", "shorter than the 20-byte header"),
    "magic-only": (b"\x03\x02\x23\x07", "shorter than the 20-byte header"),
    "odd-length": (spirv("saxpy")[:-1], "not a multiple of 4"),
    "zero-magic": (b"\x00" * 4 + spirv("saxpy")[4:], "bad magic"),
    "wrong-magic": (b"\x04" + spirv("saxpy")[1:], "bad magic"),
    "version-2": (pack([MAGIC, 0x00020000, 0, 1, 0]), "unsupported version"),
    "zero-word-count": (pack(HEADER + [0]), "word count of 0"),
    "zero-words": (pack(HEADER + [0, 0, 0]), "word count of 0"),
    "truncated-shader": (spirv("saxpy")[:24], "runs past the end"),
    "count-past-end": (pack(HEADER + [5 << 16 | 17, 1]), "runs past the end"),
    "short-decorate": (pack(HEADER + inst(OP_DECORATE)), "too few operands"),
    "no-entry-point": (pack(HEADER), "expected one GLCompute entry point, found 0"),
    "two-entry-points": (pack(PROLOGUE + ENTRY_POINT), "expected one GLCompute entry point, found 2"),
    "unterminated-name": (pack(HEADER + inst(15, 5, 1, MAIN[0])), "not nul-terminated"),
    "non-utf8-name": (pack(HEADER + inst(15, 5, 1, 0x0000FFFF)), "not UTF-8"),
    "no-local-size": (pack(HEADER + ENTRY_POINT), "no LocalSize"),
    "zero-local-size": (pack(HEADER + ENTRY_POINT + inst(OP_EXECUTION_MODE, 1, 17, 8, 0, 1)), "zero dimension"),
}


@pytest.mark.parametrize(("data", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_rejects_malformed_modules(data: bytes, message: str) -> None:
    with pytest.raises(InvalidSubmission, match=message):
        reflect(data)


def push_block_module(member_count: int) -> bytes:
    """A module whose push-constant block has the first ``member_count`` members of

    struct Push { uint n; vec3 v; float arr[3]; mat3 m; layout(row_major) mat2x3 r; Inner s[2]; }
    with struct Inner { float f; vec2 g; }, laid out the way glslang lays it out (std430).
    """
    members = [2, 4, 8, 9, 10, 12][:member_count]
    offsets = [0, 16, 28, 48, 96, 120]
    return pack(
        PROLOGUE
        + inst(71, 8, 6, 4) + inst(71, 12, 6, 16)  # ArrayStride of float[3] and Inner[2]
        + inst(72, 11, 0, 35, 0) + inst(72, 11, 1, 35, 8)  # Inner member offsets
        + [word for index, offset in enumerate(offsets) for word in inst(72, 13, index, 35, offset)]
        + inst(72, 13, 3, 7, 16) + inst(72, 13, 4, 4) + inst(72, 13, 4, 7, 8)  # MatrixStride, RowMajor
        + inst(21, 2, 32, 0) + inst(22, 3, 32)  # %2 uint, %3 float
        + inst(23, 4, 3, 3) + inst(23, 5, 3, 2)  # %4 vec3, %5 vec2
        + inst(43, 2, 6, 3) + inst(43, 2, 7, 2)  # %6 = 3u, %7 = 2u
        + inst(28, 8, 3, 6) + inst(24, 9, 4, 3) + inst(24, 10, 4, 2)  # float[3], mat3, mat2x3
        + inst(30, 11, 3, 5) + inst(28, 12, 11, 7)  # Inner, Inner[2]
        + inst(30, 13, *members) + inst(32, 14, SC_PUSH_CONSTANT, 13)
        + inst(OP_VARIABLE, 14, 15, SC_PUSH_CONSTANT)
    )


@pytest.mark.parametrize(
    ("member_count", "size"),
    [(0, 0), (1, 4), (2, 28), (3, 40), (4, 92), (5, 120), (6, 152)],
    ids=["empty", "uint", "vec3", "float[3]", "mat3", "row-major-mat2x3", "struct-array"],
)
def test_push_constant_size_ends_at_last_byte(member_count: int, size: int) -> None:
    interface = reflect(push_block_module(member_count))
    assert interface == ShaderInterface("main", (8, 4, 2), (), size)


def test_rejects_self_containing_push_constant_type() -> None:
    module = PROLOGUE + (
        inst(72, 7, 0, 35, 0)  # OpMemberDecorate %7 0 Offset 0
        + inst(30, 7, 7)  # %7 = OpTypeStruct %7
        + inst(32, 8, SC_PUSH_CONSTANT, 7)
        + inst(OP_VARIABLE, 8, 9, SC_PUSH_CONSTANT)
    )
    with pytest.raises(InvalidSubmission, match="too deep"):
        reflect(pack(module))


def check_reflect_total(data: bytes) -> None:
    """reflect() must return an interface or raise InvalidSubmission, nothing else."""
    try:
        result = reflect(data)
    except InvalidSubmission:
        return
    assert isinstance(result, ShaderInterface)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
word_values = st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1),
                        st.tuples(st.integers(0, 8), st.integers(0, 400)).map(lambda t: t[0] << 16 | t[1]))


@FUZZ
@given(st.binary(max_size=256))
def test_fuzz_random_bytes(data: bytes) -> None:
    check_reflect_total(data)


@FUZZ
@given(st.lists(word_values, max_size=64))
def test_fuzz_random_words_after_valid_header(tail: list[int]) -> None:
    check_reflect_total(pack(HEADER + tail))


@FUZZ
@given(
    name=st.sampled_from(sorted(EXPECTED)),
    changes=st.lists(st.tuples(st.integers(0, 2**20), word_values), min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(0, 2**20)),
)
def test_fuzz_mutated_shaders(name: str, changes: list[tuple[int, int]], cut: int | None) -> None:
    module = words(spirv(name))
    for index, value in changes:
        module[index % len(module)] = value
    data = pack(module)
    if cut is not None:
        data = data[:cut % (len(data) + 1)]
    check_reflect_total(data)


# --------------------------------------------------------------------------- the whitelist

OP_EXTENSION, OP_MEMORY_MODEL, OP_CAPABILITY, OP_TYPE_POINTER = 10, 14, 17, 32


def literal(text: str) -> list[int]:
    """A nul-terminated literal string as words."""
    raw = text.encode() + b"\0" * (4 - len(text) % 4)
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


def add_after_header(data: bytes, extra: list[int]) -> bytes:
    """The module with ``extra`` instructions inserted right after its header."""
    module = words(data)
    return pack(module[:5] + extra + module[5:])


@pytest.mark.parametrize(("extra", "named"), [
    (inst(OP_CAPABILITY, 5347), "capability PhysicalStorageBufferAddresses"),
    (inst(OP_CAPABILITY, 4442), "capability VariablePointers"),
    (inst(OP_CAPABILITY, 6), "capability Kernel"),
    (inst(OP_CAPABILITY, 5), "capability Linkage"),
    (inst(OP_CAPABILITY, 4), "capability Addresses"),
    (inst(OP_CAPABILITY, 99999), "capability number 99999"),
    (inst(OP_EXTENSION, *literal("SPV_KHR_physical_storage_buffer")), "extension SPV_KHR_physical_storage_buffer"),
    (inst(OP_EXTENSION, *literal("SPV_KHR_variable_pointers")), "extension SPV_KHR_variable_pointers"),
    (inst(11, 90, *literal("OpenCL.std")), "extended instruction set OpenCL.std"),
    (inst(OP_TYPE_POINTER, 91, 5349, 1), "storage class PhysicalStorageBuffer"),
    (inst(OP_TYPE_POINTER, 92, 5, 1), "storage class CrossWorkgroup"),
    (inst(OP_TYPE_POINTER, 93, 8, 1), "storage class Generic"),
])
def test_whitelist_refuses_and_names(extra: list[int], named: str) -> None:
    assert reflect(spirv("saxpy"))  # the shipped module passes
    with pytest.raises(InvalidSubmission, match=named):
        reflect(add_after_header(spirv("saxpy"), extra))


@pytest.mark.parametrize(("addressing", "named"), [(5348, "PhysicalStorageBuffer64"), (2, "Physical64")])
def test_whitelist_refuses_addressing_models(addressing: int, named: str) -> None:
    data = edit(spirv("saxpy"), OP_MEMORY_MODEL, lambda ops: [addressing, ops[1]])
    with pytest.raises(InvalidSubmission, match=f"addressing model {named}"):
        reflect(data)


def test_whitelist_allows_the_extensions_of_honest_kernels() -> None:
    honest = inst(OP_CAPABILITY, 4433) + inst(OP_EXTENSION, *literal("SPV_KHR_16bit_storage"))
    assert reflect(add_after_header(spirv("saxpy"), honest)).bindings == (0, 1)


def test_a_bool_type_without_operands_is_refused_not_a_crash() -> None:
    """Found by the fuzz test above in CI (an IndexError escaped reflect)."""
    with pytest.raises(InvalidSubmission, match="too few operands"):
        reflect(pack(HEADER + [1 << 16 | 20]))  # OpTypeBool with no result id


SC_WORKGROUP, SC_FUNCTION, OP_TYPE_POINTER, OP_CONSTANT_NULL = 4, 7, 32, 46


def instructions(data: bytes) -> list[tuple[int, list[int]]]:
    module, pos, out = words(data), 5, []
    while pos < len(module):
        count, op = module[pos] >> 16, module[pos] & 0xFFFF
        out.append((op, module[pos + 1:pos + count]))
        pos += count
    return out


def variables_and_initializers(data: bytes) -> list[tuple[int, int | None, int | None]]:
    """(storage class, initializer's null type or None, pointee type) of every variable."""
    found = instructions(data)
    pointees = {ops[0]: ops[2] for op, ops in found if op == OP_TYPE_POINTER}
    nulls = {ops[1]: ops[0] for op, ops in found if op == OP_CONSTANT_NULL}
    return [(ops[2], nulls.get(ops[3]) if len(ops) > 3 else None, pointees[ops[0]])
            for op, ops in found if op == OP_VARIABLE]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_zero_initialized_gives_every_memory_variable_a_null_of_its_type(name: str) -> None:
    from libshare.arbiter.programs.admission import validate

    out = zero_initialized(spirv(name))
    validate(out)  # spirv-val, as admission runs it
    assert reflect(out) == EXPECTED[name]
    memory = [(sc, null, pointee) for sc, null, pointee in variables_and_initializers(out)
              if sc in (SC_WORKGROUP, SC_PRIVATE, SC_FUNCTION)]
    assert memory and all(null == pointee for _, null, pointee in memory), memory
    assert zero_initialized(out) == out  # initialized variables are left alone
    assert zero_initialized(pack(words(spirv(name)), ">")) == out  # either byte order in, little-endian out


@pytest.mark.parametrize("name", ["sum", "matmul"])
def test_zero_initialized_leaves_shared_memory_alone_when_the_device_cannot_zero_it(name: str) -> None:
    out = zero_initialized(spirv(name), workgroup=False)
    shared = [null for sc, null, _ in variables_and_initializers(out) if sc == SC_WORKGROUP]
    assert shared and shared == [None] * len(shared)


@FUZZ
@given(st.lists(word_values, max_size=64))
def test_fuzz_zero_initialized_is_total_on_modules_reflection_admits(tail: list[int]) -> None:
    data = pack(HEADER + tail)
    try:
        reflect(data)
    except InvalidSubmission:
        return
    try:
        assert reflect(zero_initialized(data)) == reflect(data)
    except InvalidSubmission:
        pass
