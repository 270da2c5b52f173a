"""contrib/systemd/libshare-arbiter.service: it parses, and runs commands libshare-control has."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libshare.protocol.control import COMMANDS
from libshare.control import _parser

from tests.conftest import ROOT

UNIT = ROOT / "contrib" / "systemd" / "libshare-arbiter.service"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def _environment(service) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(service["Environment"]))


def test_unit_runs_the_arbiter_in_the_foreground_and_quits_it():
    service = _unit()["Service"]
    assert service["Type"] == "simple" and service["RuntimeDirectory"] == "libshare"
    assert _environment(service) == {"LIBSHARE_PIPE_DIRECTORY": "/run/libshare",
                                     "LIBSHARE_LOG_DIRECTORY": "/var/log/libshare"}
    start, stop = shlex.split(service["ExecStart"]), shlex.split(service["ExecStop"])
    assert Path(start[0]).name == Path(stop[0]).name == "libshare-control"
    started = _parser().parse_args(start[1:])
    assert started.foreground and not started.command
    stopped = _parser().parse_args(stop[1:])
    assert stopped.command[0] in COMMANDS and stopped.command[0] == "quit"
    assert _unit()["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    script = Path(sys.executable).parent / "libshare-control"
    if analyze is None or not script.exists():
        pytest.skip("needs systemd-analyze and an installed libshare-control script")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/libshare-control", str(script)))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
