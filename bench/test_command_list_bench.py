"""A step of 100 dependent tiny dispatches: one command list, the same dispatches one by one, direct.

A step is 100 tiny saxpy dispatches (64 floats, y = a*x + y), each reading what the one before
wrote. Three sides, alternated block by block (bench/_compare.py): **list**, the step recorded
once as a command list (``Session.record``) and run by one descriptor per step, one ticket
waited; **one by one**, the same 100 dispatches pushed through ``Session.dispatch`` (pipelined,
never waited but the last); **direct**, the same 100 dispatches submitted in one process on a
private ``Device`` (``Device.submit``: each dispatch's secondary command buffer recorded once and
cached, one primary that runs them, one fence), waited. A block is ``STEPS`` steps; its value the
median step. The daemon is the untimed one of test_arbiter_bench.py. Figures: list / one by one,
and list / direct (issue 33: <= 1.05x on lavapipe, <= 1.10x on a GPU); then the arbiter's CPU time
per step (user and system time of the daemon's arbiter process from /proc, over ``CPU_STEPS`` steps,
divided by them) as a list and one by one, alternated the same way. On lavapipe the arbiter's
process also runs the device's threads, so that time holds the kernels' own work. Last, the step
as a list of indirect dispatches against the list of dispatches (the cost of the engine's clamp).
"""

from __future__ import annotations

import mmap
import struct
import time

import numpy as np

import libshare
from bench._compare import at_most, interleave, note, ratio, record
from libshare._proc import cpu_seconds
from bench.test_arbiter_bench import arbiter_dir  # noqa: F401 - the untimed daemon fixture
from libshare.arbiter.device import Device, Dispatch

DISPATCHES = 100
STEPS = 40
CPU_STEPS = 200  # /proc counts CPU time in clock ticks (10 ms): enough steps for many ticks
PUSH = struct.pack("If", 64, 1.0)


def _steps(run) -> float:
    """The median of STEPS runs of one step, each timed (seconds)."""
    samples = []
    for _ in range(STEPS):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def _arbiter_cpu(run, arbiter_pid: int) -> float:
    """The arbiter process's CPU seconds per step over CPU_STEPS runs of one step."""
    before = cpu_seconds(arbiter_pid)
    for _ in range(CPU_STEPS):
        run()
    return (cpu_seconds(arbiter_pid) - before) / CPU_STEPS


def test_a_step_as_one_command_list(arbiter_dir):  # noqa: F811 - the fixture imported above
    with libshare.connect(mode="daemon", pipe_directory=arbiter_dir) as session, Device() as device:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        with session.record() as commands:
            for _ in range(DISPATCHES):
                commands.dispatch(saxpy, 1, [x, y], PUSH)

        def listed():
            commands.submit().wait(30)

        def one_by_one():
            for _ in range(DISPATCHES - 1):
                session.dispatch(saxpy, 1, [x, y], PUSH)
            session.dispatch(saxpy, 1, [x, y], PUSH).wait(30)

        memory = [mmap.mmap(-1, 4096) for _ in range(2)]
        buffers = [device.import_host(np.frombuffer(m, np.uint8).ctypes.data, 4096) for m in memory]
        pipeline = device.create_pipeline(libshare.shaders.path("saxpy").read_bytes(), 2, 8)
        step = [Dispatch(pipeline, [(b, 0) for b in buffers], (1, 1, 1), PUSH)] * DISPATCHES

        def direct():
            submission = device.submit(step, timed=False)
            submission.wait(30)
            submission.release()

        for run in (listed, one_by_one, direct):  # warm: recordings made, pages touched
            run()
        values = interleave({"list": lambda: _steps(listed), "one by one": lambda: _steps(one_by_one),
                             "direct": lambda: _steps(direct)})
        method = (f"a step of {DISPATCHES} dependent tiny saxpy dispatches; {STEPS} steps a block, its value "
                  "the median step; sides rotated block by block")
        ratio("command list step / the same dispatches one by one", values["list"], values["one by one"],
              names=("list", "one by one"), method=method)
        ratio("command list step / direct Device.submit of the step", values["list"], values["direct"],
              target=at_most(1.05), names=("list", "direct"), method=method)
        note(f"descriptors per step: 1 as a list, {DISPATCHES} one by one")
        pid = session.arbiter_pid
        cpu = interleave({"list": lambda: _arbiter_cpu(listed, pid),
                          "one by one": lambda: _arbiter_cpu(one_by_one, pid)})
        cpu_method = (f"the arbiter process's user+system CPU time over {CPU_STEPS} steps, per step (a CPU "
                      "device's threads included); sides alternated")
        record("arbiter CPU per step, as a command list", cpu["list"], "us", scale=1e6, method=cpu_method)
        record("arbiter CPU per step, one by one", cpu["one by one"], "us", scale=1e6, method=cpu_method)
        for buffer in buffers:
            device.destroy_buffer(buffer)
        device.destroy_pipeline(pipeline)


def test_a_step_of_indirect_dispatches(arbiter_dir):  # noqa: F811 - the fixture imported above
    """The step above as indirect dispatches (counts 1, 1, 1 read from a buffer) against the same step as
    dispatches, both as command lists: what the engine's clamp (one more one-invocation dispatch and a
    barrier per command) and a recording made per command (never cached) cost."""
    with libshare.connect(mode="daemon", pipe_directory=arbiter_dir) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(64), session.array(64)
        counts = session.array(3, np.uint32)
        counts[:] = 1
        with session.record() as direct:
            for _ in range(DISPATCHES):
                direct.dispatch(saxpy, 1, [x, y], PUSH)
        with session.record() as indirect:
            for _ in range(DISPATCHES):
                indirect.dispatch_indirect(saxpy, counts, [x, y], PUSH)
        for commands in (direct, indirect):  # warm: recordings made, pages touched
            commands.submit().wait(30)
        values = interleave({"indirect": lambda: _steps(lambda: indirect.submit().wait(30)),
                             "dispatch": lambda: _steps(lambda: direct.submit().wait(30))})
        method = (f"a command list of {DISPATCHES} dependent tiny saxpy dispatches, indirect or not; {STEPS} "
                  "steps a block, its value the median step; sides alternated ABBA")
        ratio("indirect dispatch list step / dispatch list step", values["indirect"], values["dispatch"],
              names=("indirect", "dispatch"), method=method)
