"""The examples run and check their own results."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.usefixtures("vulkan_device_name")
@pytest.mark.parametrize("script, expected_lines", [("single_client.py", 1), ("multi_process.py", 4)])
def test_example(tmp_path, script, expected_lines):
    env = dict(os.environ, LIBSHARE_PIPE_DIRECTORY=str(tmp_path))
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("right") == expected_lines  # processes' lines may interleave
