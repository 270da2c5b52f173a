"""libshare.arbiter: the process that owns the Vulkan device and serves clients.

Run it with ``python -m libshare.arbiter``; embedded sessions run the same
:class:`Arbiter` inside the client process.
"""

from ._server import Arbiter as Arbiter

__all__ = ["Arbiter"]
