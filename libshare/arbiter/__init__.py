"""libshare.arbiter: the process that owns the Vulkan device and serves clients.

Run it with ``python -m libshare.arbiter``; embedded sessions run the same
:class:`Arbiter` inside the client process. Importing this package loads nothing of the
engine or the device layer: :class:`Arbiter` is imported on first use, so the CLI and the
control daemon can use :mod:`libshare.arbiter.service`'s neighbours without them.
"""

from __future__ import annotations

__all__ = ["Arbiter"]


def __getattr__(name: str):
    """Load :class:`Arbiter` (and with it the engine and the device layer) when first asked for."""
    if name == "Arbiter":
        from libshare.arbiter.serve.server import Arbiter

        return Arbiter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
