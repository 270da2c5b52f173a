"""The daemon's lifecycle: pipe directory, PID lock, stale and live sockets, signals, crash cleanup, logs."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys

import pytest

import libshare
from libshare.daemon.logs import log_handler

from tests._wait import wait_until
from tests.conftest import ROOT, stop_process
from tests.control.conftest import alive, wait_active, wait_dead

STAMP = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (\d+)\] "


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def test_pipe_directory_is_made_private(dirs, foreground):
    dirs.pipe.mkdir(mode=0o755)
    os.chmod(dirs.pipe, 0o755)
    foreground()
    assert stat.S_IMODE(dirs.pipe.stat().st_mode) == 0o700
    assert stat.S_IMODE(dirs.socket.stat().st_mode) == 0o600


def test_lock_file_holds_the_pid_while_running_and_goes_at_exit(dirs, foreground):
    process = foreground()
    assert dirs.lock.read_text() == f"{process.pid}\n"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert not dirs.lock.exists() and not dirs.socket.exists()


def test_second_arbiter_is_refused_naming_the_running_one(dirs, foreground):
    first = foreground()
    second = foreground(wait=False)
    assert second.wait(timeout=30) == 1
    assert f"another arbiter (pid {first.pid}) serves {dirs.pipe}" in second.stderr.read()
    assert first.poll() is None and dirs.lock.read_text() == f"{first.pid}\n" and dirs.socket.exists()


def test_stale_socket_is_removed_at_start(dirs, foreground):
    dirs.pipe.mkdir(mode=0o700)
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(dirs.socket))  # bound, never listening: what a killed arbiter leaves behind
    leftover.close()
    dirs.lock.write_text("999999\n")  # an unlocked lock file from the dead one, too
    process = foreground()
    assert dirs.lock.read_text() == f"{process.pid}\n"
    log = (dirs.log / "server.log").read_text()
    assert re.search(STAMP + rf"WARNING removed stale socket {re.escape(str(dirs.socket))}", log, re.M), log


def test_live_socket_without_lock_is_refused(dirs, foreground):
    dirs.pipe.mkdir(mode=0o700)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(str(dirs.socket))
    squatter.listen(1)
    try:
        process = foreground(wait=False)
        assert process.wait(timeout=30) == 1
        assert f"another arbiter (pid {os.getpid()}) serves {dirs.pipe}" in process.stderr.read()
        assert dirs.socket.exists() and not dirs.lock.exists()
    finally:
        squatter.close()


def test_sigterm_with_a_client_connected(dirs, foreground):
    before = _shm()
    process = foreground()
    client = subprocess.Popen([sys.executable, "-m", "tests.control._client", str(dirs.pipe)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        ending = client.stdout.readline().strip()  # (each of its waits has a 30 s timeout: a hang is Timeout)
        assert client.wait(timeout=20) == 0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        client.stdout.close()
    assert ending == "lost", ending  # a clean ArbiterLost, not a hang or another error
    assert process.wait(timeout=20) == 0
    assert not dirs.socket.exists() and not dirs.lock.exists()
    assert _shm() <= before


@pytest.mark.parametrize("signum", [signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS], ids=lambda s: s.name)
def test_crash_signal_removes_socket_and_lock(dirs, foreground, signum):
    process = foreground()
    process.send_signal(signum)
    assert process.wait(timeout=20) == -signum  # died of the signal itself, after the cleanup
    assert not dirs.socket.exists() and not dirs.lock.exists()


def test_restart_after_a_crash(dirs, foreground):
    first = foreground()
    os.kill(first.pid, signal.SIGKILL)  # no handler runs: socket and lock file stay behind
    first.wait(timeout=20)
    assert dirs.socket.exists()
    second = foreground()
    assert alive(second.pid) and dirs.lock.read_text() == f"{second.pid}\n"


def test_server_log_lines_are_timestamped(dirs, foreground):
    process = foreground()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=20) == 0
    lines = (dirs.log / "server.log").read_text().splitlines()
    assert lines and all(re.match(STAMP, line) for line in lines), lines
    text = "\n".join(lines)
    for event in ("serving", r"stopping \(SIGINT\)", f"arbiter pid {process.pid} stopped"):
        assert re.search(STAMP + r"INFO .*" + event, text, re.M), (event, text)
    control_log = (dirs.log / "control.log").read_text()
    assert f"arbiter pid {process.pid} starting" in control_log
    assert f"arbiter pid {process.pid} stopped (SIGINT)" in control_log



def test_a_session_leaves_two_lines_in_the_server_log(dirs, foreground):
    """Its connect, and its end: "disconnected and reclaimed" in one line when nothing of it still
    ran (a line costs an attach some 25 us of the arbiter; a client reclaimed later gets two)."""
    foreground()
    with libshare.connect(mode="daemon", pipe_directory=dirs.pipe, name="logged") as session:
        session.stats()
        client = session.client_id
    me = re.escape(f"client {client} (logged, pid {os.getpid()}) ")
    log = dirs.log / "server.log"
    wait_until(lambda: re.search(me + "disconnected and reclaimed", log.read_text()), 30, lambda: log.read_text())
    lines = [line for line in log.read_text().splitlines() if re.search(me, line)]
    assert [re.sub(STAMP + "INFO " + me, "", line) for line in lines] == [f"connected (uid {os.getuid()})",
                                                                         "disconnected and reclaimed"], lines


def test_a_log_file_takes_whole_lines_tracebacks_included(tmp_path):
    """The arbiter's log handler (one write per line, owner and group only): the format, a traceback
    under its line, text that is not ASCII, and nothing written once closed."""
    path = tmp_path / "server.log"
    path.write_text("an older arbiter's line\n")
    os.chmod(path, 0o644)
    handler = log_handler(path)
    logger = logging.getLogger("libshare.test-log-file")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(handler)
    try:
        try:
            raise ZeroDivisionError("the cause")
        except ZeroDivisionError:
            logger.exception("request %s failed", "alloc")
        logger.info("client 3 (n\u00e9, pid %d) connected", 7)
    finally:
        logger.removeHandler(handler)
        handler.close()
        handler.close()
    logger.warning("after the close")  # no handler: nothing reaches the file
    lines = path.read_text().splitlines()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert lines[0] == "an older arbiter's line"
    assert re.match(STAMP + "ERROR request alloc failed$", lines[1]), lines
    assert lines[2] == "Traceback (most recent call last):" and lines[-2] == "ZeroDivisionError: the cause", lines
    assert re.match(STAMP + "INFO client 3 \\(n\u00e9, pid 7\\) connected$", lines[-1]), lines
    assert int(re.match(STAMP, lines[1]).group(1)) == os.getpid()


def test_an_arbiter_started_with_its_stderr_closed_serves_and_logs(dirs):
    """Without --quiet the log goes to stderr too; with no stderr at all (fd 2 closed) the arbiter
    still starts, serves and stops, its log in its files."""
    process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", *dirs.args], cwd=ROOT,
                               stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    try:
        wait_active(dirs.pipe, process)
        with libshare.connect(mode="daemon", pipe_directory=dirs.pipe, name="no-stderr") as session:
            session.stats()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
    finally:
        stop_process(process)
    assert f"arbiter pid {process.pid} stopped" in (dirs.log / "server.log").read_text()


@pytest.mark.parametrize("disarmed", [False, True], ids=["armed", "disarmed"])
def test_emergency_handler_alone(tmp_path, disarmed):
    paths = [tmp_path / "socket", tmp_path / "lock"]
    for path in paths:
        path.write_text("")
    script = ("import os, sys\n"
              "from libshare.arbiter.drain import emergency as _emergency\n"
              "_emergency.install(sys.argv[1], sys.argv[2])\n"
              f"{'_emergency.disarm()' if disarmed else ''}\n"
              "os.abort()\n")
    result = subprocess.run([sys.executable, "-c", script, *map(str, paths)], cwd=ROOT, timeout=60)
    assert result.returncode == -signal.SIGABRT
    assert [path.exists() for path in paths] == [disarmed, disarmed]
