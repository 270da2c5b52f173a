"""Texel buffers: a kernel reads uniform texel buffers and writes a storage texel buffer through views
(Session.texel_view), its bytes checked against numpy; and every hostile view, beside an honest client.

A view is part of the client's own buffer seen as texels of a format (serve/views.py): the arbiter
checks its buffer (the client's own, live), format (one the device supports), offset (aligned) and
size (whole texels within the buffer) before any VkBufferView exists, and the engine checks each
dispatch's views against the program's texel bindings (engine/validate.c). Each hostile case below
is refused (or, for a read past a view's end, bounded: zeros) for that client only, while an honest
session beside it computes and is checked.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare
from tests.arbiter.test_resources import compile_glsl

N = 256

# y[i] = uint(a[i] * 1000) + uint(c[i].x * 255) * 1000000 + uint(c[i].w * 255): a[] is r32f, c[] rgba8 (unorm),
# both uniform texel buffers; y[] an r32ui storage texel buffer. push: how many texels to write.
TEXEL = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) uniform samplerBuffer a;
layout(set = 0, binding = 1) uniform samplerBuffer c;
layout(set = 0, binding = 2, r32ui) uniform writeonly uimageBuffer y;
layout(push_constant) uniform Push { uint n; uint shift; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.n) return;
    int j = int(i + p.shift);
    vec4 colour = texelFetch(c, j);
    uint value = uint(round(texelFetch(a, j).x * 1000.0)) + uint(round(colour.x * 255.0)) * 1000000u
               + uint(round(colour.w * 255.0));
    imageStore(y, int(i), uvec4(value));
}
"""


@pytest.fixture
def texel_module(tmp_path) -> bytes:
    return compile_glsl(tmp_path, "texel", TEXEL)


def _inputs(session, rng):
    """a (r32f), c (rgba8) and y (r32ui) arrays of N texels each, on buffers of their own."""
    a, c, y = session.array(N, np.float32), session.array((N, 4), np.uint8), session.array(N, np.uint32)
    a[:] = rng.integers(0, 1000, N) / 1000.0
    c[:] = rng.integers(0, 256, (N, 4))
    return a, c, y


def _expected(a, c, shift=0, n=N) -> np.ndarray:
    """What the kernel writes for texels shift.. of a and c (zeros past their ends: robust reads)."""
    count = len(a)
    index = np.arange(n) + shift
    inside = index < count
    a_read = np.where(inside, a[np.minimum(index, count - 1)], 0.0)
    c_read = np.where(inside[:, None], c[np.minimum(index, count - 1)].astype(np.uint32), 0)
    return (np.round(a_read * 1000.0).astype(np.uint32) + c_read[:, 0] * 1000000
            + np.where(inside, c_read[:, 3], 0).astype(np.uint32))


def _run(session, program, a, c, y, shift=0, n=N, views=None):
    """Dispatch the texel kernel over whole-array views (or ``views``); the ticket waited."""
    views = views or (session.texel_view(a, "r32f"), session.texel_view(c, "rgba8"), session.texel_view(y, "r32ui"))
    session.dispatch(program, -(-n // 64), views, struct.pack("II", n, shift)).wait(60)


def _honest(session, program, rng) -> None:
    a, c, y = _inputs(session, rng)
    _run(session, program, a, c, y)
    np.testing.assert_array_equal(y, _expected(a, c))


def test_a_kernel_reads_uniform_texel_buffers_and_writes_a_storage_one(texel_module):
    rng = np.random.default_rng(1)
    with libshare.connect(mode="embedded") as session:
        program = session.load_program(texel_module)
        a, c, y = _inputs(session, rng)
        _run(session, program, a, c, y)
        np.testing.assert_array_equal(y, _expected(a, c))
        y[:] = 7
        view = session.texel_view(y.view(np.uint8)[64 * 4:], "r32ui")  # a view from byte 256: texels 64..
        assert (view.offset, view.nbytes) == (256, (N - 64) * 4)
        _run(session, program, a, c, y, n=N - 64, views=(session.texel_view(a, "r32f"),
                                                          session.texel_view(c, "rgba8"), view))
        np.testing.assert_array_equal(y[64:], _expected(a, c, n=N - 64))
        np.testing.assert_array_equal(y[:64], 7)  # nothing before the view's offset is written


def test_reads_past_a_views_end_are_zeros_and_writes_past_it_are_dropped(texel_module):
    rng = np.random.default_rng(2)
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        program, honest_program = session.load_program(texel_module), honest.load_program(texel_module)
        a, c, y = _inputs(session, rng)
        a_view, c_view = session.texel_view(a[:64], "r32f"), session.texel_view(c[:64], "rgba8")
        y_view = session.texel_view(y[:128], "r32ui")
        y[:] = 5
        _run(session, program, a, c, y, shift=32, n=N, views=(a_view, c_view, y_view))
        np.testing.assert_array_equal(y[:128], _expected(a[:64], c[:64], shift=32, n=128))  # zeros past 64
        np.testing.assert_array_equal(y[128:], 5)  # the writes past the y view's end went nowhere
        _honest(honest, honest_program, rng)
