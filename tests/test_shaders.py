"""The shipped shaders: lookup helpers, validity, and freshness of the SPIR-V."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from libshare import shaders
from libshare.shaders import build

from tests.conftest import vulkan_required

SHIPPED = ["busy", "indirect_clamp", "matmul", "saxpy", "sum", "vadd"]


def require_tool(name: str) -> str:
    """Path of a command-line tool; skip without it, or fail when LIBSHARE_REQUIRE_VULKAN=1."""
    found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed"
        if vulkan_required():
            pytest.fail(f"{message} and LIBSHARE_REQUIRE_VULKAN=1")
        pytest.skip(message)
    return found


def test_names_lists_every_shipped_shader() -> None:
    assert shaders.names() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_paths_point_at_existing_files(name: str) -> None:
    assert shaders.path(name).name == f"{name}.spv"
    assert shaders.path(name).is_file()
    assert shaders.source_path(name).name == f"{name}.comp"
    assert shaders.source_path(name).is_file()


@pytest.mark.parametrize("lookup", [shaders.path, shaders.source_path])
@pytest.mark.parametrize("name", ["nope", "", "../saxpy", "saxpy.spv"])
def test_unknown_name_raises_value_error_listing_names(lookup, name: str) -> None:
    with pytest.raises(ValueError, match="available: busy, indirect_clamp, matmul, saxpy, sum, vadd"):
        lookup(name)


@pytest.mark.parametrize("name", SHIPPED)
def test_spirv_passes_spirv_val(name: str) -> None:
    validator = require_tool("spirv-val")
    command = [validator, "--target-env", "vulkan1.1", str(shaders.path(name))]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", SHIPPED)
def test_checked_in_spirv_matches_a_fresh_compile(name: str) -> None:
    require_tool(os.environ.get("GLSLANG_VALIDATOR", "glslangValidator"))
    fresh = build.compile_reproducibly(shaders.source_path(name))
    assert fresh == shaders.path(name).read_bytes(), (
        f"shaders/{name}.spv is stale (or was built by another glslang release): "
        "run `python -m libshare.shaders.build` (or `python shaders/build.py`) and commit the .spv"
    )


def test_build_check_reports_everything_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    require_tool(os.environ.get("GLSLANG_VALIDATOR", "glslangValidator"))
    assert build.main(["--check"]) == 0
    assert "all shaders up to date" in capsys.readouterr().out


def test_every_source_has_spirv() -> None:
    assert [source.stem for source in build.sources()] == shaders.names()
