"""Texel buffers: a kernel reads uniform texel buffers and writes a storage texel buffer through views
(Session.texel_view), its bytes checked against numpy; and every hostile view, beside an honest client.

A view is part of the client's own buffer seen as texels of a format (serve/views.py): the arbiter
checks its buffer (the client's own, live), format (one the device supports), offset (aligned) and
size (whole texels within the buffer) before any VkBufferView exists, and the engine checks each
dispatch's views against the program's texel bindings (engine/validate.c). Each hostile case below
is refused (or, for a read past a view's end, bounded: zeros) for that client only, while an honest
session beside it computes and is checked. A session that reattaches to a new arbiter makes its views
again (client/reattach.py); a view of a device buffer is lost with it.
"""

from __future__ import annotations

import os
import signal
import struct

import numpy as np
import pytest

import libshare
from tests._busy import busy_iterations
from tests.arbiter.conftest import wait_until
from tests.arbiter.test_reattach import supervised  # noqa: F401 (a fixture)
from tests.arbiter.test_resources import compile_glsl

N = 256

# y[i] = uint(a[i] * 1000) + uint(c[i].x * 255) * 1000000 + uint(c[i].w * 255): a[] is r32f, c[] rgba8 (unorm),
# both uniform texel buffers; y[] an r32ui storage texel buffer. push: how many texels to write.
TEXEL = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) uniform samplerBuffer a;
layout(set = 0, binding = 1) uniform samplerBuffer c;
layout(set = 0, binding = 2, r32ui) uniform writeonly uimageBuffer y;
layout(push_constant) uniform Push { uint n; uint shift; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.n) return;
    int j = int(i + p.shift);
    vec4 colour = texelFetch(c, j);
    uint value = uint(round(texelFetch(a, j).x * 1000.0)) + uint(round(colour.x * 255.0)) * 1000000u
               + uint(round(colour.w * 255.0));
    imageStore(y, int(i), uvec4(value));
}
"""


@pytest.fixture
def texel_module(tmp_path) -> bytes:
    return compile_glsl(tmp_path, "texel", TEXEL)


def _inputs(session, rng):
    """a (r32f), c (rgba8) and y (r32ui) arrays of N texels each, on buffers of their own."""
    a, c, y = session.array(N, np.float32), session.array((N, 4), np.uint8), session.array(N, np.uint32)
    a[:] = rng.integers(0, 1000, N) / 1000.0
    c[:] = rng.integers(0, 256, (N, 4))
    return a, c, y


def _expected(a, c, shift=0, n=N) -> np.ndarray:
    """What the kernel writes for texels shift.. of a and c (zeros past their ends: robust reads)."""
    count = len(a)
    index = np.arange(n) + shift
    inside = index < count
    a_read = np.where(inside, a[np.minimum(index, count - 1)], 0.0)
    c_read = np.where(inside[:, None], c[np.minimum(index, count - 1)].astype(np.uint32), 0)
    return (np.round(a_read * 1000.0).astype(np.uint32) + c_read[:, 0] * 1000000
            + np.where(inside, c_read[:, 3], 0).astype(np.uint32))


def _run(session, program, a, c, y, shift=0, n=N, views=None):
    """Dispatch the texel kernel over whole-array views (or ``views``); the ticket waited."""
    views = views or (session.texel_view(a, "r32f"), session.texel_view(c, "rgba8"), session.texel_view(y, "r32ui"))
    session.dispatch(program, -(-n // 64), views, struct.pack("II", n, shift)).wait(60)


def _honest(session, program, rng) -> None:
    a, c, y = _inputs(session, rng)
    _run(session, program, a, c, y)
    np.testing.assert_array_equal(y, _expected(a, c))


def test_a_kernel_reads_uniform_texel_buffers_and_writes_a_storage_one(texel_module):
    rng = np.random.default_rng(1)
    with libshare.connect(mode="embedded") as session:
        program = session.load_program(texel_module)
        a, c, y = _inputs(session, rng)
        _run(session, program, a, c, y)
        np.testing.assert_array_equal(y, _expected(a, c))
        y[:] = 7
        view = session.texel_view(y.view(np.uint8)[64 * 4:], "r32ui")  # a view from byte 256: texels 64..
        assert (view.offset, view.nbytes) == (256, (N - 64) * 4)
        _run(session, program, a, c, y, n=N - 64, views=(session.texel_view(a, "r32f"),
                                                          session.texel_view(c, "rgba8"), view))
        np.testing.assert_array_equal(y[64:], _expected(a, c, n=N - 64))
        np.testing.assert_array_equal(y[:64], 7)  # nothing before the view's offset is written


def test_views_past_the_first_table_rebuild_still_hold_their_buffers(texel_module):
    """Each view is put into the client's engine table beside its buffer; a put that grows the table
    moves its slots (engine/objects.c), and the view still holds the buffer it was made over."""
    rng = np.random.default_rng(5)
    with libshare.connect(mode="embedded") as session:
        program = session.load_program(texel_module)
        a, c, y = _inputs(session, rng)
        views = [session.texel_view(y, "r32ui") for _ in range(40)]  # the table starts with 16 slots
        _run(session, program, a, c, y, views=(session.texel_view(a, "r32f"), session.texel_view(c, "rgba8"),
                                               views[-1]))
        np.testing.assert_array_equal(y, _expected(a, c))
        for view in views[:-1]:
            session.free(view)
        session.free(y)  # with its last view
        assert views[-1].freed


# y[i] = a[i] (r32ui views), after `rounds` rounds of an LCG per invocation that the compiler cannot drop
BUSY_TEXEL = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) uniform usamplerBuffer a;
layout(set = 0, binding = 1, r32ui) uniform writeonly uimageBuffer y;
layout(push_constant) uniform Push { uint n; uint rounds; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.n) return;
    uint x = i;
    for (uint r = 0u; r < p.rounds; r++) x = x * 1664525u + 1013904223u;
    imageStore(y, int(i), uvec4(texelFetch(a, int(i)).x + uint(x == 0xFFFFFFFFu && i == 0xFFFFFFFFu)));
}
"""


def test_a_buffer_freed_under_a_running_dispatch_lives_until_its_view_is_done(tmp_path):
    """Freeing a buffer frees its views; a dispatch already taken (popped, in flight) runs through them to
    the end: the view holds the buffer in the engine (engine/objects.c, "Views"), so the buffer is not
    destroyed and its memory, which the client's limits count, is released only once the dispatch retires."""
    n = 1 << 16
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        program = session.load_program(compile_glsl(tmp_path, "busy_texel", BUSY_TEXEL))
        honest_program = honest.load_program(compile_glsl(tmp_path, "texel", TEXEL))
        a, y = session.array(n, np.uint32), session.array(n, np.uint32)
        a[:] = np.arange(n, dtype=np.uint32) * 3
        held = session.stats()["memory_bytes"]
        taken = session.stats()["submitted"]
        views = (session.texel_view(a, "r32ui"), session.texel_view(y, "r32ui"))
        ticket = session.dispatch(program, n // 64, views, struct.pack("II", n, busy_iterations(20_000)))
        wait_until(lambda: session.stats()["submitted"] > taken, 60, "the engine to take the dispatch")
        session.free(y)  # about half a second before the dispatch ends (on lavapipe; scaled on a GPU)
        assert views[1].freed and session.stats()["memory_bytes"] == held  # y's pages: still held
        ticket.wait(120)
        np.testing.assert_array_equal(y, a)  # written through the view of the freed buffer
        wait_until(lambda: session.stats()["memory_bytes"] == held - y.nbytes, 60, "the freed buffer's release")
        _honest(honest, honest_program, np.random.default_rng(7))


def test_reads_past_a_views_end_are_zeros_and_writes_past_it_are_dropped(texel_module):
    rng = np.random.default_rng(2)
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        program, honest_program = session.load_program(texel_module), honest.load_program(texel_module)
        a, c, y = _inputs(session, rng)
        a_view, c_view = session.texel_view(a[:64], "r32f"), session.texel_view(c[:64], "rgba8")
        y_view = session.texel_view(y[:128], "r32ui")
        y[:] = 5
        _run(session, program, a, c, y, shift=32, n=N, views=(a_view, c_view, y_view))
        np.testing.assert_array_equal(y[:128], _expected(a[:64], c[:64], shift=32, n=128))  # zeros past 64
        np.testing.assert_array_equal(y[128:], 5)  # the writes past the y view's end went nowhere
        _honest(honest, honest_program, rng)


# a[i] (a uniform texel buffer, r32f) into y[i] (a storage buffer): a texel binding beside a buffer binding
MIXED = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) uniform samplerBuffer a;
layout(set = 0, binding = 1) buffer Out { float y[]; };
void main() { uint i = gl_GlobalInvocationID.x; y[i] = texelFetch(a, int(i)).x; }
"""


def _view_of_another_clients_buffer(session, victim, program, rng):
    """The victim's buffer id, and the victim's view, named by the attacker: neither is the attacker's."""
    a, c, y = _inputs(victim, rng)
    victim_view = victim.texel_view(y, "r32ui")
    buffer = victim.texel_view(a, "r32f").buffer
    assert buffer.id > max(session._objects, default=0)  # no object of the attacker's has that id
    with pytest.raises(libshare.InvalidSubmission, match=f"no buffer {buffer.id} of this session"):
        session.texel_view(buffer, "r32f")
    with pytest.raises(libshare.InvalidSubmission, match="unknown or freed buffer id"):
        _run(session, program, a, c, y, views=(victim_view, victim_view, victim_view))
    assert not y.any()  # nothing was written through the victim's view


def _views_past_the_buffer(session, victim, program, rng):
    array = session.array(1024, np.float32)  # one page
    buffer = session.texel_view(array, "r32f").buffer
    with pytest.raises(libshare.InvalidSubmission, match="whole texels"):
        session.texel_view(buffer, "r32f", nbytes=buffer.size + 4)
    with pytest.raises(libshare.InvalidSubmission, match="whole texels"):
        session.texel_view(buffer, "r32f", offset=buffer.size - 16, nbytes=32)
    with pytest.raises(libshare.InvalidSubmission, match="past its buffer"):
        session.texel_view(buffer, "r32f", offset=buffer.size)
    with pytest.raises(libshare.InvalidSubmission, match="whole texels"):
        session.texel_view(buffer, "rgba32f", nbytes=24)  # a texel and a half


def _misaligned_offset(session, victim, program, rng):
    array = session.array(1024, np.float32)
    with pytest.raises(libshare.InvalidSubmission, match="offset must be a multiple of"):
        session.texel_view(array, "r32f", offset=4)
    with pytest.raises(libshare.InvalidSubmission, match="offset must be a multiple of"):
        session.texel_view(array[1:], "r32f")  # an array's first byte, 4 bytes in


def _unsupported_format(session, victim, program, rng):
    array = session.array(1024, np.float32)
    for name in ("rgb9e5", "R32F", "", "r32f\0"):
        with pytest.raises(libshare.InvalidSubmission, match="format must be one of"):
            session.texel_view(array, name)


def _views_and_buffers_swapped(session, victim, program, rng):
    mixed = session.load_program(session._texel_mixed)
    x, y = session.array(N, np.float32), session.array(N, np.float32)
    x[:] = rng.random(N, np.float32)
    view_x, view_y = session.texel_view(x, "r32f"), session.texel_view(y, "r32f")
    for buffers in ([x, y], [view_x, view_y], [y, view_x]):  # a buffer at the texel binding, a view at the buffer's
        with pytest.raises(libshare.InvalidSubmission, match="unknown or freed buffer id"):
            session.dispatch(mixed, N // 64, buffers).wait(60)
    a, c, out = _inputs(session, rng)
    wrong = (session.texel_view(a, "r32ui"), session.texel_view(c, "rgba8"), session.texel_view(out, "r32ui"))
    with pytest.raises(libshare.InvalidSubmission, match="bindings"):  # an r32ui view where r32f is read
        _run(session, program, a, c, out, views=wrong)
    wrong = (session.texel_view(a, "r32f"), session.texel_view(c, "rgba8"), session.texel_view(out, "r32f"))
    with pytest.raises(libshare.InvalidSubmission, match="bindings"):  # an r32f view at the r32ui storage binding
        _run(session, program, a, c, out, views=wrong)
    assert not y.any() and not out.any()
    session.dispatch(mixed, N // 64, [view_x, y]).wait(60)  # the right ones still run
    np.testing.assert_array_equal(y, x)


def _view_after_its_buffer_was_freed(session, victim, program, rng):
    a, c, y = _inputs(session, rng)
    views = (session.texel_view(a, "r32f"), session.texel_view(c, "rgba8"), session.texel_view(y, "r32ui"))
    session.free(y)
    assert views[2].freed
    with pytest.raises(libshare.InvalidSubmission, match="unknown or freed buffer id"):
        _run(session, program, a, c, y, views=views)
    session.free(views[0])
    with pytest.raises(libshare.InvalidSubmission, match="no such buffer, program, command list, bind group or texel view"):
        session._request("free", view_id=views[0].id)


ATTACKS = {
    "a view of another client's buffer": _view_of_another_clients_buffer,
    "a view past its buffer's end": _views_past_the_buffer,
    "a misaligned offset": _misaligned_offset,
    "an unsupported format": _unsupported_format,
    "views and buffers at each other's bindings, views of the wrong format": _views_and_buffers_swapped,
    "a view used after its buffer was freed": _view_after_its_buffer_was_freed,
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_hostile_views_are_refused_to_their_client_beside_an_honest_one(tmp_path, texel_module, attack):
    rng = np.random.default_rng(3)
    with (libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as victim,
          libshare.connect(mode="embedded") as honest):
        session._texel_mixed = compile_glsl(tmp_path, "mixed", MIXED)
        program, honest_program = session.load_program(texel_module), honest.load_program(texel_module)
        victim_program = victim.load_program(texel_module)
        for _ in range(3):  # the attacker's ids stay below the victim's
            victim.alloc(4096)
        _honest(honest, honest_program, rng)
        ATTACKS[attack](session, victim, program, rng)
        _honest(honest, honest_program, rng)
        _honest(victim, victim_program, rng)
        _honest(session, program, rng)  # the attacker itself goes on


def test_views_survive_an_arbiter_restart_and_a_device_buffers_view_is_lost(supervised, texel_module):  # noqa: F811
    rng = np.random.default_rng(4)
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        program = session.load_program(texel_module)
        a, c, y = _inputs(session, rng)
        views = (session.texel_view(a, "r32f"), session.texel_view(c, "rgba8"), session.texel_view(y, "r32ui"))
        device_view = session.texel_view(session.alloc(4096, "device"), "r32f")
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: supervised.arbiter() not in (before, None), 60, "the standby to take over")
        _run(session, program, a, c, y, views=views)  # the same views, made again by the new arbiter
        np.testing.assert_array_equal(y, _expected(a, c))
        assert session.reattached == 1 and [view.lost for view in views] == [None] * 3
        assert isinstance(device_view.lost, libshare.BufferLost)


def test_hostile_view_requests_are_refused_by_their_schema_beside_an_honest_client(texel_module):
    """The ``view`` request's fields (serve/views.py) as a hostile client writes them: each refused,
    naming the field, and nothing is made; an honest session beside it computes."""
    rng = np.random.default_rng(6)
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        honest_program = honest.load_program(texel_module)
        buffer = session.alloc(4096)
        freed = session.alloc(4096)
        session.free(freed)
        hostile = [
            ({"buffer_id": buffer.id}, libshare.ProtocolError, "'format' is missing"),
            ({"format": "r32f"}, libshare.ProtocolError, "'buffer_id' is missing"),
            ({"buffer_id": buffer.id, "format": "r32f", "range": 16}, libshare.ProtocolError, "unknown field"),
            ({"buffer_id": -1, "format": "r32f"}, libshare.InvalidSubmission, "buffer_id"),
            ({"buffer_id": True, "format": "r32f"}, libshare.InvalidSubmission, "buffer_id"),
            ({"buffer_id": buffer.id, "format": 3}, libshare.InvalidSubmission, "format must be one of"),
            ({"buffer_id": buffer.id, "format": "r32f", "offset": -16}, libshare.InvalidSubmission, "offset"),
            ({"buffer_id": buffer.id, "format": "r32f", "offset": 1 << 41}, libshare.InvalidSubmission, "offset"),
            ({"buffer_id": buffer.id, "format": "r32f", "size": 0}, libshare.InvalidSubmission, "size"),
            ({"buffer_id": buffer.id, "format": "r32f", "size": "4"}, libshare.InvalidSubmission, "size"),
            ({"buffer_id": buffer.id, "format": "r32f", "id": 1}, libshare.InvalidSubmission, "given out already"),
            ({"buffer_id": freed.id, "format": "r32f"}, libshare.InvalidSubmission, f"no buffer {freed.id}"),
        ]
        for fields, error, named in hostile:
            with pytest.raises(error, match=named):
                session._request("view", **fields)
            _honest(honest, honest_program, rng)
        with pytest.raises(libshare.ProtocolError, match="carries no file descriptors"):
            session._request("view", fds=(buffer.memfd,), buffer_id=buffer.id, format="r32f")
        with pytest.raises(libshare.ProtocolError, match="one buffer_id, program_id, list_id, group_id or view_id"):
            session._request("free", buffer_id=buffer.id, view_id=buffer.id)
        view = session.texel_view(buffer, "r32f")  # the session goes on
        assert (view.offset, view.nbytes) == (0, buffer.size)
        _honest(honest, honest_program, rng)


def test_the_vetting_trial_binds_a_view_at_each_texel_buffer(texel_module, vulkan_device_name):
    """A daemon's vetting child runs each new module once (programs/compiler.py, ``_trial``): at a texel
    buffer it binds a view of its trial buffer of a format the binding takes, never a buffer descriptor
    where the pipeline's layout has a texel one; the device layer's recordings write each binding's kind."""
    from libshare.arbiter.device import Device, DeviceView, Dispatch
    from libshare.arbiter.programs.compiler import _trial
    from libshare.arbiter.programs.spirv import bound_in_set_zero
    from libshare.errors import InvalidSubmission

    with Device() as device:
        _trial(device, texel_module, 3, 8, "main")
        pipeline = device.create_pipeline(bound_in_set_zero(texel_module), 3, 8)
        assert pipeline.texel == {0: ("r32f", "rg32f", "rgba32f", "r16f", "rgba16f", "rgba8", "rgba8_snorm"),
                                  1: ("r32f", "rg32f", "rgba32f", "r16f", "rgba16f", "rgba8", "rgba8_snorm"),
                                  2: ("r32ui",)} and pipeline.uniform == {0, 1}
        buffers = [device.alloc_device(4096) for _ in range(3)]
        with pytest.raises(InvalidSubmission, match="binding 0 is a texel buffer"):
            device.submit([Dispatch(pipeline, [(b, 0) for b in buffers], (1, 1, 1), bytes(8))])
        view = device.create_view(buffers[0], 100, 0, 4096)
        assert isinstance(view, DeviceView)
        device.destroy_view(view)
        for buffer in buffers:
            device.destroy_buffer(buffer)
        device.destroy_pipeline(pipeline)


def test_a_daemon_vets_and_runs_a_texel_kernel(daemon, texel_module):
    _, pipe = daemon
    rng = np.random.default_rng(8)
    with libshare.connect(mode="daemon", pipe_directory=pipe, timeout=30) as session:
        _honest(session, session.load_program(texel_module), rng)  # vetted in a child first


def test_a_command_list_runs_through_views_and_refuses_a_freed_one(texel_module):
    """A command list's dispatches name views as single dispatches do (each checked when the list is
    kept and again as it runs: engine/lists.c); a view freed since is refused at the next run."""
    rng = np.random.default_rng(9)
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        program, honest_program = session.load_program(texel_module), honest.load_program(texel_module)
        a, c, y = _inputs(session, rng)
        views = (session.texel_view(a, "r32f"), session.texel_view(c, "rgba8"), session.texel_view(y, "r32ui"))
        with session.record() as commands:
            commands.dispatch(program, N // 64, views, struct.pack("II", N, 0))
        commands.submit().wait(60)
        np.testing.assert_array_equal(y, _expected(a, c))
        session.free(views[0])
        with pytest.raises(libshare.InvalidSubmission, match="unknown or freed buffer id"):
            commands.submit().wait(60)
        _honest(honest, honest_program, rng)


def test_views_bind_through_a_bind_group_and_a_lists_parameters(texel_module):
    """A view goes wherever a buffer is bound, at a texel binding: a bind group's entry (whole, checked when the
    group is made and at each dispatch) and a command list's parameter slot (checked as its command runs: the
    binding it lands at says view or buffer, engine/validate.c's check_binding); each refuses what a plain
    dispatch would, to its client alone."""
    rng = np.random.default_rng(11)
    push = struct.pack("II", N, 0)
    with libshare.connect(mode="embedded") as session, libshare.connect(mode="embedded") as honest:
        program, honest_program = session.load_program(texel_module), honest.load_program(texel_module)
        a, c, y = _inputs(session, rng)
        views = (session.texel_view(a, "r32f"), session.texel_view(c, "rgba8"), session.texel_view(y, "r32ui"))
        group = session.bind_group(program, views)
        session.dispatch(program, N // 64, group, push).wait(60)
        np.testing.assert_array_equal(y, _expected(a, c))
        refused = [([a, views[1], views[2]], "unknown or freed buffer id"),  # a buffer at a texel binding
                   ([(views[0], 16, None), views[1], views[2]], "outside the buffer"),  # a view has its own range
                   ([session.texel_view(a, "r32ui"), views[1], views[2]], "number of buffers differs")]  # format
        for entries, named in refused:
            with pytest.raises(libshare.InvalidSubmission, match=named):
                session.bind_group(program, entries)
            _honest(honest, honest_program, rng)
        y[:] = 0
        with session.record() as commands:
            commands.dispatch(program, N // 64, [commands.argument(0), views[1], views[2]], push)
            commands.dispatch(program, N // 64, group, push)
        commands.submit(buffers=[views[0]]).wait(60)
        np.testing.assert_array_equal(y, _expected(a, c))
        with pytest.raises(libshare.InvalidSubmission, match="unknown or freed buffer id"):
            commands.submit(buffers=[a]).wait(60)  # a buffer given for a slot that lands at a texel binding
        session.free(views[0])  # the group names it by id: its dispatches fail from now on
        with pytest.raises(libshare.InvalidSubmission, match="unknown or freed buffer id"):
            session.dispatch(program, N // 64, group, push).wait(60)
        _honest(honest, honest_program, rng)
