"""The README's main command: the multi-process demo, on the embedded default and with a daemon."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.arbiter.conftest import daemon  # noqa: F401  (fixture)
from tests.conftest import ROOT


def run_demo(pipe_dir) -> str:
    env = dict(os.environ, LIBSHARE_PIPE_DIRECTORY=str(pipe_dir))
    done = subprocess.run([sys.executable, "-m", "libshare.demo", "--clients", "4", "--seconds", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()[2:] if line.split() and line.split()[0].isdigit()]


@pytest.mark.usefixtures("vulkan_device_name")
def test_demo_on_the_embedded_default(tmp_path):
    table = run_demo(tmp_path / "no-daemon-here")
    assert "embedded" in table and "checked against numpy" in table
    found = rows(table)
    assert sorted(r[1] for r in found) == ["matmul", "saxpy", "sum", "vadd"]
    assert all(int(r[2]) > 0 for r in found)


def test_demo_with_a_daemon(daemon):  # noqa: F811
    _, pipe_dir = daemon
    table = run_demo(pipe_dir)
    assert f"daemon at {pipe_dir}" in table
    assert len(rows(table)) == 4
