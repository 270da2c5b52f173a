"""Command lists (engine/lists.c, client/lists.py): recorded once, checked at registration and as
each command runs, submitted by one descriptor, answered by one ticket; preemptible between their
commands; hostile lists refused to their client only, beside an honest client whose results are
checked."""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import struct

import numpy as np
import pytest

import libshare
from libshare.arbiter import Arbiter
from libshare.errors import InvalidSubmission
from libshare.ring import C
from libshare.ring._binding import DESC_DTYPE
from libshare.workloads import busy_reference

from tests._busy import busy_iterations
from tests._wait import wait_until
from tests.arbiter.test_reattach import supervised  # noqa: F401 - a control daemon with a standby

N = 1000  # floats per array: not a multiple of the workgroup (64), so the bounds check in saxpy matters
STEPS = 200


@contextlib.contextmanager
def serving(tmp_path):
    """An arbiter in this process serving a pipe directory under ``tmp_path``: (arbiter, pipe_dir)."""
    pipe_dir = tmp_path / "pipe"
    pipe_dir.mkdir(mode=0o700)
    arbiter = Arbiter()
    try:
        arbiter.serve(pipe_dir / "control")
        yield arbiter, pipe_dir
    finally:
        arbiter.close()


@contextlib.contextmanager
def beside_a_stream(tmp_path, streams):
    """An arbiter in this process, an honest streaming client of its own process served by it (the
    ``streams`` fixture: it checks every result), and two sessions: (honest, attacker). On a clean exit the
    stream is finished and must have seen no failure."""
    with serving(tmp_path) as (_, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as honest, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as attacker:
        stream = streams(pipe_dir)
        wait_until(lambda: stream.served_by(os.getpid()), 120, "the streaming client's first dispatch")
        yield honest, attacker
        end = stream.finish()
        assert end["ok"] > 0 and end["restarted"] == 0


def _steps(seed: int = 7):
    """STEPS dependent operations over three arrays: ("saxpy", x, y, a) and ("copy", src, dst, start, count)."""
    rng = np.random.default_rng(seed)
    ops = []
    for k in range(STEPS):
        i, j = rng.choice(3, 2, replace=False)
        if k % 3 == 2:
            start = int(rng.integers(0, N // 2))
            ops.append(("copy", int(i), int(j), start, int(rng.integers(1, N - start))))
        else:
            ops.append(("saxpy", int(i), int(j), float(rng.choice([0.5, -0.75, 1.0, 0.25]))))
    return ops


def _apply(ops, arrays, dispatch, copy):
    for op in ops:
        if op[0] == "saxpy":
            _, i, j, a = op
            dispatch(arrays[i], arrays[j], struct.pack("If", N, a))
        else:
            _, i, j, start, count = op
            copy(arrays[i][start:start + count], arrays[j][start:start + count])


def _start(arrays):
    rng = np.random.default_rng(3)
    for array in arrays:
        array[:] = rng.uniform(-1, 1, N).astype(np.float32)


def test_a_list_of_200_dependent_commands_gives_the_bytes_of_the_same_commands_one_by_one(tmp_path):
    """Each command of a list reads what the one before it wrote (a barrier after each); the list's
    one ticket carries the device time of all, and each command was put in a submission."""
    ops = _steps()
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        groups = -(-N // 64)
        listed = [session.array(N) for _ in range(3)]
        single = [session.array(N) for _ in range(3)]
        with session.record() as commands:
            _apply(ops, listed, lambda x, y, push: commands.dispatch(saxpy, groups, [x, y], push), commands.copy)
        assert len(commands) == STEPS
        _start(listed)
        ticket = commands.submit()
        ticket.wait(60)
        _start(single)
        _apply(ops, single, lambda x, y, push: session.dispatch(saxpy, groups, [x, y], push),
               lambda src, dst: session.copy(src, dst))
        session.wait_idle(60)
        for a, b in zip(listed, single):
            assert a.tobytes() == b.tobytes()
        expected = [np.zeros(N, np.float32) for _ in range(3)]
        _start(expected)
        _apply(ops, expected, lambda x, y, push: y.__setitem__(slice(None), np.float32(struct.unpack("If", push)[1]) * x + y),
               lambda src, dst: dst.__setitem__(slice(None), src))
        for a, b in zip(listed, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # numpy rounds a*x+y twice, a device may fuse
        stats = session.stats()
        assert stats["listed"] == STEPS and ticket.device_ns > 0
        assert stats["submitted"] == 1 + STEPS and stats["completed"] == 1 + STEPS  # the list: one descriptor, one answer
        again = commands.submit()  # submitted again: the same commands on what the arrays hold now
        again.wait(60)
        _apply(ops, single, lambda x, y, push: session.dispatch(saxpy, groups, [x, y], push),
               lambda src, dst: session.copy(src, dst))
        session.wait_idle(60)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(listed, single))
        session.free(commands)
        with pytest.raises(InvalidSubmission, match="unknown program"):
            C_list_again(session, commands.id).wait(10)


def test_the_same_200_commands_in_one_direct_command_buffer_give_the_same_bytes(tmp_path):
    """The list's bytes equal those of the same commands recorded into one command buffer on a device of
    the test's own (Device.submit: one primary running each command's recording, a barrier after each,
    one fence), on the same starting bytes."""
    from libshare.arbiter.device import Copy, Device, Dispatch

    ops = _steps()
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session, \
            Device() as device:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        groups = -(-N // 64)
        listed = [session.array(N) for _ in range(3)]
        with session.record() as commands:
            _apply(ops, listed, lambda x, y, push: commands.dispatch(saxpy, groups, [x, y], push), commands.copy)
        _start(listed)
        commands.submit().wait(60)

        size = -(-N * 4 // device.host_import_alignment) * device.host_import_alignment
        memory = [mmap.mmap(-1, size) for _ in range(3)]
        direct = [np.frombuffer(m, np.float32)[:N] for m in memory]
        _start(direct)
        buffers = [device.import_host(np.frombuffer(m, np.uint8).ctypes.data, size) for m in memory]
        pipeline = device.create_pipeline(libshare.shaders.path("saxpy").read_bytes(), 2, 8)
        recorded = []
        for op in ops:
            if op[0] == "saxpy":
                _, i, j, a = op
                recorded.append(Dispatch(pipeline, [(buffers[i], 0), (buffers[j], 0)], (groups, 1, 1),
                                         struct.pack("If", N, a)))
            else:
                _, i, j, start, count = op
                recorded.append(Copy(buffers[i], 4 * start, buffers[j], 4 * start, 4 * count))
        submission = device.submit(recorded, timed=False)
        submission.wait(60)
        submission.release()
        try:
            for a, b in zip(listed, direct):
                assert a.tobytes() == b.tobytes()
        finally:
            for buffer in buffers:
                device.destroy_buffer(buffer)
            device.destroy_pipeline(pipeline)


def C_list_again(session, list_id: int):
    """An LS_OP_LIST descriptor for ``list_id``, pushed as a client would (a freed list's id, say)."""
    return session._push(C.OP_LIST, list_id, 0, 0, 0, [], [], b"")


def _honest(session):
    """An honest client's list: doubles an array four times; (list, array, check)."""
    saxpy = session.load_program(libshare.shaders.path("saxpy"))
    x = session.array(N)
    with session.record() as commands:
        for _ in range(4):
            commands.dispatch(saxpy, -(-N // 64), [x, x], struct.pack("If", N, 1.0))

    def check():
        x[:] = np.arange(N, dtype=np.float32)
        commands.submit().wait(30)
        assert np.array_equal(x, np.arange(N, dtype=np.float32) * 16)
    return commands, x, check


def test_hostile_lists_fail_their_own_client_only(tmp_path):
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as honest, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as attacker:
        _, victim, check = _honest(honest)
        check()
        saxpy = attacker.load_program(libshare.shaders.path("saxpy"))
        x, y = attacker.array(N), attacker.array(N)
        push = struct.pack("If", N, 1.0)

        # A list whose buffer is freed before it runs: its ticket fails, nothing runs on freed memory.
        with attacker.record() as stale:
            stale.dispatch(saxpy, 16, [x, y], push)
            stale.copy(x, y)
        attacker.free(y)
        with pytest.raises(InvalidSubmission, match="unknown or freed buffer"):
            stale.submit().wait(30)
        check()

        # A command out of the encoder's range: refused as it is recorded, as ls_push_op refuses it.
        with pytest.raises(InvalidSubmission, match="descriptor fields out of range"):
            attacker.record().dispatch(saxpy, 1, [x] * 9, push)
        with pytest.raises(InvalidSubmission, match="descriptor fields out of range"):
            attacker.record().dispatch(saxpy, (1 << 32, 1, 1), [x, x], push)

        # More commands than the bound: refused by the client, and by the arbiter when sent anyway.
        too_long = attacker.record()
        for _ in range(1024):
            too_long.dispatch(saxpy, 1, [x, x], push)
        with pytest.raises(InvalidSubmission, match="at most 1024"):
            too_long.dispatch(saxpy, 1, [x, x], push)
        raw = np.zeros(1025, DESC_DTYPE)
        raw["opcode"], raw["program"], raw["nbuffers"], raw["groups"] = C.OP_DISPATCH, saxpy.id, 2, 1
        raw["buffer"][:, :2] = attacker._binding(x)[1]
        with pytest.raises(InvalidSubmission, match="1 to 1024"):
            attacker._request("load_list", raw.tobytes())
        with pytest.raises(InvalidSubmission, match="whole 256-byte"):
            attacker._request("load_list", raw[:2].tobytes()[:300])

        # A list naming the honest client's buffer (its id means nothing in the attacker's table).
        others = np.zeros(1, DESC_DTYPE)
        others["opcode"], others["program"], others["nbuffers"], others["groups"] = C.OP_DISPATCH, saxpy.id, 2, 1
        others["buffer"][0, :2] = [honest._binding(victim)[1] + 1000, attacker._binding(x)[1]]
        with pytest.raises(InvalidSubmission, match="unknown or freed buffer"):
            attacker._request("load_list", others.tobytes())
        copying = np.zeros(1, DESC_DTYPE)  # a copy out of a buffer id it does not hold
        copying["opcode"], copying["nbuffers"] = C.OP_COPY, 2
        copying["buffer"][0, :2] = [attacker._binding(x)[1] + 1000, attacker._binding(x)[1]]
        copying["offset"][0, :3] = [0, 0, 64]
        with pytest.raises(InvalidSubmission, match="unknown or freed buffer"):
            attacker._request("load_list", copying.tobytes())

        # Bad opcodes inside: a fence, a list inside a list, past the last opcode, the consumer's mark, flags.
        good = np.zeros(2, DESC_DTYPE)
        good["opcode"], good["program"], good["nbuffers"], good["groups"] = C.OP_DISPATCH, saxpy.id, 2, 1
        good["buffer"][:, :2] = attacker._binding(x)[1]
        for field, value in (("opcode", C.OP_NOP), ("opcode", C.OP_LIST), ("opcode", C.OP_MAX + 1),
                             ("opcode", C.OP_BAD), ("flags", 1)):
            bad = good.copy()
            bad[1][field] = value
            with pytest.raises(InvalidSubmission, match="descriptor fields out of range"):
                attacker._request("load_list", bad.tobytes())
        # An LS_OP_LIST descriptor with buffers or groups of its own, and one naming no list.
        with pytest.raises(InvalidSubmission, match="unknown program"):
            attacker._push(C.OP_LIST, 999_999, 0, 0, 0, [], [], b"").wait(10)
        with pytest.raises(InvalidSubmission, match="descriptor fields out of range"):
            attacker._push(C.OP_LIST, stale.id, 1, 1, 1, [], [], b"").wait(10)
        attacker.wait_idle(30)
        check()
        stats = attacker.stats()
        assert stats["errors"] == 3 and honest.stats()["errors"] == 0  # the three tickets above


def test_barriers_in_a_list_cost_nothing_and_end_it_in_order(tmp_path):
    """A barrier is checked and kept but records nothing (every command ends with one): a list of barriers
    alone is answered at once, and a list that ends with one is answered once the command before it ran."""
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        x = session.array(N)
        with session.record() as only:
            only.barrier()
            only.barrier()
        only.submit().wait(30)
        assert session.stats()["listed"] == 0
        with session.record() as commands:
            commands.barrier()
            commands.fill(x, 1.0)
            commands.barrier()
            commands.dispatch(saxpy, -(-N // 64), [x, x], struct.pack("If", N, 1.0))
            commands.barrier()
        for _ in range(3):
            x[:] = 0.0
            commands.submit().wait(30)
            assert np.all(x == 2.0)
        assert session.stats()["listed"] == 6  # two commands a run: the barriers put nothing in submissions


def test_a_buffer_freed_after_its_list_was_submitted_lives_until_the_list_has_run(tmp_path):
    """A free waits for the descriptors pushed before it (objects.c); a list's commands are checked
    as each runs, so the free waits for the whole list and for what was popped behind it."""
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(N), session.array(N)
        x[:] = 1
        with session.record() as commands:
            for _ in range(50):
                commands.dispatch(saxpy, -(-N // 64), [x, y], struct.pack("If", N, 1.0))
        ticket = commands.submit()
        after = session.dispatch(saxpy, -(-N // 64), [x, y], struct.pack("If", N, 1.0))  # behind the list
        session.free(y)  # y's array stays readable here
        ticket.wait(60)
        after.wait(60)
        assert np.array_equal(y, np.full(N, 51, np.float32))


def test_a_realtime_dispatch_goes_between_the_commands_of_a_low_list(tmp_path):
    """While a higher priority is active, a lower client's turn puts one command of its list in a
    submission: a realtime dispatch waits for the command on the device, never for the whole list.
    The engine's count of the list's commands put in submissions, read when the realtime answer
    has come, is short of the list."""
    commands_in_list = 40
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="low") as low, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="realtime") as realtime:
        busy, data = low.load_program(libshare.shaders.path("busy")), low.array(1024, np.uint32)
        rounds = busy_iterations(20_000)  # 16 workgroups: ~10 ms each on lavapipe
        with low.record() as commands:
            for _ in range(commands_in_list):
                commands.dispatch(busy, 16, [data], struct.pack("II", 1024, rounds))
        saxpy, x, y = realtime.load_program(libshare.shaders.path("saxpy")), realtime.array(64), realtime.array(64)
        realtime.dispatch(saxpy, 1, [x, y], struct.pack("If", 64, 1.0)).wait(10)  # the realtime client is active
        engine = arbiter.drainer.engine
        slot = next(c.slot for c in arbiter.drainer.clients.values() if c.priority == "low")
        ticket = commands.submit()
        wait_until(lambda: engine.stats(slot).listed >= 1, 30, "the list to begin")
        realtime.dispatch(saxpy, 1, [x, y], struct.pack("If", 64, 1.0)).wait(30)
        listed = engine.stats(slot).listed
        assert listed < commands_in_list and not ticket.done(), listed
        ticket.wait(120)
        assert engine.stats(slot).listed == commands_in_list
        assert np.array_equal(data, busy_reference(1024, rounds))


def test_a_list_is_handed_to_a_new_arbiter_after_the_objects_it_names(supervised):
    """A session that reattaches hands a new arbiter its lists like its programs (same ids, in id
    order: after the buffers and programs they name); one naming a device buffer, which died with
    the old arbiter, is refused there and lost."""
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(N), session.array(N)
        scratch = session.alloc(N * 4, "device")
        with session.record() as commands:
            commands.dispatch(saxpy, -(-N // 64), [x, y], struct.pack("If", N, 2.0))
            commands.copy(y, x)
        with session.record() as on_device:
            on_device.copy(x, scratch)
        on_device.submit().wait(60)
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: supervised.arbiter() not in (before, None), 60, "the standby to take over")
        x[:], y[:] = np.arange(N, dtype=np.float32), 1.0
        commands.submit().wait(60)  # reattaches first, the list with it
        assert np.array_equal(x, 2.0 * np.arange(N, dtype=np.float32) + 1.0) and np.array_equal(x, y)
        assert session.reattached == 1
        with pytest.raises(InvalidSubmission, match="lost"):
            on_device.submit()


def test_a_client_that_leaves_mid_list_is_reclaimed_and_the_rest_never_runs(tmp_path):
    """A low session closed while its list runs one command a turn (a realtime client is active):
    the list stops at its command on the device, whose retirement answers the ticket (to no one);
    the client is reclaimed once that has retired, and its neighbour runs on."""
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="realtime") as honest:
        _, _, check = _honest(honest)
        check()  # the realtime client is active: a low turn takes one command
        leaving = libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="low")
        busy, data = leaving.load_program(libshare.shaders.path("busy")), leaving.array(1024, np.uint32)
        with leaving.record() as commands:
            for _ in range(200):
                commands.dispatch(busy, 16, [data], struct.pack("II", 1024, busy_iterations(20_000)))
        engine = arbiter.drainer.engine
        slot = next(c.slot for c in arbiter.drainer.clients.values() if c.id == leaving.client_id)
        commands.submit()
        wait_until(lambda: engine.stats(slot).listed >= 1, 30, "the list to begin")
        leaving.close()
        wait_until(lambda: leaving.client_id not in arbiter.drainer.clients, 60, "the leaving client's reclaim")
        totals = arbiter.drainer.totals  # its counters, added at its reclaim
        assert 1 <= totals.listed < 200 and (totals.submitted, totals.completed, totals.errors) == (1, 0, 0), totals
        # (answered LS_ECANCELED, which counts as neither: the list stopped, it did not fail)
        check()
