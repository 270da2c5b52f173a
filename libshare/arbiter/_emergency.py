"""Binding of the crash-time cleanup in ``_emergency.c``: the only module that names its ffi and lib."""

from __future__ import annotations

import os
from pathlib import Path

from ._emergency_cffi import ffi, lib  # noqa: F401  (ffi keeps the module's types alive)


def install(socket_path: Path, lock_path: Path) -> None:
    """On SIGSEGV, SIGABRT, SIGBUS, SIGILL or SIGFPE, unlink both paths, then die of that signal."""
    rc = lib.ls_emergency_install(os.fsencode(socket_path), os.fsencode(lock_path))
    if rc < 0:
        raise OSError(-rc, f"cannot install the emergency cleanup: {os.strerror(-rc)}")


def disarm() -> None:
    """Stop unlinking the paths on a crash (they may belong to the next arbiter once this one stopped)."""
    lib.ls_emergency_disarm()
