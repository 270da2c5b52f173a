"""cffi build script for the arbiter's crash-time cleanup (hooked in through setup.py's cffi_modules)."""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "emergency.h"


def _cdef() -> str:
    text = HEADER.read_text()
    return text[text.index("/* cdef-begin */") + len("/* cdef-begin */"):text.index("/* cdef-end */")]


def _relative(path: Path) -> str:
    return os.path.relpath(path, Path.cwd())


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "libshare.arbiter.drain._emergency_cffi",
    '#include "emergency.h"',
    sources=[_relative(HERE / "emergency.c")],
    include_dirs=[_relative(HERE), _relative(HERE.parents[1] / "ring")],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(HERE.parents[2]), verbose=True)
