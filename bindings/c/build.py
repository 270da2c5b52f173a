"""Build libshare.so and libshare.pc into bindings/c/build/ (``python bindings/c/build.py``).

libshare.so is a cffi embedding library: the ring's C core (libshare/ring/) and the
C API (the session and its hot path in capi.c, the control calls in capi_control.c,
reattach in capi_reattach.c) in C, and the control plane served by the Python
client (hooks.py) in an interpreter that starts inside the C process on the
first control call. The cdef is the ring.h block, the api.h block (the public
API, which C implements) and the hooks.h block (private, implemented in
Python), so the library, its cffi module and libshare.h share one source.

The embedded interpreter is the one that runs this script: its libpython is
linked (with an rpath), and its site-packages directories are added to
``sys.path`` at start-up, so a virtual environment's packages (libshare, numpy,
vulkan) are found without activating it.
"""

from __future__ import annotations

import argparse
import os
import site
import sys
import sysconfig
from pathlib import Path

from cffi import FFI

from libshare.ring._build import SOURCES as RING_SOURCES
from libshare.ring._build import cdef_source

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RING = ROOT / "libshare" / "ring"
BUILD = HERE / "build"
LIBRARY = "libshare.so"
MODULE = "_libshare_capi"
CAPI = ("capi.c", "capi_control.c", "capi_reattach.c")
"""The C API's files, in order, compiled as one unit: the one where cffi defines the hooks (hooks.h)."""


def cdef() -> str:
    """Everything cffi is told: the ring ABI, the public API, the Python hooks."""
    hooks = cdef_source(HERE / "hooks.h").replace("LSX_HOOK", 'extern "Python"')
    return cdef_source(RING / "ring.h") + cdef_source(HERE / "api.h") + hooks


def site_dirs() -> list[str]:
    """The site-packages of this interpreter (a venv's included), for the embedded one."""
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def libshare_home() -> str:
    """The folder holding the libshare package this interpreter imports (this checkout when editable)."""
    import libshare

    return str(Path(libshare.__file__).resolve().parent.parent)


def init_code() -> str:
    """hooks.py, after a preamble that puts this environment's packages on sys.path.

    The folder of this interpreter's libshare goes first, so the embedded Python
    imports the same libshare even where another one is installed system-wide.
    """
    preamble = (
        "import site as _site\n"
        f"for _d in {site_dirs()!r}:\n"
        "    _site.addsitedir(_d)\n"
        f"import sys as _sys\n_sys.path.insert(0, {libshare_home()!r})\n"
    )
    return preamble + (HERE / "hooks.py").read_text()


def ffibuilder() -> FFI:
    """The cffi builder of libshare.so."""
    ffi = FFI()
    ffi.cdef(cdef())
    ffi.embedding_init_code(init_code())
    libdir = sysconfig.get_config_var("LIBDIR")
    ffi.set_source(
        MODULE,
        "".join(f'#include "{name}"\n' for name in CAPI),
        sources=[str(path) for path in RING_SOURCES],
        include_dirs=[str(HERE), str(RING)],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        extra_link_args=[f"-Wl,-rpath,{libdir}", "-pthread"] if libdir else ["-pthread"],
    )
    return ffi


PC_TEMPLATE = """prefix={build}
libdir={build}
includedir={include}

Name: libshare
Description: libshare client: many processes sharing one Vulkan device through an arbiter
Version: {version}
Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lshare
Cflags: -I${{includedir}}
"""


def write_pc(build: Path) -> Path:
    """libshare.pc for ``pkg-config --cflags --libs bindings/c/build/libshare.pc``."""
    import libshare

    path = build / "libshare.pc"
    path.write_text(PC_TEMPLATE.format(build=build, include=HERE, version=libshare.__version__))
    return path


def build(out: Path = BUILD, verbose: bool = False) -> Path:
    """Compile libshare.so into ``out`` and write libshare.pc beside it; return the library path."""
    out.mkdir(parents=True, exist_ok=True)
    library = ffibuilder().compile(tmpdir=str(out / "tmp"), target=LIBRARY, verbose=verbose)
    final = out / LIBRARY
    os.replace(library, final)
    write_pc(out)
    return final


def main(argv: list[str] | None = None) -> None:
    """Command line: build, print where the library went."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUILD, help=f"output folder (default {BUILD})")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    print(build(args.out.resolve(), args.verbose))


if __name__ == "__main__":
    sys.exit(main())
