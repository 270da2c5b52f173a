"""Fixtures of the Vulkan driver's tests: an arbiter daemon, and programs run through libshare-run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.arbiter.conftest import run_daemon

PROBE = Path(__file__).resolve().parent / "_probe.py"
"""The unmodified Vulkan program the tests run (it knows nothing of libshare)."""


def compiled(tmp_path: Path, name: str, text: str, env: str | None = None) -> Path:
    """``text`` (GLSL) compiled to SPIR-V by glslangValidator (for Vulkan environment ``env``, else its
    default); the test skips without it."""
    if shutil.which("glslangValidator") is None:
        pytest.skip("glslangValidator is not installed (apt-get install glslang-tools)")
    source, out = tmp_path / f"{name}.comp", tmp_path / f"{name}.spv"
    source.write_text(text)
    target = ["--target-env", env] if env else []
    subprocess.run(["glslangValidator", "-V", *target, str(source), "-o", str(out)], check=True, capture_output=True)
    return out


@pytest.fixture
def daemon(tmp_path, vulkan_device_name):
    """An arbiter on its own pipe directory: (process, pipe_dir)."""
    with contextlib.contextmanager(run_daemon)(tmp_path / "pipe") as started:
        yield started


def environment(pipe_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment, pointed at ``pipe_dir``, without the loader's driver variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")}
    return {**env, "LIBSHARE_PIPE_DIRECTORY": str(pipe_dir), "PYTHONPATH": str(ROOT), **extra}


def libshare_run(*args: str) -> list[str]:
    """The command line of ``libshare-run ARGS`` (the module, so a stale console script cannot hide a change)."""
    return [sys.executable, "-m", "libshare.run", *args]


def probe(command: list[str], env: dict[str, str]) -> dict:
    """Run the probe by ``command`` (ending in the probe's own command line); what it printed, parsed. It
    must exit 0: no crash, whatever the driver said."""
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return {**json.loads(done.stdout.splitlines()[0]), "stderr": done.stderr}
