"""Binding of the crash-time cleanup in ``emergency.c``: the only module that names its ffi and lib."""

from __future__ import annotations

import os
from pathlib import Path

from libshare.arbiter.drain._emergency_cffi import ffi, lib  # noqa: F401  (ffi keeps the module's types alive)


def install(socket_path: Path, lock_path: Path) -> None:
    """On SIGSEGV, SIGABRT, SIGBUS, SIGILL or SIGFPE, unlink both paths, then die of that signal."""
    rc = lib.ls_emergency_install(os.fsencode(socket_path), os.fsencode(lock_path))
    if rc < 0:
        raise OSError(-rc, f"cannot install the emergency cleanup: {os.strerror(-rc)}")


def disarm() -> None:
    """Stop unlinking the paths on a crash (they may belong to the next arbiter once this one stopped)."""
    lib.ls_emergency_disarm()


def busy_word() -> int:
    """The address of the word the engine keeps a client's slot + 1 in while it handles that
    client's descriptors (``Engine.set_busy_word``); the crash handler reads it."""
    return lib.ls_emergency_busy_word()


def set_busy(slot_plus_one: int) -> None:
    """Set the busy word (a test hook: as the engine does while it handles a client)."""
    lib.ls_emergency_set_busy(slot_plus_one)


RECORD_BYTES = lib.LS_EMERGENCY_RECORD_BYTES
"""The most bytes of one client's crash record (:func:`prepare`)."""


def journal(directory: str) -> None:
    """On a crash while the busy word names a slot that holds a record (:func:`prepare`), write that
    record into ``directory`` (the quarantine's) as a journal record; "" turns it off."""
    rc = lib.ls_emergency_journal(os.fsencode(directory))
    if rc < 0:
        raise OSError(-rc, f"cannot journal crashes in {directory}: {os.strerror(-rc)}")


def prepare(slot: int, record: bytes) -> None:
    """Hold ``record`` (at most RECORD_BYTES) as client ``slot``'s crash record, written only should
    the arbiter crash while it handles that client; ``b""`` withdraws it. OSError when it cannot be held."""
    rc = lib.ls_emergency_prepare(slot, record, len(record))
    if rc < 0:
        raise OSError(-rc, f"cannot hold the crash record of client slot {slot}: {os.strerror(-rc)}")
