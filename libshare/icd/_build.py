"""Build hook: compile the Vulkan driver ``libshare_icd.so`` and write its manifest (setup.py calls it).

The driver is a plain shared library, not a Python module: the Vulkan loader dlopens it inside
any application, so it links only the C library, libm and cJSON (``libcjson-dev``), and exports
the loader interface's three functions alone (``-fvisibility=hidden``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = sorted(HERE.glob("*.c"))
"""The driver's C files (icd.h maps them)."""
FLAGS = ["-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-fPIC", "-shared", "-fvisibility=hidden",
         "-Wl,-z,defs", "-Wl,-z,now"]


def build(output_dir: Path) -> Path:
    """Compile the driver into ``output_dir`` and write its manifest beside it; the library's path."""
    from libshare.icd import LIBRARY, write_manifest  # (this module runs from setup.py, before install)
    output_dir.mkdir(parents=True, exist_ok=True)
    library = output_dir / LIBRARY
    compiler = os.environ.get("CC", "cc")
    subprocess.run([compiler, *FLAGS, "-o", str(library), *map(str, SOURCES), "-lcjson", "-lm"], check=True)
    write_manifest(library)
    return library
