"""Non-semantic instructions taken out of a module, for a device that cannot take them.

``SPV_KHR_non_semantic_info`` lets a module carry instructions that change nothing it computes:
``OpExtInst`` of an ``OpExtInstImport`` whose name begins ``NonSemantic.`` (shader debug info,
``debugPrintfEXT``). By definition their results are used by no other kind of instruction, so a
module without them computes the same. A device takes them only with
``VK_KHR_shader_non_semantic_info`` or Vulkan 1.3 (which absorbed it); the Vulkan driver offers the
extension on any device, so on a device that has neither (its features lack the extension's name,
device/_instance.py) program loading (``loading.py``) admits and compiles :func:`without_nonsemantic`'s
module: the imports, their ``OpExtInst``, the names and decorations of those instructions' results,
and the ``OpExtension`` go, and the validator then checks what is left, as what the device will take.
A ``debugPrintfEXT`` then prints nothing, as it prints nothing without the validation layer that reads
it.
"""

from __future__ import annotations

import struct

from libshare.arbiter.programs.spirv import _instructions, _string, _words

__all__ = ["without_nonsemantic"]

_HEADER_WORDS = 5
_OP_NAME, _OP_MEMBER_NAME, _OP_EXTENSION, _OP_EXT_INST_IMPORT, _OP_EXT_INST = 5, 6, 10, 11, 12
_OP_DECORATE, _OP_MEMBER_DECORATE, _OP_DECORATE_ID, _OP_DECORATE_STRING = 71, 72, 332, 5632
_ABOUT_AN_ID = (_OP_NAME, _OP_MEMBER_NAME, _OP_DECORATE, _OP_MEMBER_DECORATE, _OP_DECORATE_ID, _OP_DECORATE_STRING)
_EXTENSION = "SPV_KHR_non_semantic_info"


def without_nonsemantic(spirv: bytes) -> bytes:
    """``spirv`` (a client's module, not yet admitted: anything malformed raises InvalidSubmission, and an
    instruction too short to name what it is about is left for the validator) without its non-semantic
    instructions (see the module's essay): little-endian words, or the module itself when it has none."""
    words = _words(bytes(spirv))
    sets = {ops[0] for opcode, ops in _instructions(words)
            if opcode == _OP_EXT_INST_IMPORT and _string(ops[1:]).startswith("NonSemantic.")}
    if not sets:
        return bytes(spirv)
    gone = {ops[1] for opcode, ops in _instructions(words) if _non_semantic(opcode, ops, sets)}
    out = list(words[:_HEADER_WORDS])
    for opcode, ops in _instructions(words):
        if (opcode == _OP_EXT_INST_IMPORT and ops[0] in sets) or _non_semantic(opcode, ops, sets) or \
                (opcode == _OP_EXTENSION and _string(ops) == _EXTENSION) or \
                (opcode in _ABOUT_AN_ID and ops and ops[0] in gone):
            continue
        out.extend(((len(ops) + 1) << 16 | opcode, *ops))
    return struct.pack(f"<{len(out)}I", *out)


def _non_semantic(opcode: int, ops: tuple[int, ...], sets: set[int]) -> bool:
    """Whether an instruction is an OpExtInst of one of the non-semantic ``sets`` (result type, result,
    set, instruction: at least four operands)."""
    return opcode == _OP_EXT_INST and len(ops) >= 4 and ops[2] in sets
