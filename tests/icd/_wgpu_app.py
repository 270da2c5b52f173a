"""A wgpu-py program (WebGPU on Vulkan, wgpu-native underneath), unmodified.

``python _wgpu_app.py [run|steps|again]`` asks wgpu for its adapter and device, runs its kernels and
prints one JSON line: the adapter's name and backend, then each kernel's result as a list; with
``steps`` or ``again`` it then times or repeats them on demand (_steps.py). It knows nothing of
libshare: under ``libshare-run`` its Vulkan adapter is libshare's driver, directly the device's own
driver. tests/icd/test_applications.py compares the two runs, and the results with numpy.

The kernels use what wgpu makes of WGSL on Vulkan:

- ``affine``: a uniform buffer of parameters beside two storage buffers;
- ``scaled``: a pipeline-overridable constant (a specialization constant), set at pipeline creation;
- ``two_groups``: bind groups 0 and 1 (two descriptor sets);
- ``sums``: workgroup memory and barriers (a tree reduction per workgroup);
- ``histogram``: storage atomics;
- ``indirect``: a dispatch whose workgroup count is read from a buffer;
- ``chain``: 64 compute passes in one command buffer, each adding 1 to every element;
- ``copies``: ``write_buffer``, ``clear_buffer`` and ``copy_buffer_to_buffer`` between passes;
- ``half`` (where the adapter offers ``shader-f16``): float16 arithmetic;
- ``timed`` (where it offers ``timestamp-query``): a pass's timestamps written and resolved into a
  buffer: whether the first is past 0 and the second not before it.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import wgpu

from _steps import again, steps

N = 1024
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST

AFFINE = """
struct Params { a: f32, b: f32, n: u32, pad: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n) { y[id.x] = params.a * x[id.x] + params.b; }
}
"""

SCALED = """
override scale: f32 = 1.0;
@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) { v[id.x] = v[id.x] * scale; }
"""

TWO_GROUPS = """
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(1) @binding(0) var<storage, read> b: array<f32>;
@group(1) @binding(1) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) { c[id.x] = a[id.x] - 2.0 * b[id.x]; }
"""

SUMS = """
var<workgroup> partial: array<f32, 64>;
@group(0) @binding(0) var<storage, read> v: array<f32>;
@group(0) @binding(1) var<storage, read_write> sums: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(local_invocation_index) i: u32,
        @builtin(workgroup_id) group: vec3<u32>) {
    partial[i] = v[id.x];
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride = stride / 2u) {
        if (i < stride) { partial[i] = partial[i] + partial[i + stride]; }
        workgroupBarrier();
    }
    if (i == 0u) { sums[group.x] = partial[0]; }
}
"""

HISTOGRAM = """
@group(0) @binding(0) var<storage, read> v: array<u32>;
@group(0) @binding(1) var<storage, read_write> bins: array<atomic<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) { atomicAdd(&bins[v[id.x] % 16u], 1u); }
"""

HALF = """
enable f16;
@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) { let h = f16(v[id.x]); v[id.x] = f32(h * 2.0h + 0.5h); }
"""

OPTIONAL = ("shader-f16", "timestamp-query")

INCREMENT = """
@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) { v[id.x] = v[id.x] + 1.0; }
"""


class Kernels:
    """The device and what each kernel needs to run on it."""

    def __init__(self) -> None:
        self.adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        self.features = [feature for feature in OPTIONAL if feature in self.adapter.features]
        self.device = self.adapter.request_device_sync(required_features=self.features)

    def buffer(self, data: np.ndarray, usage=STORAGE):
        return self.device.create_buffer_with_data(data=data, usage=usage)

    def read(self, buffer, dtype) -> list:
        return np.frombuffer(self.device.queue.read_buffer(buffer), dtype).tolist()

    def pipeline(self, code: str, constants: dict | None = None):
        module = self.device.create_shader_module(code=code)
        return self.device.create_compute_pipeline(layout="auto", compute={
            "module": module, "entry_point": "main", "constants": constants or {}})

    def group(self, pipeline, index: int, *buffers):
        return self.device.create_bind_group(layout=pipeline.get_bind_group_layout(index), entries=[
            {"binding": k, "resource": {"buffer": b}} for k, b in enumerate(buffers)])

    def run(self, pipeline, groups, count: int = N // 64, indirect=None, timed=None) -> None:
        encoder = self.device.create_command_encoder()
        compute = encoder.begin_compute_pass(timestamp_writes=timed and {
            "query_set": timed[0], "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
        compute.set_pipeline(pipeline)
        for index, group in enumerate(groups):
            compute.set_bind_group(index, group)
        if indirect is None:
            compute.dispatch_workgroups(count)
        else:
            compute.dispatch_workgroups_indirect(indirect, 0)
        compute.end()
        if timed:
            encoder.resolve_query_set(timed[0], 0, 2, timed[1], 0)
        self.device.queue.submit([encoder.finish()])


def run_optional(k: Kernels, x: np.ndarray, results: dict) -> None:
    """The kernels of the optional features the adapter offers."""
    increment = k.pipeline(INCREMENT)
    if "shader-f16" in k.features:
        v = k.buffer(x)
        half = k.pipeline(HALF)
        k.run(half, [k.group(half, 0, v)])
        results["half"] = k.read(v, np.float32)
    if "timestamp-query" in k.features:
        stamps = k.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        k.run(increment, [k.group(increment, 0, k.buffer(x))],
              timed=(k.device.create_query_set(type="timestamp", count=2), stamps))
        first, second = np.frombuffer(k.device.queue.read_buffer(stamps), np.uint64).tolist()
        results["timed"] = [first > 0, second >= first]


def run_all(k: Kernels, x: np.ndarray, words: np.ndarray) -> dict:
    """Every kernel once; each result as a list."""
    results = {}
    params = np.zeros(4, np.float32)
    params[:2] = (2.5, -1.0)
    params.view(np.uint32)[2] = N
    y = k.buffer(np.zeros(N, np.float32))
    affine = k.pipeline(AFFINE)
    k.run(affine, [k.group(affine, 0, k.buffer(params, wgpu.BufferUsage.UNIFORM), k.buffer(x), y)])
    results["affine"] = k.read(y, np.float32)

    v = k.buffer(x)
    scaled = k.pipeline(SCALED, {"scale": 3.0})
    k.run(scaled, [k.group(scaled, 0, v)])
    results["scaled"] = k.read(v, np.float32)

    c = k.buffer(np.zeros(N, np.float32))
    two = k.pipeline(TWO_GROUPS)
    k.run(two, [k.group(two, 0, k.buffer(x)), k.group(two, 1, k.buffer(x[::-1].copy()), c)])
    results["two_groups"] = k.read(c, np.float32)

    sums = k.buffer(np.zeros(N // 64, np.float32))
    reduce = k.pipeline(SUMS)
    k.run(reduce, [k.group(reduce, 0, k.buffer(x), sums)])
    results["sums"] = k.read(sums, np.float32)

    bins = k.buffer(np.zeros(16, np.uint32))
    histogram = k.pipeline(HISTOGRAM)
    k.run(histogram, [k.group(histogram, 0, k.buffer(words), bins)])
    results["histogram"] = k.read(bins, np.uint32)

    counts = k.buffer(np.array([N // 128, 1, 1], np.uint32), wgpu.BufferUsage.INDIRECT)
    w = k.buffer(np.zeros(N, np.float32))
    increment = k.pipeline(INCREMENT)
    k.run(increment, [k.group(increment, 0, w)], indirect=counts)
    results["indirect"] = k.read(w, np.float32)

    chain = k.buffer(np.zeros(N, np.float32))
    encoder = k.device.create_command_encoder()
    group = k.group(increment, 0, chain)
    for _ in range(64):
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(increment)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(N // 64)
        compute.end()
    k.device.queue.submit([encoder.finish()])
    results["chain"] = k.read(chain, np.float32)

    source, target = k.buffer(np.zeros(N, np.float32)), k.buffer(np.full(N, 9, np.float32))
    k.device.queue.write_buffer(source, 0, x)
    encoder = k.device.create_command_encoder()
    encoder.clear_buffer(target, 0, N * 2)
    encoder.copy_buffer_to_buffer(source, N * 2, target, N * 2, N * 2)
    k.device.queue.submit([encoder.finish()])
    results["copies"] = k.read(target, np.float32)
    run_optional(k, x, results)
    return results


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """The kernels' inputs: floats, and words for the histogram (numbers below 1000)."""
    x = ((np.arange(N) % 37) / 8 - 2).astype(np.float32)
    words = (np.arange(N, dtype=np.uint64) * 2654435761 % 1000).astype(np.uint32)
    return x, words


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "run"
    x, words = inputs()
    kernels = Kernels()
    info = kernels.adapter.info
    print(json.dumps({"adapter": info["device"], "backend": info["backend_type"],
                      **run_all(kernels, x, words)}), flush=True)
    if mode == "steps":
        steps(lambda: run_all(kernels, x, words))
    elif mode == "again":
        again(lambda: {"backend": info["backend_type"], **run_all(kernels, x, words)})


if __name__ == "__main__":
    sys.exit(main())
