"""Ready-made workloads on the shipped shaders, each checked against numpy.

Used by the demo, the examples and the multi-process tests. ``prepare`` loads
the kernel and fills its buffers once and returns a :class:`Job`; a job can be
dispatched any number of times and then checked, since every kernel here is
either idempotent or (saxpy) accumulates a result numpy can predict exactly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from libshare import shaders

__all__ = ["WORKLOADS", "Job", "WorkloadError", "busy_reference", "prepare", "run"]


class WorkloadError(AssertionError):
    """A kernel's result differed from numpy's."""


@dataclass
class Job:
    """One kernel with its buffers, ready to dispatch again and again."""

    name: str
    session: object
    program: object
    groups: tuple
    buffers: list
    push: bytes
    expect: Callable[[int], bool]  # given how many dispatches ran, is the output right?
    dispatched: int = 0
    owned: list = field(default_factory=list)

    def dispatch(self):
        """Queue one more dispatch; returns its Ticket."""
        self.dispatched += 1
        return self.session.dispatch(self.program, self.groups, self.buffers, self.push)

    def check(self) -> None:
        """Raise WorkloadError unless the output matches numpy after every dispatch so far."""
        if not self.expect(self.dispatched):
            raise WorkloadError(f"{self.name}: device result differs from numpy "
                                f"after {self.dispatched} dispatches")

    def free(self) -> None:
        """Free the job's buffers."""
        for array in self.owned:
            self.session.free(array)


def _program(session, name: str, cache: dict):
    if name not in cache:
        cache[name] = session.load_program(shaders.path(name))
    return cache[name]


def _arrays(session, *shapes, dtype=np.float32):
    return [session.array(shape, dtype) for shape in shapes]


def _saxpy(session, rng, cache, n=4096):
    x, y = _arrays(session, n, n)
    x[:] = rng.integers(0, 100, n)  # small integers: k accumulations stay exact in float32
    y[:] = rng.integers(0, 100, n)
    y0 = y.copy()
    push = struct.pack("If", n, 2.0)
    return Job("saxpy", session, _program(session, "saxpy", cache), (-(-n // 64), 1, 1), [x, y], push,
               lambda k: np.array_equal(y, y0 + 2.0 * k * x), owned=[x, y])


def _vadd(session, rng, cache, n=4096):
    a, b, c = _arrays(session, n, n, n)
    a[:], b[:] = rng.random(n, np.float32), rng.random(n, np.float32)
    return Job("vadd", session, _program(session, "vadd", cache), (-(-n // 64), 1, 1), [a, b, c],
               struct.pack("I", n), lambda k: np.array_equal(c, a + b), owned=[a, b, c])


def _sum(session, rng, cache, n=8192):
    groups = -(-n // 64)
    data, partial = _arrays(session, n, groups)
    data[:] = rng.random(n, np.float32)
    total = data.sum(dtype=np.float64)
    return Job("sum", session, _program(session, "sum", cache), (groups, 1, 1), [data, partial],
               struct.pack("I", n), lambda k: bool(np.isclose(partial.sum(dtype=np.float64), total, rtol=1e-4)),
               owned=[data, partial])


def _matmul(session, rng, cache, m=48, k=40, n=56):
    a, b, c = _arrays(session, (m, k), (k, n), (m, n))  # not multiples of the 16x16 tile on purpose
    a[:], b[:] = rng.random((m, k), np.float32), rng.random((k, n), np.float32)
    return Job("matmul", session, _program(session, "matmul", cache), (-(-n // 16), -(-m // 16), 1), [a, b, c],
               struct.pack("III", m, n, k), lambda _: np.allclose(c, a @ b, rtol=1e-4, atol=1e-4),
               owned=[a, b, c])


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


def _busy(session, rng, cache, n=1024, iterations=64):
    (data,) = _arrays(session, n, dtype=np.uint32)
    expected = busy_reference(n, iterations)
    return Job("busy", session, _program(session, "busy", cache), (-(-n // 64), 1, 1), [data],
               struct.pack("II", n, iterations), lambda k: np.array_equal(data, expected), owned=[data])


WORKLOADS = {"saxpy": _saxpy, "vadd": _vadd, "sum": _sum, "matmul": _matmul, "busy": _busy}
"""Name -> preparer."""


def prepare(name: str, session, rng, cache: dict) -> Job:
    """Load the named kernel (once per ``cache``) and fill fresh buffers for it."""
    return WORKLOADS[name](session, rng, cache)


def run(name: str, session, rng, cache: dict):
    """Prepare, dispatch once, wait, check against numpy, free; return the Ticket."""
    job = prepare(name, session, rng, cache)
    ticket = job.dispatch().wait(30)
    job.check()
    job.free()
    return ticket
