"""The operator's configuration file (--config): at start, on reload and SIGHUP, refused when bad.

Real control daemons and arbiters on lavapipe; the test process is the client, in group "batch".
"""

from __future__ import annotations

import os
import re
import signal

import numpy as np
import pytest

import libshare

from tests._wait import wait_until
from tests.control.conftest import Dirs, control
from tests.control.test_disk_bounds import Honest

START = """\
# the operator's configuration
[defaults]
active_thread_percentage = 60
priority = "high"
scheduling = "fairshare"
max_clients = 8
watchdog_seconds = 30

[groups.batch]
active_thread_percentage = 40
mem_limit = "1M"
"""

RELOADED = """\
[defaults]
active_thread_percentage = 60
priority = "high"
max_clients = 9
watchdog_seconds = 30

[groups.batch]
active_thread_percentage = 25
mem_limit = "8M"
priority = "low"
"""

BIG = 512 * 1024  # float32 elements: 2 MiB, past a 1M group limit, within 8M


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "libshare.toml"
    path.write_text(START)
    return path


def _ok(*args: str) -> str:
    result = control(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _start(dirs, config_file) -> None:
    _ok("-d", *dirs.args, "--config", str(config_file))


def _connect(dirs):
    return libshare.connect(name="member", group="batch", mode="daemon", pipe_directory=dirs.pipe)


def _config_lines(dirs) -> dict[str, str]:
    """get_config's lines, by "table.key" (value and comment)."""
    table, lines = "", {}
    for line in _ok(*dirs.args, "get_config").splitlines():
        if line.startswith("["):
            table = line.strip("[]")
        elif " = " in line:
            key, value = line.split(" = ", 1)
            lines[f"{table}.{key}"] = value
    return lines


def _wait_for_log(dirs, pattern: str, timeout: float = 60) -> None:
    """Wait until control.log has a line matching ``pattern`` (what the reload logs when it is done)."""
    wait_until(lambda: re.search(pattern, (dirs.log / "control.log").read_text(), re.M), timeout,
               f"{pattern!r} in control.log", interval=0.02)


def test_config_at_start_is_in_force_and_shown(dirs, config_file, vulkan_device_name):
    _start(dirs, config_file)
    shown = _config_lines(dirs)
    assert shown["defaults.active_thread_percentage"] == "60  # file"
    assert shown["defaults.scheduling"] == '"fairshare"  # file'
    assert shown["defaults.max_clients"].startswith("8  # file")
    assert shown["defaults.watchdog_seconds"] == "30.0  # file"
    assert shown["defaults.device_mem_limit"] == '"unlimited"  # default'
    assert shown["groups.batch.mem_limit"] == '"1M"  # file'
    assert _ok(*dirs.args, "get_scheduling_mode").strip() == "fairshare"
    assert _ok(*dirs.args, "get_default_active_thread_percentage").strip() == "60"
    with _connect(dirs) as session:
        row = [line for line in _ok(*dirs.args, "ps").splitlines() if line.split()[0] == str(os.getpid())]
        assert len(row) == 1 and row[0].split()[5] == "high", row  # the file's default priority
        assert _ok(*dirs.args, "get_active_thread_percentage", str(os.getpid())).strip() == "40"  # the group's
        session.array(1024, np.float32)
        with pytest.raises(libshare.QuotaExceeded, match="group 'batch'"):
            session.array(BIG, np.float32)


def test_reload_applies_a_changed_file_to_running_clients(dirs, config_file, vulkan_device_name):
    _start(dirs, config_file)
    with _connect(dirs) as session:
        with pytest.raises(libshare.QuotaExceeded):
            session.array(BIG, np.float32)
        config_file.write_text(RELOADED)
        output = _ok(*dirs.args, "reload")
        assert "groups.batch.active_thread_percentage: 40 -> 25" in output
        assert 'defaults.scheduling: "fairshare" -> "throughput"' in output  # taken out: back to the default
        assert re.search(r"defaults.max_clients: 8 stays in force until the next start", output), output
        assert _ok(*dirs.args, "get_active_thread_percentage", str(os.getpid())).strip() == "25"
        assert _ok(*dirs.args, "get_scheduling_mode").strip() == "throughput"
        big = session.array(BIG, np.float32)  # the same client, under the new group limit
        big[:] = 1.0
        shown = _config_lines(dirs)
        assert shown["defaults.scheduling"] == '"throughput"  # default'
        assert shown["groups.batch.priority"] == '"low"  # file'
        assert "the file's 9 takes effect at the next start" in shown["defaults.max_clients"]

        # A control command may change a value since; get_config says so, and a reload puts the file's back.
        _ok(*dirs.args, "set_group_active_thread_percentage", "batch", "70")
        assert _config_lines(dirs)["groups.batch.active_thread_percentage"] == \
            "70  # control command since (the file says 25)"
        assert "groups.batch.active_thread_percentage: 70 -> 25" in _ok(*dirs.args, "reload")
        assert _ok(*dirs.args, "get_active_thread_percentage", str(os.getpid())).strip() == "25"


def test_sighup_to_the_control_daemon_reloads_the_arbiter(dirs, config_file, vulkan_device_name):
    _start(dirs, config_file)
    with _connect(dirs):
        config_file.write_text(START.replace("active_thread_percentage = 40", "active_thread_percentage = 30"))
        os.kill(dirs.control_daemon_pid(), signal.SIGHUP)
        _wait_for_log(dirs, r"applied \(SIGHUP\): groups.batch.active_thread_percentage: 40 -> 30")
        assert _ok(*dirs.args, "get_active_thread_percentage", str(os.getpid())).strip() == "30"
    assert "SIGHUP: passed on to arbiter pid" in (dirs.log / "control.log").read_text()


def test_sighup_to_a_lone_arbiter_reloads_it(dirs, config_file, foreground):
    process = foreground("--config", str(config_file))
    config_file.write_text(START.replace('scheduling = "fairshare"', 'scheduling = "throughput"'))
    process.send_signal(signal.SIGHUP)
    _wait_for_log(dirs, r'applied \(SIGHUP\): defaults.scheduling: "fairshare" -> "throughput"')
    assert _ok(*dirs.args, "get_scheduling_mode").strip() == "throughput"
    assert process.poll() is None


@pytest.mark.parametrize("text, line, reason", [
    (START.replace("active_thread_percentage = 40", "active_thread_percentage = 150"), 10,
     r"\[groups.batch\] active_thread_percentage = 150: a percentage must be a whole number in 1..100"),
    (START.replace('mem_limit = "1M"', "mem_limit = \"1M\"\ncolour = \"blue\""), 12,
     r"unknown key 'colour' in \[groups.batch\]: the keys are active_thread_percentage, mem_limit, priority"),
    (START.replace("max_clients = 8", "max_clients = "), 6, r"TOML syntax error: Invalid value"),
    (START.replace('priority = "high"', "priority = true"), 4,
     r"\[defaults\] priority must be a string or an integer, got a boolean"),
])
def test_a_bad_file_at_reload_is_refused_and_the_old_config_stays(dirs, config_file, vulkan_device_name,
                                                                 text, line, reason):
    _start(dirs, config_file)
    before = _ok(*dirs.args, "get_config")
    config_file.write_text(text)
    result = control(*dirs.args, "reload")
    assert result.returncode != 0
    assert re.search(rf"^error: {re.escape(str(config_file))}:{line}: {reason}", result.stderr), result.stderr
    assert "the configuration in force stays" in result.stderr
    assert _ok(*dirs.args, "get_config") == before

    os.kill(dirs.server_pid(), signal.SIGHUP)  # SIGHUP refuses it the same way
    _wait_for_log(dirs, rf"ERROR configuration not reloaded \(SIGHUP\): {re.escape(str(config_file))}:{line}: ")
    assert _ok(*dirs.args, "get_config") == before


def test_a_bad_file_refuses_the_start_with_the_reason(dirs, tmp_path, foreground):
    bad = tmp_path / "bad.toml"
    bad.write_text("[defaults]\nscheduling = \"fastest\"\n")
    result = control("-d", *dirs.args, "--config", str(bad))
    assert result.returncode != 0
    assert f"{bad}:2: [defaults] scheduling = \"fastest\": scheduling mode must be one of" in result.stderr, \
        result.stderr
    assert not dirs.lock.exists() and dirs.control_daemon_pid() is None

    bad.write_text("[defaults]\nactive_thread_percentage = 50\n\n[sharing]\nfair = true\n")
    process = foreground("--config", str(bad), wait=False)
    assert process.wait(timeout=60) == 1
    assert f"{bad}:4: unknown key 'sharing': the tables are [defaults] and [groups.NAME]" in process.stderr.read()
    assert not dirs.lock.exists()


def test_get_config_without_a_file_shows_the_defaults_and_reload_says_why_not(dirs, daemon):
    shown = _config_lines(dirs)
    assert shown["defaults.scheduling"] == '"throughput"  # default'
    assert shown["defaults.max_clients"].startswith("48  # default")
    _ok(*dirs.args, "set_group_priority", "batch", "low")
    assert _config_lines(dirs)["groups.batch.priority"] == '"low"  # control command'
    result = control(*dirs.args, "reload")
    assert result.returncode != 0 and "no configuration file: start it with --config FILE" in result.stderr


def test_a_reloaded_default_reaches_the_running_clients_that_took_it(dirs, config_file, vulkan_device_name):
    """Unlike MPS, and unlike the set_default_* commands alone: a reload gives the running clients
    that took the default priority and share the new ones; a client that asked for its own keeps it."""
    _start(dirs, config_file)

    def priority_of(name: str) -> str:
        rows = [line.split() for line in _ok(*dirs.args, "ps").splitlines()[1:]]
        return next(row[5] for row in rows if row[2] == name)

    with libshare.connect(name="follower", mode="daemon", pipe_directory=dirs.pipe) as follower, \
            libshare.connect(name="chooser", priority="low", mode="daemon", pipe_directory=dirs.pipe) as chooser:
        for session in (follower, chooser):  # a dispatch each: the scheduler knows them
            x, y = session.array(64), session.array(64)
            session.dispatch(session.load_program(libshare.shaders.path("saxpy")), 1, [x, y],
                             b"\x40\x00\x00\x00\x00\x00\x80\x3f").wait(60)
        assert (priority_of("follower"), priority_of("chooser")) == ("high", "low")
        config_file.write_text(START.replace('priority = "high"', 'priority = "normal"')
                               .replace("active_thread_percentage = 60", "active_thread_percentage = 30", 1))
        output = _ok(*dirs.args, "reload")
        assert "running clients that took the default" in output, output
        assert (priority_of("follower"), priority_of("chooser")) == ("normal", "low")
        shares = _ok(*dirs.args, "get_active_thread_percentage", str(os.getpid())).split()
        assert shares and all(share == "30" for share in shares), shares


NESTED = "[defaults]\nscheduling = " + "[" * 50_000 + "]" * 50_000 + "\n"

HOSTILE = {  # name: (the file's text, what the refusal says)
    "nested arrays": (NESTED, r"arrays or inline tables nested too deeply to read"),
    "nested inline tables": ("[groups.batch]\npriority = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n",
                             r"arrays or inline tables nested too deeply to read"),
    "an integer of 5000 digits": ("[defaults]\nmax_clients = " + "9" * 5000 + "\n",
                                  r"a value cannot be read: Exceeds the limit \(4300 digits\)"),
    "over 1 MiB": ("# " + "x" * (1 << 20) + "\n", r"cannot read the configuration file .*: larger than 1024 KiB"),
    "a long line before a bad key": ('[defaults]\ndevice_mem_limit = """\n' + " " * 20_000 + '4G\n"""\ncolour = 1\n',
                                     r":5: unknown key 'colour' in \[defaults\]"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_file_is_refused_and_sighup_goes_on_reloading(dirs, config_file, vulkan_device_name, name):
    """A file that breaks the TOML reader (nesting, digits), one too large, or one whose bad key sits
    after a long line: the reload command and SIGHUP refuse it with the reason, the configuration in
    force stays, the honest session's work goes on, and the next SIGHUP with a good file applies it."""
    text, reason = HOSTILE[name]
    _start(dirs, config_file)
    honest = Honest(dirs.pipe)
    try:
        before = _ok(*dirs.args, "get_config")
        config_file.write_text(text)
        result = control(*dirs.args, "reload")
        assert result.returncode != 0 and re.search(rf"^error: .*{reason}", result.stderr), result.stderr
        assert "the configuration in force stays" in result.stderr and len(result.stderr) < 2000
        honest.round_trip()

        os.kill(dirs.server_pid(), signal.SIGHUP)
        _wait_for_log(dirs, rf"ERROR configuration not reloaded \(SIGHUP\): .*{reason}")
        assert _ok(*dirs.args, "get_config") == before
        honest.round_trip()

        config_file.write_text(START.replace("active_thread_percentage = 40", "active_thread_percentage = 30"))
        os.kill(dirs.server_pid(), signal.SIGHUP)  # the signal thread outlived the hostile file
        _wait_for_log(dirs, r"applied \(SIGHUP\): groups.batch.active_thread_percentage: 40 -> 30")
        honest.round_trip()
    finally:
        honest.close()


@pytest.mark.parametrize("mode", ["-d", "-f"])
def test_a_hostile_file_refuses_a_start_with_the_reason(dirs, config_file, tmp_path, vulkan_device_name, mode):
    """``libshare-control -d/-f --config FILE`` with a file nested past the reader's depth: a refusal
    naming the reason, no traceback, while another daemon's honest session goes on."""
    _start(dirs, config_file)
    honest = Honest(dirs.pipe)
    other = Dirs(tmp_path / "other")
    try:
        hostile = tmp_path / "nested.toml"
        hostile.write_text(NESTED)
        result = control(mode, *other.args, "--config", str(hostile))
        assert result.returncode == 1, result.stderr
        assert "arrays or inline tables nested too deeply to read" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and other.control_daemon_pid() is None and other.server_pid() is None
        honest.round_trip()
    finally:
        honest.close()
