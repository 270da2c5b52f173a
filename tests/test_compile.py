"""libshare.compile: GLSL and HLSL to SPIR-V with glslangValidator, its messages, its cache."""

from __future__ import annotations

import shutil

import pytest

import libshare
from libshare import compiling
from libshare.arbiter.programs.spirv import reflect

pytestmark = pytest.mark.skipif(shutil.which("glslangValidator") is None,
                                reason="glslangValidator is not installed (apt-get install glslang-tools)")

GLSL = """\
#version 450
layout(local_size_x = WIDTH) in;
layout(std430, binding = 0) buffer Out { float data[]; };
void main() { data[gl_GlobalInvocationID.x] = float(gl_GlobalInvocationID.x); }
"""
HLSL = """\
RWStructuredBuffer<float> data : register(u0);
[numthreads(WIDTH, 1, 1)]
void scale(uint3 id : SV_DispatchThreadID) { data[id.x] = 2.0 * id.x; }
"""


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "libshare" / "spirv"


def test_glsl_compiles_with_its_defines():
    spirv = libshare.compile(GLSL, defines={"WIDTH": 32})
    assert reflect(spirv).local_size == (32, 1, 1)
    assert reflect(libshare.compile(GLSL, defines={"WIDTH": 8})).local_size == (8, 1, 1)
    assert reflect(libshare.compile(GLSL.encode(), "comp", {"WIDTH": 8}, "vulkan1.1")).local_size == (8, 1, 1)


def test_hlsl_compiles_with_its_entry_point():
    spirv = libshare.compile(HLSL, language="hlsl", entry_point="scale", defines={"WIDTH": 16})
    interface = reflect(spirv)
    assert interface.local_size == (16, 1, 1) and interface.entry_point == "scale"


def test_a_refusal_carries_the_compilers_message():
    with pytest.raises(libshare.CompileError, match=r"<source>:4: 'undefined_thing' : undeclared identifier"):
        libshare.compile(GLSL.replace("float(gl_GlobalInvocationID.x)", "undefined_thing"), defines={"WIDTH": 1})
    with pytest.raises(libshare.CompileError, match="WIDTH"):  # the define it lacks
        libshare.compile(GLSL)
    with pytest.raises(libshare.InvalidSubmission):  # a CompileError is one
        libshare.compile(HLSL.replace("2.0 *", "2.0 +*"), language="hlsl", entry_point="scale",
                         defines={"WIDTH": 1})


def test_bad_arguments_are_refused_before_the_compiler_runs():
    for kwargs in ({"stage": "compute"}, {"defines": {"A B": 1}}, {"defines": {"A": "1\n#error"}},
                   {"target_env": "vulkan9"}, {"language": "wgsl"}, {"language": "hlsl", "entry_point": "a;b"}):
        with pytest.raises(ValueError):
            libshare.compile(GLSL, **kwargs)
    with pytest.raises(TypeError):
        libshare.compile(42)


def test_a_missing_compiler_is_a_compile_error_that_says_what_to_install(monkeypatch):
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    with pytest.raises(libshare.CompileError, match="glslang-tools"):
        libshare.compile(GLSL, defines={"WIDTH": 1})


def test_a_cache_hit_returns_the_same_bytes_without_compiling(cache, monkeypatch):
    first = libshare.compile(GLSL, defines={"WIDTH": 4})
    assert [path.read_bytes() for path in cache.glob("*.spv")] == [first]
    assert cache.stat().st_mode & 0o777 == 0o700

    def no_compiler(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(compiling, "_run", no_compiler)
    assert libshare.compile(GLSL, defines={"WIDTH": 4}) == first
    with pytest.raises(AssertionError):  # other defines: another entry
        libshare.compile(GLSL, defines={"WIDTH": 5})


def test_a_damaged_cache_entry_is_compiled_again(cache):
    first = libshare.compile(GLSL, defines={"WIDTH": 4})
    (entry,) = cache.glob("*.spv")
    entry.write_bytes(b"not SPIR-V")
    assert libshare.compile(GLSL, defines={"WIDTH": 4}) == first
    assert entry.read_bytes() == first


def test_the_cache_keeps_at_most_its_bound(cache, monkeypatch):
    size = len(libshare.compile(GLSL, defines={"WIDTH": 1}))
    monkeypatch.setattr(compiling, "CACHE_BYTES", 3 * size)
    for width in range(2, 8):
        libshare.compile(GLSL, defines={"WIDTH": width})
    assert sum(path.stat().st_size for path in cache.glob("*.spv")) <= 3 * size
    assert not list(cache.glob(".compile-*"))  # no temporary file left


def test_a_source_with_includes_is_not_cached(cache):
    source = GLSL.replace("#version 450\n", "#version 450\n#extension GL_GOOGLE_include_directive : require\n"
                          "#include \"missing.glsl\"\n")
    with pytest.raises(libshare.CompileError, match="missing.glsl"):
        libshare.compile(source, defines={"WIDTH": 1})
    assert not list(cache.glob("*.spv"))
