"""Ready-made workloads on the shipped shaders, each checked against numpy.

Used by the demo, the examples and the multi-process tests. Every workload
takes a Session and a numpy Generator, runs one kernel through the arbiter,
and returns the Ticket after asserting the result equals numpy's.
"""

from __future__ import annotations

import struct

import numpy as np

from . import shaders

__all__ = ["WORKLOADS", "busy_reference", "run"]


class WorkloadError(AssertionError):
    """A kernel's result differed from numpy's."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise WorkloadError(f"{what}: device result differs from numpy")


def _program(session, name: str, cache: dict):
    if name not in cache:
        cache[name] = session.load_program(shaders.path(name))
    return cache[name]


def saxpy(session, rng, cache: dict, n: int = 4096):
    """y = a*x + y."""
    x, y = session.array(n), session.array(n)
    x[:], y[:] = rng.random(n, np.float32), rng.random(n, np.float32)
    a, expected = np.float32(rng.random()), None
    expected = a * x + y
    ticket = session.dispatch(_program(session, "saxpy", cache), groups=-(-n // 64), buffers=[x, y],
                              push=struct.pack("If", n, a)).wait(30)
    _check(np.allclose(y, expected, rtol=1e-6), "saxpy")
    session.free(x), session.free(y)
    return ticket


def vadd(session, rng, cache: dict, n: int = 4096):
    """c = a + b."""
    a, b, c = session.array(n), session.array(n), session.array(n)
    a[:], b[:] = rng.random(n, np.float32), rng.random(n, np.float32)
    ticket = session.dispatch(_program(session, "vadd", cache), groups=-(-n // 64), buffers=[a, b, c],
                              push=struct.pack("I", n)).wait(30)
    _check(np.array_equal(c, a + b), "vadd")
    for array in (a, b, c):
        session.free(array)
    return ticket


def reduce_sum(session, rng, cache: dict, n: int = 8192):
    """Partial sums per workgroup of 64, added on the host."""
    groups = -(-n // 64)
    data, partial = session.array(n), session.array(groups)
    data[:] = rng.random(n, np.float32)
    ticket = session.dispatch(_program(session, "sum", cache), groups=groups, buffers=[data, partial],
                              push=struct.pack("I", n)).wait(30)
    _check(np.isclose(partial.sum(dtype=np.float64), data.sum(dtype=np.float64), rtol=1e-4), "sum")
    session.free(data), session.free(partial)
    return ticket


def matmul(session, rng, cache: dict, m: int = 48, k: int = 40, n: int = 56):
    """C = A @ B (sizes not multiples of the 16x16 tile on purpose)."""
    a, b, c = session.array((m, k)), session.array((k, n)), session.array((m, n))
    a[:], b[:] = rng.random((m, k), np.float32), rng.random((k, n), np.float32)
    ticket = session.dispatch(_program(session, "matmul", cache), groups=(-(-n // 16), -(-m // 16), 1),
                              buffers=[a, b, c], push=struct.pack("III", m, n, k)).wait(30)
    _check(np.allclose(c, a @ b, rtol=1e-4, atol=1e-4), "matmul")
    for array in (a, b, c):
        session.free(array)
    return ticket


def busy_reference(n: int, iterations: int) -> np.ndarray:
    """What busy.comp writes: xorshift32 then an LCG step, ``iterations`` times, from x = i."""
    x = np.arange(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for _ in range(iterations):
            x ^= x << np.uint32(13)
            x ^= x >> np.uint32(17)
            x ^= x << np.uint32(5)
            x = x * np.uint32(1664525) + np.uint32(1013904223)
    return x


def busy(session, rng, cache: dict, n: int = 1024, iterations: int = 64):
    """A busy loop whose result numpy reproduces."""
    data = session.array(n, np.uint32)
    ticket = session.dispatch(_program(session, "busy", cache), groups=-(-n // 64), buffers=[data],
                              push=struct.pack("II", n, iterations)).wait(30)
    _check(np.array_equal(data, busy_reference(n, iterations)), "busy")
    session.free(data)
    return ticket


WORKLOADS = {"saxpy": saxpy, "vadd": vadd, "sum": reduce_sum, "matmul": matmul, "busy": busy}
"""Name -> workload function."""


def run(name: str, session, rng, cache: dict):
    """Run the named workload once; return its Ticket."""
    return WORKLOADS[name](session, rng, cache)
