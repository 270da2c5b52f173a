"""Array indices clamped: no kernel reaches past a shared or private array.

``robustBufferAccess`` bounds what a kernel reads and writes through a buffer. It does nothing
for arrays in ``Workgroup`` (shared), ``Private`` or ``Function`` memory, where an index past the
end is undefined behaviour; and on lavapipe those arrays are the heap and the stacks of the
arbiter's own threads (a ggml argsort given one of its two size constants wrote past a 32-entry
shared array and aborted the process). So before any driver sees a module, :func:`clamped`
rewrites every access chain into such memory: each index into an array, a vector or a matrix
that is not a constant within its length becomes ``UMin(index, length - 1)`` (``GLSL.std.450``;
unsigned, so a negative index clamps too), computed just before the access. A kernel that
indexes out of bounds then computes nonsense in its own buffers, and nothing else.

Buffers are left to ``robustBufferAccess``: clamping there would turn a dropped out-of-bounds
write into a write of the buffer's last element. Not the choice of a buffer: an index into an
array of buffers (``b[i].x[j]``, an access chain whose base points to an array of ``Block`` or
``BufferBlock`` structs in ``Uniform`` or ``StorageBuffer`` memory) picks a descriptor, and
``robustBufferAccess`` bounds an access through a descriptor, not the choice of one: past the
array, a driver reads whatever lies beside the pushed descriptors (another binding, or memory
that holds no descriptor of this kernel). So that first index is clamped like a shared array's,
and the indices after it, inside the buffer, are left to ``robustBufferAccess``. Pointer access chains
(``OpPtrAccessChain``) into such memory need variable pointers, which the whitelist refuses;
one found here is refused too. To know an index's integer type the pass needs, for every
instruction, whether its first operand is a result type: :data:`_RESULT_TYPED`, the opcodes
that have one in the SPIR-V grammar 1.6 rev 1 (written as ranges; a test checks it against
``spirv.core.grammar.json`` where the Debian ``spirv-headers`` package is installed). An index
whose type cannot be told refuses the module.
"""

from __future__ import annotations

import struct

from libshare.arbiter.programs.spirv import _instructions, _string, _words
from libshare.errors import InvalidSubmission

__all__ = ["clamped"]

_RESULT_TYPED_RANGES = (
    (1, 1), (12, 12), (41, 46), (48, 52), (54, 55), (57, 57), (59, 61), (65, 70), (77, 84), (86, 98),
    (100, 107), (109, 124), (126, 152), (154, 191), (194, 205), (207, 215), (227, 227), (229, 242),
    (245, 245), (259, 259), (261, 271), (274, 279), (282, 286), (291, 296), (299, 300), (303, 316),
    (318, 318), (320, 321), (323, 326), (328, 328), (333, 366), (400, 403), (4421, 4422), (4428, 4432),
    (4447, 4447), (4450, 4455), (4477, 4477), (4479, 4479), (5000, 5007), (5011, 5012), (5056, 5056),
    (5252, 5255), (5257, 5258), (5265, 5265), (5267, 5278), (5283, 5283), (5296, 5296), (5334, 5334),
    (5359, 5359), (5361, 5362), (5381, 5381), (5391, 5396), (5571, 5575), (5577, 5577), (5580, 5580),
    (5585, 5598), (5600, 5601), (5609, 5611), (5614, 5615), (5631, 5631), (5699, 5699), (5713, 5816),
    (5818, 5819), (5840, 5843), (5846, 5882), (5923, 5934), (5938, 5938), (5946, 5947), (5949, 5949),
    (6016, 6032), (6035, 6035), (6401, 6408),
)
_RESULT_TYPED = frozenset(op for low, high in _RESULT_TYPED_RANGES for op in range(low, high + 1))
"""Opcodes whose first operand is a result type (and whose second is the result id)."""

_OP_EXT_INST_IMPORT, _OP_EXT_INST, _OP_MEMORY_MODEL, _OP_FUNCTION = 11, 12, 14, 54
_OP_TYPE_INT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX, _OP_TYPE_ARRAY, _OP_TYPE_STRUCT = 21, 23, 24, 28, 30
_OP_TYPE_POINTER, _OP_CONSTANT = 32, 43
_OP_ACCESS_CHAIN, _OP_IN_BOUNDS_ACCESS_CHAIN, _OP_PTR_ACCESS_CHAIN, _OP_IN_BOUNDS_PTR_ACCESS_CHAIN = 65, 66, 67, 70
_CLAMPED_CLASSES = {4: "Workgroup", 6: "Private", 7: "Function"}
_BUFFER_CLASSES = (2, 12)  # Uniform, StorageBuffer
_OP_DECORATE, _DEC_BLOCK, _DEC_BUFFER_BLOCK = 71, 2, 3
_GLSL_UMIN = 38
_GLSL = "GLSL.std.450"


def clamped(spirv: bytes) -> bytes:
    """``spirv`` with every index into a shared, private or function array clamped to its length
    (see the module's essay); little-endian words. Raises InvalidSubmission when an index's type
    cannot be told, or on a pointer access chain into such memory."""
    return _Clamper(_words(bytes(spirv))).run()


class _Clamper:
    """One pass over a module: the facts it needs, then the rewritten instructions."""

    def __init__(self, words: tuple[int, ...]):
        self.header = list(words[:5])
        self.instructions = list(_instructions(words))
        self.types: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.constants: dict[int, tuple[int, ...]] = {}  # id -> OpConstant operands
        self.type_of: dict[int, int] = {}
        self.blocks: set[int] = set()  # the struct types decorated Block or BufferBlock
        self.glsl: int | None = None  # the GLSL.std.450 import the module has
        self.new_glsl: int | None = None  # ... or the one this pass adds
        for opcode, ops in self.instructions:
            if opcode in (_OP_TYPE_INT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX, _OP_TYPE_ARRAY, _OP_TYPE_STRUCT,
                          _OP_TYPE_POINTER):
                self.types[ops[0]] = (opcode, ops)
            elif opcode == _OP_EXT_INST_IMPORT and _string(ops[1:]) == _GLSL:
                self.glsl = ops[0]
            if opcode == _OP_CONSTANT:
                self.constants[ops[1]] = ops
            if opcode == _OP_DECORATE and len(ops) >= 2 and ops[1] in (_DEC_BLOCK, _DEC_BUFFER_BLOCK):
                self.blocks.add(ops[0])
            if opcode in _RESULT_TYPED and len(ops) >= 2:
                self.type_of[ops[1]] = ops[0]
        self.new_constants: list[tuple[int, tuple[int, ...]]] = []
        self._limits: dict[tuple[int, int], int] = {}
        self.clamps = 0

    def run(self) -> bytes:
        """The module with its clamps (itself, repacked, when nothing needed one)."""
        body: list[tuple[int, tuple[int, ...]]] = []
        for opcode, ops in self.instructions:
            if opcode in (_OP_ACCESS_CHAIN, _OP_IN_BOUNDS_ACCESS_CHAIN) and self._clamped_class(ops[2]):
                ops = self._clamp_chain(ops, body)
            elif opcode in (_OP_PTR_ACCESS_CHAIN, _OP_IN_BOUNDS_PTR_ACCESS_CHAIN) and self._clamped_class(ops[2]):
                raise InvalidSubmission("a pointer access chain into shared or private memory is not allowed")
            elif opcode in (_OP_ACCESS_CHAIN, _OP_IN_BOUNDS_ACCESS_CHAIN) and len(ops) > 3:
                length = self._buffers_length(ops[2])
                if length is not None:  # the choice of a buffer in an array of them: clamped
                    ops = (*ops[:3], self._clamp(ops[3], length, body), *ops[4:])
            body.append((opcode, ops))
        if not self.clamps:
            return _pack(self.header, self.instructions)
        return _pack(self.header, self._placed(body))

    def _placed(self, body) -> list[tuple[int, tuple[int, ...]]]:
        """``body`` with the GLSL.std.450 import (if new) before the memory model and the new
        constants before the first function."""
        out, functions_began = [], False
        for opcode, ops in body:
            if opcode == _OP_MEMORY_MODEL and self.new_glsl is not None:
                out.append((_OP_EXT_INST_IMPORT, (self.new_glsl, *_literal(_GLSL))))
            if opcode == _OP_FUNCTION and not functions_began:
                functions_began = True
                out.extend(self.new_constants)
            out.append((opcode, ops))
        return out

    def _clamped_class(self, base: int) -> bool:
        """Whether the pointer ``base`` points into Workgroup, Private or Function memory."""
        pointer = self.types.get(self.type_of.get(base, -1))
        return pointer is not None and pointer[0] == _OP_TYPE_POINTER and pointer[1][1] in _CLAMPED_CLASSES

    def _buffers_length(self, base: int) -> int | None:
        """The length of the array of buffers that the pointer ``base`` points to, or None when it points to
        anything else."""
        pointer = self.types.get(self.type_of.get(base, -1))
        if pointer is None or pointer[0] != _OP_TYPE_POINTER or pointer[1][1] not in _BUFFER_CLASSES:
            return None
        array = self.types.get(pointer[1][2])
        if array is None or array[0] != _OP_TYPE_ARRAY or array[1][1] not in self.blocks:
            return None
        return self._constant_value(array[1][2])

    def _clamp_chain(self, ops: tuple[int, ...], body: list) -> tuple[int, ...]:
        """An access chain's operands with each out-of-range-able index replaced by its clamp,
        whose UMin instructions go into ``body`` first."""
        current = self.types[self.type_of[ops[2]]][1][2]  # the pointee
        indices = []
        for index in ops[3:]:
            kind, type_ops = self._type(current)
            if kind == _OP_TYPE_STRUCT:
                indices.append(index)
                current = type_ops[1 + self._constant_value(index)]
                continue
            if kind == _OP_TYPE_ARRAY and type_ops[2] not in self.constants:
                indices.append(index)  # a length that is no constant: reflection refuses such memory
                current = type_ops[1]
                continue
            if kind == _OP_TYPE_ARRAY:
                length, current = self._constant_value(type_ops[2]), type_ops[1]
            elif kind in (_OP_TYPE_VECTOR, _OP_TYPE_MATRIX):
                length, current = type_ops[2], type_ops[1]
            else:
                raise InvalidSubmission(f"invalid SPIR-V: an access chain indexes into type %{type_ops[0]}")
            indices.append(self._clamp(index, length, body))
        return (*ops[:3], *indices)

    def _clamp(self, index: int, length: int, body: list) -> int:
        """``index`` when it is a constant below ``length``, else the id of UMin(index, length - 1)."""
        if index in self.constants and self._constant_value(index) < length:
            return index
        index_type = self.type_of.get(index)
        if index_type is None or self._type(index_type)[0] != _OP_TYPE_INT:
            raise InvalidSubmission(f"refused SPIR-V: the type of index %{index} cannot be told, so it cannot be "
                                    "clamped to its array")
        if self.glsl is None and self.new_glsl is None:
            self.new_glsl = self._new_id()
        glsl = self.glsl if self.glsl is not None else self.new_glsl
        result = self._new_id()
        body.append((_OP_EXT_INST, (index_type, result, glsl, _GLSL_UMIN, index, self._limit(index_type, length - 1))))
        self.clamps += 1
        return result

    def _limit(self, int_type: int, value: int) -> int:
        """A constant ``value`` of the integer type ``int_type`` (made once, before the functions)."""
        key = (int_type, value)
        if key not in self._limits:
            width = self._type(int_type)[1][1]
            words = (value,) if width <= 32 else (value & 0xFFFFFFFF, value >> 32)
            self._limits[key] = self._new_id()
            self.new_constants.append((_OP_CONSTANT, (int_type, self._limits[key], *words)))
        return self._limits[key]

    def _constant_value(self, constant: int) -> int:
        ops = self.constants.get(constant)
        if ops is None or len(ops) < 3:
            raise InvalidSubmission(f"invalid SPIR-V: %{constant} is not a scalar constant")
        return ops[2] | (ops[3] << 32 if len(ops) > 3 else 0)

    def _type(self, type_id: int) -> tuple[int, tuple[int, ...]]:
        if type_id not in self.types:
            raise InvalidSubmission(f"invalid SPIR-V: %{type_id} is not a declared type")
        return self.types[type_id]

    def _new_id(self) -> int:
        self.header[3] += 1
        return self.header[3] - 1


def _literal(text: str) -> tuple[int, ...]:
    """A nul-terminated string packed into little-endian words."""
    raw = text.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return struct.unpack(f"<{len(raw) // 4}I", raw)


def _pack(header: list[int], instructions) -> bytes:
    words = list(header)
    for opcode, ops in instructions:
        words.extend(((len(ops) + 1) << 16 | opcode, *ops))
    return struct.pack(f"<{len(words)}I", *words)
