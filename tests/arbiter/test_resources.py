"""The buffers real kernels declare: uniform buffers, several sets, gaps, several views of one binding.

Each kernel is GLSL compiled here with glslangValidator and run on lavapipe through an embedded
session; its output is checked against numpy. A program's buffers are its distinct (set,
binding) pairs in that order (libshare/arbiter/programs/spirv.py): the client passes one buffer
for each. Hostile uses (an unaligned uniform offset, more buffers than a dispatch binds) are
refused to that client while an honest one beside it computes.
"""

from __future__ import annotations

import struct
import subprocess

import numpy as np
import pytest

import libshare

N = 256


def compile_glsl(tmp_path, name: str, source: str) -> bytes:
    """SPIR-V of a compute shader, compiled for Vulkan 1.1."""
    path = tmp_path / f"{name}.comp"
    path.write_text(source)
    out = tmp_path / f"{name}.spv"
    subprocess.run(["glslangValidator", "--target-env", "vulkan1.1", "-o", str(out), str(path)], check=True,
                   capture_output=True)
    return out.read_bytes()


UNIFORM = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) uniform Params { float scale; uint n; } params;
layout(set = 0, binding = 1) buffer Out { float y[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < params.n) y[i] = params.scale * float(i);
}
"""

SETS_AND_GAPS = """#version 450
layout(local_size_x = 64) in;
layout(set = 1, binding = 3) readonly buffer A { float a[]; };
layout(set = 0, binding = 5) buffer B { float b[]; };
layout(set = 2, binding = 0) readonly buffer C { float c[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    b[i] = a[i] + 2.0 * c[i];
}
"""

VIEWS = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer AsFloat { float f[]; };
layout(set = 0, binding = 0) buffer AsUint { uint u[]; };
layout(set = 0, binding = 1) buffer Out { uint bits[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    bits[i] = u[i] ^ floatBitsToUint(f[i] * 2.0);
}
"""

MANY = """#version 450
layout(local_size_x = 1) in;
""" + "\n".join(f"layout(binding = {k}) buffer B{k} {{ uint v{k}[]; }};" for k in range(33)) + """
void main() { v0[0] = """ + " + ".join(f"v{k}[0]" for k in range(1, 33)) + """; }
"""


def test_a_uniform_buffer_is_bound_as_one(tmp_path):
    with libshare.connect(mode="embedded") as session:
        program = session.load_program(compile_glsl(tmp_path, "uniform", UNIFORM))
        params, y = session.array(16, np.uint8), session.array(N, np.float32)
        params[:8] = np.frombuffer(struct.pack("fI", 0.5, N - 6), np.uint8)
        session.dispatch(program, N // 64, [params, y]).wait(60)
        expected = 0.5 * np.arange(N, dtype=np.float32)
        expected[N - 6:] = 0
        assert np.array_equal(y, expected)


def test_buffers_in_several_sets_with_gaps_go_in_set_binding_order(tmp_path):
    with libshare.connect(mode="embedded") as session:
        program = session.load_program(compile_glsl(tmp_path, "sets", SETS_AND_GAPS))
        assert program.bindings == 3
        a, b, c = (session.array(N, np.float32) for _ in range(3))
        a[:] = np.arange(N)
        c[:] = 100.0
        session.dispatch(program, N // 64, [b, a, c]).wait(60)  # (0, 5), (1, 3), (2, 0)
        assert np.array_equal(b, np.arange(N, dtype=np.float32) + 200.0)


def test_two_typed_views_of_one_binding_are_one_buffer(tmp_path):
    with libshare.connect(mode="embedded") as session:
        program = session.load_program(compile_glsl(tmp_path, "views", VIEWS))
        assert program.bindings == 2
        values, bits = session.array(N, np.float32), session.array(N, np.uint32)
        values[:] = np.linspace(-3, 3, N, dtype=np.float32)
        session.dispatch(program, N // 64, [values, bits]).wait(60)
        assert np.array_equal(bits, values.view(np.uint32) ^ (values * 2).view(np.uint32))


def test_hostile_uses_are_refused_to_their_client_alone(tmp_path):
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        with pytest.raises(libshare.InvalidSubmission, match=r"declares 33 buffers .* at most \d+ here .*libshare's 32"):
            session.load_program(compile_glsl(tmp_path, "many", MANY))
        program = session.load_program(compile_glsl(tmp_path, "uniform", UNIFORM))
        params, y = session.array(1024, np.uint8), session.array(N, np.float32)
        with pytest.raises(libshare.LibshareError):  # a uniform offset off the device's alignment
            session.dispatch(program, 1, [params[4:], y]).wait(60)
        saxpy = honest.load_program(libshare.shaders.path("saxpy"))
        x, z = honest.array(N, np.float32), honest.array(N, np.float32)
        x[:], z[:] = 1.0, 2.0
        honest.dispatch(saxpy, N // 64, [x, z], struct.pack("If", N, 3.0)).wait(60)
        assert np.all(z == 5.0)


PAST_ITS_BUFFER = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) uniform Params { uint n; vec4 pad[255]; float far; } params;
layout(set = 0, binding = 1) buffer Out { float y[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    y[i] = params.far + float(params.n);
}
"""


def test_a_uniform_block_larger_than_its_buffer_reads_zeros_past_the_end(tmp_path):
    """The binding's range ends at the buffer's end: what the block declares past it reads as zeros,
    never as the memory after the client's buffer."""
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as neighbour:
        secret = neighbour.array(4096, np.float32)
        secret[:] = 123.0  # another client's memory, allocated before
        program = session.load_program(compile_glsl(tmp_path, "past", PAST_ITS_BUFFER))
        params, y = session.array(16, np.uint8), session.array(N, np.float32)
        params[:4] = np.frombuffer(struct.pack("I", 5), np.uint8)
        session.dispatch(program, N // 64, [params, y]).wait(60)
        assert np.all(y == 5.0)  # params.far (at byte 4096) read as 0
        assert np.all(secret == 123.0)
