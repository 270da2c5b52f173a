"""SPIR-V reflection for compute shaders, in pure Python.

The arbiter needs four facts about a client's shader before it builds a
pipeline: the entry point name, the workgroup size, which descriptor bindings
the shader uses (and the kind of each) and how many bytes of push constants it reads. ``reflect()``
reads them straight from the SPIR-V word stream.

The module comes from an untrusted client, so parsing never trusts a count or
an id: every instruction must fit inside the module, a zero word count is an
error rather than an endless loop, type sizes are computed with a depth limit
(a malicious module may make a type contain itself), and every failure raises
:class:`~libshare.errors.InvalidSubmission`. Passing reflection does not make
a module valid; the Vulkan driver still sees it, and spirv-val is the real
validator.

Supported resources are buffers: storage buffers, declared either the SPIR-V 1.3+ way
(``StorageBuffer`` storage class) or the SPIR-V 1.0 way (``Uniform`` storage class with a
``BufferBlock`` struct), and uniform buffers (``Uniform`` with a ``Block`` struct), and texel
buffers (``UniformConstant`` variables of an ``OpTypeImage`` of ``Dim Buffer``: ``Sampled 1``, alone
or in an ``OpTypeSampledImage``, a uniform texel buffer, any view format of its sampled type's
numeric class; ``Sampled 2`` a storage texel buffer, only views of the ``ImageFormat`` it declares,
and ``Unknown`` is refused), in any descriptor set, at any binding numbers, gaps allowed, several
variables (typed views) on one binding allowed when they agree on its kind. A program's buffers
are its distinct (set, binding) pairs in that order: the client passes one buffer (or, at a texel
buffer, one texel view: arbiter/serve/views.py) for each, and :func:`bound_in_set_zero` renumbers
them 0..N-1 in set 0 before a driver sees the module, so that one push-descriptor set binds them
all (:func:`buffer_layout` says each binding's kind). A binding declared as a fixed-size array of
blocks (``layout(binding=0) buffer B { float x[]; } b[4];``) takes that many buffers, one after the
other in the client's list (its descriptors' count: :func:`buffer_layout`); an index into such an
array is clamped to its length (programs/clamp.py), so no kernel reaches a descriptor past it.
A runtime-sized array of blocks (``b[]``, descriptor indexing) is one of the length the client gave
when it loaded the program: programs/arrays.py rewrites it into a fixed-size one before reflection
reads the module (``ShaderNonUniform`` and the ``NonUniformIndexing`` capabilities of buffer arrays
are on the whitelist, each admitted only where the device has its feature). Arrays of arrays of
blocks, arrays of texel buffers, images of any other dimension and samplers are refused: the arbiter binds buffers
and views of buffers only, each one the client named.

What a module may use (the whitelist)
-------------------------------------
A client's module is untrusted code that runs on the shared device, and on lavapipe
inside the arbiter's own address space. Bounds checking (``robustBufferAccess``)
protects every access through a bound descriptor; it cannot protect an access through a
raw address. So reflection also admits a module only if everything it declares is on an
explicit list of what a compute kernel over its bound storage buffers needs, and names
the first thing that is not:

* **capabilities** in :data:`ALLOWED_CAPABILITIES` (``Shader``, the 8/16/64-bit scalar
  types and storage, subgroup operations, the Vulkan memory model, ``ImageBuffer`` and
  ``SampledBuffer`` for texel buffers, non-uniform indexing of arrays of buffers). Refused,
  among others: ``PhysicalStorageBufferAddresses``
  (``GL_EXT_buffer_reference``: a pointer made from an integer reads and writes any memory of
  the process), ``VariablePointers``, ``Addresses``, ``Kernel``, ``Linkage``, ``Int64ImageEXT``
  and every other image capability (``ImageQuery``, ``StorageImageReadWithoutFormat``, ...);
  and ``OpImageTexelPointer`` (an atomic on a texel), by name.
* **extensions** in :data:`ALLOWED_EXTENSIONS`, and extended instruction sets
  ``GLSL.std.450`` and ``NonSemantic.*`` (which by definition change nothing);
* the **addressing model** ``Logical`` and the **memory models** ``GLSL450`` and
  ``Vulkan``;
* pointers and variables only in the **storage classes** ``Input`` (built-ins),
  ``Uniform``/``StorageBuffer`` (bound buffers), ``PushConstant``, ``Workgroup``,
  ``Private`` and ``Function``.

Reflection also sums the bytes of the module's ``Workgroup`` variables and of its
``Private`` and ``Function`` variables (natural sizes; every array must have a constant
length), so that the arbiter can refuse a kernel whose shared or per-invocation memory
would exceed the device's limit or, on lavapipe, the stack of the thread that runs it.
None of this replaces the SPIR-V validator, which the arbiter runs as well.

Memory a kernel did not write reads as zeros
--------------------------------------------
A variable without an initializer holds whatever its memory held: on lavapipe, shared
(``Workgroup``) memory is a buffer the driver's threads reuse from one workgroup to the next,
whoever's kernel that was (a kernel that reads its shared memory before writing it would read
another client's words), and ``Private`` and ``Function`` variables live on the thread's stack.
:func:`zero_initialized` gives every such variable an ``OpConstantNull`` initializer before a
driver sees the module: the device zeroes it as the kernel starts (``Workgroup`` initializers
need the device's ``shaderZeroInitializeWorkgroupMemory``, VK_KHR_zero_initialize_workgroup_memory,
core in Vulkan 1.3; a device without it runs no kernel that declares shared memory).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

from libshare.arbiter.programs.capabilities import capability_name
from libshare.errors import InvalidSubmission
from libshare.arbiter.programs.texel_kinds import texel_kind

__all__ = ["ALLOWED_CAPABILITIES", "ALLOWED_EXTENSIONS", "ShaderInterface", "bound_in_set_zero", "buffer_layout",
           "reflect", "zero_initialized"]

_MAGIC = 0x07230203
_MAGIC_SWAPPED = 0x03022307  # the magic number read in the wrong byte order
_HEADER_WORDS = 5
_MAX_TYPE_DEPTH = 32

# Opcodes, and the fewest operands each must carry for the parser to read it.
_OP_ENTRY_POINT, _OP_EXECUTION_MODE, _OP_EXECUTION_MODE_ID = 15, 16, 331
_OP_DECORATE, _OP_MEMBER_DECORATE, _OP_VARIABLE = 71, 72, 59
_OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX = 21, 22, 23, 24
_OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER = 28, 29, 30, 32
_OP_CONSTANT, _OP_SPEC_CONSTANT = 43, 50
_OP_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_OP = 44, 51, 52
_OP_EXTENSION, _OP_EXT_INST_IMPORT, _OP_MEMORY_MODEL, _OP_CAPABILITY = 10, 11, 14, 17
_OP_TYPE_BOOL, _OP_TYPE_FORWARD_POINTER = 20, 39
_OP_CONSTANT_NULL, _OP_FUNCTION = 46, 54
_OP_TYPE_IMAGE, _OP_TYPE_SAMPLER, _OP_TYPE_SAMPLED_IMAGE, _OP_IMAGE_TEXEL_POINTER = 25, 26, 27, 60
_MIN_OPERANDS = {
    _OP_ENTRY_POINT: 3, _OP_EXECUTION_MODE: 2, _OP_EXECUTION_MODE_ID: 2,
    _OP_DECORATE: 2, _OP_MEMBER_DECORATE: 3, _OP_VARIABLE: 3,
    _OP_TYPE_INT: 3, _OP_TYPE_FLOAT: 2, _OP_TYPE_VECTOR: 3, _OP_TYPE_MATRIX: 3,
    _OP_TYPE_ARRAY: 3, _OP_TYPE_RUNTIME_ARRAY: 2, _OP_TYPE_STRUCT: 1, _OP_TYPE_POINTER: 3,
    _OP_CONSTANT: 3, _OP_SPEC_CONSTANT: 3,
    _OP_CONSTANT_COMPOSITE: 2, _OP_SPEC_CONSTANT_COMPOSITE: 2, _OP_SPEC_CONSTANT_OP: 3,
    _OP_EXTENSION: 1, _OP_EXT_INST_IMPORT: 2, _OP_MEMORY_MODEL: 2, _OP_CAPABILITY: 1,
    _OP_TYPE_FORWARD_POINTER: 2, _OP_TYPE_BOOL: 1,
    _OP_TYPE_IMAGE: 8, _OP_TYPE_SAMPLER: 1, _OP_TYPE_SAMPLED_IMAGE: 2, _OP_IMAGE_TEXEL_POINTER: 5,
}
_TYPE_OPS = {_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX, _OP_TYPE_ARRAY,
             _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER, _OP_TYPE_IMAGE, _OP_TYPE_SAMPLER,
             _OP_TYPE_SAMPLED_IMAGE}
_CONSTANT_OPS = {_OP_CONSTANT, _OP_SPEC_CONSTANT, _OP_CONSTANT_COMPOSITE,
                 _OP_SPEC_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_OP}

_GL_COMPUTE = 5
_MODE_LOCAL_SIZE, _MODE_LOCAL_SIZE_ID = 17, 38
_DEC_BLOCK, _DEC_BUFFER_BLOCK, _DEC_ROW_MAJOR = 2, 3, 4
_DEC_ARRAY_STRIDE, _DEC_MATRIX_STRIDE, _DEC_BUILTIN = 6, 7, 11
_DEC_BINDING, _DEC_DESCRIPTOR_SET, _DEC_OFFSET = 33, 34, 35
_BUILTIN_NUM_WORKGROUPS, _BUILTIN_WORKGROUP_SIZE = 24, 25
_SC_UNIFORM_CONSTANT, _SC_UNIFORM, _SC_PUSH_CONSTANT, _SC_STORAGE_BUFFER = 0, 2, 9, 12
_SC_INPUT, _SC_WORKGROUP, _SC_PRIVATE, _SC_FUNCTION = 1, 4, 6, 7
_BUFFER_CLASSES = (_SC_UNIFORM_CONSTANT, _SC_UNIFORM, _SC_STORAGE_BUFFER)  # the classes of bound resources

ALLOWED_CAPABILITIES = {number: capability_name(number) for number in (
    0, 1, 9, 10, 11, 12, 22, 39,  # Matrix, Shader, Float16, Float64, Int64, Int64Atomics, Int16, Int8
    46, 47,  # SampledBuffer, ImageBuffer: uniform and storage texel buffers (no other image capability)
    61, 62, 63, 64, 65, 66, 67, 68,  # the GroupNonUniform operations
    4423, 4431,  # SubgroupBallotKHR, SubgroupVoteKHR
    4433, 4434, 4435, 4448, 4449, 4450,  # 16- and 8-bit storage
    4464, 4465, 4466, 4467, 4468,  # float controls: denormals, signed zeros, rounding
    5345, 5346,  # the Vulkan memory model
    6016, 6017, 6018, 6019,  # integer dot product
    6033, 6034, 6095, 5612, 5613, 5616,  # float atomics: add, min and max
    5301, 5306, 5308,  # ShaderNonUniform, Uniform/StorageBufferArrayNonUniformIndexing: arrays of buffers
)}
"""SPIR-V capabilities a client module may declare (enumerant: name); each is admitted only on a device with
a feature it needs (capabilities.py)."""

ALLOWED_EXTENSIONS = frozenset({
    "SPV_KHR_storage_buffer_storage_class", "SPV_KHR_16bit_storage", "SPV_KHR_8bit_storage",
    "SPV_KHR_vulkan_memory_model", "SPV_KHR_float_controls", "SPV_KHR_non_semantic_info",
    "SPV_KHR_shader_ballot", "SPV_KHR_subgroup_vote", "SPV_KHR_integer_dot_product",
    "SPV_EXT_shader_atomic_float_add", "SPV_EXT_shader_atomic_float_min_max", "SPV_EXT_shader_atomic_float16_add",
    "SPV_EXT_descriptor_indexing",
})
"""SPIR-V extensions a client module may declare."""

_ALLOWED_STORAGE = {_SC_INPUT: "Input", _SC_UNIFORM: "Uniform", _SC_WORKGROUP: "Workgroup",
                    _SC_PRIVATE: "Private", _SC_FUNCTION: "Function", _SC_PUSH_CONSTANT: "PushConstant",
                    _SC_STORAGE_BUFFER: "StorageBuffer"}
_ADDRESSING_LOGICAL = 0
_MEMORY_MODELS = {1: "GLSL450", 3: "Vulkan"}
# Names of refused enumerants, so that a refusal names what it refused.
_STORAGE_NAMES = {0: "UniformConstant", 3: "Output", 5: "CrossWorkgroup", 8: "Generic",
                  10: "AtomicCounter", 11: "Image", 5349: "PhysicalStorageBuffer"}
_ADDRESSING_NAMES = {1: "Physical32", 2: "Physical64", 5348: "PhysicalStorageBuffer64"}
_MAX_NATURAL_BYTES = 1 << 40  # beyond any limit; stops a size computation from growing without end


@dataclass(frozen=True)
class ShaderInterface:
    """What a compute shader needs from the pipeline that runs it."""

    entry_point: str
    """Name of the module's single GLCompute entry point."""
    local_size: tuple[int, int, int]
    """Workgroup size (x, y, z)."""
    bindings: tuple[int, ...]
    """The buffers the client passes, 0..N-1: one per binding, or per element of an array of buffers
    (the binding numbers the pipeline sees are those of :func:`bound_in_set_zero`, see :attr:`arrays`)."""
    push_constant_size: int
    """Bytes of the push-constant block up to the end of its last member, rounded up to whole words;
    0 when none."""
    workgroup_bytes: int = 0
    """Bytes of shared (``Workgroup``) memory one workgroup uses."""
    private_bytes: int = 0
    """Bytes of ``Private`` and ``Function`` variables one invocation may hold at once (at most)."""
    counts_workgroups: bool = False
    """Whether it reads the ``NumWorkgroups`` built-in: its dispatches then never run in pieces, each of
    which would see its own count (policy/engine_policy.c, "Pieces")."""
    resources: tuple[tuple[int, int], ...] = ()
    """The module's own (descriptor set, binding) of each binding, in the order of :attr:`bindings`."""
    uniform: frozenset[int] = frozenset()
    """Which of :attr:`bindings` are uniform buffers or uniform texel buffers (the others are storage ones)."""
    arrays: tuple[int, ...] = ()
    """The buffers each of :attr:`resources` takes: 1, or the length of its array of buffers."""
    texel: tuple[tuple[int, tuple[str, ...]], ...] = ()
    """The texel buffers among :attr:`bindings`: (binding, the view formats it reads or writes,
    libshare.protocol.texels names), in binding order."""


def reflect(spirv: bytes) -> ShaderInterface:
    """Read a compute shader's interface from a SPIR-V module.

    Accepts either byte order. Raises :class:`~libshare.errors.InvalidSubmission`
    when the module is malformed, declares something off the whitelist, or uses a
    resource other than storage buffers in descriptor set 0 (see the module
    docstring); ``TypeError`` when ``spirv`` is not bytes-like.
    """
    if not isinstance(spirv, (bytes, bytearray, memoryview)):
        raise TypeError(f"SPIR-V must be bytes, not {type(spirv).__name__}")
    module = _Module(_words(bytes(spirv)))
    module.check_whitelist()
    entry_id, name = module.entry_point()
    resources = module.resources()
    counts, uniform, texel = _layout(resources)
    return ShaderInterface(
        entry_point=name,
        local_size=module.local_size(entry_id),
        bindings=tuple(range(sum(counts))),
        resources=tuple(place for place, _, _, _ in resources),
        uniform=uniform,
        arrays=counts,
        texel=tuple(sorted(texel.items())),
        push_constant_size=module.push_constant_size(),
        workgroup_bytes=module.variable_bytes((_SC_WORKGROUP,)),
        private_bytes=module.variable_bytes((_SC_PRIVATE, _SC_FUNCTION)),
        counts_workgroups=_BUILTIN_NUM_WORKGROUPS in module.builtins,
    )


def zero_initialized(spirv: bytes, workgroup: bool = True) -> bytes:
    """``spirv`` (a module :func:`reflect` admitted) with an ``OpConstantNull`` initializer on every
    ``Private`` and ``Function`` variable that had none, and, if ``workgroup`` (the device has
    shaderZeroInitializeWorkgroupMemory), every ``Workgroup`` one; little-endian words (see "Memory a
    kernel did not write reads as zeros"). A null constant of a global variable's type goes just
    before that variable, those of function variables' types before the first function (their
    initializers must be module-scope constants)."""
    words = _words(bytes(spirv))
    pointees = {ops[0]: ops[2] for opcode, ops in _instructions(words) if opcode == _OP_TYPE_POINTER}
    bound, nulls, out = words[3], {}, list(words[:_HEADER_WORDS])

    def null_of(type_id: int) -> int:
        nonlocal bound
        if type_id not in nulls:
            nulls[type_id] = bound
            out.extend(((3 << 16) | _OP_CONSTANT_NULL, type_id, bound))
            bound += 1
        return nulls[type_id]

    zeroed = (_SC_WORKGROUP, _SC_PRIVATE, _SC_FUNCTION) if workgroup else (_SC_PRIVATE, _SC_FUNCTION)
    in_functions = False
    function_types = [pointees.get(ops[0]) for opcode, ops in _instructions(words)
                      if opcode == _OP_VARIABLE and ops[2] == _SC_FUNCTION and len(ops) == 3]
    for opcode, ops in _instructions(words):
        if opcode == _OP_FUNCTION and not in_functions:
            in_functions = True
            for type_id in function_types:
                if type_id is None:
                    raise _invalid("a Function variable's type is not a pointer type")
                null_of(type_id)
        if opcode == _OP_VARIABLE and len(ops) == 3 and ops[2] in zeroed:
            type_id = pointees.get(ops[0])
            if type_id is None:
                raise _invalid(f"variable %{ops[1]}'s type is not a pointer type")
            ops = (*ops, nulls[type_id] if in_functions else null_of(type_id))
        out.extend(((len(ops) + 1) << 16 | opcode, *ops))
    out[3] = bound
    return struct.pack(f"<{len(out)}I", *out)


def bound_in_set_zero(spirv: bytes) -> bytes:
    """``spirv`` (a module :func:`reflect` admitted) with its buffers renumbered 0..N-1 in
    descriptor set 0, in the order of their (set, binding): every variable on one binding keeps
    sharing it. Little-endian words; the module itself when it is so numbered already."""
    words = _words(bytes(spirv))
    module = _Module(words)
    places = [place for place, _, _, _ in module.resources()]
    if places == [(0, k) for k in range(len(places))]:
        return bytes(spirv) if spirv[:4] == b"\x03\x02\x23\x07" else struct.pack(f"<{len(words)}I", *words)
    number = {place: k for k, place in enumerate(places)}
    place_of = {var: module.place(var) for _, var, storage in module.variables if storage in _BUFFER_CLASSES}
    out = list(words[:_HEADER_WORDS])
    for opcode, ops in _instructions(words):
        if opcode == _OP_DECORATE and ops[0] in place_of and ops[1] in (_DEC_DESCRIPTOR_SET, _DEC_BINDING):
            ops = (ops[0], ops[1], 0 if ops[1] == _DEC_DESCRIPTOR_SET else number[place_of[ops[0]]])
        out.extend(((len(ops) + 1) << 16 | opcode, *ops))
    return struct.pack(f"<{len(out)}I", *out)


def buffer_layout(spirv: bytes) -> tuple[tuple[int, ...], frozenset[int], dict[int, tuple[str, ...]]]:
    """The descriptors' count of each binding of ``spirv`` in (set, binding) order (1, or an array of
    buffers' length), which of its buffers (0..N-1, an array's elements one after the other) are
    uniform buffers or uniform texel buffers, and which are texel buffers: buffer -> the view formats
    it takes (libshare.protocol.texels names)."""
    return _layout(_Module(_words(bytes(spirv))).resources())


def _layout(resources: list) -> tuple[tuple[int, ...], frozenset[int], dict[int, tuple[str, ...]]]:
    counts = tuple(count for _, _, count, _ in resources)
    uniform, texel, first = set(), {}, 0
    for (_, is_uniform, count, formats) in resources:
        if is_uniform:
            uniform.update(range(first, first + count))
        if formats is not None:
            texel.update((k, formats) for k in range(first, first + count))
        first += count
    return counts, frozenset(uniform), texel


def _invalid(message: str) -> InvalidSubmission:
    return InvalidSubmission(f"invalid SPIR-V: {message}")


def _refused(what: str) -> InvalidSubmission:
    return InvalidSubmission(f"refused SPIR-V: {what} is not allowed in a libshare program "
                             "(only compute kernels over their bound storage buffers)")


def _words(data: bytes) -> tuple[int, ...]:
    """Decode the module into 32-bit words in its own byte order, checking the header."""
    if len(data) % 4:
        raise _invalid(f"length {len(data)} is not a multiple of 4")
    if len(data) < 4 * _HEADER_WORDS:
        raise _invalid(f"{len(data)} bytes is shorter than the 20-byte header")
    magic = int.from_bytes(data[:4], "little")
    if magic == _MAGIC:
        order = "<"
    elif magic == _MAGIC_SWAPPED:
        order = ">"
    else:
        raise _invalid(f"bad magic number 0x{magic:08x} (expected 0x{_MAGIC:08x})")
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    if (words[1] >> 16) & 0xFF != 1:
        raise _invalid(f"unsupported version word 0x{words[1]:08x}")
    return words


def _instructions(words: tuple[int, ...]) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Yield (opcode, operands) for each instruction after the header."""
    pos = _HEADER_WORDS
    while pos < len(words):
        count, opcode = words[pos] >> 16, words[pos] & 0xFFFF
        if count == 0:
            raise _invalid(f"instruction at word {pos} has a word count of 0")
        if pos + count > len(words):
            raise _invalid(f"instruction at word {pos} runs past the end of the module")
        operands = words[pos + 1:pos + count]
        if len(operands) < _MIN_OPERANDS.get(opcode, 0):
            raise _invalid(f"opcode {opcode} at word {pos} has too few operands")
        yield opcode, operands
        pos += count


def _string(words: tuple[int, ...]) -> str:
    """Decode a nul-terminated UTF-8 literal string packed into words."""
    raw = b"".join(word.to_bytes(4, "little") for word in words)
    end = raw.find(b"\0")
    if end < 0:
        raise _invalid("literal string is not nul-terminated")
    try:
        return raw[:end].decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("literal string is not UTF-8") from None


class _Module:
    """The parts of a module that reflection reads, indexed by id."""

    def __init__(self, words: tuple[int, ...]) -> None:
        self.entry_points: list[tuple[int, str]] = []
        self.modes: list[tuple[int, tuple[int, ...]]] = []
        self.decorations: dict[int, dict[int, tuple[int, ...]]] = {}
        self.member_decorations: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}
        self.types: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.constants: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.variables: list[tuple[int, int, int]] = []
        self.capabilities: list[int] = []
        self.extensions: list[str] = []
        self.imports: list[str] = []
        self.models: list[tuple[int, int]] = []  # (addressing, memory)
        self.pointer_classes: list[int] = []  # storage classes of OpTypePointer / OpTypeForwardPointer
        self.builtins: set[int] = set()  # every BuiltIn decoration's value, on any id or member
        self.texel_pointers = False  # an OpImageTexelPointer (an atomic on a texel): refused
        for opcode, ops in _instructions(words):
            self._record(opcode, ops)

    def _record(self, opcode: int, ops: tuple[int, ...]) -> None:
        if opcode == _OP_CAPABILITY:
            self.capabilities.append(ops[0])
        elif opcode == _OP_EXTENSION:
            self.extensions.append(_string(ops))
        elif opcode == _OP_EXT_INST_IMPORT:
            self.imports.append(_string(ops[1:]))
        elif opcode == _OP_MEMORY_MODEL:
            self.models.append((ops[0], ops[1]))
        elif opcode == _OP_TYPE_FORWARD_POINTER:
            self.pointer_classes.append(ops[1])
        if opcode == _OP_TYPE_POINTER:
            self.pointer_classes.append(ops[1])
        elif opcode == _OP_IMAGE_TEXEL_POINTER:
            self.texel_pointers = True
        if opcode == _OP_ENTRY_POINT and ops[0] == _GL_COMPUTE:
            self.entry_points.append((ops[1], _string(ops[2:])))
        elif opcode in (_OP_EXECUTION_MODE, _OP_EXECUTION_MODE_ID):
            self.modes.append((ops[0], ops[1:]))
        elif opcode == _OP_DECORATE:
            self.decorations.setdefault(ops[0], {})[ops[1]] = ops[2:]
            if ops[1] == _DEC_BUILTIN and len(ops) > 2:
                self.builtins.add(ops[2])
        elif opcode == _OP_MEMBER_DECORATE:
            self.member_decorations.setdefault((ops[0], ops[1]), {})[ops[2]] = ops[3:]
            if ops[2] == _DEC_BUILTIN and len(ops) > 3:
                self.builtins.add(ops[3])
        elif opcode in _TYPE_OPS:
            self.types[ops[0]] = (opcode, ops)
        elif opcode in _CONSTANT_OPS:
            self.constants[ops[1]] = (opcode, ops)
        elif opcode == _OP_VARIABLE:
            self.variables.append((ops[0], ops[1], ops[2]))

    def check_whitelist(self) -> None:
        """Raise InvalidSubmission naming the first capability, extension, import, model
        or storage class that is not on the whitelist (see the module docstring)."""
        for capability in self.capabilities:
            if capability not in ALLOWED_CAPABILITIES:
                raise _refused(f"capability {capability_name(capability)}")
        for extension in self.extensions:
            if extension not in ALLOWED_EXTENSIONS:
                raise _refused(f"extension {extension}")
        for name in self.imports:
            if name != "GLSL.std.450" and not name.startswith("NonSemantic."):
                raise _refused(f"extended instruction set {name}")
        if len(self.models) != 1:
            raise _invalid(f"expected one OpMemoryModel, found {len(self.models)}")
        addressing, memory = self.models[0]
        if addressing != _ADDRESSING_LOGICAL:
            raise _refused(f"addressing model {_ADDRESSING_NAMES.get(addressing, addressing)}")
        if memory not in _MEMORY_MODELS:
            raise _refused(f"memory model number {memory}")
        if self.texel_pointers:  # (its pointer's class is Image: named here first)
            raise _refused("an atomic on a texel buffer (OpImageTexelPointer: imageAtomic*)")
        for storage in self.pointer_classes + [storage for _, _, storage in self.variables]:
            if storage not in _ALLOWED_STORAGE and storage != _SC_UNIFORM_CONSTANT:  # images: refused later, by name
                raise _refused(f"storage class {_STORAGE_NAMES.get(storage, storage)}")

    def variable_bytes(self, storage_classes: tuple[int, ...]) -> int:
        """Natural bytes of all variables in ``storage_classes`` (an over-estimate for Function ones)."""
        total = 0
        for pointer, _, storage in self.variables:
            if storage in storage_classes:
                total += self._natural_size(self._pointee(pointer), 0)
        return total

    def _natural_size(self, type_id: int, depth: int) -> int:
        """Bytes of a value of this type without explicit layout (no strides, no padding)."""
        if depth > _MAX_TYPE_DEPTH:
            raise _invalid("type nesting too deep (or a type contains itself)")
        kind, ops = self._type(type_id)
        if kind == _OP_TYPE_BOOL:
            return 4
        if kind in (_OP_TYPE_INT, _OP_TYPE_FLOAT):
            return max(ops[1] // 8, 1)
        if kind in (_OP_TYPE_VECTOR, _OP_TYPE_MATRIX):
            size = ops[2] * self._natural_size(ops[1], depth + 1)
        elif kind == _OP_TYPE_ARRAY:
            size = self._scalar(ops[2]) * self._natural_size(ops[1], depth + 1)
        elif kind == _OP_TYPE_STRUCT:
            size = sum(self._natural_size(member, depth + 1) for member in ops[1:])
        elif kind == _OP_TYPE_POINTER:
            size = 8
        else:
            raise _invalid(f"variable of type %{type_id} (opcode {kind}) has no fixed size")
        if size > _MAX_NATURAL_BYTES:
            raise _refused(f"a variable of {size} bytes (too large)")
        return size

    def entry_point(self) -> tuple[int, str]:
        """Id and name of the single GLCompute entry point."""
        if len(self.entry_points) != 1:
            raise _invalid(f"expected one GLCompute entry point, found {len(self.entry_points)}")
        return self.entry_points[0]

    def local_size(self, entry_id: int) -> tuple[int, int, int]:
        """WorkgroupSize built-in if present (it overrides the mode), else LocalSize(Id)."""
        sizes: tuple[int, ...] | None = None
        for target, decorations in self.decorations.items():
            if decorations.get(_DEC_BUILTIN, ())[:1] == (_BUILTIN_WORKGROUP_SIZE,):
                sizes = self._composite(target)
        for target, (mode, *args) in self.modes:
            if sizes is None and target == entry_id and len(args) >= 3:
                if mode == _MODE_LOCAL_SIZE:
                    sizes = tuple(args[:3])
                elif mode == _MODE_LOCAL_SIZE_ID:
                    sizes = tuple(self._scalar(arg) for arg in args[:3])
        if sizes is None:
            raise _invalid("no LocalSize execution mode for the entry point")
        x, y, z = sizes
        if min(sizes) < 1:
            raise _invalid(f"local size {sizes} has a zero dimension")
        return x, y, z

    def resources(self) -> list[tuple[tuple[int, int], bool, int, tuple[str, ...] | None]]:
        """Each distinct (set, binding) of the module's buffers, sorted, with its kind: whether it is
        uniform, how many buffers it takes (an array of buffers' length, else 1), and None for a buffer
        or the view formats of a texel buffer; raises on any other resource, and on a binding whose
        views disagree on its kind or length."""
        found: dict[tuple[int, int], tuple[bool, int, tuple[str, ...] | None]] = {}
        for pointer, var, storage in self.variables:
            if storage in _BUFFER_CLASSES:
                kind = self._buffer_kind(pointer, storage)
                place = self.place(var)
                if found.setdefault(place, kind) != kind:
                    raise _invalid(f"binding {place[1]} of set {place[0]} is declared as two kinds of resource "
                                   f"({_kind_name(found[place])} and {_kind_name(kind)})")
        return sorted((place, *kind) for place, kind in found.items())

    def push_constant_size(self) -> int:
        """Byte size of the push-constant block, 0 when there is none."""
        blocks = [p for p, _, storage in self.variables if storage == _SC_PUSH_CONSTANT]
        if len(blocks) > 1:
            raise _invalid("more than one push-constant block")
        size = self._size(self._pointee(blocks[0]), {}, 0) if blocks else 0
        return (size + 3) & ~3  # a push-constant range is whole words (a block of one int8_t: 4 bytes)

    def _buffer_kind(self, pointer: int, storage: int) -> tuple[bool, int, tuple[str, ...] | None]:
        """(True for a uniform buffer or texel buffer; how many: an array of buffers' length, else 1; None
        for a buffer, or a texel buffer's view formats); raises on any other resource."""
        if storage == _SC_UNIFORM_CONSTANT:
            return texel_kind(self._type, self._pointee(pointer))
        pointee, count = self._pointee(pointer), 1
        kind, ops = self._type(pointee)
        if kind == _OP_TYPE_RUNTIME_ARRAY:
            raise _invalid(f"%{pointee} is a runtime-sized array of something other than Block or BufferBlock "
                           "structs (arrays.py sizes those)")
        if kind == _OP_TYPE_ARRAY:
            pointee, count = ops[1], self._scalar(ops[2])
            if count < 1:
                raise _invalid(f"array of buffers %{ops[0]} has length {count}")
        if self._type(pointee)[0] != _OP_TYPE_STRUCT:
            raise InvalidSubmission("arrays of arrays of buffers are not supported: declare one array of buffers "
                                    "(b[4]) or one buffer per binding")
        decorations = self.decorations.get(pointee, {})
        if storage == _SC_STORAGE_BUFFER and _DEC_BLOCK in decorations:
            return False, count, None
        if storage == _SC_UNIFORM and _DEC_BUFFER_BLOCK in decorations:
            return False, count, None
        if storage == _SC_UNIFORM and _DEC_BLOCK in decorations:
            return True, count, None
        raise _invalid(f"buffer type %{pointee} has neither a Block nor a BufferBlock decoration")

    def place(self, var: int) -> tuple[int, int]:
        """A resource variable's (descriptor set, binding)."""
        decorations = self.decorations.get(var, {})
        descriptor_set = _first(decorations, _DEC_DESCRIPTOR_SET, f"DescriptorSet on %{var}")
        return descriptor_set, _first(decorations, _DEC_BINDING, f"Binding on %{var}")

    def _type(self, type_id: int) -> tuple[int, tuple[int, ...]]:
        if type_id not in self.types:
            raise _invalid(f"%{type_id} is not a declared type")
        return self.types[type_id]

    def _pointee(self, pointer: int) -> int:
        kind, ops = self._type(pointer)
        if kind != _OP_TYPE_POINTER:
            raise _invalid(f"variable type %{pointer} is not a pointer")
        return ops[2]

    def _scalar(self, const_id: int) -> int:
        """Value of an integer (spec) constant; a spec constant gives its default."""
        opcode, ops = self.constants.get(const_id, (None, ()))
        if opcode == _OP_SPEC_CONSTANT_OP:  # left by specialize.py only when spirv-opt could not fold it
            raise _invalid(f"%{const_id} is a specialization-constant expression that could not be folded "
                           "to a constant")
        if opcode not in (_OP_CONSTANT, _OP_SPEC_CONSTANT):
            raise _invalid(f"%{const_id} is not a scalar constant")
        return sum(word << (32 * i) for i, word in enumerate(ops[2:]))

    def _composite(self, const_id: int) -> tuple[int, ...]:
        opcode, ops = self.constants.get(const_id, (None, ()))
        if opcode not in (_OP_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_COMPOSITE) or len(ops) != 5:
            raise _invalid(f"WorkgroupSize %{const_id} is not a 3-component constant")
        return tuple(self._scalar(part) for part in ops[2:])

    def _size(self, type_id: int, layout: dict[int, tuple[int, ...]], depth: int) -> int:
        """Bytes from the start of a value of this type to the end of its last byte.

        ``layout`` holds the decorations of the struct member being sized,
        which carry a matrix's stride and majorness.
        """
        if depth > _MAX_TYPE_DEPTH:
            raise _invalid("type nesting too deep (or a type contains itself)")
        kind, ops = self._type(type_id)
        if kind in (_OP_TYPE_INT, _OP_TYPE_FLOAT):
            return ops[1] // 8
        if kind == _OP_TYPE_VECTOR:
            return ops[2] * self._size(ops[1], {}, depth + 1)
        if kind == _OP_TYPE_ARRAY:
            decorations = self.decorations.get(type_id, {})
            stride = _first(decorations, _DEC_ARRAY_STRIDE, f"ArrayStride on %{type_id}")
            count = self._scalar(ops[2])
            return self._extent(count, stride, self._size(ops[1], {}, depth + 1))
        if kind == _OP_TYPE_MATRIX:
            column_kind, column = self._type(ops[1])
            if column_kind != _OP_TYPE_VECTOR:
                raise _invalid(f"matrix %{type_id} has a non-vector column type")
            stride = _first(layout, _DEC_MATRIX_STRIDE, f"MatrixStride on matrix %{type_id}")
            scalar = self._size(column[1], {}, depth + 1)
            rows, columns = column[2], ops[2]
            if _DEC_ROW_MAJOR in layout:
                return self._extent(rows, stride, columns * scalar)
            return self._extent(columns, stride, rows * scalar)
        if kind == _OP_TYPE_STRUCT:
            return self._struct_size(type_id, ops[1:], depth)
        raise _invalid(f"type %{type_id} (opcode {kind}) has no size in a push-constant block")

    @staticmethod
    def _extent(count: int, stride: int, element_size: int) -> int:
        """Bytes spanned by ``count`` elements ``stride`` apart."""
        if count < 1:
            raise _invalid("array or matrix has no elements")
        return (count - 1) * stride + element_size

    def _struct_size(self, struct_id: int, members: tuple[int, ...], depth: int) -> int:
        end = 0
        for index, member in enumerate(members):
            layout = self.member_decorations.get((struct_id, index), {})
            offset = _first(layout, _DEC_OFFSET, f"Offset on member {index} of struct %{struct_id}")
            end = max(end, offset + self._size(member, layout, depth + 1))
        return end


def _kind_name(kind: tuple[bool, int, tuple[str, ...] | None]) -> str:
    """A binding's kind in words, for a refusal."""
    what = f"{'a uniform' if kind[0] else 'a storage'} {'buffer' if kind[2] is None else 'texel buffer'}"
    return what if kind[1] == 1 else f"an array of {kind[1]} of {what[2:]}s"


def _first(decorations: dict[int, tuple[int, ...]], decoration: int, what: str) -> int:
    """The first literal of a required decoration; ``what`` names it for the error."""
    literals = decorations.get(decoration, ())
    if not literals:
        raise _invalid(f"missing decoration {what}")
    return literals[0]
