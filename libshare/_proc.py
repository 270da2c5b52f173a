"""What /proc says about a process or thread: the one reader of ``/proc/PID/stat`` in libshare.

A stat line is ``PID (NAME) STATE PPID ...``; the name may hold spaces and parentheses, so
it is cut at the last ``)``. :func:`stat_fields` returns what follows, so that index 0 is
field 3 of proc(5) (the state), index 1 field 4 (the parent), index 19 field 22 (the start
time in clock ticks after boot). Every function here answers None (or False) for a process
that is gone or unreadable, never raises for it: a pid can end between any two reads.
"""

from __future__ import annotations

import os

__all__ = ["MAX_PID", "cpu_seconds", "parent_of", "running", "start_time", "stat_fields", "thread_ids"]

MAX_PID = (1 << 22) - 1
"""The largest pid Linux gives (``kernel.pid_max`` cannot pass 2^22): a bound on every pid read from text."""

_STATE, _PARENT, _UTIME, _STIME, _START = 0, 1, 11, 12, 19  # indexes into stat_fields (fields 3, 4, 14, 15, 22)


def stat_fields(pid: int, tid: int | None = None) -> list[str] | None:
    """The fields of /proc/PID/stat (or of thread TID's) from the state on; None if it is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:  # three system calls (a buffered open() makes eight): a hello reads it on its way to the welcome
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            line = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    _name, paren, rest = line.rpartition(b")")
    fields = rest.decode("ascii", "replace").split()
    return fields if paren and len(fields) > _START else None


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is neither a zombie nor dead (a zombie whose parent never reaps
    it, such as a child reparented to an init that does not, counts as gone)."""
    fields = stat_fields(pid)
    return fields is not None and fields[_STATE] not in ("Z", "X")


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid``; None if it is gone."""
    fields = stat_fields(pid)
    return int(fields[_PARENT]) if fields is not None else None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot): with the pid, a process's identity, since
    pids are reused; None if it is gone."""
    fields = stat_fields(pid)
    return int(fields[_START]) if fields is not None else None


def cpu_seconds(pid: int, tid: int | None = None) -> float | None:
    """utime + stime so far of every thread of ``pid`` (or of its thread ``tid`` alone), in
    seconds at the kernel's tick (10 ms here); None if it is gone."""
    fields = stat_fields(pid, tid)
    if fields is None:
        return None
    return (int(fields[_UTIME]) + int(fields[_STIME])) / os.sysconf("SC_CLK_TCK")


def thread_ids(pid: int | str = "self") -> set[int]:
    """The kernel ids of the threads of ``pid`` (this process by default) now."""
    return {int(name) for name in os.listdir(f"/proc/{pid}/task")}
