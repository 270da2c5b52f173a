"""What each process imports follows what it is: the CLI, the control daemon, the Kubernetes plugin,
the Slurm hooks and a client load nothing of the engine, the device layer or Vulkan.

Checked twice: in a fresh interpreter's ``sys.modules`` after importing each entry point, and in
the memory map of a running control daemon (``/proc/PID/maps``), where a C extension or the
Vulkan loader would show as a mapped file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.control.conftest import control

ENTRY_POINTS = ["libshare.control", "libshare.daemon.supervisor", "libshare.k8s", "libshare.slurm",
                "libshare.manager", "libshare"]
"""The modules behind libshare-control, the control daemon, the device plugin, the Slurm hooks,
the manager and a client."""

ENGINE_AND_DEVICE = ("libshare.arbiter.engine", "libshare.arbiter.device", "libshare.arbiter.drain",
                     "libshare.arbiter.serve", "libshare.arbiter.programs", "vulkan")
"""Prefixes of the modules that only an arbiter may import."""

MAPPED_ONLY_BY_AN_ARBITER = ("_engine_cffi", "_emergency_cffi", "libvulkan", "_vulkan")
"""Pieces of file names that only an arbiter process maps."""


def _heavy(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(ENGINE_AND_DEVICE))


def _modules_after_import(module: str) -> list[str]:
    script = f"import json, sys, {module}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_an_entry_point_imports_nothing_of_the_engine_or_the_device(module):
    loaded = _modules_after_import(module)
    assert module in loaded
    assert _heavy(loaded) == [], f"importing {module} loaded {_heavy(loaded)}"


def test_the_check_sees_an_arbiter_import():
    """The check is not blind: the arbiter's own module loads the engine and the device layer."""
    loaded = _modules_after_import("libshare.arbiter.serve.server")
    assert any(m.startswith("libshare.arbiter.engine") for m in loaded)
    assert any(m.startswith("libshare.arbiter.device") for m in loaded)


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.vulkan
def test_a_running_control_daemon_maps_no_engine_and_no_vulkan(dirs, daemon):
    supervisor = dirs.control_daemon_pid()
    assert supervisor is not None and supervisor != daemon
    daemon_maps, arbiter_maps = _maps(supervisor), _maps(daemon)
    assert "python" in daemon_maps  # the map was read
    found = [piece for piece in MAPPED_ONLY_BY_AN_ARBITER if piece in daemon_maps]
    assert found == [], f"the control daemon (pid {supervisor}) maps {found}"
    # The arbiter it supervises does map them: the pieces name what they should.
    assert "_engine_cffi" in arbiter_maps and "libvulkan" in arbiter_maps
    assert control(*dirs.args, "quit").returncode == 0
