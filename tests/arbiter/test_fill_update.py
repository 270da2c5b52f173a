"""Fills, updates and barriers (LS_OP_FILL, LS_OP_UPDATE, LS_OP_BARRIER; engine/validate.c): results
checked against numpy, alone and in command lists; hostile ranges and fields refused to their client
only, beside an honest streaming client whose results are checked."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare
from libshare.errors import InvalidSubmission
from libshare.ring import C

from tests.arbiter.test_command_lists import beside_a_stream, serving

N = 1000


def test_fills_and_updates_write_what_numpy_says(tmp_path):
    rng = np.random.default_rng(5)
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        data = session.array(N, np.uint32)
        expected = np.zeros(N, np.uint32)
        for _ in range(40):
            start = int(rng.integers(0, N))
            count = int(rng.integers(1, N - start + 1))
            if rng.integers(2):
                value = int(rng.integers(0, 1 << 32))
                session.fill(data[start:], value, nbytes=4 * count)
                expected[start:start + count] = value
            else:
                count = min(count, C.MAX_PUSH // 4)
                words = rng.integers(0, 1 << 32, count, dtype=np.uint32)
                session.update(data, words, offset=4 * start)
                expected[start:start + count] = words
        session.wait_idle(30)
        assert np.array_equal(data, expected)
        floats = session.array(N, np.float32)
        session.fill(floats, 2.5).wait(30)  # a float is written as float32
        assert np.all(floats == 2.5)
        session.fill(data, -1).wait(30)  # an int modulo 2^32
        assert np.all(data == 0xFFFFFFFF)
        device = session.alloc(4096, "device")  # a device buffer: filled there, read back by a copy
        session.fill(device, 0x01020304, nbytes=64, offset=64)
        session.copy(device, data, nbytes=256)
        session.wait_idle(30)
        assert np.array_equal(data[:64], np.r_[np.zeros(16), np.full(16, 0x01020304), np.zeros(32)])
        barrier = session._push(C.OP_BARRIER, 0, 0, 0, 0, [], [], b"")  # alone: answered in order, as a NOP
        barrier.wait(30)


def test_a_list_fills_updates_and_computes_in_order(tmp_path):
    with serving(tmp_path) as (_, pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(N), session.array(N)
        ramp = np.arange(300, dtype=np.float32)
        with session.record() as commands:
            commands.fill(x, 3.0)
            commands.update(x, ramp)  # 1200 bytes: recorded as ten updates
            commands.fill(y, 1.0)
            commands.barrier()
            commands.dispatch(saxpy, -(-N // 64), [x, y], struct.pack("If", N, 2.0))
            commands.fill(x[500:], 0.0, nbytes=40)
        assert len(commands) == 15
        for _ in range(2):
            x[:], y[:] = -7.0, -7.0
            commands.submit().wait(30)
            before = np.r_[ramp, np.full(N - 300, 3.0, np.float32)]
            assert np.array_equal(y, 2.0 * before + 1.0)
            assert np.array_equal(x, np.r_[before[:500], np.zeros(10), before[510:]])
        with pytest.raises(InvalidSubmission, match="4 to 128 bytes"):
            session.update(x, ramp)  # a single update carries 128 bytes at most
        with pytest.raises(InvalidSubmission, match="4 to 128 bytes"):
            session.update(x, b"abc")


def _raw(session, opcode: int, buffers, offsets, push: bytes, program: int = 0, groups=(0, 0, 0)):
    """A descriptor pushed with raw fields, as a hostile client would."""
    return session._push(opcode, program, *groups, list(buffers), list(offsets), push)


def test_hostile_fills_updates_and_barriers_fail_their_own_client_only(tmp_path, streams):
    with beside_a_stream(tmp_path, streams) as (honest, attacker):
        mine = honest.array(N, np.uint32)

        def honest_check(value: int) -> None:
            honest.fill(mine, value).wait(30)
            honest.update(mine, np.arange(32, dtype=np.uint32), offset=400).wait(30)
            expected = np.full(N, value, np.uint32)
            expected[100:132] = np.arange(32)
            assert np.array_equal(mine, expected)

        honest_check(11)
        target = attacker.array(N, np.uint32)
        tid = attacker._binding(target)[1]
        size = attacker._objects[tid].size
        word = struct.pack("<I", 7)
        refusals = [  # (what, opcode, buffers, offsets, push, program, groups, the message)
            ("a fill past the end", C.OP_FILL, [tid], [size - 4, 8], word, 0, (0, 0, 0), "outside the buffer"),
            ("a fill of 0 bytes", C.OP_FILL, [tid], [0, 0], word, 0, (0, 0, 0), "outside the buffer"),
            ("a misaligned fill", C.OP_FILL, [tid], [2, 8], word, 0, (0, 0, 0), "outside the buffer"),
            ("a fill of an odd size", C.OP_FILL, [tid], [0, 6], word, 0, (0, 0, 0), "outside the buffer"),
            ("a fill wrapping 2^64", C.OP_FILL, [tid], [(1 << 64) - 4, 8], word, 0, (0, 0, 0), "outside the buffer"),
            ("a fill without its value", C.OP_FILL, [tid], [0, 8], b"", 0, (0, 0, 0), "push-constant"),
            ("a fill of two buffers", C.OP_FILL, [tid, tid], [0, 8], word, 0, (0, 0, 0), "number of buffers"),
            ("a fill of another's buffer", C.OP_FILL, [tid + 50], [0, 8], word, 0, (0, 0, 0), "unknown or freed"),
            ("a fill with a program", C.OP_FILL, [tid], [0, 8], word, 1, (0, 0, 0), "fields out of range"),
            ("an update past the end", C.OP_UPDATE, [tid], [size - 4], word * 2, 0, (0, 0, 0), "outside the buffer"),
            ("a misaligned update", C.OP_UPDATE, [tid], [6], word, 0, (0, 0, 0), "outside the buffer"),
            ("an empty update", C.OP_UPDATE, [tid], [0], b"", 0, (0, 0, 0), "push-constant"),
            ("an update of 6 bytes", C.OP_UPDATE, [tid], [0], b"abcdef", 0, (0, 0, 0), "push-constant"),
            ("an update without a buffer", C.OP_UPDATE, [], [], word, 0, (0, 0, 0), "number of buffers"),
            ("an update with groups", C.OP_UPDATE, [tid], [0], word, 0, (1, 1, 1), "fields out of range"),
            ("a barrier naming a buffer", C.OP_BARRIER, [tid], [0], b"", 0, (0, 0, 0), "fields out of range"),
            ("a barrier with groups", C.OP_BARRIER, [], [], b"", 0, (0, 0, 1), "fields out of range"),
            ("a barrier with push bytes", C.OP_BARRIER, [], [], word, 0, (0, 0, 0), "fields out of range"),
            ("a barrier with a program", C.OP_BARRIER, [], [], b"", 3, (0, 0, 0), "fields out of range"),
        ]
        target[:] = 5
        for what, opcode, buffers, offsets, push, program, groups, message in refusals:
            with pytest.raises(InvalidSubmission, match=message):
                _raw(attacker, opcode, buffers, offsets, push, program, groups).wait(30)
            assert np.all(target == 5), what
        honest_check(12)
        # The same refusals inside a list: refused when the list is registered, naming the command.
        for what, opcode, buffers, offsets, push, program, groups, message in refusals:
            raw = libshare.ring._binding.encode_op(opcode, program, groups, buffers, offsets, push)
            with pytest.raises(InvalidSubmission, match=message):
                attacker._request("load_list", raw)
        with pytest.raises(InvalidSubmission, match="32-bit int"):
            attacker.fill(target, 1 << 40)  # not a 32-bit value
        attacker.fill(target, 9, nbytes=8).wait(30)  # the attacker's honest fill still runs
        assert list(target[:3]) == [9, 9, 5]
        honest_check(13)
        assert honest.stats()["errors"] == 0
