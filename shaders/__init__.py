"""Compute shaders shipped with libshare, as GLSL sources and precompiled SPIR-V.

Each shader ``NAME`` has its source ``NAME.comp`` and its SPIR-V ``NAME.spv``
side by side in this package, so users need no shader compiler. After editing a
source, run ``python -m libshare.shaders.build`` (or ``python shaders/build.py``
from a checkout) to recompile; a test fails while any ``.spv`` is stale.

Every shader keeps its storage buffers in descriptor set 0 at bindings 0..N-1
and its parameters in one push-constant block; the comment at the top of each
source gives the buffers, the push constants and the dispatch size.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["names", "path", "source_path"]

_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """Sorted names of the shaders that have precompiled SPIR-V."""
    return sorted(spv.stem for spv in _DIR.glob("*.spv"))


def path(name: str) -> Path:
    """Path of the precompiled SPIR-V for shader ``name``.

    Raises ``ValueError`` naming the available shaders when ``name`` is unknown.
    """
    return _DIR / f"{_known(name)}.spv"


def source_path(name: str) -> Path:
    """Path of the GLSL source for shader ``name`` (``ValueError`` when unknown)."""
    return _DIR / f"{_known(name)}.comp"


def _known(name: str) -> str:
    available = names()
    if name not in available:
        raise ValueError(f"unknown shader {name!r}; available: {', '.join(available)}")
    return name
