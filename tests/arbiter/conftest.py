"""Fixtures for arbiter tests: a real daemon in a temporary pipe directory, client processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ..conftest import ROOT


@pytest.fixture
def daemon(tmp_path, vulkan_device_name):
    """A running ``python -m libshare.arbiter`` on lavapipe; yields (process, pipe directory)."""
    pipe_dir = tmp_path / "pipe"
    process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir)],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (pipe_dir / "control").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"arbiter did not start: {process.communicate()[1][-2000:]}")
        time.sleep(0.05)
    yield process, pipe_dir
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    process.stdout.close()
    process.stderr.close()


def start_client(role: str, pipe_dir, *args) -> subprocess.Popen:
    """Start ``tests/arbiter/_client.py ROLE PIPE_DIR ARGS`` with its stdout piped."""
    return subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", role, str(pipe_dir), *map(str, args)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
