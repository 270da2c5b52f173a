"""The Vulkan driver's shader modules, pipelines, layouts and descriptor sets under an unmodified program.

tests/icd/_pipelines.py (the ``vulkan`` bindings, through the real loader and ``libshare-run``, against a
real arbiter with lavapipe behind it) makes a compute pipeline of a GLSL kernel with specialization
constants (its workgroup size among them) over two descriptor sets with a gap, uniform and storage
buffers: the arbiter holds its program for the device's session (with one program a client, a second
pipeline is refused while it lives, and one is made again once it is destroyed); an image kernel is
refused with the arbiter's reason on stderr and a null handle; a sampler layout is refused and reported
unsupported; pools refuse sets past maxSets and frees without their flag, and reset and free give sets
back; a pool declaring every descriptor type (Taichi's) gives buffer sets; descriptor writes misaligned, of the wrong type or past a binding are skipped and named on
stderr. Constants of every width (int64, double, int16, uint8, float16, uint64) reach the arbiter typed
as the module declares them. A hostile program (wrong handles of every new kind, a specialization entry past its data, a
module of garbage) gets errors, beside an honest Python client whose results are checked. What no
Vulkan program can read back (the program a pipeline recorded, descriptors resolved into the arbiter's
terms after plain, template and copied writes) is read by tests/icd/pipelines_unit.c, built with the
driver's sources and the sanitizers, against the real arbiter.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libshare.icd import _build
from tests.conftest import ROOT, stop_process
from tests.arbiter.conftest import run_daemon, start_client
from tests.icd.conftest import compiled, environment, libshare_run, probe
from tests.icd.test_c_program import SANITIZE

PIPELINES = Path(__file__).resolve().parent / "_pipelines.py"
KERNEL = """#version 450
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const float SCALE = 1.0;
layout(constant_id = 2) const bool FLIP = false;
layout(constant_id = 3) const int SHIFT = 0;
layout(set = 0, binding = 0) buffer Out { float o[]; };
layout(set = 0, binding = 2) uniform U { vec4 u; };
layout(set = 1, binding = 0) readonly buffer In0 { float x[]; };
layout(set = 1, binding = 1) readonly buffer In1 { float y[]; };
layout(push_constant) uniform P { uint n; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= n) return;
    float v = x[i] * SCALE + y[i] + float(SHIFT) + u.x;
    o[i] = FLIP ? -v : v;
}
"""
IMAGE = """#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0, rgba8) uniform writeonly image2D img;
void main() { imageStore(img, ivec2(0), vec4(1)); }
"""
WIDE = """#version 450
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 1) in;
layout(constant_id = 0) const int64_t BIG = 0;
layout(constant_id = 1) const double D = 0.0;
layout(constant_id = 2) const int16_t SMALL = int16_t(0);
layout(constant_id = 3) const uint8_t TINY = uint8_t(0);
layout(constant_id = 4) const float16_t HALF = float16_t(0);
layout(constant_id = 5) const uint64_t UBIG = 0;
layout(set = 0, binding = 0) buffer Out { double o[]; };
void main() { o[0] = double(BIG) + D + double(SMALL) + double(TINY) + double(HALF) + double(UBIG); }
"""
INVALID = "VkErrorUnknown"  # VK_ERROR_UNKNOWN: invalid input the driver detected
VK_ERROR_OUT_OF_POOL_MEMORY = -1000069000
VK_INCOMPLETE = 5


@pytest.fixture
def one_program_daemon(tmp_path, vulkan_device_name):
    """An arbiter whose clients may each hold one program: (process, pipe_dir)."""
    with contextlib.contextmanager(run_daemon)(tmp_path / "pipe", LIBSHARE_MAX_PROGRAMS="1") as started:
        yield started


def read_json(program) -> dict:
    return json.loads(program.stdout.readline())


def test_a_pipeline_is_the_sessions_program_and_descriptors_are_checked(tmp_path, one_program_daemon):
    _process, pipe_dir = one_program_daemon
    kernel, image = compiled(tmp_path, "kernel", KERNEL), compiled(tmp_path, "image", IMAGE)
    command = libshare_run("--name", "pipelines", "--", sys.executable, str(PIPELINES), "honest", str(kernel),
                           str(image))
    with subprocess.Popen(command, env=environment(pipe_dir), cwd=ROOT, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as program:
        try:
            assert read_json(program) == {"sampler layout": INVALID, "image layout": INVALID,
                                          "sampler supported": False, "pipeline": "ok"}
            assert program.stdout.readline() == "made\n"
            program.stdin.write("\n")
            program.stdin.flush()
            # The arbiter holds the first pipeline's program for this session: its one program.
            assert read_json(program) == {"second": "VkErrorOutOfDeviceMemory"}
            program.stdin.write("\n")
            program.stdin.flush()
            assert read_json(program) == {"again": "ok"}  # destroyed: its program was freed
            seen = read_json(program)
            program.stdin.close()
            stderr = program.stderr.read()
        finally:
            program.wait(60)
    assert program.returncode == 0, stderr
    assert seen == {
        "image kernel": INVALID, "image pipeline handle": 0, "wrong entry point": INVALID,
        "too small a layout": INVALID, "no push constants": INVALID,
        "cache header": True, "cache size": 32, "cache too short": [VK_INCOMPLETE, 0], "merged": "ok",
        "past max sets": [VK_ERROR_OUT_OF_POOL_MEMORY, 0], "free without the flag": "ok", "after the free": 0, "after reset": 0,
        "free with the flag": "ok", "after free": 0, "free another pool's": INVALID, "push template": INVALID,
        "every type": [0, "ok"],
    }
    assert "storage images, sampled images and samplers are not supported" in stderr  # the arbiter's reason
    assert 'the module\'s entry point is "main", not "other"' in stderr
    assert "the pipeline layout has no storage buffer binding 0 of set 1" in stderr
    skipped = [line for line in stderr.splitlines() if "vkUpdateDescriptorSets: write 0 skipped" in line]
    assert [line.split("skipped: ")[1] for line in skipped] == [
        "an offset not aligned to the device's minimum offset alignment",
        "no binding of that type holds its elements",  # a uniform write into a storage binding
        "no binding of that type holds its elements",  # past the last binding that holds any
        "a range of 0 or past the buffer",
    ], stderr
    assert "UpdateDescriptorSetWithTemplate" not in stderr  # the template's write was a good one


def test_hostile_pipelines_and_descriptors_end_in_errors_beside_an_honest_client(tmp_path, daemon):
    _process, pipe_dir = daemon
    kernel = compiled(tmp_path, "kernel", KERNEL)
    honest = start_client("mixed", pipe_dir, 5, 20)  # checks every result against numpy
    try:
        seen = probe(libshare_run("--name", "hostile", "--", sys.executable, str(PIPELINES), "hostile", str(kernel),
                                  str(kernel)), environment(pipe_dir))
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)
    assert {key: value for key, value in seen.items() if key != "stderr"} == {
        "garbage module": INVALID, "short module": INVALID, "junk module pipeline": INVALID,
        "wrong module": INVALID, "wrong layout": INVALID, "entry past its data": INVALID,
        "constant given twice": INVALID, "wrong constant size": INVALID, "wrong set layout": INVALID,
        "wrong cache data": -13, "wrong pool reset": INVALID, "wrong pool allocate": -13,
        "wrong layout allocate": -13, "wrong set free": INVALID, "wrong template layout": INVALID,
        "huge template": INVALID, "still works": "ok",
    }
    assert "invalid SPIR-V" in seen["stderr"]  # the arbiter's word on the junk module, passed on
    assert "write 0 skipped: no such buffer" in seen["stderr"]
    assert "copy 0 skipped: more descriptors than a set holds" in seen["stderr"]
    assert "vkUpdateDescriptorSetWithTemplate: entry 0 skipped: no data" in seen["stderr"]


def test_constants_of_every_width_are_sent_as_the_module_types_them(tmp_path, daemon):
    """The arbiter refuses a value its type cannot hold (-7 sent as 65529 for an int16, say): these pass,
    a NaN and infinities among them (spelled as JSON cannot, as the arbiter's reader takes them)."""
    _process, pipe_dir = daemon
    wide = compiled(tmp_path, "wide", WIDE)
    seen = probe(libshare_run("--", sys.executable, str(PIPELINES), "widths", str(wide), str(wide)),
                 environment(pipe_dir))
    assert {key: value for key, value in seen.items() if key != "stderr"} == {
        "every width": "ok", "not a number": "ok", "infinities": "ok", "int64 of 4 bytes": INVALID}


UNIT = Path(__file__).resolve().parent / "pipelines_unit.c"


def test_the_driver_records_the_program_and_resolves_descriptors(tmp_path, daemon):
    """pipelines_unit.c, built with the driver's sources and the sanitizers, reads what the driver keeps."""
    _process, pipe_dir = daemon
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    program = tmp_path / "pipelines_unit"
    subprocess.run(["cc", "-O1", "-g", "-std=gnu11", f"-I{_build.HERE}", f"-I{_build.RING}", *SANITIZE, "-o",
                    str(program), str(UNIT), *map(str, _build.SOURCES), "-lcjson", "-lm", "-lpthread"], check=True)
    done = subprocess.run([str(program), str(compiled(tmp_path, "kernel", KERNEL))], env=environment(pipe_dir),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, \
        done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["hostile"] == [-13, -13, -13]  # a module of junk, a constant past its data, another entry point
    assert "invalid SPIR-V" in done.stderr and "skipped: more descriptors than a set holds" in done.stderr
    # The second create info names a wrong layout: it alone fails, its handle null; the first is made.
    assert (seen["made"], seen["second"]) == (-13, 0)
    assert seen["local_size"] == [48, 1, 1]  # local_size_x_id's constant, frozen by the arbiter
    assert seen["buffers"] == 4 and seen["push_size"] == 4
    assert seen["resources"] == [[0, 0, 1], [0, 2, 1], [1, 0, 1], [1, 1, 1]]  # (set, binding) order
    buffer_id, memory_offset, other_offset, size = seen["buffer_id"], 65536, 131072, 8192
    # A dynamic uniform buffer written at 256 for 1024 bytes: the dynamic offset added, the range clipped.
    assert seen["dynamic"] == [[buffer_id, memory_offset + 256, 1024], [buffer_id, memory_offset + 512, 1024],
                               [buffer_id, memory_offset + 7680, size - 7680], -13]
    assert seen["never written"] == -13
    # Three elements from binding 1 on: binding 1, then binding 4's two (binding 3 holds none).
    written = [[buffer_id, memory_offset + 512, size - 512], [buffer_id, other_offset, 64],
               [buffer_id, other_offset + 4096, 4096]]
    assert seen["plain"] == written and seen["template"] == written and seen["copied"] == written
    assert seen["buffer destroyed"] == -13 and seen["memory freed"] == -13


SUBGROUPS = Path(__file__).resolve().parent / "_subgroups.py"
SUBGROUP_KERNEL = """#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) buffer Out { uint o[]; };
void main()
{
    uint i = gl_LocalInvocationIndex;
    o[2 * i] = gl_SubgroupSize;
    o[2 * i + 1] = subgroupAdd(1u);
}
"""


def test_subgroup_size_control_where_the_device_runs_one_size(daemon, tmp_path):
    """VK_EXT_subgroup_size_control, offered where the arbiter's device runs one subgroup size (lavapipe:
    8): a pipeline that requires that size and full subgroups runs as on the direct driver, every
    invocation in a full subgroup of that size; a size the device does not run, full subgroups of a
    workgroup narrower than one, and a required size with ALLOW_VARYING are refused."""
    _process, pipe_dir = daemon
    spv = compiled(tmp_path, "subgroups", SUBGROUP_KERNEL, "vulkan1.1")
    run = [sys.executable, str(SUBGROUPS), "run", str(spv)]
    direct = probe(run, environment(pipe_dir))
    if not direct["listed"] or direct["sizes"][0] != direct["sizes"][1]:
        pytest.skip("the device does not run one subgroup size: the driver does not offer size control")
    seen = probe(libshare_run("--name", "subgroups", "--", *run), environment(pipe_dir))
    size = direct["sizes"][1]
    assert (seen["listed"], seen["features"], seen["sizes"][:2], seen["made"]) == (True, [True, True], [size, size],
                                                                                   "ok"), seen
    assert seen["sizes"][2] & 0x20, seen["sizes"]  # VK_SHADER_STAGE_COMPUTE_BIT
    assert seen["output"] == direct["output"] == [size] * 128, seen["stderr"][-2000:]
    refused = probe(libshare_run("--name", "subgroups", "--", sys.executable, str(SUBGROUPS), "refusals", str(spv)),
                    environment(pipe_dir))
    assert {k: v for k, v in refused.items() if k != "stderr"} == {
        "twice the size": INVALID, "half a subgroup": INVALID, "varying and required": INVALID,
        "varying alone": "ok"}, refused
