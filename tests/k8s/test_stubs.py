"""The gRPC stubs: generated from the proto on first import into a private cache, never committed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc_tools")

from tests.conftest import ROOT  # noqa: E402

_IMPORT = ("from libshare.k8s._stubs import api_pb2, api_pb2_grpc\n"
           "print(api_pb2_grpc.__file__)\n"
           "assert api_pb2.DESCRIPTOR.package == 'v1beta1'\n"
           "assert api_pb2.DESCRIPTOR.services_by_name['DevicePlugin'].methods_by_name['ListAndWatch'].server_streaming")


def _import(cache: Path) -> Path:
    result = subprocess.run([sys.executable, "-c", _IMPORT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "LIBSHARE_K8S_STUB_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip())


def test_stubs_are_generated_once_into_a_private_cache(tmp_path):
    cache = tmp_path / "cache"
    first = _import(cache)
    (key,) = cache.iterdir()
    assert first.is_relative_to(key) and (key.stat().st_mode & 0o777) == 0o700
    assert sorted(p.name for p in first.parent.iterdir()) == ["api_pb2.py", "api_pb2_grpc.py"]
    assert _import(cache) == first and list(cache.iterdir()) == [key]


def test_a_cache_others_may_write_is_not_used(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    loaded = _import(cache)
    assert not loaded.is_relative_to(cache) and not loaded.exists()  # made in a private directory, then removed
    assert list(cache.iterdir()) == []


def test_nothing_generated_is_in_the_source_tree():
    assert not [p for p in (ROOT / "libshare").rglob("*_pb2*.py")]
    assert sorted(p.name for p in (ROOT / "libshare" / "k8s" / "proto").iterdir()) == ["LICENSE", "api.proto"]


def test_the_console_script_runs():
    script = shutil.which("libshare-k8s-device-plugin", path=str(Path(sys.executable).parent))
    assert script, "libshare-k8s-device-plugin is not installed beside python: reinstall (pip install -e '.[test]')"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--shares" in result.stdout
