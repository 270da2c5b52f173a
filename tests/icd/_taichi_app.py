"""An unmodified Taichi program on Taichi's Vulkan backend: a few kernels, their results as JSON.

``python _taichi_app.py [run|hold|loop|steps|again]`` initializes Taichi with ``ti.init(arch=ti.vulkan)`` and
runs four kernels on seeded inputs:

- ``saxpy``: elementwise ``a * x + y`` over float32 ndarrays;
- ``sum``: a reduction of int32 values into a 0-d field (Taichi lowers the ``+=`` to an atomic add;
  integers, so the result does not depend on the order the atomics land in);
- ``field``: a 2-D field written from an ndarray and a per-row scale, then read back;
- ``histogram``: a loop of ``ti.atomic_add`` into 16 bins.

It prints one JSON line: ``arch`` (the backend Taichi ended on: ``vulkan``, never a silent CPU
fallback), and each kernel's output as a list. With ``hold`` it then prints ``holding`` and waits
until its standard input closes; with ``loop`` it prints ``looping`` and runs the kernels again
until it is killed; with ``steps``, it times its kernels on demand, and with ``again`` runs them
again on demand (_steps.py). It knows nothing of libshare: the same program runs on any Vulkan driver.
"""

# (no "from __future__ import annotations": Taichi reads its kernels' annotations as objects)

import json
import sys

import numpy as np
import taichi as ti

from _steps import again, steps

N = 4096
BINS = 16


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "run"
    ti.init(arch=ti.vulkan, random_seed=0, offline_cache=False, log_level=ti.WARN)
    arch = ti.lang.impl.current_cfg().arch
    rng = np.random.default_rng(34)
    x = rng.standard_normal(N).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    values = rng.integers(-1000, 1000, N).astype(np.int32)
    grid = rng.standard_normal((64, 32)).astype(np.float32)
    scale = rng.standard_normal(64).astype(np.float32)
    kernels = Kernels()
    results = kernels.run(x, y, values, grid, scale)
    print(json.dumps({"arch": str(arch).split(".")[-1], **results}), flush=True)
    if mode == "hold":
        print("holding", flush=True)
        sys.stdin.read()
    elif mode == "loop":
        print("looping", flush=True)
        while True:
            kernels.run(x, y, values, grid, scale)
    elif mode == "steps":
        steps(lambda: kernels.run(x, y, values, grid, scale))
    elif mode == "again":
        again(lambda: {"arch": "vulkan", **kernels.run(x, y, values, grid, scale)})


class Kernels:
    """The four kernels and the fields they write."""

    def __init__(self) -> None:
        self.total = ti.field(ti.i32, shape=())
        self.field = ti.field(ti.f32, shape=(64, 32))
        self.bins = ti.field(ti.i32, shape=BINS)

    def run(self, x, y, values, grid, scale) -> dict:
        out = ti.ndarray(ti.f32, shape=N)
        xs, ys = ti.ndarray(ti.f32, shape=N), ti.ndarray(ti.f32, shape=N)
        xs.from_numpy(x)
        ys.from_numpy(y)
        saxpy(2.5, xs, ys, out)
        counted = ti.ndarray(ti.i32, shape=N)
        counted.from_numpy(values)
        self.total[None] = 0
        reduce(counted, self.total)
        source, scales = ti.ndarray(ti.f32, shape=grid.shape), ti.ndarray(ti.f32, shape=scale.shape)
        source.from_numpy(grid)
        scales.from_numpy(scale)
        scale_rows(source, scales, self.field)
        self.bins.fill(0)
        histogram(counted, self.bins)
        return {"saxpy": out.to_numpy().tolist(), "sum": int(self.total[None]),
                "field": self.field.to_numpy().ravel().tolist(), "histogram": self.bins.to_numpy().tolist()}


@ti.kernel
def saxpy(a: ti.f32, x: ti.types.ndarray(), y: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        out[i] = a * x[i] + y[i]


@ti.kernel
def reduce(values: ti.types.ndarray(), total: ti.template()):
    for i in values:
        total[None] += values[i]


@ti.kernel
def scale_rows(source: ti.types.ndarray(), scales: ti.types.ndarray(), field: ti.template()):
    for i, j in field:
        field[i, j] = source[i, j] * scales[i] + ti.cast(j, ti.f32)


@ti.kernel
def histogram(values: ti.types.ndarray(), bins: ti.template()):
    for i in values:
        ti.atomic_add(bins[(values[i] + 1000) * BINS // 2000], 1)


if __name__ == "__main__":
    main()
