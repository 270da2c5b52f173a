"""Hostile uses of the program model beside an honest client: a descriptor set a dispatch never
binds, and images and samplers (which libshare does not bind) naming memory.

A program's buffers are its distinct (set, binding) pairs in order (programs/spirv.py); a dispatch
that leaves one out (a whole set, or the last binding) is refused with LS_EBINDINGS before a
recording is made, so no kernel ever reads a descriptor nobody wrote. A module that declares an
image or a sampler is refused at load, naming what it declares: with nothing to bind, an image
view of another client's memory cannot be made. Texel buffers are accepted (a view is made of the
client's own buffer only: tests/arbiter/test_texel_buffers.py), but not what reaches past them:
a size query (capability ImageQuery), an atomic on a texel, a storage texel buffer of no declared
format (capability StorageImageWriteWithoutFormat; reflection refuses one that declares it anyway). An honest session beside each computes and is checked.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare
from tests.arbiter.test_resources import SETS_AND_GAPS, compile_glsl

N = 256

IMAGES = {
    "storage image": ("layout(set = 0, binding = 0, r32f) uniform image2D img;",
                      "imageLoad(img, ivec2(i, 0)).x", "storage images, sampled images and samplers"),
    "sampled image": ("layout(set = 0, binding = 0) uniform sampler2D img;",
                      "textureLod(img, vec2(0.5), 0.0).x", "storage images, sampled images and samplers"),
    "1D storage image": ("layout(set = 0, binding = 0, r32f) uniform image1D img;",
                         "imageLoad(img, int(i)).x", "capability Image1D"),
    "texel buffer size query": ("layout(set = 0, binding = 0) uniform samplerBuffer img;",
                                "float(textureSize(img))", "capability ImageQuery"),
    "texel atomic": ("layout(set = 0, binding = 0, r32ui) uniform uimageBuffer img;",
                     "float(imageAtomicAdd(img, int(i), 1u))", "an atomic on a texel buffer"),
    "storage texel buffer of no format": ("layout(set = 0, binding = 0) uniform writeonly imageBuffer img;",
                                          "0.0; imageStore(img, int(i), vec4(1.0))",
                                          "capability StorageImageWriteWithoutFormat"),
}
TEXEL_BUFFERS = {
    "storage texel buffer": ("layout(set = 0, binding = 0, r32f) uniform imageBuffer img;",
                             "imageLoad(img, int(i)).x"),
    "uniform texel buffer": ("layout(set = 0, binding = 0) uniform samplerBuffer img;",
                             "texelFetch(img, int(i)).x"),
}


def _honest_saxpy(honest) -> None:
    saxpy = honest.load_program(libshare.shaders.path("saxpy"))
    x, y = honest.array(N, np.float32), honest.array(N, np.float32)
    x[:], y[:] = 1.0, 2.0
    honest.dispatch(saxpy, N // 64, [x, y], struct.pack("If", N, 3.0)).wait(60)
    np.testing.assert_array_equal(y, np.full(N, 5.0, np.float32))


def test_a_descriptor_set_never_bound_is_refused_before_any_recording(tmp_path):
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        program = session.load_program(compile_glsl(tmp_path, "sets", SETS_AND_GAPS))
        a, b, c = (session.array(N, np.float32) for _ in range(3))
        for buffers in ([b, a], [b], []):  # set 2 (or sets 1 and 2, or all three) left unbound
            with pytest.raises(libshare.InvalidSubmission, match="buffer"):
                session.dispatch(program, N // 64, buffers).wait(60)
            _honest_saxpy(honest)
        a[:], c[:] = 1.0, 3.0
        session.dispatch(program, N // 64, [b, a, c]).wait(60)  # (0, 5), (1, 3), (2, 0): still good
        np.testing.assert_array_equal(b, np.full(N, 7.0, np.float32))


def _module(tmp_path, kind: str, declaration: str, read: str) -> bytes:
    source = f"""#version 450
layout(local_size_x = 64) in;
{declaration}
layout(set = 0, binding = 1) buffer Out {{ float y[]; }};
void main() {{ uint i = gl_GlobalInvocationID.x; y[i] = {read}; }}
"""
    return compile_glsl(tmp_path, kind.replace(" ", "_"), source)


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_images_samplers_and_what_reaches_past_a_texel_buffer_are_refused_by_name(tmp_path, kind):
    declaration, read, named = IMAGES[kind]
    module = _module(tmp_path, kind, declaration, read)
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        with pytest.raises(libshare.InvalidSubmission, match=named):
            session.load_program(module)
        _honest_saxpy(honest)


@pytest.mark.parametrize("kind", sorted(TEXEL_BUFFERS))
def test_texel_buffers_are_accepted_and_bind_only_views(tmp_path, kind):
    module = _module(tmp_path, kind, *TEXEL_BUFFERS[kind])
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        program = session.load_program(module)
        x, y = session.array(N, np.float32), session.array(N, np.float32)
        x[:] = np.arange(N)
        with pytest.raises(libshare.InvalidSubmission, match="unknown or freed buffer"):
            session.dispatch(program, N // 64, [x, y]).wait(60)  # a buffer at the texel binding
        _honest_saxpy(honest)
        session.dispatch(program, N // 64, [session.texel_view(x, "r32f"), y]).wait(60)
        np.testing.assert_array_equal(y, x)
