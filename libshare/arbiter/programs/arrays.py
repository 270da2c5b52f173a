"""Runtime-sized arrays of buffers, given their length when a program is loaded.

A kernel may declare an array of buffers without a length (``layout(binding = 0) buffer B { uint x[]; }
b[];``, GL_EXT_nonuniform_qualifier: an ``OpTypeRuntimeArray`` of a ``Block`` or ``BufferBlock`` struct as
the type of a ``StorageBuffer`` or ``Uniform`` variable). In Vulkan its length is the ``descriptorCount`` of
its binding in the pipeline layout; the arbiter has no pipeline layout from the client, so the client gives
it: ``load_program``'s ``arrays``, ``[[set, binding, length], ...]`` (:func:`arrays_rule`: at most
:data:`MOST_BINDINGS` triples, places distinct, each length 1..:data:`MOST_BINDINGS`, the most buffers a
bind group binds).

:func:`sized` writes the lengths into the module before anything else reads it, as specialize.py
freezes specialization constants: each such ``OpTypeRuntimeArray`` becomes an ``OpTypeArray`` of the same
element, with the same id, whose length is a new ``OpConstant`` of a 32-bit unsigned integer type (the
module's own, moved before the first array if it is declared later, or a new one), and the
``RuntimeDescriptorArray`` capability, which the module no longer needs, is dropped. From then on the
array is a fixed-size one: reflection counts its buffers, admission checks that count against the
device's per-stage limits and libshare's, clamp.py clamps an index into it to its length, and a bind
group names one buffer per element. The identity of the program (its pipeline's key, the quarantine's)
is that of the sized module, so other lengths make another program; the admission cache keys the
module sent with its lengths (:func:`arrays_key`).

Refused, naming the set and binding: a runtime array of buffers given no length; a length given for a
place that holds no runtime array of buffers; one array type shared by places given different lengths.
``NonUniform`` decorations stay; the capabilities that go with them (``ShaderNonUniform``,
``StorageBufferArrayNonUniformIndexing``, ``UniformBufferArrayNonUniformIndexing``) are admitted only on
a device created with their features (capabilities.py).
"""

from __future__ import annotations

import struct

from libshare.arbiter.engine.binding import MOST_BINDINGS
from libshare.arbiter.programs.spirv import _instructions, _words
from libshare.errors import InvalidSubmission

__all__ = ["arrays_key", "arrays_rule", "sized"]

_HEADER_WORDS, _BOUND = 5, 3
_OP_TYPE_INT, _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_ARRAY, _OP_TYPE_STRUCT = 21, 29, 28, 30
_OP_TYPE_POINTER, _OP_CONSTANT, _OP_VARIABLE, _OP_DECORATE, _OP_CAPABILITY = 32, 43, 59, 71, 17
_DEC_BLOCK, _DEC_BUFFER_BLOCK, _DEC_BINDING, _DEC_DESCRIPTOR_SET = 2, 3, 33, 34
_SC_UNIFORM, _SC_STORAGE_BUFFER = 2, 12
_RUNTIME_DESCRIPTOR_ARRAY = 5302
_MAX_PLACE = (1 << 32) - 1


def arrays_rule(name: str, value):
    """The wire rule of ``load_program``'s ``arrays``: a list of at most :data:`MOST_BINDINGS`
    ``[set, binding, length]`` triples, places distinct, set and binding integers in 0..2^32-1, each
    length an integer in 1..:data:`MOST_BINDINGS` (whether a place holds a runtime array: :func:`sized`)."""
    if not isinstance(value, list) or len(value) > MOST_BINDINGS:
        raise InvalidSubmission(f"{name} must be a list of at most {MOST_BINDINGS} [set, binding, length] triples")
    seen = set()
    for triple in value:
        if not isinstance(triple, list) or len(triple) != 3:
            raise InvalidSubmission(f"{name}: each array length is a [set, binding, length] triple")
        if not all(isinstance(part, int) and not isinstance(part, bool) for part in triple):
            raise InvalidSubmission(f"{name}: set, binding and length must be integers (got {triple!r:.80})")
        descriptor_set, binding, length = triple
        if not (0 <= descriptor_set <= _MAX_PLACE and 0 <= binding <= _MAX_PLACE):
            raise InvalidSubmission(f"{name}: a set and a binding are integers in 0..{_MAX_PLACE}")
        if not 1 <= length <= MOST_BINDINGS:
            raise InvalidSubmission(f"{name}: the array at set {descriptor_set}, binding {binding} is given length "
                                    f"{length}; a length is 1..{MOST_BINDINGS} (the most buffers a program binds)")
        if (descriptor_set, binding) in seen:
            raise InvalidSubmission(f"{name}: set {descriptor_set}, binding {binding} is given twice")
        seen.add((descriptor_set, binding))
    return value


def arrays_key(arrays) -> bytes:
    """Bytes that tell one set of array lengths from another (for the admission cache): b"" for none."""
    return repr(sorted(tuple(triple) for triple in arrays)).encode() if arrays else b""


def sized(spirv: bytes, arrays=()) -> bytes:
    """``spirv`` with each runtime-sized array of buffers made an array of the length ``arrays``
    (``[set, binding, length]`` triples, :func:`arrays_rule`) gives it (see the module's essay); the
    module itself when it has none and none are given. Raises InvalidSubmission naming what it refuses."""
    lengths = {(int(s), int(b)): int(n) for s, b, n in arrays or ()}
    words = _words(bytes(spirv))
    instructions = list(_instructions(words))
    runtime = _runtime_arrays(instructions)  # runtime array type id -> its places
    places = {place for found in runtime.values() for place in found}
    for place in sorted(set(lengths) - places):
        raise InvalidSubmission(f"arrays: set {place[0]}, binding {place[1]} is not a runtime-sized array of "
                                f"buffers in this module (its runtime arrays: {_names(places)})")
    for place in sorted(places - set(lengths)):
        raise InvalidSubmission(f"the buffers at set {place[0]}, binding {place[1]} are a runtime-sized array (b[]): "
                                f"load_program must give its length (arrays=[[{place[0]}, {place[1]}, n]]; "
                                f"the Vulkan driver gives the binding's descriptorCount)")
    if not runtime:
        return spirv
    length_of = {}
    for type_id, found in runtime.items():
        given = {lengths[place] for place in found}
        if len(given) > 1:
            raise InvalidSubmission(f"the runtime arrays of buffers at {_names(found)} share one type: give them "
                                    f"one length (got {sorted(given)})")
        length_of[type_id] = given.pop()
    return _rewritten(words, instructions, length_of)


def _runtime_arrays(instructions) -> dict[int, set[tuple[int, int]]]:
    """Each ``OpTypeRuntimeArray`` of blocks that types a buffer variable, with the places of its variables."""
    decorations: dict[int, dict[int, int]] = {}
    runtime, structs, pointers, variables = {}, set(), {}, []
    for opcode, ops in instructions:
        if opcode == _OP_DECORATE and len(ops) >= 2:
            decorations.setdefault(ops[0], {})[ops[1]] = ops[2] if len(ops) > 2 else 0
        elif opcode == _OP_TYPE_RUNTIME_ARRAY and len(ops) >= 2:
            runtime[ops[0]] = ops[1]
        elif opcode == _OP_TYPE_STRUCT and ops:
            structs.add(ops[0])
        elif opcode == _OP_TYPE_POINTER and len(ops) >= 3:
            pointers[ops[0]] = (ops[1], ops[2])
        elif opcode == _OP_VARIABLE and len(ops) >= 3 and ops[2] in (_SC_UNIFORM, _SC_STORAGE_BUFFER):
            variables.append((ops[0], ops[1]))
    found: dict[int, set[tuple[int, int]]] = {}
    for pointer, var in variables:
        pointee = pointers.get(pointer, (None, None))[1]
        element = runtime.get(pointee)
        marks = decorations.get(element, {})
        if element in structs and (_DEC_BLOCK in marks or _DEC_BUFFER_BLOCK in marks):
            own = decorations.get(var, {})
            if _DEC_DESCRIPTOR_SET not in own or _DEC_BINDING not in own:
                raise InvalidSubmission(f"invalid SPIR-V: buffer variable %{var} has no DescriptorSet or Binding")
            found.setdefault(pointee, set()).add((own[_DEC_DESCRIPTOR_SET], own[_DEC_BINDING]))
    return found


def _rewritten(words, instructions, length_of: dict[int, int]) -> bytes:
    """The module (little-endian) with each runtime array in ``length_of`` an array of that length."""
    bound = words[_BOUND]
    uint = next((ops[0] for opcode, ops in instructions if opcode == _OP_TYPE_INT and ops[1:3] == (32, 0)), None)
    if uint is None:
        uint, bound = bound, bound + 1
    out, declared = list(words[:_HEADER_WORDS]), False
    for opcode, ops in instructions:
        if opcode == _OP_CAPABILITY and ops[0] == _RUNTIME_DESCRIPTOR_ARRAY:
            continue
        if opcode == _OP_TYPE_INT and ops[0] == uint:
            if declared:
                continue  # moved before the first array it sizes
            declared = True
        if opcode == _OP_TYPE_RUNTIME_ARRAY and ops[0] in length_of:
            if not declared:
                out.extend((4 << 16 | _OP_TYPE_INT, uint, 32, 0))
                declared = True
            out.extend((4 << 16 | _OP_CONSTANT, uint, bound, length_of[ops[0]]))
            opcode, ops, bound = _OP_TYPE_ARRAY, (ops[0], ops[1], bound), bound + 1
        out.extend(((len(ops) + 1) << 16 | opcode, *ops))
    out[_BOUND] = bound
    return struct.pack(f"<{len(out)}I", *out)


def _names(places) -> str:
    return ", ".join(f"(set {s}, binding {b})" for s, b in sorted(places)) or "none"
