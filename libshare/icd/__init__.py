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

import json
import os
import tempfile
from pathlib import Path

from libshare.errors import VulkanUnavailable

__all__ = ["LIBRARY", "API_VERSION", "library_path", "manifest_path", "manifest_text", "write_manifest"]

HERE = Path(__file__).resolve().parent
LIBRARY = "libshare_icd.so"
"""The driver's file name, in this folder."""
MANIFEST = "libshare_icd.json"
API_VERSION = "1.1.0"
"""The Vulkan version the driver reports (LS_ICD_API_VERSION in icd.h)."""


def library_path() -> Path:
    """The built driver; VulkanUnavailable when it was not built."""
    library = HERE / LIBRARY
    if not library.is_file():
        raise VulkanUnavailable(f"libshare's Vulkan driver was not built ({library} is missing): install "
                                "libcjson-dev and run `pip install -e .` again (sh tools/setup.sh does both)")
    return library


def manifest_text(library: Path) -> str:
    """The manifest of the driver at ``library`` (the loader's file_format_version 1.0.0)."""
    return json.dumps({"file_format_version": "1.0.0",
                       "ICD": {"library_path": str(library), "api_version": API_VERSION}}, indent=4) + "\n"


def write_manifest(library: Path, path: Path | None = None) -> Path:
    """Write the manifest of ``library`` to ``path`` (beside the library by default), whole or not at
    all (a loader reading it meanwhile sees the old one or the new one); its path."""
    path = path or library.parent / MANIFEST
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(manifest_text(library))
    os.replace(partial, path)
    return path


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
