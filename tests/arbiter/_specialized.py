"""A kernel sized by its specialization constants (tests/arbiter/test_specialization.py, the C test
bindings/c/tests/test_constants.c): ``out[i] = SCALE * (l % BLOCK) + local_size_x`` where ``l`` is
the invocation's index in its workgroup. The workgroup's width is constant 0 (``local_size_x_id``,
default 64), a shared array is sized by an expression of BLOCK (constant 1), a private array by
PRIVATE (constant 3)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import libshare

SOURCE = """\
#version 450
layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint BLOCK = 16;
layout(constant_id = 2) const float SCALE = 1.0;
layout(constant_id = 3) const uint PRIVATE = 4;
layout(constant_id = 4) const bool NEGATE = false;
layout(std430, binding = 0) buffer Out { float data[]; };
shared float tile[(BLOCK + 1) / 2 * 2];
float priv[PRIVATE];
void main() {
    uint l = gl_LocalInvocationID.x;
    if (l < BLOCK) tile[l] = SCALE * float(l);
    priv[l % PRIVATE] = float(l);
    barrier();
    float value = tile[l % BLOCK] + float(gl_WorkGroupSize.x) + 0.0 * priv[l % PRIVATE];
    data[gl_GlobalInvocationID.x] = NEGATE ? -value : value;
}
"""
DEFAULTS = {0: 64, 1: 16, 2: 1.0, 3: 4, 4: False}


def compiled(target_env: str | None = None) -> bytes:
    """The kernel's SPIR-V (skips the test without glslangValidator)."""
    if shutil.which("glslangValidator") is None:
        pytest.skip("glslangValidator is not installed (apt-get install glslang-tools)")
    return libshare.compile(SOURCE, target_env=target_env)


def expected(groups: int, constants: dict) -> np.ndarray:
    """What the kernel writes over ``groups`` workgroups with ``constants`` (the others at their defaults)."""
    values = {**DEFAULTS, **constants}
    width, block, scale = values[0], values[1], values[2]
    local = np.arange(groups * width) % width
    out = (scale * (local % block) + width).astype(np.float32)
    return -out if values[4] else out
