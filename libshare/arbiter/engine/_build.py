"""cffi build script for the arbiter's native engine (hooked in through setup.py's cffi_modules).

The cdef is the block of engine.h between its cdef markers, plus the planning callback,
which cffi implements in Python (``extern "Python+C"``). The engine is the C files of this
folder (internal.h lists them) and the scheduling policy's C part, ``policy/engine_policy.c``.
It calls the ring's C core directly, so ring.c is compiled in as well; it needs the Vulkan
headers (Debian's ``libvulkan-dev``) and loads the Vulkan loader at run time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
POLICY = HERE.parent / "policy"
RING = HERE.parents[1] / "ring"
HEADER = HERE / "engine.h"

# The ring's build script holds the cdef extraction; loaded by path, for the package itself is not built yet.
_spec = importlib.util.spec_from_file_location("_ring_build", RING / "_build.py")
_ring_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ring_build)
_cdef, _relative = _ring_build.cdef_source, _ring_build.relative

SOURCES = [HERE / name for name in ("api.c", "loop.c", "wait.c", "validate.c", "recordings.c", "flights.c",
                                    "answers.c", "objects.c", "lists.c")] + [POLICY / "engine_policy.c", *_ring_build.CORE]

ffibuilder = FFI()
ffibuilder.cdef(_cdef(HEADER) + '\nextern "Python+C" void ls_engine_plan_cb(void *engine);\n')
ffibuilder.set_source(
    "libshare.arbiter.engine._engine_cffi",
    '#include "engine.h"',
    sources=[_relative(path) for path in SOURCES],
    include_dirs=[_relative(HERE), _relative(POLICY), _relative(RING)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
    libraries=["dl", "pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(HERE.parents[2]), verbose=True)
