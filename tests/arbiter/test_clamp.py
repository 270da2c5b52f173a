"""Indices past a shared or private array, or an array of buffers, are clamped: a hostile kernel
cannot reach the arbiter.

On lavapipe a kernel's shared and private arrays are the heap and stacks of the arbiter's own
threads, and robustBufferAccess bounds buffers only. The kernel below writes far past both
(its push constants choose the index) through a daemon arbiter, beside an honest client whose
results are checked: the arbiter must live on, and the kernel's writes land on its arrays'
last elements (libshare/arbiter/programs/clamp.py).
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.arbiter.programs import clamp as _clamp
from libshare.arbiter.programs.clamp import clamped
from libshare.arbiter.programs.spirv import reflect

OUT_OF_BOUNDS = """#version 450
layout(local_size_x = 64) in;
layout(push_constant) uniform P { uint i; uint j; } p;
layout(set = 0, binding = 0) buffer Out { uint o[]; };
shared uint s[32];
void main() {
    uint priv[4];
    uint lane = gl_LocalInvocationID.x;
    priv[lane & 3u] = 5u;
    s[lane % 32u] = 1u;
    barrier();
    if (lane == 0u) s[p.i] = 7u;
    priv[p.j] = 9u;
    barrier();
    o[gl_GlobalInvocationID.x] = s[lane % 32u] * 100u + priv[lane & 3u];
}
"""


def compile_glsl(tmp_path, source: str) -> bytes:
    (tmp_path / "k.comp").write_text(source)
    subprocess.run(["glslangValidator", "-V", "--target-env", "vulkan1.1", "-o", str(tmp_path / "k.spv"),
                    str(tmp_path / "k.comp")], check=True, capture_output=True)
    return (tmp_path / "k.spv").read_bytes()


def test_clamping_rewrites_only_what_reaches_shared_or_private_arrays(tmp_path):
    module = compile_glsl(tmp_path, OUT_OF_BOUNDS)
    out = clamped(module)
    assert out != module and reflect(out) == reflect(module)
    subprocess.run(["spirv-val", "--target-env", "vulkan1.1", "-"], input=out, check=True)
    dis = subprocess.run(["spirv-dis", "-"], input=out, capture_output=True, check=True).stdout.decode()
    assert dis.count("UMin") >= 2  # the two hostile indices, at least
    saxpy = libshare.shaders.path("saxpy").read_bytes()
    assert clamped(saxpy) == saxpy  # buffers are left to robustBufferAccess


def test_a_kernel_writing_past_its_shared_and_private_arrays_harms_nothing(tmp_path, daemon):
    process, pipe_dir = daemon
    module = compile_glsl(tmp_path, OUT_OF_BOUNDS)
    with libshare.connect(name="hostile", mode="daemon", pipe_directory=pipe_dir) as hostile, \
            libshare.connect(name="honest", mode="daemon", pipe_directory=pipe_dir) as honest:
        program = hostile.load_program(module)
        out = hostile.array(64 * 16, np.uint32)
        saxpy = honest.load_program(libshare.shaders.path("saxpy"))
        x, y = honest.array(4096, np.float32), honest.array(4096, np.float32)
        for i, j in ((1 << 20, 1 << 20), (0xFFFFFFFF, 0x80000000), (40, 6)):
            hostile.dispatch(program, 16, [out], struct.pack("II", i, j)).wait(60)
            lanes = np.arange(64 * 16) % 64
            shared = np.where(lanes % 32 == 31, 7, 1)  # s[p.i] clamped to s[31]
            private = np.where(lanes % 4 == 3, 9, 5)  # priv[p.j] clamped to priv[3]
            assert np.array_equal(out, shared * 100 + private)
            x[:], y[:] = 1.0, 2.0
            honest.dispatch(saxpy, 64, [x, y], struct.pack("If", 4096, 3.0)).wait(60)
            assert np.all(y == 5.0)
        assert process.poll() is None  # the arbiter lives on


GRAMMAR = Path("/usr/include/spirv/unified1/spirv.core.grammar.json")  # Debian's spirv-headers


@pytest.mark.skipif(not GRAMMAR.exists(), reason="spirv-headers is not installed")
def test_the_result_typed_opcodes_are_the_grammars():
    grammar = json.loads(GRAMMAR.read_text())
    typed = {i["opcode"] for i in grammar["instructions"] if i.get("operands") and
             i["operands"][0]["kind"] == "IdResultType"}
    assert _clamp._RESULT_TYPED <= typed  # none taken for typed that is not
    # A newer grammar may add opcodes: an index such an instruction makes is refused, not unclamped.
    assert _clamp._RESULT_TYPED == typed or (grammar["major_version"], grammar["minor_version"]) > (1, 6)


ARRAY_OF_BUFFERS = """#version 450
layout(local_size_x = 64) in;
layout(push_constant) uniform P { uint k; uint i; } p;
layout(set = 0, binding = 0) buffer In { float x[]; } ins[4];
layout(set = 0, binding = 1) buffer Out { float y[]; } o;
void main() { o.y[p.i] = ins[p.k].x[p.i]; }
"""


def test_the_choice_of_a_buffer_in_an_array_of_them_is_clamped_not_the_index_inside_it(tmp_path):
    """robustBufferAccess bounds ins[k].x[i] and o.y[i]; nothing bounds k but the clamp."""
    module = compile_glsl(tmp_path, ARRAY_OF_BUFFERS)
    out = clamped(module)
    assert reflect(out) == reflect(module) and reflect(out).arrays == (4, 1)
    subprocess.run(["spirv-val", "--target-env", "vulkan1.1", "-"], input=out, check=True)
    dis = subprocess.run(["spirv-dis", "-"], input=out, capture_output=True, check=True).stdout.decode()
    umin = [line for line in dis.splitlines() if "UMin" in line]
    assert len(umin) == 1 and umin[0].endswith("%uint_3")  # k alone, to the array's last element: i indexes
    # inside a buffer, left to robustBufferAccess
