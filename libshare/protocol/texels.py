"""The texel formats a texel view may have: one table, read by the client, the arbiter and the engine.

A texel buffer (GLSL ``uniform samplerBuffer`` / ``textureBuffer``: a uniform texel buffer;
``layout(r32f) uniform imageBuffer``: a storage texel buffer) reads and writes a buffer through
a view with a format (``Session.texel_view``). A format is named as in GLSL's layout qualifiers
(``"r32f"``, ``"rgba8"``: unsigned normalized bytes, read as floats in 0..1). Each entry gives
the Vulkan format of the view, the bytes of one texel, the numeric class a kernel reads it as
(``float``, ``uint``, ``sint``: a ``samplerBuffer``, ``usamplerBuffer`` or ``isamplerBuffer``) and
the SPIR-V ``ImageFormat`` a storage texel buffer of that format declares. Its position in
:data:`TEXEL_FORMATS` is the format's code in the engine (a program's binding accepts a mask of
codes: engine/validate.c).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TEXEL_FORMATS", "TEXEL_STORAGE", "TEXEL_UNIFORM", "TexelFormat", "format_code"]

TEXEL_STORAGE, TEXEL_UNIFORM = 1, 2
"""A view format's uses on a device (bits): in a storage texel buffer, in a uniform texel buffer (the engine's
view uses too: engine/validate.c)."""


class TexelFormat(NamedTuple):
    """One texel format: its Vulkan format, bytes per texel, numeric class and SPIR-V ImageFormat."""

    vk_format: int
    texel_bytes: int
    numeric: str  # "float", "uint" or "sint"
    spirv_format: int


TEXEL_FORMATS: dict[str, TexelFormat] = {
    "r32f": TexelFormat(100, 4, "float", 3),  # VK_FORMAT_R32_SFLOAT, R32f
    "r32ui": TexelFormat(98, 4, "uint", 33),  # VK_FORMAT_R32_UINT, R32ui
    "r32i": TexelFormat(99, 4, "sint", 24),  # VK_FORMAT_R32_SINT, R32i
    "rg32f": TexelFormat(103, 8, "float", 6),  # VK_FORMAT_R32G32_SFLOAT, Rg32f
    "rgba32f": TexelFormat(109, 16, "float", 1),  # VK_FORMAT_R32G32B32A32_SFLOAT, Rgba32f
    "rgba32ui": TexelFormat(107, 16, "uint", 30),  # VK_FORMAT_R32G32B32A32_UINT, Rgba32ui
    "rgba32i": TexelFormat(108, 16, "sint", 21),  # VK_FORMAT_R32G32B32A32_SINT, Rgba32i
    "r16f": TexelFormat(76, 2, "float", 9),  # VK_FORMAT_R16_SFLOAT, R16f
    "rgba16f": TexelFormat(97, 8, "float", 2),  # VK_FORMAT_R16G16B16A16_SFLOAT, Rgba16f
    "rgba8": TexelFormat(37, 4, "float", 4),  # VK_FORMAT_R8G8B8A8_UNORM, Rgba8
    "rgba8_snorm": TexelFormat(38, 4, "float", 5),  # VK_FORMAT_R8G8B8A8_SNORM, Rgba8Snorm
    "rgba8ui": TexelFormat(41, 4, "uint", 32),  # VK_FORMAT_R8G8B8A8_UINT, Rgba8ui
    "rgba8i": TexelFormat(42, 4, "sint", 23),  # VK_FORMAT_R8G8B8A8_SINT, Rgba8i
}
"""Every texel format a view may have, by name; at most 16 (the engine keeps a 16-bit mask per binding)."""

assert len(TEXEL_FORMATS) <= 16


def format_code(name: str) -> int:
    """The engine's code of format ``name`` (its position in :data:`TEXEL_FORMATS`)."""
    return list(TEXEL_FORMATS).index(name)
