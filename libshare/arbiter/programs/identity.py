"""A SPIR-V module's identity: what it computes, not the bytes a validator ignores.

The quarantine (``arbiter/drain/quarantine.py``) remembers modules that ended arbiters. Keyed
by the SHA-256 of the bytes, it was evaded by changing one word that does not change what
the module does: a debug name (``OpName``, ``OpMemberName``), a source line (``OpLine``), the
``OpSource`` version, an ``OpString``, ``OpModuleProcessed``, a non-semantic instruction, the
header's generator or id bound, or the numbering of the ids themselves. :func:`canonical_digest`
hashes the module after taking all of that away:

1. ``spirv-opt --strip-debug --strip-nonsemantic --compact-ids`` (SPIRV-Tools, installed beside
   the ``spirv-val`` the arbiter requires): the debug and non-semantic instructions go, and the
   ids are renumbered from 1 in the order they first appear, which depends only on the
   instructions (it also sets the bound to the largest id plus one). It runs in a child process
   with a time limit, at most one per core at once, on a module ``spirv-val`` accepted already;
2. the header's generator word is zeroed, and the words are hashed in little-endian order.

When ``spirv-opt`` is missing, fails or outruns its limit, a pure-Python pass does what it can
without the SPIR-V grammar (which operands are ids): the debug instructions dropped, the
generator and bound zeroed. That still catches every one-word change but a renumbering.

A module's identity is computed once per content: ``load_program`` asks for it only for a
module admission accepted, and the quarantine keeps what it computed by SHA-256 of the bytes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import threading

__all__ = ["DEBUG_OPCODES", "canonical_digest", "canonical_words"]

DEBUG_OPCODES = frozenset({2, 3, 4, 5, 6, 7, 8, 317, 330, 0})
"""OpSourceContinued, OpSource, OpSourceExtension, OpName, OpMemberName, OpString, OpLine,
OpNoLine, OpModuleProcessed, and OpNop: instructions that change nothing a kernel computes."""

_MAGIC = 0x07230203
_HEADER_WORDS = 5
_GENERATOR, _BOUND = 2, 3  # header word indices
_TIMEOUT = 10.0
_OPTIMIZERS = threading.BoundedSemaphore(os.cpu_count() or 2)  # spirv-opt processes at once
_PASSES = ("--strip-debug", "--strip-nonsemantic", "--compact-ids")


def canonical_digest(spirv: bytes) -> bytes:
    """The SHA-256 of ``spirv``'s canonical form (see the module's essay): modules that differ only
    in debug instructions, id numbering, generator or bound have the same one."""
    words = _optimized(bytes(spirv))
    if words is None:
        words = canonical_words(bytes(spirv))
    return hashlib.sha256(struct.pack(f"<{len(words)}I", *words)).digest()


def canonical_words(spirv: bytes) -> list[int]:
    """The fallback without spirv-opt: ``spirv``'s words (either byte order) without the debug
    instructions, with the generator and bound zeroed. A module that does not parse is its own
    words (it is refused before it is run anyway)."""
    if len(spirv) % 4 or len(spirv) < 4 * _HEADER_WORDS:
        return list(struct.unpack(f"<{len(spirv) // 4}I", spirv[:len(spirv) // 4 * 4]))
    order = "<" if int.from_bytes(spirv[:4], "little") == _MAGIC else ">"
    words = struct.unpack(f"{order}{len(spirv) // 4}I", spirv)
    kept = [*words[:_HEADER_WORDS]]
    kept[_GENERATOR] = kept[_BOUND] = 0
    pos = _HEADER_WORDS
    while pos < len(words):
        count, opcode = words[pos] >> 16, words[pos] & 0xFFFF
        if count == 0 or pos + count > len(words):
            return list(words)
        if opcode not in DEBUG_OPCODES:
            kept.extend(words[pos:pos + count])
        pos += count
    return kept


def _optimized(spirv: bytes) -> list[int] | None:
    """spirv-opt's canonical form with the generator zeroed; None when it cannot give one."""
    tool = shutil.which("spirv-opt")
    if tool is None:
        return None
    try:
        with _OPTIMIZERS:
            result = subprocess.run([tool, *_PASSES, "-", "-o", "-"], input=spirv, capture_output=True,
                                    timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = result.stdout
    if result.returncode != 0 or len(out) % 4 or len(out) < 4 * _HEADER_WORDS or \
            int.from_bytes(out[:4], "little") != _MAGIC:
        return None
    words = list(struct.unpack(f"<{len(out) // 4}I", out))
    words[_GENERATOR] = 0
    return words
