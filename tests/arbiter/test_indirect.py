"""Indirect dispatches (LS_OP_DISPATCH_INDIRECT; engine/recordings.c, "Indirect dispatches"): the group
counts are read from a client's buffer when the command runs, written maybe by an earlier command of
the same list, and clamped on the device by the engine's clamp program; hostile counts, offsets and
buffers are refused to their client only, beside an honest streaming client whose results are checked."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest

import libshare
from libshare.daemon.options import EXIT_UNRECOVERABLE
from libshare.errors import InvalidSubmission
from libshare.ring import C

from tests.arbiter.test_command_lists import beside_a_stream, serving
from tests.arbiter.test_runaway import BUSY, RUNAWAY_GROUPS, RUNAWAY_N, RUNAWAY_PUSH, arbiter, connect, gone

N = 4096  # floats per array
COUNTS_WRITER = """\
#version 450
layout(local_size_x = 1) in;
layout(std430, binding = 0) writeonly buffer Counts { uint counts[]; };
layout(push_constant) uniform Push { uint x, y, z; } p;
void main() { counts[0] = p.x; counts[1] = p.y; counts[2] = p.z; }
"""
"""A one-invocation kernel that writes three counts from its push constants: an earlier dispatch of a list
that decides the size of the indirect dispatch after it."""


def _saxpy(session):
    """saxpy and two arrays on ``session``: (program, x, y), x = i, y = 1."""
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(N), session.array(N)
    x[:] = np.arange(N, dtype=np.float32)
    y[:] = 1.0
    return program, x, y


def _ran(x, y, groups: int) -> bool:
    """y = 2x + 1 over the first ``groups`` workgroups of 64 and 1 past them (saxpy with a = 2 over y = 1)."""
    expected = np.ones(N, np.float32)
    done = min(groups * 64, N)
    expected[:done] = 2.0 * x[:done] + 1.0
    return np.array_equal(y, expected)


def test_an_indirect_dispatch_runs_the_counts_its_buffer_holds_when_it_runs(tmp_path):
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        program, x, y = _saxpy(session)
        counts = session.array(8, np.uint32)
        push = struct.pack("If", N, 2.0)
        for groups, at in ((5, 0), (17, 4), (N // 64, 20)):
            y[:] = 1.0
            counts[at // 4:at // 4 + 3] = [groups, 1, 1]
            session.dispatch_indirect(program, counts, [x, y], push, offset=at).wait(30)
            assert _ran(x, y, groups)
        y[:] = 1.0
        counts[:3] = [0, 5, 5]  # a zero count: nothing runs, and the ticket succeeds (Vulkan's rule)
        session.dispatch_indirect(program, counts, [x, y], push).wait(30)
        assert _ran(x, y, 0)
        # The counts of a slice: its offset in the buffer plus the offset given.
        counts[:] = [0, 0, 3, 1, 1, 0, 0, 0]
        session.dispatch_indirect(program, counts[2:], [x, y], push).wait(30)
        assert _ran(x, y, 3)
        # The same descriptor twice in one submission: each entry clamps into a slot of its own.
        y[:] = 1.0
        counts[:3] = [2, 1, 1]
        half = struct.pack("If", N, 1.0)
        tickets = [session.dispatch_indirect(program, counts, [x, y], half) for _ in range(2)]
        for ticket in tickets:
            ticket.wait(30)
        assert _ran(x, y, 2)


def test_a_list_dispatches_over_counts_an_earlier_dispatch_wrote(tmp_path):
    if shutil.which("glslangValidator") is None:
        pytest.skip("glslangValidator is not installed (apt-get install glslang-tools)")
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        program, x, y = _saxpy(session)
        writer = session.load_program(libshare.compile(COUNTS_WRITER))
        counts = session.array(4, np.uint32)
        counts[:] = 9  # stale counts the list overwrites before its indirect dispatch reads them
        with session.record() as commands:
            commands.fill(y, 1.0)
            commands.dispatch(writer, 1, [counts], struct.pack("III", 7, 1, 1))
            commands.dispatch_indirect(program, counts, [x, y], struct.pack("If", N, 2.0))
            commands.dispatch(writer, 1, [counts], struct.pack("III", 3, 1, 1))
            commands.barrier()
            commands.dispatch_indirect(program, counts, [x, y], struct.pack("If", N, 2.0))
        for _ in range(3):  # recorded once, run again: the counts are read at every run
            y[:] = 5.0
            commands.submit().wait(30)
            expected = np.ones(N, np.float32)
            expected[:7 * 64] = 2.0 * x[:7 * 64] + 1.0
            expected[:3 * 64] = 2.0 * x[:3 * 64] + expected[:3 * 64]
            assert np.array_equal(y, expected) and list(counts[:3]) == [3, 1, 1]
        # A list whose writer leaves counts past the limit: that command runs nothing, the rest runs, and
        # the list's one ticket carries the refusal.
        with session.record() as hostile:
            hostile.dispatch(writer, 1, [counts], struct.pack("III", 0xFFFFFFFF, 1, 1))
            hostile.dispatch_indirect(program, counts, [x, y], struct.pack("If", N, 2.0))
            hostile.fill(y, 4.0, nbytes=16)
        y[:] = 1.0
        with pytest.raises(InvalidSubmission, match="group count"):
            hostile.submit().wait(30)
        assert np.all(y[:4] == 4.0) and np.all(y[4:] == 1.0)


def _raw_indirect(session, program, counts_id: int, at: int, buffers):
    """An indirect dispatch pushed with raw fields, as a hostile client would."""
    ids = [session._binding(item)[1] for item in buffers]
    return session._push(C.OP_DISPATCH_INDIRECT, program.id, counts_id, at & 0xFFFFFFFF, at >> 32, ids,
                         [0] * len(ids), struct.pack("If", N, 2.0))


def test_hostile_counts_are_refused_or_clamped_for_their_client_only(tmp_path, streams):
    with beside_a_stream(tmp_path, streams) as (honest, attacker):
        h_program, hx, hy = _saxpy(honest)
        h_counts = honest.array(4, np.uint32)
        for _ in range(4):  # the honest session holds buffer ids the attacker never had
            honest.array(16)
        victim_id = honest._binding(honest.array(16))[1]

        def honest_check(groups: int) -> None:
            hy[:] = 1.0
            h_counts[:3] = [groups, 1, 1]
            honest.dispatch_indirect(h_program, h_counts, [hx, hy], struct.pack("If", N, 2.0)).wait(30)
            assert _ran(hx, hy, groups)

        honest_check(7)
        program, x, y = _saxpy(attacker)
        counts = attacker.array(4, np.uint32)
        counts_id = attacker._binding(counts)[1]
        push = struct.pack("If", N, 2.0)
        # Counts past the device's limit, or whose product is past 2^32 - 1 (lavapipe would run the
        # remainder): nothing runs, LS_EGROUPS.
        for bad in ([0xFFFFFFFF, 1, 1], [1, 0xFFFFFFFF, 1], [1, 1, 0xFFFFFFFF], [0xFFFFFFFF] * 3,
                    [65535, 65535, 2], [65536, 65536, 1]):
            counts[:3] = bad
            with pytest.raises(InvalidSubmission, match="group count"):
                attacker.dispatch_indirect(program, counts, [x, y], push).wait(30)
            assert np.all(y == 1.0), bad
            honest_check(3)
        # Counts at or past the buffer's end, straddling it, misaligned, or past 2^64 - 12.
        size = attacker._objects[counts_id].size
        for at in (size, size - 8, size - 4, 2, 1, size + 4, 1 << 40, (1 << 64) - 4):
            with pytest.raises(InvalidSubmission, match="outside the buffer"):
                _raw_indirect(attacker, program, counts_id, at, [x, y]).wait(30)
        with pytest.raises(InvalidSubmission, match="outside the buffer"):
            attacker.dispatch_indirect(program, counts, [x, y], push, offset=size - 8).wait(30)
        # Another client's buffer as the counts' buffer: its id names nothing in the attacker's table.
        with pytest.raises(InvalidSubmission, match="unknown or freed buffer"):
            _raw_indirect(attacker, program, victim_id, 0, [x, y]).wait(30)
        with pytest.raises(InvalidSubmission, match="unknown or freed buffer"):
            _raw_indirect(attacker, program, 0, 0, [x, y]).wait(30)
        honest_check(N // 64)
        assert np.all(y == 1.0)
        counts[:3] = [2, 1, 1]  # the attacker's honest indirect dispatch still runs
        attacker.dispatch_indirect(program, counts, [x, y], push).wait(30)
        assert _ran(x, y, 2)
        assert honest.stats()["errors"] == 0


def test_two_clients_indirect_dispatches_in_one_submission_keep_their_own_counts(tmp_path):
    """Each entry of a submission clamps into a slot of its own, and its verdict is its own: two sessions'
    indirect dispatches and a third's refused ones, interleaved in the same submissions, each run exactly
    their own counts, and only the third's fail."""
    with serving(tmp_path) as (_, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as first, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as second, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as hostile:
        runs = []
        for session, groups in ((first, 3), (hostile, 0xFFFFFFFF), (second, 11)):
            program, x, y = _saxpy(session)
            counts = session.array(3, np.uint32)
            counts[:] = [groups, 1, 1]
            runs.append((session, program, x, y, counts, groups))
        rounds = 40
        tickets = []
        for _ in range(rounds):  # pushed without waiting: the engine takes the rings into the same passes
            for session, program, x, y, counts, groups in runs:
                ticket = session.dispatch_indirect(program, counts, [x, y], struct.pack("If", N, 1.0))
                tickets.append((ticket, groups))
        for ticket, groups in tickets:
            if groups == 0xFFFFFFFF:
                with pytest.raises(InvalidSubmission, match="group count"):
                    ticket.wait(60)
            else:
                ticket.wait(60)
        _, _, _, y, _, _ = runs.pop(1)
        assert np.all(y == 1.0)
        for _, _, x, y, _, groups in runs:
            expected = np.ones(N, np.float32)
            expected[:groups * 64] += rounds * x[:groups * 64]
            assert np.array_equal(y, expected), groups


def test_an_indirect_runaway_is_caught_by_the_watchdog(tmp_path, vulkan_device_name):
    """An indirect dispatch never runs in pieces (its size is read on the device), but it runs under the
    watchdog: counts within the limits that would run for hours fault the server on time, naming its
    client, as a direct runaway does (test_runaway.py)."""
    with arbiter(tmp_path, "1") as (process, pipe_dir):
        with connect(pipe_dir, "runaway") as session:
            program = session.load_program(BUSY)
            data = session.array(RUNAWAY_N, np.uint32)
            counts = session.array(3, np.uint32)
            counts[:] = RUNAWAY_GROUPS
            ticket = session.dispatch_indirect(program, counts, [data], RUNAWAY_PUSH)
            with pytest.raises(libshare.ServerFault):
                ticket.wait(timeout=120)
            assert process.wait(timeout=120) == EXIT_UNRECOVERABLE
        log = gone(process, pipe_dir)
        assert "past the 1 s watchdog; raised by client" in log and "(runaway" in log
