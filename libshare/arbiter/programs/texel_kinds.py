"""A texel buffer binding's kind, read from its SPIR-V type (``spirv.py``'s resources).

A texel buffer is a ``UniformConstant`` variable of an ``OpTypeImage`` of ``Dim Buffer``: ``Sampled 1``,
alone or in an ``OpTypeSampledImage`` (``samplerBuffer``), is a uniform texel buffer that takes a view of
any format of its sampled type's numeric class (``texelFetch`` converts); ``Sampled 2`` (``imageBuffer``)
is a storage texel buffer that takes views of the ``ImageFormat`` it declares only (``Unknown`` is
refused). Any other image, a sampler, and an array of texel buffers are refused, naming what was found:
the arbiter binds views of buffers one per binding (an index into an array of them would need the
clamp ``clamp.py`` gives arrays of buffers).
"""

from __future__ import annotations

from typing import Callable

from libshare.errors import InvalidSubmission
from libshare.protocol.texels import TEXEL_FORMATS

__all__ = ["texel_kind"]

_OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_IMAGE, _OP_TYPE_SAMPLED_IMAGE = 21, 22, 25, 27
_OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY = 28, 29
_DIM_BUFFER = 5
IMAGE_FORMAT_NAMES = {0: "Unknown", 1: "Rgba32f", 2: "Rgba16f", 3: "R32f", 4: "Rgba8", 5: "Rgba8Snorm", 6: "Rg32f",
                      9: "R16f", 21: "Rgba32i", 23: "Rgba8i", 24: "R32i", 30: "Rgba32ui", 32: "Rgba8ui", 33: "R32ui"}
"""SPIR-V ImageFormat numbers, named in refusals."""


def texel_kind(type_of: Callable[[int], tuple[int, tuple[int, ...]]], type_id: int) -> tuple[bool, int, tuple[str, ...]]:
    """(uniform, 1, the view formats it takes) of the texel buffer type ``type_id``, ``type_of`` giving a
    declared type's (opcode, operands); raises, naming it, on any other image, a sampler or an array of them."""
    kind, ops = type_of(type_id)
    if kind == _OP_TYPE_SAMPLED_IMAGE:
        kind, ops = type_of(ops[1])
    if kind in (_OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY):
        raise InvalidSubmission("arrays of texel buffers are not supported: declare one per binding")
    if kind != _OP_TYPE_IMAGE or ops[2] != _DIM_BUFFER:
        raise InvalidSubmission("storage images, sampled images and samplers are not supported: libshare binds "
                                "buffers only, and images only over buffers (imageBuffer, samplerBuffer)")
    sampled, image_format = ops[6], ops[7]
    scalar, texel = type_of(ops[1])
    if scalar not in (_OP_TYPE_FLOAT, _OP_TYPE_INT) or texel[1] != 32:
        raise InvalidSubmission(f"a texel buffer's sampled type %{ops[1]} is not a 32-bit float or integer")
    numeric = "float" if scalar == _OP_TYPE_FLOAT else "sint" if texel[2] else "uint"
    if sampled == 1:  # a uniform texel buffer: any format of its numeric class (texelFetch converts)
        return True, 1, tuple(name for name, f in TEXEL_FORMATS.items() if f.numeric == numeric)
    if sampled != 2:
        raise InvalidSubmission(f"invalid SPIR-V: texel buffer type %{type_id} has Sampled {sampled} (1 or 2 for "
                                "a Vulkan texel buffer)")
    named = IMAGE_FORMAT_NAMES.get(image_format, f"number {image_format}")
    if image_format == 0:
        raise InvalidSubmission("a storage texel buffer of format Unknown is not supported: declare its format "
                                "(layout(r32f) uniform imageBuffer)")
    formats = tuple(name for name, f in TEXEL_FORMATS.items()
                    if f.spirv_format == image_format and f.numeric == numeric)
    if not formats:
        raise InvalidSubmission(f"a storage texel buffer of format {named} is not supported: libshare views "
                                f"{', '.join(TEXEL_FORMATS)}")
    return False, 1, formats
