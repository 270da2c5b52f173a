"""An unmodified vkdispatch program (vkdispatch 0.1.0: kernels written in Python, VkFFT inside): results as JSON.

``python _vkdispatch_app.py [run|again]`` makes vkdispatch's context on Vulkan device 0 (vkdispatch
skips CPU devices unless told which to take) and runs, on seeded inputs: ``saxpy`` (a kernel with a
constant), ``graph`` (a command graph of three dispatches with push-constant variables, submitted
three times), ``sum`` (its two-stage reduction), ``absmax`` (a subgroup reduction), ``histogram`` (an
atomic add into 16 bins), ``fft`` and ``ifft`` (its own FFT shaders), ``fft2`` and ``vkfft``
(VkFFT, 1-D of 1000 and 2-D). Every buffer vkdispatch writes is laid out with ``layout(scalar)``:
the device must offer ``scalarBlockLayout``. It prints one JSON line: ``device``, ``ok`` (each
result within float tolerance of numpy's) and ``hash`` (the SHA-256 of each result's bytes, so that
two runs compare bit for bit). With ``again`` it then prints ``again`` and runs once more for each
line of standard input (_steps.py). It knows nothing of libshare.

It leaves by ``os._exit`` once its output is flushed: vkdispatch 0.1.0's exit handler (``destroy_context``,
context.py line 614) segfaulted in 2 of 30 runs on lavapipe directly, without libshare, after the
program had printed everything, and the tests count a crash a failure. The device is then closed by the
process's end, as when any program is killed.
"""
# (no "from __future__ import annotations": vkdispatch reads its kernels' annotations as objects)

import hashlib
import json
import os
import sys

import numpy as np
import vkdispatch as vd
import vkdispatch.codegen as vc
from _steps import again
from vkdispatch.codegen.abbreviations import Buff, Const, Var, f32, i32


@vd.shader("y.size")
def saxpy(y: Buff[f32], x: Buff[f32], a: Const[f32]):
    t = vc.global_invocation_id().x
    y[t] = a * x[t] + y[t]


@vd.shader("buf.size")
def affine(buf: Buff[f32], a: Var[f32], b: Var[f32]):
    t = vc.global_invocation_id().x
    buf[t] = buf[t] * a + b


@vd.shader("values.size")
def histogram(bins: Buff[i32], values: Buff[i32]):
    t = vc.global_invocation_id().x
    vc.atomic_add(bins[values[t]], 1)


@vd.reduce.reduce(0)
def total(a: f32, b: f32) -> f32:
    return a + b


@vd.reduce.map_reduce(vd.reduce.SubgroupMax)
def absmax(buf: Buff[f32]) -> f32:
    return vc.abs(buf[vd.reduce.mapped_io_index()])


def graph(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Three dispatches recorded once in a command graph, submitted three times with new variables."""
    buffer, commands, want = vd.asbuffer(values), vd.CommandGraph(), values.copy()
    affine(buffer, a=commands.bind_var("a"), b=commands.bind_var("b"), graph=commands)
    affine(buffer, a=0.5, b=1.0, graph=commands)
    saxpy(buffer, buffer, 0.5, graph=commands)
    for k in range(3):
        commands.set_var("a", float(k + 1))
        commands.set_var("b", float(-k))
        commands.submit()
        want = ((want * (k + 1) - k) * 0.5 + 1.0) * 1.5
    vd.queue_wait_idle()
    return buffer.read(0), want


def run() -> dict:
    rng = np.random.default_rng(34)
    x, y = rng.standard_normal(4096).astype(np.float32), rng.standard_normal(4096).astype(np.float32)
    seen: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    bx, by = vd.asbuffer(x), vd.asbuffer(y)
    saxpy(by, bx, 2.5)
    seen["saxpy"] = (by.read(0), 2.5 * x + y, 1e-5)
    seen["graph"] = (*graph(np.arange(1024, dtype=np.float32)), 1e-3)
    r = rng.random(100_000).astype(np.float32)
    seen["sum"] = (np.asarray(total(vd.asbuffer(r)).read(0)).ravel()[:1], [r.astype(np.float64).sum()], 0.5)
    seen["absmax"] = (np.asarray(absmax(bx).read(0)).ravel()[:1], [np.abs(x).max()], 0)
    words = rng.integers(0, 16, 5000).astype(np.int32)
    bins = vd.asbuffer(np.zeros(16, np.int32))
    histogram(bins, vd.asbuffer(words))
    seen["histogram"] = (bins.read(0), np.bincount(words, minlength=16), 0)
    c = (rng.standard_normal(512) + 1j * rng.standard_normal(512)).astype(np.complex64)
    bc = vd.asbuffer(c)
    vd.fft.fft(bc)
    seen["fft"] = (bc.read(0), np.fft.fft(c), 1e-3)
    vd.fft.ifft(bc)
    seen["ifft"] = (bc.read(0), c, 1e-4)
    c2 = (rng.standard_normal((64, 64)) + 1j * rng.standard_normal((64, 64))).astype(np.complex64)
    bc2 = vd.asbuffer(c2)
    vd.vkfft.fft2(bc2)
    seen["fft2"] = (bc2.read(0), np.fft.fft2(c2), 1e-2)
    c3 = (rng.standard_normal(1000) + 1j * rng.standard_normal(1000)).astype(np.complex64)
    bc3 = vd.asbuffer(c3)
    vd.vkfft.fft(bc3)
    seen["vkfft"] = (bc3.read(0), np.fft.fft(c3), 1e-3)
    vd.queue_wait_idle()
    return {"device": vd.get_devices()[0].device_name,
            "ok": {name: bool(np.max(np.abs(np.asarray(got, np.complex128) - np.asarray(want, np.complex128))) <= tol)
                   for name, (got, want, tol) in seen.items()},
            "hash": {name: hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()
                     for name, (got, _want, _tol) in seen.items()}}


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "run"
    vd.make_context(device_ids=0)
    print(json.dumps(run()), flush=True)
    if mode == "again":
        again(run)
    sys.stdout.flush()
    os._exit(0)  # (vkdispatch's own exit handler segfaults now and then: see above)


if __name__ == "__main__":
    main()
