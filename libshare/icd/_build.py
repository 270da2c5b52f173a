"""Build hook: compile the Vulkan driver ``libshare_icd.so`` and write its manifest.

setup.py loads this file by its path (as cffi's build scripts are), before libshare is installed and
in pip's isolated build environment, so it imports nothing of libshare: the manifest's format lives
here, and libshare/icd/__init__.py imports it. The driver is a plain shared library, not a Python
module: the Vulkan loader dlopens it inside any application, so it links only the C library, libm
and cJSON (``libcjson-dev``), with the ring's C compiled in (the data path), and exports the loader interface's three functions alone
(``-fvisibility=hidden``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

__all__ = ["LIBRARY", "MANIFEST", "API_VERSION", "RING", "SOURCES", "FLAGS", "manifest_text", "write_manifest", "build"]

HERE = Path(__file__).resolve().parent
LIBRARY = "libshare_icd.so"
"""The driver's file name."""
MANIFEST = "libshare_icd.json"
"""The manifest's file name, beside the driver."""
API_VERSION = "{}.{}.0".format(*re.search(r"#define LS_ICD_API_VERSION VK_API_VERSION_(\d+)_(\d+)",
                                            (HERE / "icd.h").read_text()).groups())
"""The Vulkan version the driver reports, for its manifest: read from icd.h's LS_ICD_API_VERSION, its one
definition."""
RING = HERE.parent / "ring"
SOURCES = sorted(HERE.glob("*.c")) + [RING / name for name in ("ring.c", "lanes.c", "completions.c", "wake.c",
                                                                "tickets.c")]
"""The driver's C files (icd.h maps them), and the ring's a client compiles: its core and the ticket book
(libshare/ring/_build.py's SOURCES), for the data path (queue.c) and ls_encode_op (the command lists)."""
FLAGS = ["-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-fPIC", "-shared", "-fvisibility=hidden",
         f"-I{RING}", "-pthread", "-Wl,-z,defs", "-Wl,-z,now"]
"""The compiler's flags (tests/icd/test_c_program.py adds the sanitizers to them)."""


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


def build(output_dir: Path) -> Path:
    """Compile the driver into ``output_dir`` and write its manifest beside it; the library's path."""
    output_dir.mkdir(parents=True, exist_ok=True)
    library = output_dir / LIBRARY
    compiler = os.environ.get("CC", "cc")
    subprocess.run([compiler, *FLAGS, "-o", str(library), *map(str, SOURCES), "-lcjson", "-lm"], check=True)
    write_manifest(library)
    return library
