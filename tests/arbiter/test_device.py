"""Tests of libshare.arbiter.device against a real Vulkan driver (lavapipe in CI).

No mocks: each test imports mmap'd host memory into the device, dispatches a small
SPIR-V kernel compiled here from GLSL, and checks the result with numpy.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from libshare.errors import InvalidSubmission, VulkanUnavailable

pytestmark = pytest.mark.vulkan

SAXPY_GLSL = """
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; float a; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) y[i] = p.a * x[i] + y[i];
}
"""


def _vulkan_missing(reason: str) -> None:
    """Fail when CI demands Vulkan (LIBSHARE_REQUIRE_VULKAN=1), else skip."""
    if os.environ.get("LIBSHARE_REQUIRE_VULKAN") == "1":
        pytest.fail(f"LIBSHARE_REQUIRE_VULKAN=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def device():
    """One real Device for the module; skips (or fails, see above) without Vulkan."""
    from libshare.arbiter.device import Device

    try:
        dev = Device()
    except VulkanUnavailable as exc:
        _vulkan_missing(f"Vulkan is unavailable: {exc}")
    with dev:
        yield dev


@pytest.fixture(scope="module")
def saxpy_spirv(tmp_path_factory) -> bytes:
    """SPIR-V of ``y[i] = a * x[i] + y[i]`` with push constants {uint n; float a;}."""
    compiler = shutil.which("glslangValidator")
    if compiler is None:
        _vulkan_missing("glslangValidator is not installed (apt-get install glslang-tools)")
    folder = tmp_path_factory.mktemp("shaders")
    (folder / "saxpy.comp").write_text(SAXPY_GLSL)
    subprocess.run([compiler, "-V", "saxpy.comp", "-o", "saxpy.spv"], cwd=folder, check=True, capture_output=True)
    return (folder / "saxpy.spv").read_bytes()


@pytest.fixture(scope="module")
def saxpy(device, saxpy_spirv):
    """The saxpy pipeline: two storage buffers, 8 bytes of push constants."""
    pipeline = device.create_pipeline(saxpy_spirv, binding_count=2, push_size=8)
    yield pipeline
    device.destroy_pipeline(pipeline)


@pytest.fixture
def host(device):
    """Factory of (numpy array, Buffer) pairs on imported mmap'd memory, freed after the test."""
    made = []

    def make(n: int, fill: float = 0.0):
        size = -(-n * 4 // device.host_import_alignment) * device.host_import_alignment
        memory = mmap.mmap(-1, size)
        array = np.frombuffer(memory, np.float32)
        array[:] = fill
        buf = device.import_host(array.ctypes.data, size)
        made.append((buf, memory))
        return array[:n], buf

    yield make
    device.wait_idle()
    for buf, _memory in made:
        device.destroy_buffer(buf)


def _saxpy(pipeline, x, y, n: int, a: float):
    """A Dispatch of saxpy over n elements."""
    from libshare.arbiter.device import Dispatch

    return Dispatch(pipeline, [(x, 0), (y, 0)], (-(-n // 64), 1, 1), struct.pack("If", n, a))


def _run(device, commands, timed=True):
    """Submit, wait, return device_ns, release."""
    sub = device.submit(commands, timed=timed)
    assert sub.wait(10.0)
    assert sub.done()
    ns = sub.device_ns
    sub.release()
    return ns


def test_properties(device):
    assert device.name
    assert len(device.uuid) == 36 and device.uuid.count("-") == 4
    assert all(count >= 65535 for count in device.max_group_count)
    assert device.max_push_constants_size >= 128
    assert device.host_import_alignment > 0
    assert device.timestamp_period_ns > 0


def test_saxpy(device, saxpy, host):
    n = 1000  # not a multiple of the workgroup size
    x, bx = host(n)
    y, by = host(n)
    x[:] = np.arange(n, dtype=np.float32)
    y[:] = 1.0
    _run(device, [_saxpy(saxpy, bx, by, n, 3.0)])
    np.testing.assert_allclose(y, 3.0 * np.arange(n) + 1.0)


def test_second_dispatch_sees_first(device, saxpy, host):
    n = 4096
    x, bx = host(n, 1.0)
    y, by = host(n, 2.0)
    z, bz = host(n, 0.5)
    # y = 3x + y, then z = 10y + z: the second reads what the first wrote.
    _run(device, [_saxpy(saxpy, bx, by, n, 3.0), _saxpy(saxpy, by, bz, n, 10.0)])
    np.testing.assert_allclose(y, 5.0)
    np.testing.assert_allclose(z, 50.5)


def test_identical_dispatches_in_one_batch_run_in_order(device, saxpy, host):
    n = 256
    x, bx = host(n, 1.0)
    y, by = host(n, 0.0)
    step = _saxpy(saxpy, bx, by, n, 1.0)
    for timed in (True, False, True):  # the second round reuses cached recordings
        _run(device, [step] * 40, timed=timed)
    np.testing.assert_allclose(y, 120.0)


def test_consecutive_submissions_are_ordered(device, saxpy, host):
    n = 512
    x, bx = host(n, 1.0)
    y, by = host(n, 0.0)
    subs = [device.submit([_saxpy(saxpy, bx, by, n, 2.0)], timed=False) for _ in range(10)]
    assert subs[-1].wait(10.0)
    for sub in subs:
        assert sub.wait(0)
        sub.release()
    np.testing.assert_allclose(y, 20.0)


def test_copy_through_device_buffer(device, host):
    from libshare.arbiter.device import Copy

    n = 2048
    src, bsrc = host(n)
    dst, bdst = host(n, -1.0)
    src[:] = np.random.default_rng(7).standard_normal(n, dtype=np.float32)
    staging = device.alloc_device(n * 4)
    try:
        _run(device, [Copy(bsrc, 0, staging, 0, n * 4), Copy(staging, 0, bdst, 0, n * 4)])
        np.testing.assert_array_equal(dst, src)
        # Offsets: the second half back onto the first half of dst.
        _run(device, [Copy(staging, n * 2, bdst, 0, n * 2)])
        np.testing.assert_array_equal(dst[: n // 2], src[n // 2 :])
    finally:
        device.destroy_buffer(staging)


def test_device_ns(device, saxpy, host):
    n = 1 << 16
    x, bx = host(n, 1.0)
    y, by = host(n, 0.0)
    single = _run(device, [_saxpy(saxpy, bx, by, n, 1.0)])
    assert len(single) == 1 and single[0] > 0
    batch = _run(device, [_saxpy(saxpy, bx, by, n, 1.0)] * 3)
    assert len(batch) == 3 and all(ns > 0 for ns in batch)
    assert _run(device, [_saxpy(saxpy, bx, by, n, 1.0)], timed=False) is None


def test_device_ns_needs_completion_and_no_release(device, saxpy, host):
    x, bx = host(64, 1.0)
    y, by = host(64)
    sub = device.submit([_saxpy(saxpy, bx, by, 64, 1.0)])
    assert sub.wait(10.0)
    sub.release()
    sub.release()  # idempotent
    with pytest.raises(InvalidSubmission):
        sub.device_ns


def test_only_push_constants_differ(device, saxpy, host):
    n = 128
    x, bx = host(n, 1.0)
    ys = [host(n, 0.0) for _ in range(4)]
    for a in (1.0, 2.0, 3.0, 1.0, 2.0):  # repeats hit the cache
        _run(device, [_saxpy(saxpy, bx, ys[0][1], n, a)])
    np.testing.assert_allclose(ys[0][0], 9.0)
    _run(device, [_saxpy(saxpy, bx, by, n, float(a)) for a, (_y, by) in enumerate(ys[1:], start=1)])
    for a, (y, _by) in enumerate(ys[1:], start=1):
        np.testing.assert_allclose(y, float(a))


def test_misaligned_import_raises(device):
    alignment = device.host_import_alignment
    memory = mmap.mmap(-1, 4 * alignment)
    address = np.frombuffer(memory, np.uint8).ctypes.data
    with pytest.raises(InvalidSubmission):
        device.import_host(address + 4, alignment)
    with pytest.raises(InvalidSubmission):
        device.import_host(address, alignment + 4)
    with pytest.raises(InvalidSubmission):
        device.import_host(address, 0)


def test_bad_selector_names_the_devices(device):
    from libshare.arbiter.device import Device

    with pytest.raises(VulkanUnavailable, match=re.escape(device.name)):
        Device("no-such-device")
    with pytest.raises(VulkanUnavailable):
        Device("97")


def test_select_by_uuid_and_index(device):
    from libshare.arbiter.device import Device

    with Device(device.uuid.replace("-", "").upper()) as same:
        assert same.uuid == device.uuid
    with Device("0") as first:
        assert first.name


def test_invalid_commands_raise(device, saxpy, host):
    from libshare.arbiter.device import Copy, Dispatch

    x, bx = host(64)
    y, by = host(64)
    bad = [
        Dispatch(saxpy, [(bx, 0)], (1, 1, 1), b"\0" * 8),  # one buffer short
        Dispatch(saxpy, [(bx, 0), (by, 2)], (1, 1, 1), b"\0" * 8),  # misaligned offset
        Dispatch(saxpy, [(bx, 0), (by, 1 << 20)], (1, 1, 1), b"\0" * 8),  # offset past the end
        Dispatch(saxpy, [(bx, 0), (by, 0)], (1, 1, 1), b"\0" * 12),  # push too long
        Dispatch(saxpy, [(bx, 0), (by, 0)], (device.max_group_count[0] + 1, 1, 1), b"\0" * 8),  # too many groups
        Copy(bx, 0, by, 0, 1 << 20),  # copy past the end
        Copy(bx, 0, bx, 8, 64),  # overlapping copy
        Dispatch(saxpy, [(bx, 0, 0), (by, 0)], (1, 1, 1), b"\0" * 8),  # not a (buffer, offset) pair
        "not a command",
    ]
    for command in bad:
        with pytest.raises(InvalidSubmission):
            device.submit([_saxpy(saxpy, bx, by, 64, 1.0), command])
    _run(device, [])  # nothing leaked: the device still works


def test_bad_pipelines_raise(device, saxpy_spirv):
    with pytest.raises(InvalidSubmission):
        device.create_pipeline(b"\0" * 64, 2, 8)
    with pytest.raises(InvalidSubmission):
        device.create_pipeline(saxpy_spirv, 2, device.max_push_constants_size + 4)


def test_destroy_refused_while_in_use(device, saxpy, host):
    x, bx = host(64)
    y, by = host(64)
    sub = device.submit([_saxpy(saxpy, bx, by, 64, 1.0)])
    sub.wait(10.0)
    with pytest.raises(InvalidSubmission):
        device.destroy_buffer(by)
    sub.release()
    device.destroy_buffer(by)
    assert not by.alive
    with pytest.raises(InvalidSubmission):
        device.submit([_saxpy(saxpy, bx, by, 64, 1.0)])


def test_cache_is_bounded(device, saxpy_spirv):
    from libshare.arbiter.device import Device

    with Device(cache_size=8) as dev:
        pipeline = dev.create_pipeline(saxpy_spirv, 2, 8)
        memory = mmap.mmap(-1, 2 * dev.host_import_alignment)
        data = np.frombuffer(memory, np.float32)
        data[:] = 1.0
        half = dev.host_import_alignment
        bx = dev.import_host(data.ctypes.data, half)
        by = dev.import_host(data.ctypes.data + half, half)
        for a in range(50):
            _run(dev, [_saxpy(pipeline, bx, by, 64, float(a))], timed=a % 2 == 0)
            assert len(dev.recordings) <= 8
        _run(dev, [_saxpy(pipeline, bx, by, 64, 1.0)] * 20)  # in flight at once: may exceed, then shrinks
        _run(dev, [_saxpy(pipeline, bx, by, 64, 2.0)])
        assert len(dev.recordings) <= 8
        np.testing.assert_allclose(data[half // 4 : half // 4 + 64], 1.0 + sum(range(50)) + 20.0 + 2.0)
        # A command whose cache entry is evicted while in flight still protects its buffers.
        pending = dev.submit([_saxpy(pipeline, by, bx, 64, 0.0)])
        for a in range(20):
            _run(dev, [_saxpy(pipeline, bx, by, 64, 100.0 + a)])
        with pytest.raises(InvalidSubmission):
            dev.destroy_buffer(bx)
        assert pending.wait(10.0)
        pending.release()
        dev.destroy_buffer(bx)


def test_close_is_idempotent_and_final(device, saxpy_spirv):
    from libshare.arbiter.device import Device

    dev = Device()
    dev.create_pipeline(saxpy_spirv, 2, 8)
    dev.close()
    dev.close()
    with pytest.raises(InvalidSubmission):
        dev.submit([])


@pytest.mark.parametrize("count", [1, 3], ids=["single", "batch"])
def test_device_ns_of_finished_work_does_not_wait_for_later_work(device, saxpy, host, count):
    x, bx = host(64, 1.0)
    y, by = host(64)
    n = 1 << 19
    big_x, big_bx = host(n, 1.0)
    big_y, big_by = host(n)
    first = device.submit([_saxpy(saxpy, bx, by, 64, 1.0)] * count)
    later = device.submit([_saxpy(saxpy, big_bx, big_by, n, 1.0)] * 200)  # a second or so on lavapipe
    assert first.wait(10.0)
    assert len(first.device_ns) == count and all(ns > 0 for ns in first.device_ns)
    assert not later.done(), "reading the timestamps waited for the submission after them"
    assert later.wait(60.0)
    assert big_y[0] == 200.0 and y[0] == count
    first.release()
    later.release()


@pytest.mark.parametrize("cpu", [True, False], ids=["anonymous-pages", "zero-fill"])
def test_fresh_device_buffers_read_as_zeros_on_both_paths(device, host, cpu):
    """Lavapipe takes the anonymous-pages path; ``cpu=False`` drives the fill a GPU gets, on the same driver."""
    from libshare.arbiter.device import Copy

    n = 16 << 10
    pattern, source = host(n, 7.0)
    out, sink = host(n)
    anonymous, device.memory.anonymous = device.memory.anonymous, cpu
    try:
        for _ in range(3):  # freed memory is the next buffer's: it must never show the pattern
            dirty = device.alloc_device(n * 4)
            _run(device, [Copy(source, 0, dirty, 0, n * 4)])
            device.destroy_buffer(dirty)
            fresh = device.alloc_device(n * 4)
            _run(device, [Copy(fresh, 0, sink, 0, n * 4)])
            assert not out.any(), "a fresh device buffer held data"
            device.destroy_buffer(fresh)
        device.wait_idle()
        assert device.clearing_bytes == 0
    finally:
        device.memory.anonymous = anonymous


def test_importing_the_package_loads_no_vulkan():
    """The binding loads when a Device is built, not on import: the arbiter's parent process
    imports the package without loading Vulkan (see ``_compiler.py``)."""
    code = "import sys, libshare.arbiter.device; assert 'vulkan' not in sys.modules, 'vulkan was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
