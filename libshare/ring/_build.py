"""cffi build script for the ring's C core (hooked in through setup.py's cffi_modules).

The cdef is the block of ring.h between the cdef-begin and cdef-end markers, so
the C header, the cffi module and bindings/c/libshare.h share one source.
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "ring.h"

CORE = [HERE / name for name in ("ring.c", "lanes.c", "completions.c", "wake.c")]
"""The ring's C core (region.h lists what each file holds): compiled into this module, the
arbiter's engine (which drains rings in C) and bindings/c's libshare.so."""
SOURCES = CORE + [HERE / "tickets.c"]
"""Everything a client's module compiles: the core and the ticket book."""


def cdef_source(header: Path = HEADER) -> str:
    """Return the declarations of ``header`` between its cdef markers."""
    text = header.read_text()
    start = text.index("/* cdef-begin */") + len("/* cdef-begin */")
    end = text.index("/* cdef-end */")
    return text[start:end]


def relative(path: Path) -> str:
    """``path`` relative to the working directory (cffi wants relative source paths)."""
    return os.path.relpath(path, Path.cwd())


ffibuilder = FFI()
ffibuilder.cdef(cdef_source())
ffibuilder.set_source(
    "libshare.ring._ring_cffi",
    '#include "ring.h"',
    sources=[relative(path) for path in SOURCES],
    include_dirs=[relative(HERE)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(HERE.parent.parent), verbose=True)
