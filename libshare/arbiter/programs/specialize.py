"""Specialization constants, frozen into a module before admission sees it.

A compute kernel declares specialization constants (``layout(constant_id = 1) const uint
BLOCK = 64;``, ``layout(local_size_x_id = 0) in;``) whose values a Vulkan program gives when it
creates the pipeline. They size things: the workgroup, shared arrays (``shared float
tmp[BLOCK / 2]``), private arrays, loop bounds. A size that admission checked with one value and
the driver compiled with another would smuggle a workgroup past the device's limits or a
private array past the stack of the thread that runs it. So the arbiter never hands a driver a
``VkSpecializationInfo``: it writes the client's values into the module itself, and every later
step (reflection, the whitelist, the device limits, ``spirv-val``, the vetting compile, the
pipeline) sees that one specialized module, and only it.

:func:`specialize` does it in two steps, after sizing runtime arrays of buffers (0):

0. **Array lengths** (``arrays.py``): each runtime-sized array of
   buffers (``b[]``) becomes an array of the length ``load_program``'s ``arrays`` gives it.

1. **Defaults** (here, in Python): each constant the client gives (``load_program``'s
   ``constants``: at most :data:`MAX_CONSTANTS` pairs of SpecId and value, :func:`constants_rule`)
   becomes the default of every ``OpSpecConstant``, ``OpSpecConstantTrue`` or
   ``OpSpecConstantFalse`` decorated with that ``SpecId``, typed by the module's own declaration:
   8, 16, 32 or 64-bit integers (a value in the range of its signedness), 16, 32 or 64-bit floats
   (an integer or a float the type can hold), bools (true or false). An id the module does not
   declare, or a value its type cannot hold, is refused, naming it.
2. **Freezing** (``spirv-opt --freeze-spec-const --fold-spec-const-op-composite``, SPIRV-Tools):
   the spec constants become plain constants and the expressions over them
   (``OpSpecConstantOp``: ``BLOCK / 2``; ``OpSpecConstantComposite``: the ``WorkgroupSize``
   built-in) are folded, so that an array sized by an expression has a plain constant length that
   reflection can read. ``spirv-opt`` reads hostile input, so it runs in a child process with a
   time limit, at most one per core at once, after the module passed the size bounds
   (``admission.check_bounds``): a crash or a hang costs a child and refuses the module. It
   skips its own validation: its output is what admission checks, bounds and ``spirv-val`` (for
   the arbiter's environment) included, so that one validator decides what a module may be.

3. **Clamping** (``clamp.py``, in Python, for every module): every index into a shared,
   private or function array is clamped to the array's length, so that a kernel that indexes
   past one (undefined in Vulkan; on lavapipe, the arbiter's own heap and stacks) computes
   nonsense in its own buffers only.

A module that declares no spec constant goes through the clamping alone (no child process). A
module that declares some and is given none is frozen at its own defaults, which is what makes a
kernel whose shared arrays are sized by a spec-constant expression admissible at all. When
``spirv-opt`` is not installed, the module with its defaults set (step 1) is what the arbiter
admits and runs: a driver given no ``VkSpecializationInfo`` uses exactly those defaults, and
reflection reads them; only an expression stays unfolded, which reflection refuses where it
sizes something.
"""

from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import threading

from libshare.arbiter.programs.admission import check_bounds
from libshare.arbiter.programs.arrays import sized
from libshare.arbiter.programs.clamp import clamped
from libshare.arbiter.programs.spirv import _instructions, _words
from libshare.errors import InvalidSubmission

__all__ = ["MAX_CONSTANTS", "constants_key", "constants_rule", "specialize"]

MAX_CONSTANTS = 64
"""Most specialization constants one ``load_program`` may set."""
MAX_SPEC_ID = (1 << 31) - 1
"""Largest SpecId a constant may be given for (Vulkan's constantID is a uint32; SPIR-V ids stay below 2^31)."""
_FREEZE_TIMEOUT = 10.0
_FREEZE = ("--freeze-spec-const", "--fold-spec-const-op-composite")
_OPTIMIZERS = threading.BoundedSemaphore(os.cpu_count() or 2)  # spirv-opt processes at once
_HEADER_WORDS = 5
_MAGIC = 0x07230203

_OP_DECORATE, _DEC_SPEC_ID = 71, 1
_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT = 20, 21, 22
_OP_SPEC_TRUE, _OP_SPEC_FALSE, _OP_SPEC_CONSTANT = 48, 49, 50
_SPEC_OPS = frozenset({48, 49, 50, 51, 52})  # OpSpecConstant{True,False,,Composite,Op}
_FLOAT_FORMATS = {16: "<e", 32: "<f", 64: "<d"}


def constants_rule(name: str, value):
    """The wire rule of ``load_program``'s ``constants``: a list of at most :data:`MAX_CONSTANTS`
    ``[id, value]`` pairs, ids distinct in 0..:data:`MAX_SPEC_ID`, values true, false, integers
    in -2^63..2^64-1 or floats (the module's types are checked by :func:`specialize`)."""
    if not isinstance(value, list) or len(value) > MAX_CONSTANTS:
        raise InvalidSubmission(f"{name} must be a list of at most {MAX_CONSTANTS} [id, value] pairs")
    seen = set()
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise InvalidSubmission(f"{name}: each constant is an [id, value] pair")
        spec_id, item = pair
        if not isinstance(spec_id, int) or isinstance(spec_id, bool) or not 0 <= spec_id <= MAX_SPEC_ID:
            raise InvalidSubmission(f"{name}: a constant id must be an integer in 0..{MAX_SPEC_ID}")
        if spec_id in seen:
            raise InvalidSubmission(f"{name}: constant {spec_id} is given twice")
        seen.add(spec_id)
        if isinstance(item, int) and not isinstance(item, bool) and not -(1 << 63) <= item < (1 << 64):
            raise InvalidSubmission(f"{name}: constant {spec_id}'s value is outside -2^63..2^64-1")
        if not isinstance(item, (bool, int, float)):
            raise InvalidSubmission(f"{name}: constant {spec_id}'s value must be a number or true or false")
    return value


def constants_key(constants) -> bytes:
    """Bytes that tell one set of constants from another (for the admission cache): b"" for none."""
    if not constants:
        return b""
    return repr(sorted((int(spec_id), type(item).__name__, repr(item)) for spec_id, item in constants)).encode()


def specialize(spirv: bytes, constants=(), arrays=()) -> bytes:
    """``spirv`` with ``constants`` (``[id, value]`` pairs, :func:`constants_rule`) as the values
    of its specialization constants, frozen, and its runtime arrays of buffers given the lengths
    ``arrays`` gives (``[set, binding, length]`` triples, arrays.py; see the module's essay); the
    module itself when it declares none and none are given. Raises InvalidSubmission naming what it
    refuses."""
    spirv = bytes(spirv)
    check_bounds(spirv)
    spirv = sized(spirv, arrays)
    words = _words(spirv)
    instructions = list(_instructions(words))
    given = {int(spec_id): item for spec_id, item in constants or ()}
    if not given and not any(opcode in _SPEC_OPS for opcode, _ in instructions):
        return clamped(spirv)
    module = _with_defaults(words[:_HEADER_WORDS], instructions, given)
    frozen = _optimized(module, _FREEZE)
    return clamped(module if frozen is None else frozen)  # (admission checks it, from the bounds on)


def _with_defaults(header, instructions, given: dict) -> bytes:
    """The module (little-endian) with each given constant as the default of its spec constants."""
    spec_ids: dict[int, list[int]] = {}  # result id -> its SpecIds
    scalars: dict[int, tuple[str, int, bool]] = {}  # type id -> (kind, width, signed)
    for opcode, ops in instructions:
        if opcode == _OP_DECORATE and ops[1] == _DEC_SPEC_ID and len(ops) > 2:
            spec_ids.setdefault(ops[0], []).append(ops[2])
        elif opcode == _OP_TYPE_BOOL:
            scalars[ops[0]] = ("bool", 1, False)
        elif opcode == _OP_TYPE_INT:
            scalars[ops[0]] = ("int", ops[1], bool(ops[2]))
        elif opcode == _OP_TYPE_FLOAT:
            scalars[ops[0]] = ("float", ops[1], True)
    declared = {spec_id for ids in spec_ids.values() for spec_id in ids}
    unknown = sorted(set(given) - declared)
    if unknown:
        have = ", ".join(map(str, sorted(declared))) or "none"
        raise InvalidSubmission(f"specialization constant {unknown[0]} is not declared by this module (its "
                                f"constant ids: {have})")
    out = list(header)
    for opcode, ops in instructions:
        if opcode in (_OP_SPEC_TRUE, _OP_SPEC_FALSE, _OP_SPEC_CONSTANT) and len(ops) >= 2:
            for spec_id in spec_ids.get(ops[1], ()):
                if spec_id in given:
                    opcode, ops = _set(opcode, ops, scalars.get(ops[0]), spec_id, given[spec_id])
        out.extend(((len(ops) + 1) << 16 | opcode, *ops))
    return struct.pack(f"<{len(out)}I", *out)


def _set(opcode: int, ops: tuple[int, ...], scalar, spec_id: int, value) -> tuple[int, tuple[int, ...]]:
    """The spec constant instruction with ``value`` as its default."""
    if scalar is None or (scalar[0] == "bool") != (opcode != _OP_SPEC_CONSTANT):
        raise InvalidSubmission(f"invalid SPIR-V: specialization constant {spec_id} is not of a scalar type")
    kind, width, signed = scalar
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidSubmission(f"specialization constant {spec_id} is a bool: its value must be true or "
                                    f"false (got {value!r})")
        return (_OP_SPEC_TRUE if value else _OP_SPEC_FALSE), ops[:2]
    if width not in (8, 16, 32, 64) or (kind == "float" and width not in _FLOAT_FORMATS):
        raise InvalidSubmission(f"invalid SPIR-V: specialization constant {spec_id} has a {width}-bit {kind} type")
    what = f"specialization constant {spec_id} is a {width}-bit " + (
        "float" if kind == "float" else "signed integer" if signed else "unsigned integer")
    if kind == "int":
        low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise InvalidSubmission(f"{what}: its value must be an integer in {low}..{high} (got {value!r})")
        bits = value & ((1 << width) - 1)
        if signed and width < 32 and value < 0:
            bits = value & 0xFFFFFFFF  # a narrow signed literal is sign-extended into its word
    else:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InvalidSubmission(f"{what}: its value must be a number (got {value!r})")
        try:
            packed = struct.pack(_FLOAT_FORMATS[width], float(value))
        except (OverflowError, struct.error):
            raise InvalidSubmission(f"{what}: {value!r} is out of its range") from None
        if math.isfinite(float(value)) and not math.isfinite(struct.unpack(_FLOAT_FORMATS[width], packed)[0]):
            raise InvalidSubmission(f"{what}: {value!r} is out of its range")
        bits = int.from_bytes(packed, "little")
    literal = (bits & 0xFFFFFFFF, bits >> 32) if width == 64 else (bits,)
    return opcode, (*ops[:2], *literal)


def _optimized(module: bytes, passes: tuple[str, ...]) -> bytes | None:
    """The module through spirv-opt's ``passes`` (freezing and folding: see the module's essay);
    None when spirv-opt is not installed. Raises InvalidSubmission when spirv-opt refuses the
    module, crashes or outruns its limit."""
    tool = shutil.which("spirv-opt")
    if tool is None:
        return None
    try:
        with _OPTIMIZERS:  # clients that send modules at once share the cores, not take one each
            result = subprocess.run([tool, "--skip-validation", *passes, "-", "-o", "-"], input=module,
                                    capture_output=True, timeout=_FREEZE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise InvalidSubmission(f"spirv-opt took longer than {_FREEZE_TIMEOUT:.0f} s preparing this module "
                                "(its specialization constants); refused") from None
    except OSError as exc:
        raise InvalidSubmission(f"spirv-opt could not run to prepare this module ({exc.strerror}); refused") from None
    if result.returncode < 0:
        raise InvalidSubmission(f"spirv-opt crashed (signal {-result.returncode}) preparing this module "
                                "(its specialization constants); refused")
    out = result.stdout
    if result.returncode != 0 or len(out) % 4 or len(out) < 4 * _HEADER_WORDS or \
            int.from_bytes(out[:4], "little") != _MAGIC:
        lines = result.stderr.decode(errors="replace").strip().splitlines()
        message = lines[0] if lines else f"exit status {result.returncode}"
        raise InvalidSubmission(f"invalid SPIR-V: spirv-opt could not freeze its specialization constants: "
                                f"{message[:500]}")
    return out
