"""Bind groups: more buffers than a descriptor's 8, per-binding offsets and ranges, arrays of buffers.

A group is made once (``Session.bind_group``) and named by one descriptor (``LS_DESC_GROUP``);
the arbiter checks its entries when it is made and at every dispatch that names it
(engine/validate.c). The hostile cases each perform the attack beside an honest streaming
client whose results are checked, and each is refused to the attacker alone.
"""

from __future__ import annotations

import os
import signal
import struct

import numpy as np
import pytest

import libshare
from libshare.ring import C

from tests.arbiter.conftest import wait_until
from tests.arbiter.test_reattach import supervised  # noqa: F401 - a fixture

N = 1024
MANY = 12
WIDE = """#version 450
layout(local_size_x = 64) in;
""" + "\n".join(f"layout(binding = {k}) buffer B{k} {{ float v{k}[]; }};" for k in range(MANY)) + """
void main() {
    uint i = gl_GlobalInvocationID.x;
    v0[i] = """ + " + ".join(f"{k}.0 * v{k}[i]" for k in range(1, MANY)) + """;
}
"""
ARRAY = """#version 450
layout(local_size_x = 64) in;
layout(binding = 0) buffer In { float x[]; } ins[4];
layout(binding = 1) buffer Out { float y[]; } o;
layout(push_constant) uniform P { uint k; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    o.y[i] = ins[0].x[i] + 10.0 * ins[1].x[i] + 100.0 * ins[2].x[i] + 1000.0 * ins[p.k].x[i];
}
"""
UNIFORM = """#version 450
layout(local_size_x = 1) in;
layout(binding = 0) uniform U { vec4 v[16]; } u;
layout(binding = 1) buffer O { float y[]; } o;
void main() { o.y[0] = u.v[0].x; }
"""
RUNTIME_ARRAY = """#version 450
#extension GL_EXT_nonuniform_qualifier : require
layout(local_size_x = 1) in;
layout(binding = 0) buffer B { float x[]; } b[];
void main() { b[gl_GlobalInvocationID.x].x[0] = 1.0; }
"""


def wide(session):
    """The 12-buffer program and its buffers: v_k = k + 1 everywhere but v0."""
    program = session.load_program(libshare.compile(WIDE))
    arrays = [session.array(N, np.float32) for _ in range(MANY)]
    for k, a in enumerate(arrays[1:], 1):
        a[:] = k + 1
    return program, arrays


WIDE_SUM = float(sum(k * (k + 1) for k in range(1, MANY)))


def test_a_twelve_buffer_program_runs_through_a_group_and_only_so():
    with libshare.connect(mode="embedded") as session:
        program, arrays = wide(session)
        assert program.bindings == MANY
        group = session.bind_group(program, arrays)
        session.dispatch(program, N // 64, buffers=group).wait(60)
        assert np.all(arrays[0] == WIDE_SUM)
        with pytest.raises(libshare.InvalidSubmission, match="binds 12 buffers, more than a descriptor's 8: "
                                                             "dispatch it through a bind group"):
            session.dispatch(program, N // 64, arrays)
        with session.record() as commands:  # a list over the group: one descriptor runs it
            commands.dispatch(program, N // 64, buffers=group)
        arrays[0][:] = 0
        commands.submit().wait(60)
        assert np.all(arrays[0] == WIDE_SUM)
        saxpy = session.load_program(libshare.shaders.path("saxpy"))  # small programs may use groups too
        x, y = session.array(N, np.float32), session.array(N, np.float32)
        x[:], y[:] = 1.0, 2.0
        small = session.bind_group(saxpy, [x, y])
        session.dispatch(saxpy, N // 64, buffers=small, push=struct.pack("If", N, 3.0)).wait(60)
        assert np.all(y == 5.0)


def test_each_binding_has_its_offset_and_range():
    """Writes past a binding's range are dropped (robustBufferAccess), reads past it read zeros."""
    with libshare.connect(mode="embedded") as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))  # y[i] = a * x[i] + y[i], i < n
        x, y = session.array(N, np.float32), session.array(N, np.float32)
        x[:] = np.arange(N, dtype=np.float32)
        y[:] = 1.0
        group = session.bind_group(saxpy, [(x, 256 * 4, 128 * 4), (y, 64 * 4, None)])
        session.dispatch(saxpy, N // 64, buffers=group, push=struct.pack("If", N, 2.0)).wait(60)
        expected = np.ones(N, np.float32)
        expected[64:64 + 128] += 2.0 * np.arange(256, 256 + 128, dtype=np.float32)  # x's range: 128 floats
        assert np.array_equal(y, expected)  # y from float 64 to its end; x past its range read as zeros
        with pytest.raises(libshare.InvalidSubmission, match="binds 2 buffers; the group lists 3"):
            session.bind_group(saxpy, [x, y, y])


def test_an_array_of_buffers_takes_its_length_of_buffers_and_its_index_is_clamped():
    with libshare.connect(mode="embedded") as session:
        program = session.load_program(libshare.compile(ARRAY))
        assert program.bindings == 5  # ins[4], then o
        ins = [session.array(N, np.float32) for _ in range(4)]
        for k, a in enumerate(ins):
            a[:] = k + 1
        out = session.array(N, np.float32)
        session.dispatch(program, N // 64, ins + [out], struct.pack("I", 3)).wait(60)  # a plain descriptor: 5 <= 8
        assert np.all(out == 1 + 20 + 300 + 4000)
        group = session.bind_group(program, [*ins, out])
        session.dispatch(program, N // 64, buffers=group, push=struct.pack("I", 1 << 30)).wait(60)
        assert np.all(out == 1 + 20 + 300 + 4000)  # ins[2^30] is ins[3]: clamped, never past the array
        session.dispatch(program, N // 64, buffers=group, push=struct.pack("I", 1)).wait(60)
        assert np.all(out == 1 + 20 + 300 + 2000)
        runtime = libshare.compile(RUNTIME_ARRAY, target_env="vulkan1.2")
        with pytest.raises(libshare.InvalidSubmission, match="set 0, binding 0 are a runtime-sized array"):
            session.load_program(runtime)  # its length is the client's to give (test_runtime_arrays.py)
        assert session.load_program(runtime, array_lengths={(0, 0): 2}).bindings == 2


UNKNOWN, OUTSIDE, LAYOUT = "unknown or freed buffer id", "outside the buffer", "differs from the program's bindings"


def _refused(call, match: str) -> None:
    with pytest.raises(libshare.LibshareError, match=match):
        call()


def test_hostile_groups_are_refused_to_their_client_alone(daemon, streams):
    process, pipe = daemon
    honest = streams(pipe)
    wait_until(lambda: honest.served_by(process.pid), 120, "the honest client's first dispatch")
    with libshare.connect(name="victim", mode="daemon", pipe_directory=pipe) as victim, \
            libshare.connect(name="attacker", mode="daemon", pipe_directory=pipe) as attacker:
        secrets = [victim.array(N, np.float32) for _ in range(40)]  # ids past the attacker's
        for secret in secrets:
            secret[:] = 7.0
        saxpy = attacker.load_program(libshare.shaders.path("saxpy"))
        x, y = attacker.array(N, np.float32), attacker.array(N, np.float32)
        request = attacker._request

        def group(entries, program=saxpy.id):
            return request("bind_group", program_id=program, buffers=entries)

        foreign = victim._binding(secrets[-1])[1]
        x_id, y_id = attacker._binding(x)[1], attacker._binding(y)[1]
        assert foreign > max(x_id, y_id)  # an id the attacker never had: the victim's alone
        _refused(lambda: group([[x_id, 0, 0], [foreign, 0, 0]]), UNKNOWN)  # another client's buffer
        _refused(lambda: group([[x_id, 0, 0], [(1 << 32) - 1, 0, 0]]), UNKNOWN)  # never allocated
        _refused(lambda: group([[x_id, 0, N * 4 + 4], [y_id, 0, 0]]), OUTSIDE)  # past the buffer
        _refused(lambda: group([[x_id, 0, 0], [y_id, N * 4, 4]]), OUTSIDE)  # offset at its end
        _refused(lambda: group([[x_id, 1, 0], [y_id, 0, 0]]), OUTSIDE)  # misaligned offset
        _refused(lambda: group([[x_id, 0, 0]] * 33), "1 to 32")  # too many entries
        _refused(lambda: group([[x_id, 0, 0]] * 3), LAYOUT)  # not the program's count
        _refused(lambda: group([[x_id, 0, 0], [y_id, 0, 0]], program=(1 << 32) - 1), "unknown program id")
        uniform = attacker.load_program(libshare.compile(UNIFORM))
        big = attacker.alloc(1 << 20)
        _refused(lambda: group([[big.id, 0, (1 << 20) - 256], [y_id, 0, 0]], program=uniform.id),
                 OUTSIDE)  # a uniform range past maxUniformBufferRange (lavapipe: 64 KiB)
        attacker.bind_group(uniform, [(big, 0, 256), y])  # within it: fine

        theirs = victim.bind_group(victim.load_program(libshare.shaders.path("saxpy")), secrets[-2:])
        assert theirs.id not in attacker._objects  # the victim's group id: none of the attacker's
        stolen = libshare.BindGroup(theirs.id, saxpy, [])
        _refused(lambda: attacker.dispatch(saxpy, 1, buffers=stolen, push=struct.pack("If", N, 1.0)).wait(60),
                 UNKNOWN)  # a group id the attacker does not hold
        program, arrays = wide(attacker)
        twelve = attacker.bind_group(program, arrays)
        _refused(lambda: attacker.dispatch(saxpy, 1, buffers=twelve, push=struct.pack("If", N, 1.0)).wait(60),
                 LAYOUT)  # a program of another layout
        attacker.dispatch(program, N // 64, buffers=twelve).wait(60)  # cached, then a buffer of it freed
        with attacker.record() as commands:
            commands.dispatch(program, N // 64, buffers=twelve)
        attacker.free(arrays[5])
        _refused(lambda: attacker.dispatch(program, N // 64, buffers=twelve).wait(60), UNKNOWN)
        _refused(lambda: commands.submit().wait(60), UNKNOWN)
        assert all(np.all(secret == 7.0) for secret in secrets)  # the victim's memory untouched
        vx, vy = victim.array(N, np.float32), victim.array(N, np.float32)
        vx[:], vy[:] = 1.0, 2.0
        vsaxpy = victim.load_program(libshare.shaders.path("saxpy"))
        victim.dispatch(vsaxpy, N // 64, victim.bind_group(vsaxpy, [vx, vy]), struct.pack("If", N, 3.0)).wait(60)
        assert np.all(vy == 5.0)
        assert attacker.stats()["completed"] >= 1  # the attacker's session goes on
    end = honest.finish()
    assert end["ok"] > 0


def test_groups_and_lists_over_them_survive_a_restart(supervised):  # noqa: F811 - the fixture
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        program, arrays = wide(session)
        group = session.bind_group(program, arrays)
        with session.record() as commands:
            commands.dispatch(program, N // 64, buffers=group)
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: supervised.arbiter() not in (before, None), 60, "the standby to take over")
        session.dispatch(program, N // 64, buffers=group).wait(60)  # the same group, on the new arbiter
        assert np.all(arrays[0] == WIDE_SUM) and session.reattached == 1
        arrays[0][:] = 0
        commands.submit().wait(60)
        assert np.all(arrays[0] == WIDE_SUM)


def test_the_descriptor_carries_the_group_by_its_flag():
    """nbuffers 0, buffer[0] the group's id, flags LS_DESC_GROUP: what the engine's check reads."""
    from libshare.ring import DESC_DTYPE
    from libshare.ring._binding import encode_op

    slot = np.frombuffer(encode_op(C.OP_DISPATCH | C.DESC_GROUP << 16, 3, (1, 1, 1), [77], [], b""), DESC_DTYPE)[0]
    assert (slot["flags"], slot["nbuffers"], slot["buffer"][0], slot["opcode"]) == (C.DESC_GROUP, 0, 77, C.OP_DISPATCH)
    with pytest.raises(libshare.LibshareError):  # a group with buffer ids beside it
        encode_op(C.OP_DISPATCH | C.DESC_GROUP << 16, 3, (1, 1, 1), [77, 78], [], b"")
    with pytest.raises(libshare.LibshareError):  # a flag no one defined
        encode_op(C.OP_DISPATCH | 0x8000 << 16, 3, (1, 1, 1), [77], [], b"")
