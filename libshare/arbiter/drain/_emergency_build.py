"""cffi build script for the arbiter's crash-time cleanup (hooked in through setup.py's cffi_modules).

The cdef is the block of emergency.h between its cdef markers, read by the ring's build script's
``cdef_source`` (loaded by path: the package itself is not built yet).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
RING = HERE.parents[1] / "ring"

_spec = importlib.util.spec_from_file_location("_ring_build", RING / "_build.py")
_ring_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ring_build)

ffibuilder = FFI()
ffibuilder.cdef(_ring_build.cdef_source(HERE / "emergency.h"))
ffibuilder.set_source(
    "libshare.arbiter.drain._emergency_cffi",
    '#include "emergency.h"',
    sources=[_ring_build.relative(HERE / "emergency.c")],
    include_dirs=[_ring_build.relative(HERE), _ring_build.relative(RING)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(HERE.parents[2]), verbose=True)
