"""Long dispatches of busy.comp, as long on the device at hand as on lavapipe.

Some tests need work that is still running when they act: a wait that times out, a client or
an arbiter killed mid-dispatch, a realtime dispatch that must not wait behind a slow one, a
watchdog. Their dispatches of ``shaders/busy.comp`` were sized on lavapipe, where each
invocation runs on the CPU and a dispatch of 1 << 16 invocations x 20,000 rounds takes about
half a second. A GPU runs the invocations side by side: on an H100 the same dispatch ended
within 10 ms, and those tests saw finished work where they expected running work (the lent
GPU's run of the suite, 2026-11-23).

So a test asks :func:`busy_iterations` for the rounds it wants and gets, on a GPU, that many
times the GPU's speed-up over lavapipe on a reference dispatch, measured once per test run by
:func:`publish_scale` in the pytest process and handed to the clients it starts (the C tests
too) through ``LIBSHARE_TEST_BUSY_SCALE``. On a CPU device the scale is 1: the sizes the tests
were written and checked with stand as they are.

Rounds grow rather than invocations: on a GPU a dispatch's time follows the rounds of one
invocation (the reference's 1 << 16 invocations run at once on a large GPU), and lavapipe's
loop cap limits rounds on the CPU only (see busy.comp). A dispatch of fewer invocations than the
reference's so takes as long as it on a GPU, and less on lavapipe: a scaled dispatch is at
least as long on a GPU as on lavapipe, never shorter.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

import numpy as np

SCALE_ENV = "LIBSHARE_TEST_BUSY_SCALE"
REFERENCE_INVOCATIONS = 1 << 16
REFERENCE_ITERATIONS = 20_000
REFERENCE_LAVAPIPE_S = 0.5  # the reference dispatch on this VM's idle lavapipe: 0.42 s measured, 0.5 s said
_MAX_ROUNDS = 0xFFFFFFFF  # busy.comp's push constant is a uint


def busy_iterations(iterations: int) -> int:
    """Rounds per invocation that take as long on this run's device as ``iterations`` take on lavapipe."""
    return min(iterations * scale(), _MAX_ROUNDS)


def long_queue(session, count: int = 20, iterations: int = 20_000) -> list:
    """``count`` tickets of busy dispatches on ``session`` (a libshare Session) over one array of
    the reference's 1 << 16 invocations: each about 0.5 s on an idle lavapipe at the default
    iterations, at least as long on a GPU."""
    import libshare

    program = session.load_program(libshare.shaders.path("busy"))
    data = session.array(REFERENCE_INVOCATIONS, np.uint32)
    push = struct.pack("II", REFERENCE_INVOCATIONS, busy_iterations(iterations))
    return [session.dispatch(program, groups=REFERENCE_INVOCATIONS // 64, buffers=[data], push=push)
            for _ in range(count)]


def scale() -> int:
    """This run's factor (1 unless :func:`publish_scale` measured a faster device)."""
    return int(os.environ.get(SCALE_ENV, "1"))


def publish_scale(device_is_cpu: bool, selector: str | None) -> None:
    """Measure the factor once on the tested device (``selector``, as for ``Device``; 1 on a CPU
    device), unless the environment names it already, and put it in the environment for this
    process and the clients it starts."""
    if SCALE_ENV not in os.environ:
        os.environ[SCALE_ENV] = "1" if device_is_cpu else str(_measured_scale(selector))


def _measured_scale(selector: str | None) -> int:
    """The GPU's speed-up over lavapipe on the reference dispatch, at least 1."""
    from libshare.arbiter.device import Device

    with Device(selector) as device:
        return max(1, round(REFERENCE_LAVAPIPE_S / reference_seconds(device)))


def reference_seconds(device, iterations: int = REFERENCE_ITERATIONS, runs: int = 3) -> float:
    """The shortest of ``runs`` runs of the reference dispatch (``iterations`` rounds) on ``device``."""
    import libshare
    from libshare.arbiter.device import Dispatch

    size = REFERENCE_INVOCATIONS * 4
    memory = mmap.mmap(-1, size)
    buffer = device.import_host(np.frombuffer(memory, np.uint8).ctypes.data, size)
    pipeline = device.create_pipeline(libshare.shaders.path("busy").read_bytes(), 1, 8)
    try:
        command = Dispatch(pipeline, [(buffer, 0)], (REFERENCE_INVOCATIONS // 64, 1, 1),
                           struct.pack("II", REFERENCE_INVOCATIONS, iterations))
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            submission = device.submit([command], timed=False)
            submission.wait(60)
            times.append(time.perf_counter() - started)
            submission.release()
        return max(min(times), 1e-6)
    finally:
        device.destroy_buffer(buffer)
        device.destroy_pipeline(pipeline)
        memory.close()
