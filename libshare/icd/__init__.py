"""libshare's Vulkan driver: where the library and its manifest are, and the manifest itself.

The driver (``libshare_icd.so``, the C files of this folder, built by ``pip install -e .``
through setup.py and ``_build.py``) is an installable client driver: the Vulkan loader finds it
through a JSON manifest named by ``VK_DRIVER_FILES`` (``VK_ICD_FILENAMES`` for loaders before
1.3.207), loads it into any application, and the application sees one physical device, the
arbiter's, as a libshare session (docs/icd.md). ``libshare-run`` (libshare/run.py) sets those
variables; ``libshare-run --manifest`` prints the manifest's path for those who set them
themselves.

The manifest names the library by its absolute path, so it is written where the library is,
by the build and again by :func:`manifest_path` whenever it is missing or names another path
(the package moved, or was installed from a wheel built elsewhere); where the package's folder
is not writable, it goes to the temporary directory instead, one per user.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from libshare.errors import VulkanUnavailable
from libshare.icd._build import API_VERSION, LIBRARY, MANIFEST, manifest_text, write_manifest

__all__ = ["LIBRARY", "API_VERSION", "library_path", "manifest_path"]

HERE = Path(__file__).resolve().parent


def library_path() -> Path:
    """The built driver; VulkanUnavailable when it was not built."""
    library = HERE / LIBRARY
    if not library.is_file():
        raise VulkanUnavailable(f"libshare's Vulkan driver was not built ({library} is missing): install "
                                "libcjson-dev and run `pip install -e .` again (sh tools/setup.sh does both)")
    return library


def manifest_path() -> Path:
    """The path of a manifest that names the built driver: beside it, else in the temporary directory."""
    library = library_path()
    wanted = manifest_text(library)
    for path in (HERE / MANIFEST, Path(tempfile.gettempdir()) / f"libshare-{os.getuid()}-{MANIFEST}"):
        try:
            if path.read_text() == wanted:
                return path
        except OSError:
            pass
        try:
            return write_manifest(library, path)
        except OSError:
            continue
    raise VulkanUnavailable(f"could not write the Vulkan driver's manifest beside {library} or in "
                            f"{tempfile.gettempdir()}")
