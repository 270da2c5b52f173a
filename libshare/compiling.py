"""``libshare.compile``: GLSL or HLSL source to SPIR-V, with ``glslangValidator``, cached by content.

The compiler is Khronos' reference front end, ``glslangValidator`` (Debian's ``glslang-tools``,
which ``tools/setup.sh`` installs and which builds the shipped shaders), run as a child process
with a time limit. Its refusal is a :class:`~libshare.errors.CompileError` that carries the
compiler's own messages (``ERROR: <source>:12: 'x' : undeclared identifier``).

Compiled modules are kept in ``$XDG_CACHE_HOME/libshare/spirv`` (else ``~/.cache``), one file
per SHA-256 of what decides the output: the source, the stage, the language, the entry point,
the defines, the target environment and the compiler itself (its path, size and modification
time). A hit returns the very bytes the compile gave; the directory is private to the user
(mode 0700), each file is written whole then renamed, a file that does not read as SPIR-V is
compiled again, and the least recently used files go once the directory holds more than
:data:`CACHE_BYTES`. Source that ``#include``\\ s another file is compiled every time: the cache
cannot see the included file change.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from libshare.errors import CompileError

__all__ = ["CACHE_BYTES", "cache_directory", "compile"]

CACHE_BYTES = 64 << 20
"""Most bytes of compiled modules the cache keeps."""
_TIMEOUT = 60.0
_MAX_MESSAGE = 4000
_MAGIC = b"\x03\x02\x23\x07"
_STAGES = ("comp", "vert", "frag", "geom", "tesc", "tese", "mesh", "task", "rgen", "rint", "rahit", "rchit",
           "rmiss", "rcall")
_TARGET_ENV = re.compile(r"(vulkan1\.[0-3]|spirv1\.[0-6]|opengl)\Z")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INSTALL_HINT = "install glslang-tools (`apt-get install glslang-tools`)"


def compile(source: str | bytes, stage: str = "comp", defines: dict | None = None,  # noqa: A001 - the API's name
            target_env: str | None = None, language: str = "glsl", entry_point: str = "main") -> bytes:
    """SPIR-V compiled from ``source`` (GLSL, or HLSL with ``language="hlsl"``) for ``stage``.

    ``defines``: preprocessor macros (``{"BLOCK": 64, "FAST": None}``: ``-DBLOCK=64 -DFAST``);
    ``target_env``: glslang's ``--target-env`` (``"vulkan1.1"``, ``"spirv1.3"``; default
    glslang's own, Vulkan 1.0); ``entry_point``: the HLSL function to compile. Raises
    :class:`~libshare.errors.CompileError` carrying the compiler's messages, TypeError or
    ValueError for a bad argument. Results are cached by content (see the module's essay).
    """
    text = source.decode() if isinstance(source, (bytes, bytearray)) else source
    if not isinstance(text, str):
        raise TypeError(f"source must be str or bytes, not {type(source).__name__}")
    args = _arguments(stage, defines, target_env, language, entry_point)
    tool = shutil.which("glslangValidator")
    if tool is None:
        raise CompileError(f"the GLSL compiler glslangValidator is not installed; {_INSTALL_HINT}")
    key = _key(tool, text, args)
    cached = None if "#include" in text else _cache_path(key)
    if cached is not None and (found := _read(cached)) is not None:
        return found
    spirv = _run(tool, text, args)
    if cached is not None:
        _store(cached, spirv)
    return spirv


def cache_directory() -> Path:
    """Where compiled modules are kept: ``$XDG_CACHE_HOME/libshare/spirv``, else ``~/.cache/...``."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"  # (the XDG rule: a relative one is ignored)
    return root / "libshare" / "spirv"


def _arguments(stage, defines, target_env, language, entry_point) -> list[str]:
    """glslangValidator's arguments for these options (checked)."""
    if stage not in _STAGES:
        raise ValueError(f"stage must be one of {', '.join(_STAGES)} (got {stage!r})")
    if language not in ("glsl", "hlsl"):
        raise ValueError(f"language must be 'glsl' or 'hlsl' (got {language!r})")
    args = ["-V", "-S", stage]
    if language == "hlsl":
        if not isinstance(entry_point, str) or not _NAME.match(entry_point):
            raise ValueError(f"entry_point must be an identifier (got {entry_point!r})")
        args += ["-D", "-e", entry_point]
    if target_env is not None:
        if not isinstance(target_env, str) or not _TARGET_ENV.match(target_env):
            raise ValueError(f"target_env must be vulkan1.0..vulkan1.3 or spirv1.0..spirv1.6 (got {target_env!r})")
        args += ["--target-env", target_env]
    for name, value in sorted((defines or {}).items()):
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"a define's name must be an identifier (got {name!r})")
        if value is None:
            args.append(f"-D{name}")
            continue
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float, str)) or "\n" in str(value) or "\0" in str(value):
            raise ValueError(f"define {name}'s value must be a number or a one-line string (got {value!r})")
        args.append(f"-D{name}={value}")
    return args


def _key(tool: str, text: str, args: list[str]) -> str:
    stat = os.stat(tool)
    what = json.dumps([text, args, tool, stat.st_size, stat.st_mtime_ns])
    return hashlib.sha256(what.encode()).hexdigest()


def _run(tool: str, text: str, args: list[str]) -> bytes:
    """Compile in a child process; CompileError with its messages when it refuses."""
    with tempfile.TemporaryDirectory(prefix="libshare-compile-") as scratch:
        out, source = Path(scratch) / "out.spv", Path(scratch) / "source"
        source.write_text(text)  # (this glslangValidator's --stdin prints its usage instead)
        try:
            result = subprocess.run([tool, *args, "-o", str(out), str(source)], stdin=subprocess.DEVNULL,
                                    capture_output=True, timeout=_TIMEOUT, check=False, cwd=scratch)
        except subprocess.TimeoutExpired:
            raise CompileError(f"glslangValidator took longer than {_TIMEOUT:.0f} s; gave up") from None
        except OSError as exc:
            raise CompileError(f"glslangValidator could not run: {exc}") from None
        spirv = out.read_bytes() if result.returncode == 0 and out.exists() else b""
    if not spirv.startswith(_MAGIC) or len(spirv) % 4:
        message = _messages(result).replace(str(source), "<source>")
        raise CompileError(f"glslangValidator refused the source: {message}")
    return spirv


def _messages(result: subprocess.CompletedProcess) -> str:
    """The compiler's error lines (all its output when it names none), bounded."""
    lines = (result.stdout + result.stderr).decode(errors="replace").splitlines()
    errors = [line.strip() for line in lines if "ERROR" in line or "error" in line]
    text = "; ".join(errors or [line.strip() for line in lines if line.strip() and not line.strip().endswith("/source")])
    text = text or f"exit status {result.returncode}"
    return text[:_MAX_MESSAGE] + ("..." if len(text) > _MAX_MESSAGE else "")


def _cache_path(key: str) -> Path | None:
    """The cache file of ``key``, its directory made; None when there can be no cache."""
    directory = cache_directory()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return directory / f"{key}.spv"


def _read(path: Path) -> bytes | None:
    """A cached module, or None (absent, unreadable, or not SPIR-V: compile again)."""
    try:
        data = path.read_bytes()
        os.utime(path)  # recently used
    except OSError:
        return None
    return data if data.startswith(_MAGIC) and len(data) % 4 == 0 else None


def _store(path: Path, spirv: bytes) -> None:
    """Write a module whole (a temporary file renamed), then trim the cache to its bound."""
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".compile-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(spirv)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return
    _trim(path.parent)


def _trim(directory: Path) -> None:
    """Delete the least recently used modules while the cache holds more than CACHE_BYTES."""
    entries = []
    for entry in os.scandir(directory):
        if entry.name.endswith(".spv"):
            try:
                stat = entry.stat()
            except OSError:
                continue
            entries.append((stat.st_mtime_ns, stat.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, name in sorted(entries):
        if total <= CACHE_BYTES:
            break
        try:
            os.unlink(name)
        except OSError:
            continue
        total -= size
