"""libshare._proc: reading /proc/PID/stat, including names that look like its punctuation."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from libshare._proc import cpu_seconds, parent_of, running, start_time, stat_fields, thread_ids

# A child that names itself with the stat line's own punctuation, says so, and waits for a line.
_ODD_NAME = "x) (y z) 9"
_CHILD = f"""
import sys
with open("/proc/self/comm", "w") as comm:
    comm.write({_ODD_NAME!r})
print("named", flush=True)
sys.stdin.readline()
"""


def _odd_child() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "named"
    return child


def test_this_process_reads_as_running_with_its_parent():
    fields = stat_fields(os.getpid())
    assert fields[0] == "R"  # reading its own stat, it runs
    assert parent_of(os.getpid()) == os.getppid()
    assert running(os.getpid())
    assert start_time(os.getpid()) == start_time(os.getpid()) > 0


def test_a_name_with_parentheses_and_spaces_does_not_shift_the_fields():
    child = _odd_child()
    try:
        with open(f"/proc/{child.pid}/comm") as comm:
            assert comm.read().strip() == _ODD_NAME[:15]  # the kernel keeps 15 bytes of it
        assert parent_of(child.pid) == os.getpid()
        assert stat_fields(child.pid)[0] in ("R", "S")  # on its way to readline, or asleep in it
        assert start_time(child.pid) >= start_time(os.getpid())
    finally:
        child.communicate("go\n", timeout=30)


def test_a_zombie_is_not_running_and_a_reaped_process_is_gone():
    child = _odd_child()
    child.stdin.write("go\n")
    child.stdin.flush()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert stat_fields(child.pid)[0] == "Z"
    assert not running(child.pid)
    assert parent_of(child.pid) == os.getpid()  # a zombie still has its stat line
    child.communicate(timeout=30)  # reaps it, and closes its pipes
    assert stat_fields(child.pid) is None
    assert parent_of(child.pid) is None and start_time(child.pid) is None and cpu_seconds(child.pid) is None
    assert not running(child.pid)


def test_threads_are_listed_and_their_cpu_is_part_of_the_process():
    started, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait(30)))
    worker.start()
    try:
        started.wait(30)
        assert {threading.get_native_id(), worker.native_id} <= thread_ids()
        assert stat_fields(os.getpid(), worker.native_id)[0] in ("R", "S")  # on its way to wait, or in it
        assert stat_fields(os.getpid(), max(thread_ids()) + 1_000_000) is None  # no such thread
        assert 0 <= cpu_seconds(os.getpid(), worker.native_id) <= cpu_seconds(os.getpid())
    finally:
        stop.set()
        worker.join(30)
