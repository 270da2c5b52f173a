"""Admission of a client's SPIR-V module: every check it passes before a driver sees it.

A module is untrusted code. Mesa's compiler segfaults on about 1 in 45 byte-flipped
variants of a valid module, loops for tens of seconds on a tiny module with a huge id
bound, and on lavapipe the module's code runs inside the arbiter itself. So a module
reaches ``vkCreateShaderModule`` only after all of these, cheapest first:

1. **Bounds**: at most :data:`MAX_MODULE_BYTES` bytes, and an id bound no larger than
   the module could use (twice its word count, plus slack). A larger bound is never
   needed by a real module and is what made Mesa allocate for seconds.
2. **Reflection and the whitelist** (:func:`libshare.arbiter.programs.spirv.reflect`): one GLCompute
   entry point, buffers (storage and uniform, any sets and bindings) and texel buffers (storage ones of a
   declared format, uniform ones) as its only resources, and only the capabilities, extensions,
   addressing and memory models and storage classes a compute kernel over its bound
   buffers needs. ``PhysicalStorageBufferAddresses`` (pointers made from integers) is
   the one that matters most.
3. **Device limits**: workgroup size and invocations, shared memory, push-constant
   bytes, the buffers it binds (at most :func:`most_bindings`: the device's push-descriptor
   and per-stage limits and the engine's ``LS_ENGINE_MAX_BINDINGS``, 32; a program with more
   than a descriptor's 8 is dispatched through a bind group), and a ceiling on per-invocation private memory (on lavapipe it lives on the
   stack of the arbiter thread that runs the kernel); and **device features**
   (``capabilities.py``): a SPIR-V version the device runs, and for every capability the
   module declares, a feature the device was created with (``Float16``: ``shaderFloat16``); and for
   every texel buffer, a view format of its kind that the device supports in a buffer view
   (``bufferFeatures``: ``STORAGE_TEXEL_BUFFER`` for a storage one: ``r32f`` for ``layout(r32f)``).
4. **The SPIR-V validator**: ``spirv-val`` from SPIRV-Tools (Debian's ``spirv-tools``),
   for the Vulkan environment the arbiter's device runs (1.1, 1.2 or 1.3), in a subprocess with a
   time limit, so that a validator bug costs a child process, not the arbiter; at most
   one per core at once, so that clients sending modules together cannot take every
   core from the device. The validator's first message goes back to the client.

Every check runs on the *specialized* module: the client's specialization constants are
frozen into it first (``specialize.py``, after the bounds), and the bytes admitted here are the
bytes the vetting compile and the pipeline get, with no ``VkSpecializationInfo``: a constant
cannot size a workgroup, a shared or a private array past these checks.

Every refusal is an :class:`~libshare.errors.InvalidSubmission` that names what was
refused. Compiling (in a vetting child first, see ``_compiler.py``) comes after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

from libshare.arbiter.programs.capabilities import check_device_features, target_env
from libshare.arbiter.programs.spirv import ShaderInterface, reflect
from libshare.errors import InvalidSubmission, VulkanUnavailable
from libshare.ring import C
from libshare.arbiter.engine.binding import MOST_BINDINGS
from libshare.protocol.texels import TEXEL_STORAGE, TEXEL_UNIFORM

__all__ = ["MAX_MODULE_BYTES", "MAX_PRIVATE_BYTES", "admit", "check_texel_formats", "validator_path"]

MAX_MODULE_BYTES = 1 << 20
"""Largest module accepted (1 MiB; the shipped kernels are 1-3 kB)."""
MAX_PRIVATE_BYTES = 64 << 10
"""Most bytes of Private and Function variables a kernel may declare."""
_ID_BOUND_SLACK = 1024
_VALIDATOR_TIMEOUT = 10.0
_TARGET_ENV = "vulkan1.1"  # the oldest Vulkan a device runs for libshare; admit() asks for the device's own
_INSTALL_HINT = "install SPIRV-Tools (`apt-get install spirv-tools`)"
_VALIDATORS = threading.BoundedSemaphore(os.cpu_count() or 2)  # spirv-val processes at once


def admit(spirv: bytes, device) -> ShaderInterface:
    """The module's interface once it has passed every check above for ``device``.

    Raises :class:`InvalidSubmission` naming the first check it failed.
    """
    check_bounds(spirv)
    try:
        interface = reflect(spirv)
    except InvalidSubmission:
        raise
    except (ArithmeticError, LookupError, RecursionError, TypeError, ValueError) as exc:  # a parser bug: refuse
        raise InvalidSubmission(f"invalid SPIR-V: reflection could not read it ({type(exc).__name__})") from None
    check_device_limits(interface, device)
    check_texel_formats(interface, device)
    check_device_features(spirv, device)
    validate(spirv, target_env(device), layout_flags(device))
    return interface


def check_bounds(spirv: bytes) -> None:
    """Refuse a module that is too large, or whose header claims more ids than it could use."""
    if len(spirv) > MAX_MODULE_BYTES:
        raise InvalidSubmission(f"SPIR-V module of {len(spirv)} bytes is too large (the limit is "
                                f"{MAX_MODULE_BYTES} bytes)")
    if len(spirv) >= 20:
        order = "little" if spirv[:4] == b"\x03\x02\x23\x07" else "big"
        bound = int.from_bytes(spirv[12:16], order)
        most = 2 * (len(spirv) // 4) + _ID_BOUND_SLACK
        if bound > most:
            raise InvalidSubmission(f"SPIR-V id bound {bound} is too large for a {len(spirv)}-byte module "
                                    f"(at most {most})")


def check_device_limits(interface: ShaderInterface, device) -> None:
    """Refuse a kernel whose workgroup, shared, private or push-constant memory the device cannot give."""
    size, limit = interface.local_size, device.max_workgroup_size
    if any(a > b for a, b in zip(size, limit)):
        raise InvalidSubmission(f"workgroup size {size} exceeds the device's {limit}")
    invocations = size[0] * size[1] * size[2]
    if invocations > device.max_workgroup_invocations:
        raise InvalidSubmission(f"workgroup of {invocations} invocations exceeds the device's "
                                f"{device.max_workgroup_invocations}")
    if interface.workgroup_bytes and not device.zero_workgroup_memory:
        raise InvalidSubmission("kernel declares shared memory, and this device cannot zero it before a kernel "
                                "starts (it lacks shaderZeroInitializeWorkgroupMemory): it would read what "
                                "another client's kernel left there")
    if interface.workgroup_bytes > device.max_shared_memory:
        raise InvalidSubmission(f"kernel declares {interface.workgroup_bytes} bytes of shared memory; the "
                                f"device allows {device.max_shared_memory}")
    if interface.private_bytes > MAX_PRIVATE_BYTES:
        raise InvalidSubmission(f"kernel declares {interface.private_bytes} bytes of private variables; "
                                f"libshare allows {MAX_PRIVATE_BYTES}")
    if interface.push_constant_size > min(device.max_push_constants_size, C.MAX_PUSH):
        raise InvalidSubmission(f"program declares {interface.push_constant_size} bytes of push constants; "
                                f"the device allows {device.max_push_constants_size} and a descriptor carries "
                                f"{C.MAX_PUSH}")
    check_binding_limits(interface, device.binding_limits)


def check_binding_limits(interface: ShaderInterface, limits: dict[str, int]) -> None:
    """Refuse a kernel that binds more buffers than :func:`most_bindings` allows, naming the count and the
    limit (a program with more than ring.h's LS_MAX_BUFFERS is dispatched through a bind group)."""
    texel = {k for k, _ in interface.texel}   # (texel buffers count against the device's image limits)
    total, uniform = len(interface.bindings), len(interface.uniform - texel)
    counts = {"buffers": (total, most_bindings(limits)),
              "storage buffers": (total - uniform - len(texel), limits["per-stage storage buffers"]),
              "uniform buffers": (uniform, limits["per-stage uniform buffers"])}
    for what, (count, limit) in counts.items():
        if count > limit:
            raise InvalidSubmission(f"program declares {count} {what} (at (set, binding) "
                                    f"{', '.join(map(str, interface.resources))}); a kernel binds at most {limit} "
                                    f"here ({_limits_text(limits)}, libshare's {MOST_BINDINGS})")


def most_bindings(limits: dict[str, int]) -> int:
    """The most buffers a program binds on a device with these ``binding_limits``: the least of its
    push-descriptor and per-stage resource limits and the engine's LS_ENGINE_MAX_BINDINGS."""
    return min(limits["push descriptors"], limits["per-stage resources"], MOST_BINDINGS)


def _limits_text(limits: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in limits.items())


def check_texel_formats(interface: ShaderInterface, device) -> None:
    """Refuse a kernel with a texel buffer that no view format the device supports for its kind can serve."""
    for binding, formats in interface.texel:
        uniform = binding in interface.uniform
        use = TEXEL_UNIFORM if uniform else TEXEL_STORAGE
        if not any(device.texel_formats.get(name, 0) & use for name in formats):
            place = interface.resources[_resource_of(interface.arrays, binding)]
            raise InvalidSubmission(f"the {'uniform' if uniform else 'storage'} texel buffer at (set, binding) "
                                    f"{place} takes views of format {' or '.join(formats)}, which {device.name} "
                                    f"does not support in a {'uniform' if uniform else 'storage'} texel buffer")


def _resource_of(arrays: tuple[int, ...], binding: int) -> int:
    """The index into a ShaderInterface's resources of its buffer ``binding`` (arrays of buffers take several)."""
    first = 0
    for k, count in enumerate(arrays):
        if binding < first + count:
            return k
        first += count
    return binding


def validator_path() -> str:
    """Where ``spirv-val`` is; raises VulkanUnavailable with an install hint when it is missing."""
    path = shutil.which("spirv-val")
    if path is None:
        raise VulkanUnavailable(f"the SPIR-V validator spirv-val is not installed, and no client module may "
                                f"run unvalidated; {_INSTALL_HINT}")
    return path


_LAYOUT_FLAGS = {"scalarBlockLayout": "--scalar-block-layout",
                 "uniformBufferStandardLayout": "--uniform-buffer-standard-layout"}
"""The block layouts a device feature allows, as spirv-val's flags: without them it holds a module to
the standard layouts (std140 uniform blocks, std430 storage blocks)."""


def layout_flags(device) -> tuple[str, ...]:
    """``spirv-val``'s flags for the block layouts ``device`` was created to allow."""
    return tuple(flag for feature, flag in _LAYOUT_FLAGS.items() if feature in device.features)


def validate(spirv: bytes, env: str = _TARGET_ENV, flags: tuple[str, ...] = ()) -> None:
    """Run ``spirv-val`` on the module for the Vulkan environment ``env`` (``vulkan1.2``: see
    :func:`~.capabilities.target_env`) with ``flags`` (:func:`layout_flags`); raise InvalidSubmission
    with its message when it refuses."""
    try:
        with _VALIDATORS:  # clients that send modules at once share the cores, not take one each
            result = subprocess.run([validator_path(), "--target-env", env, *flags, "-"], input=bytes(spirv),
                                    capture_output=True, timeout=_VALIDATOR_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise InvalidSubmission(f"spirv-val took longer than {_VALIDATOR_TIMEOUT:.0f} s on this module; "
                                "refused") from None
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()
        message = lines[0] if lines else f"exit status {result.returncode}"
        raise InvalidSubmission(f"invalid SPIR-V: spirv-val: {message[:500]}")
