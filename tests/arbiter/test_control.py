"""The arbiter's control commands against a live daemon, with real client processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.protocol import control as _control
from libshare.errors import AccessDenied, InvalidSubmission, ProtocolError

from tests.conftest import ROOT
from tests.arbiter.conftest import open_fds, run_daemon, start_client, wait_until


def control(pipe_dir, command: str, *args: str) -> str:
    return _control.run(command, *args, pipe_directory=pipe_dir)


def ready(process: subprocess.Popen) -> subprocess.Popen:
    assert process.stdout.readline().strip() == "ready"
    return process


def finish(process: subprocess.Popen) -> str:
    """Let a ``hold`` client exit; return what it printed after 'ready'."""
    out, _ = process.communicate("\n", timeout=60)
    return out.strip()


def start_holder(pipe_dir, name: str) -> subprocess.Popen:
    return ready(subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", "hold", str(pipe_dir), name],
                                  cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))


def test_queries_describe_the_server_and_each_client(daemon):
    process, pipe_dir = daemon
    alpha, beta = start_holder(pipe_dir, "alpha"), start_holder(pipe_dir, "beta")
    try:
        assert control(pipe_dir, "get_server_list") == str(process.pid)
        assert control(pipe_dir, "get_server_status") == "ACTIVE"
        assert control(pipe_dir, "get_server_status", str(process.pid)) == "ACTIVE"
        with pytest.raises(InvalidSubmission, match="no arbiter with pid"):
            control(pipe_dir, "get_server_status", str(process.pid + 1))
        assert control(pipe_dir, "get_client_list").split() == sorted([str(alpha.pid), str(beta.pid)], key=int)
        device_line, *pids = control(pipe_dir, "get_device_client_list").splitlines()
        assert device_line.split()[0] == "0" and sorted(pids) == sorted([str(alpha.pid), str(beta.pid)])

        def table():
            header, *rows = control(pipe_dir, "ps").splitlines()
            return header, [row.split() for row in rows]

        header, rows = wait_until(lambda: (t := table()) and all(int(r[6]) > 0 for r in t[1]) and t,
                                  what="both clients to have dispatched")
        assert header.split() == ["PID", "ID", "NAME", "DEVICE", "STATE", "PRIORITY", "DISPATCHES",
                                  "DEVICE_TIME", "MEMORY", "MEM_LIMIT", "COMMAND"]
        by_name = {row[2]: row for row in rows}
        assert set(by_name) == {"alpha", "beta"}
        assert by_name["alpha"][0] == str(alpha.pid) and by_name["alpha"][4:6] == ["ACTIVE", "normal"]
        assert by_name["alpha"][8] == "4.0KiB"  # one page-rounded 4 KiB buffer
        assert by_name["alpha"][9] == "unlimited"
        assert "tests.arbiter._client" in " ".join(by_name["alpha"][10:])
        only = control(pipe_dir, "ps", "-p", str(beta.pid)).splitlines()
        assert len(only) == 2 and only[1].split()[2] == "beta"
    finally:
        for holder in (alpha, beta):
            holder.kill()
            holder.communicate()


def test_every_command_in_the_table_has_a_server_side():
    from libshare.arbiter.serve.commands import Commands

    assert [name for name in _control.COMMANDS if name not in Commands(None).handlers] == []


def test_bad_commands_get_clear_errors(daemon):
    _, pipe_dir = daemon
    with pytest.raises(ProtocolError, match="unknown command 'bogus'.*get_server_list"):
        control(pipe_dir, "bogus")
    with pytest.raises(InvalidSubmission, match="usage: ps"):
        control(pipe_dir, "ps", "-x")
    with pytest.raises(InvalidSubmission, match="no client with pid"):
        control(pipe_dir, "terminate_client", "1")
    with pytest.raises(InvalidSubmission, match="not a pid"):
        control(pipe_dir, "terminate_client", "abc")
    with pytest.raises(InvalidSubmission, match="seconds"):
        control(pipe_dir, "quit", "-t", "forever")
    with pytest.raises(AccessDenied, match="test hook"):
        control(pipe_dir, "inject_fault")
    assert control(pipe_dir, "get_server_status") == "ACTIVE"  # none of that hurt it


@pytest.mark.parametrize("command", [("terminate_client", "²"), ("get_client_list", "³"), ("ps", "-p", "¹"),
                                     ("set_client_priority", "①", "high"), ("terminate_client", "١٢٣"),
                                     ("terminate_client", "1_0"), ("terminate_client", "9" * 400)])
def test_a_pid_in_digits_that_are_not_ascii_is_refused_as_not_a_pid(daemon, command):
    """str.isdigit passes "²" (which int() refuses) and int() reads "١٢٣": each is answered, not dropped."""
    _, pipe_dir = daemon
    with pytest.raises(InvalidSubmission, match="not a pid"):
        control(pipe_dir, *command)
    with pytest.raises(InvalidSubmission, match="client pid"):
        control(pipe_dir, "clear_quarantine", command[1])


@pytest.mark.parametrize("command", [("set_default_device_pinned_mem_limit", "0", "9" * 400),
                                     ("set_group_mem_limit", "g", "9" * 320 + "G"),
                                     ("set_device_pinned_mem_limit", "ARBITER", "0", "1" * 320),
                                     ("set_group_mem_limit", "g", "1152921504606846977")])
def test_a_memory_size_of_hundreds_of_digits_is_refused_as_too_large(daemon, command):
    process, pipe_dir = daemon
    with pytest.raises(InvalidSubmission, match="too large"):
        control(pipe_dir, *[str(process.pid) if arg == "ARBITER" else arg for arg in command])
    assert control(pipe_dir, "get_server_status") == "ACTIVE"


@pytest.mark.parametrize("command", [("set_group_priority", "high"), ("set_group_active_thread_percentage", "50"),
                                     ("set_group_mem_limit", "1G"), ("set_group_owner", "1000")])
def test_group_settings_are_bounded_in_name_and_number(daemon, command, monkeypatch):
    """A group name has at most 64 characters, and each kind of group setting holds MAX_GROUPS groups (a
    stream of new names grew the arbiter by 13 MB/s): past that a new group is refused until one is removed."""
    from libshare.arbiter.serve import commands_groups as _groups

    _, pipe_dir = daemon
    name, value = command
    with pytest.raises(InvalidSubmission, match="1 to 64 characters"):
        control(pipe_dir, name, "g" * 4096, value)
    with _control.ControlConnection(pipe_dir) as connection:  # one connection: 1,024 commands in a second
        for i in range(_groups.MAX_GROUPS):
            connection.run(name, f"group-{i}", value)
        with pytest.raises(InvalidSubmission, match="groups have this setting already; remove one first"):
            connection.run(name, "one-more", value)
        connection.run(name, "group-7", value)  # a group that has the setting may change it
        connection.run(name, "group-7", "unlimited" if name == "set_group_mem_limit" else "none")
        connection.run(name, "one-more", value)  # room again


def test_a_command_that_fails_on_a_bug_is_answered_not_dropped():
    """Defence in depth: an exception that is not a LibshareError is answered as a ProtocolError naming it."""
    from libshare.arbiter.serve.commands import Commands

    class Broken(Commands):
        def run(self, name, args, pid, uid):
            raise ValueError("a bug")

    reply = Broken(None).answer({"op": "control", "command": "ps", "args": []}, os.getpid(), os.getuid())
    assert reply["ok"] is False and reply["error"] == "ProtocolError" and "ValueError" in reply["message"]


def test_terminate_client_cancels_one_client_and_spares_the_others(daemon):
    process, pipe_dir = daemon
    baseline = open_fds(process.pid)
    victim = start_holder(pipe_dir, "victim")
    bystander = start_client("mixed", pipe_dir, 7, 12)
    output = control(pipe_dir, "terminate_client", str(victim.pid))
    assert f"pid {victim.pid}" in output
    assert str(victim.pid) not in control(pipe_dir, "get_client_list").split()
    assert finish(victim) == "ClientTerminated ClientTerminated ClientTerminated"  # sticky
    assert bystander.communicate(timeout=300)[0].strip() == "ok" and bystander.returncode == 0
    wait_until(lambda: open_fds(process.pid) == baseline, what="the arbiter's fds to return to the baseline")
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:  # a new client is served
        x = session.array(64)
        x[:] = 1
        y = session.array(64)
        session.copy(x, y).wait(10)
        assert np.array_equal(x, y)


def test_terminate_group_ends_every_client_of_the_group_and_no_other(daemon):
    """The Slurm epilog's: a process that outlived its job (proctrack/linuxproc) stayed in the job's
    group after the epilog lifted its memory limit, and allocated 450M against a 100M grant."""
    _, pipe_dir = daemon
    sessions = [libshare.connect(mode="daemon", pipe_directory=pipe_dir, group=group)
                for group in ("slurm-9", "slurm-9", "slurm-10")]
    try:
        for session in sessions:  # a control task, run after the one that adds the client (connect() may return first)
            session.array(16)
        output = control(pipe_dir, "terminate_group", "slurm-9")
        assert output.count("terminated client") == 2, output
        for session in sessions[:2]:
            with pytest.raises(libshare.ClientTerminated):
                session.array(16)
        x = sessions[2].array(64)
        sessions[2].copy(x, sessions[2].array(64)).wait(10)  # the other group's client is served
        assert control(pipe_dir, "terminate_group", "slurm-9") == "none"
    finally:
        for session in sessions:
            session.close()


def test_terminate_client_two_pid_form_checks_the_server_pid(daemon):
    process, pipe_dir = daemon
    victim = start_holder(pipe_dir, "victim")
    try:
        with pytest.raises(InvalidSubmission, match="no arbiter with pid"):
            control(pipe_dir, "terminate_client", str(process.pid + 1), str(victim.pid))
        control(pipe_dir, "terminate_client", str(process.pid), str(victim.pid))  # the MPS two-pid form
        assert finish(victim).split()[0] == "ClientTerminated"
    finally:
        victim.kill()
        victim.communicate()


def test_fault_contains_every_client_refuses_new_ones_and_recovers(hooked_daemon):
    _, pipe_dir = hooked_daemon
    first, second = start_holder(pipe_dir, "first"), start_holder(pipe_dir, "second")
    assert control(pipe_dir, "inject_fault", str(first.pid)) == "FAULT"
    assert control(pipe_dir, "get_server_status") == "FAULT"
    assert finish_line(first) == "ServerFault ServerFault ServerFault"
    with pytest.raises(libshare.ServerNotReady, match="FAULT"):
        libshare.connect(mode="daemon", pipe_directory=pipe_dir)
    finish(first)
    assert control(pipe_dir, "get_server_status") == "FAULT"  # the second faulted client is still there
    assert finish(second) == "ServerFault ServerFault ServerFault"
    wait_until(lambda: control(pipe_dir, "get_server_status") == "ACTIVE", what="recovery")
    client = start_client("mixed", pipe_dir, 3, 5)  # the recreated device computes right
    assert client.communicate(timeout=300)[0].strip() == "ok"


def finish_line(process: subprocess.Popen) -> str:
    """The line a ``hold`` client prints once its calls fail (it keeps running)."""
    return process.stdout.readline().strip()


@pytest.fixture
def open_daemon(vulkan_device_name):
    """A daemon whose pipe directory every user can reach (outside pytest's private 0700 tmp)."""
    base = Path(tempfile.mkdtemp(prefix="libshare-acl-"))
    base.chmod(0o755)
    try:
        yield from run_daemon(base / "pipe")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_another_uid_is_refused_and_may_not_change_state(open_daemon):
    process, pipe_dir = open_daemon
    # Open the file-system path to everyone, so that the refusal shown is the arbiter's own.
    os.chmod(pipe_dir, 0o755)
    os.chmod(pipe_dir / "control", 0o666)

    def as_nobody(*args: str) -> str:
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                   str(ROOT / "tests" / "arbiter" / "_foreign.py"), str(pipe_dir / "control"), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout.strip()

    assert as_nobody("hello") == "AccessDenied"
    assert as_nobody("quit") == "AccessDenied"
    assert as_nobody("get_server_status") == "ok"  # queries are open to anyone who can reach the socket
    assert process.poll() is None and control(pipe_dir, "get_server_status") == "ACTIVE"
