"""``libshare-control``: -d, -f, commands as arguments and on stdin, help, errors, control.log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from importlib import metadata

import libshare
from libshare.protocol.control import COMMANDS
from libshare._proc import parent_of

from tests.conftest import ROOT, killed_on_exit
from tests.control.conftest import alive, control, server_status, wait_active, wait_dead


def test_console_script_is_declared():
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("libshare-control") == "libshare.control:main"


def test_help_explains_every_command():
    result = control("--help")
    assert result.returncode == 0
    for command in COMMANDS.values():
        assert command.usage in result.stdout
        assert command.help.split()[0] in result.stdout
    assert "-d" in result.stdout and "-f" in result.stdout


def test_unknown_command_fails_naming_the_valid_ones(dirs):
    result = control(*dirs.args, "frobnicate")
    assert result.returncode != 0
    assert "unknown command 'frobnicate'" in result.stderr
    assert "get_server_status" in result.stderr and "terminate_client" in result.stderr


def test_no_arbiter_exits_nonzero(dirs):
    for result in (control(*dirs.args, "ps"), control(*dirs.args, stdin="get_server_list\n")):
        assert result.returncode != 0
        assert "error: no arbiter answers" in result.stderr
        assert "libshare-control -d" in result.stderr


def test_dash_d_takes_no_command(dirs):
    result = control("-d", *dirs.args, "ps")
    assert result.returncode != 0 and "take no command" in result.stderr
    assert not dirs.pipe.exists()


def test_daemon_mode_returns_once_active_and_serves(dirs, daemon):
    assert server_status(dirs.pipe) == "ACTIVE"  # no waiting: -d returned only once it was
    assert control(*dirs.args, "get_server_list").stdout.split() == [str(daemon)]
    with libshare.connect(name="probe", mode="daemon", pipe_directory=dirs.pipe):
        clients = control(*dirs.args, "get_client_list")
        assert clients.returncode == 0 and str(os.getpid()) in clients.stdout.split()
        assert "probe" in control(*dirs.args, "ps").stdout


def test_arguments_and_stdin_give_the_same_answers(dirs, daemon):
    by_args = [control(*dirs.args, name).stdout for name in ("get_server_list", "get_server_status")]
    by_stdin = control(*dirs.args, stdin="get_server_list\n# a comment\n\nget_server_status\n")
    assert by_stdin.returncode == 0, by_stdin.stderr
    assert by_stdin.stdout == "".join(by_args)
    assert by_args == [f"{daemon}\n", "ACTIVE\n"]


def test_a_failed_stdin_command_fails_the_run_but_not_the_others(dirs, daemon):
    result = control(*dirs.args, stdin="get_server_status\nnope\nps -p\nget_server_list\n")
    assert result.returncode != 0
    assert result.stdout.startswith("ACTIVE\n") and result.stdout.endswith(f"{daemon}\n")
    assert "unknown command 'nope'" in result.stderr


def test_control_log_records_commands_and_results(dirs, daemon):
    control(*dirs.args, "get_server_list")
    control(*dirs.args, "nope")
    text = (dirs.log / "control.log").read_text()
    stamp = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \d+\]"
    assert re.search(stamp + rf" INFO get_server_list -> {daemon}$", text, re.M), text
    assert re.search(stamp + r" WARNING nope -> error: unknown command", text, re.M), text
    assert re.search(stamp + rf" INFO arbiter pid {daemon} serving ", text, re.M), text


def test_second_daemon_refused_naming_the_running_one(dirs, daemon):
    supervisor = parent_of(daemon)  # the control daemon -d started
    result = control("-d", *dirs.args)
    assert result.returncode != 0
    assert f"another control daemon (pid {supervisor}) supervises {dirs.pipe}" in result.stderr
    assert alive(daemon) and server_status(dirs.pipe) == "ACTIVE" and parent_of(daemon) == supervisor


def test_quit_stops_the_daemon_and_removes_socket_and_lock(dirs, daemon):
    result = control(*dirs.args, "quit")
    assert result.returncode == 0, result.stderr
    assert wait_dead(daemon, 20)
    assert not dirs.socket.exists() and not dirs.lock.exists()
    assert re.search(rf"arbiter pid {daemon} stopped \(quit command\)", (dirs.log / "control.log").read_text())


def test_foreground_mode_serves_until_sigint(dirs, vulkan_device_name):
    foreground = [sys.executable, "-m", "libshare.control", "-f", *dirs.args]
    with killed_on_exit(subprocess.Popen(foreground, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         text=True)) as process:
        wait_active(dirs.pipe, process)
        server = dirs.server_pid()
        assert parent_of(server) == process.pid  # the control daemon runs in the foreground, the arbiter is its child
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert f"arbiter pid {server} serves" in stderr and "stopped (SIGINT)" in stderr  # its log echoes on stderr
    assert not dirs.socket.exists() and not dirs.lock.exists() and not alive(server)


def test_daemon_start_failure_reports_the_reason(dirs, vulkan_device_name):
    """A start that cannot open its device fails with the reason, and leaves no lock and no arbiter
    behind (``control`` bounds the command against a hang; how long the refusal took is a figure of
    bench/test_lifecycle_mechanism_bench.py)."""
    result = control("-d", *dirs.args, "--device", "no-such-device")
    assert result.returncode != 0
    assert "no-such-device" in result.stderr, result.stderr
    assert not dirs.lock.exists() and not dirs.socket.exists() and server_status(dirs.pipe) is None


def test_a_refused_command_prints_the_arbiters_reason(dirs, daemon):
    result = control(*dirs.args, "terminate_client", "999999")
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.startswith("error: ") and "999999" in result.stderr, result.stderr
    assert re.search(r"WARNING terminate_client 999999 -> error: ", (dirs.log / "control.log").read_text())
