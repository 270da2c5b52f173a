"""Recompile the shipped compute shaders from GLSL to SPIR-V.

Run ``python -m libshare.shaders.build`` (or ``python shaders/build.py`` from a
checkout) after editing any ``.comp`` file, and commit the ``.spv`` files it
writes. ``--check`` writes nothing and exits with status 1 when any checked-in
``.spv`` differs from a fresh compile.

The output must be reproducible, because a test compares the checked-in files
with a fresh compile. So there is no ``-g`` (debug info would embed the source
text and file name), and every shader is compiled twice and the two results
must match byte for byte. glslang writes its own version into the SPIR-V
header's generator word, so a different glslang release may produce different
bytes; rebuild with the release the project uses. Set ``GLSLANG_VALIDATOR`` to
use a compiler that is not on ``PATH`` as ``glslangValidator``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SHADER_DIR = Path(__file__).resolve().parent
FLAGS = ("-V", "--target-env", "vulkan1.1")
"""glslangValidator flags: Vulkan SPIR-V for Vulkan 1.1 (SPIR-V 1.3), no debug info."""


def compiler() -> str:
    """Path of glslangValidator; ``FileNotFoundError`` when it is not installed."""
    name = os.environ.get("GLSLANG_VALIDATOR", "glslangValidator")
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found; install glslang-tools (Debian) or set GLSLANG_VALIDATOR")
    return found


def compile_source(source: Path) -> bytes:
    """Compile one GLSL compute source and return its SPIR-V.

    Raises ``RuntimeError`` with glslang's messages when compilation fails.
    """
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "out.spv"
        command = [compiler(), *FLAGS, "-o", str(output), str(source)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"glslangValidator failed on {source.name}:\n{result.stdout}{result.stderr}")
        return output.read_bytes()


def compile_reproducibly(source: Path) -> bytes:
    """Compile ``source`` twice and return the SPIR-V, or raise if the two differ."""
    first = compile_source(source)
    if compile_source(source) != first:
        raise RuntimeError(f"glslangValidator output for {source.name} is not deterministic")
    return first


def sources() -> list[Path]:
    """Every GLSL compute source in the shader directory, sorted."""
    return sorted(SHADER_DIR.glob("*.comp"))


def main(argv: list[str] | None = None) -> int:
    """Rebuild (or with ``--check`` only compare) every shader; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale .spv files, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for source in sources():
        spirv = compile_reproducibly(source)
        target = source.with_suffix(".spv")
        if target.exists() and target.read_bytes() == spirv:
            continue
        stale.append(target.name)
        if not args.check:
            target.write_bytes(spirv)
    verb = "stale" if args.check else "rebuilt"
    print(f"{verb}: {', '.join(stale)}" if stale else "all shaders up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
