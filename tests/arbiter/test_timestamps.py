"""Timestamps (LS_OP_TIMESTAMP; engine/recordings.c, "Timestamps"): the device's timestamp once the
commands before it have ended, a uint64 and its availability (a uint64 1) in the client's own buffer,
alone and in command lists (with a list's parameter too); hostile offsets and fields refused to their
client only, beside an honest streaming client whose results are checked."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare
from libshare.errors import InvalidSubmission
from libshare.ring import C
from libshare.workloads import busy_reference

from tests._busy import busy_iterations
from tests.arbiter.test_command_lists import beside_a_stream, serving

N = 1 << 14
GARBAGE = 0xDEADBEEFDEADBEEF


def _stamps(words: np.ndarray, count: int) -> tuple[list[int], list[int]]:
    """The stamps and their availabilities of ``count`` 16-byte timestamps at the start of ``words``."""
    pairs = words[:2 * count].reshape(count, 2)
    return [int(v) for v in pairs[:, 0]], [int(v) for v in pairs[:, 1]]


def test_timestamps_around_long_dispatches_increase_and_are_available(tmp_path):
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        busy = session.load_program(libshare.shaders.path("busy"))
        rounds = busy_iterations(3000)
        data = session.array(N, np.uint32)
        words = session.array(16, np.uint64)
        words[:] = GARBAGE
        push = struct.pack("II", N, rounds)
        with session.record() as commands:
            commands.timestamp(words)
            commands.dispatch(busy, N // 64, [data], push)
            commands.timestamp(words, 16)
            commands.dispatch(busy, N // 64, [data], push)
            commands.timestamp(words, 32)
        for _ in range(2):  # a list runs again: new stamps, each after the one before
            words[:] = GARBAGE
            data[:] = 0
            commands.submit().wait(60)
            stamps, available = _stamps(words, 3)
            assert available == [1, 1, 1]
            assert 0 < stamps[0] < stamps[1] < stamps[2] and GARBAGE not in stamps, stamps
            assert np.array_equal(data, busy_reference(N, rounds))
            # alone, after the list: a single descriptor, later than every stamp of the list
            session.timestamp(words, 48).wait(30)
            last, ok = _stamps(words[6:], 1)
            assert ok == [1] and last[0] > stamps[2]
        # a device buffer: written there, read back by a copy
        device = session.alloc(64, "device")
        session.fill(device, 0)
        session.timestamp(device, 8)
        session.dispatch(busy, N // 64, [data], push)
        session.timestamp(device, 24)
        session.copy(device, words, nbytes=64).wait(60)
        assert words[0] == 0 and words[2] == 1 and words[4] == 1 and 0 < words[1] < words[3], list(words[:5])


def test_a_lists_parameter_takes_the_stamp_at_its_slots_offset(tmp_path):
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        first, second = session.array(8, np.uint64), session.array(8, np.uint64)
        with session.record() as commands:
            commands.timestamp(commands.argument(0), 16)
            commands.timestamp(commands.argument(0), 32)
        first[:], second[:] = GARBAGE, GARBAGE
        commands.submit(buffers=[first]).wait(30)
        commands.submit(buffers=[second[2:]]).wait(30)  # slot 0 at byte 16 of second: stamps at 32 and 48
        one, ok_one = _stamps(first[2:], 2)
        two, ok_two = _stamps(second[4:], 2)
        assert ok_one == ok_two == [1, 1]
        assert list(first[[0, 1, 6, 7]]) == [GARBAGE] * 4 and list(second[:4]) == [GARBAGE] * 4
        assert 0 < one[0] < one[1] < two[0] < two[1], (one, two)


def _raw(session, buffers, offsets, push: bytes = b"", program: int = 0, groups=(0, 0, 0)):
    """An LS_OP_TIMESTAMP pushed with raw fields, as a hostile client would."""
    return session._push(C.OP_TIMESTAMP, program, *groups, list(buffers), list(offsets), push)


def test_hostile_timestamps_fail_their_own_client_only(tmp_path, streams):
    with beside_a_stream(tmp_path, streams) as (honest, attacker):
        saxpy = honest.load_program(libshare.shaders.path("saxpy"))
        x, y = honest.array(1000), honest.array(1000)
        mine = honest.array(8, np.uint64)

        def honest_check(a: float) -> None:
            x[:], y[:] = np.arange(1000, dtype=np.float32), 1.0
            mine[:] = GARBAGE
            honest.timestamp(mine)
            honest.dispatch(saxpy, 16, [x, y], struct.pack("If", 1000, a))
            honest.timestamp(mine, 16).wait(30)
            stamps, available = _stamps(mine, 2)
            assert available == [1, 1] and 0 < stamps[0] < stamps[1]
            assert np.array_equal(y, a * np.arange(1000, dtype=np.float32) + 1.0)

        honest_check(2.0)
        target = attacker.array(64, np.uint64)
        tid = attacker._binding(target)[1]
        size = attacker._objects[tid].size
        refusals = [  # (what, buffers, offsets, push, program, groups, the message)
            ("a misaligned offset", [tid], [4], b"", 0, (0, 0, 0), "outside the buffer"),
            ("an offset 8 short of the end", [tid], [size - 8], b"", 0, (0, 0, 0), "outside the buffer"),
            ("an offset past the end", [tid], [size], b"", 0, (0, 0, 0), "outside the buffer"),
            ("an offset wrapping 2^64", [tid], [(1 << 64) - 8], b"", 0, (0, 0, 0), "outside the buffer"),
            ("another's buffer", [tid + 50], [0], b"", 0, (0, 0, 0), "unknown or freed"),
            ("two buffers", [tid, tid], [0, 16], b"", 0, (0, 0, 0), "number of buffers"),
            ("no buffer", [], [], b"", 0, (0, 0, 0), "number of buffers"),
            ("push bytes", [tid], [0], b"abcd", 0, (0, 0, 0), "fields out of range"),
            ("a program", [tid], [0], b"", 1, (0, 0, 0), "fields out of range"),
            ("groups", [tid], [0], b"", 0, (0, 1, 0), "fields out of range"),
        ]
        target[:] = 5
        for what, buffers, offsets, push, program, groups, message in refusals:
            with pytest.raises(InvalidSubmission, match=message):
                _raw(attacker, buffers, offsets, push, program, groups).wait(30)
            assert np.all(target == 5), what
        honest_check(3.0)
        # The same refusals inside a list: refused when the list is registered, naming the command.
        for what, buffers, offsets, push, program, groups, message in refusals:
            raw = libshare.ring._binding.encode_op(C.OP_TIMESTAMP, program, groups, buffers, offsets, push)
            with pytest.raises(InvalidSubmission, match=message):
                attacker._request("load_list", raw)
        # A parameter's offset is checked as the command runs: the slot's offset added, then refused.
        with attacker.record() as commands:
            commands.timestamp(commands.argument(0), 8)
        for offset in (4, size - 16, (1 << 64) - 8):  # misaligned, 8 short of the end, wrapping 2^64
            with pytest.raises(InvalidSubmission, match="outside the buffer"):
                _list_at(attacker, commands, tid, offset).wait(30)
            assert np.all(target == 5)
        commands.submit(buffers=[target]).wait(30)  # at an honest slot it runs
        assert target[2] == 1 and target[1] != 5 and target[0] == target[3] == 5
        target[:] = 5
        attacker.timestamp(target, 8).wait(30)  # the attacker's honest timestamp still runs
        assert list(target[[0, 3]]) == [5, 5] and target[2] == 1 and target[1] != 5
        honest_check(4.0)
        assert honest.stats()["errors"] == 0


def _list_at(session, commands, buffer_id: int, offset: int):
    """Submit list ``commands`` with its slot 0 at ``buffer_id``'s raw ``offset`` (a hostile one)."""
    return session._push(C.OP_LIST, commands.id, 0, 0, 0, [buffer_id], [offset], b"")


def test_each_command_is_charged_its_own_device_time(tmp_path, vulkan_device_is_cpu):
    """The engine's timestamps after each command (engine/flights.c) give each ticket its own command's
    device time: of a light, a heavy and a light dispatch pushed together behind a heavy one, the
    heavy one holds more than either light one (were the stamps lumped at a flush, the first of a
    flight would hold them all). On lavapipe the stamps go at the top of the pipe, where it writes
    them without a flush (the instance reads its driver id)."""
    from libshare.arbiter.device._instance import Instance
    instance = Instance(None)
    try:
        assert instance.ends_each_command == vulkan_device_is_cpu  # (lavapipe: the one CPU driver here)
    finally:
        instance.destroy()
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        busy = session.load_program(libshare.shaders.path("busy"))
        data = session.array(N, np.uint32)
        heavy, light = struct.pack("II", N, busy_iterations(20_000)), struct.pack("II", 64, 16)
        first = session.dispatch(busy, N // 64, [data], heavy)  # the device busy while the rest are pushed
        tickets = [session.dispatch(busy, N // 64, [data], push) for push in (light, heavy, light)]
        first.wait(60)
        before, middle, after = (ticket.wait(60).device_ns for ticket in tickets)
        assert middle > before and middle > after, (before, middle, after)
