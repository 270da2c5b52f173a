"""The Session API against a real arbiter on lavapipe: kernels, buffers, errors, async."""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest

import libshare
from libshare import workloads

from tests._busy import long_queue

pytestmark = pytest.mark.usefixtures("vulkan_device_name")


@pytest.fixture
def session():
    with libshare.connect(name="test", mode="embedded") as s:
        yield s


@pytest.mark.parametrize("name", sorted(workloads.WORKLOADS))
def test_each_shader_matches_numpy(session, name):
    ticket = workloads.run(name, session, np.random.default_rng(5), {})
    assert ticket.done()


def test_saxpy_on_a_slice_binds_from_its_first_element(session):
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(2048), session.array(2048)
    x[:], y[:] = 1.0, 2.0
    session.dispatch(program, groups=16, buffers=[x[1024:], y[1024:]], push=struct.pack("If", 1024, 10.0)).wait(10)
    assert np.all(y[:1024] == 2.0) and np.all(y[1024:] == 12.0)


def test_bindings_remembered_per_array_follow_new_arrays_and_freed_buffers(session):
    program = session.load_program(libshare.shaders.path("saxpy"))
    push = struct.pack("If", 64, 1.0)
    x = session.array(64)
    x[:] = 1.0
    for round in range(20):  # new arrays, often at the address (and id) of one just dropped
        y = session.array(128)[64:]
        session.dispatch(program, 1, [x, y], push).wait(10)
        assert np.all(y == 1.0) and np.all(y.base[:64] == 0.0), f"round {round} bound a stale array"
        session.free(y)
        with pytest.raises(ValueError, match="not a view on a live buffer"):
            session.dispatch(program, 1, [x, y], push)
        del y


def test_a_buffer_freed_right_after_dispatches_serves_them_all(session):
    program = session.load_program(libshare.shaders.path("saxpy"))
    push = struct.pack("If", 64, 1.0)
    for round in range(5):
        x, y = session.array(64), session.array(64)
        x[:], y[:] = 1.0, 0.0
        tickets = [session.dispatch(program, 1, [x, y], push) for _ in range(300)]
        session.free(x)  # the arbiter pops the 300 before it lets go of x
        for ticket in tickets:
            ticket.wait(30)
        assert np.all(y == 300.0), f"round {round}"


def test_dispatches_of_one_session_run_in_order_and_see_earlier_writes(session):
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(4096), session.array(4096)
    x[:], y[:] = 1.0, 0.0
    tickets = [session.dispatch(program, groups=64, buffers=[x, y], push=struct.pack("If", 4096, 1.0))
               for _ in range(100)]
    for ticket in tickets:
        ticket.wait(30)
    assert np.all(y == 100.0)


def test_device_buffer_round_trip_through_copies(session):
    src, dst = session.array(10_000, np.int32), session.array(10_000, np.int32)
    src[:] = np.arange(10_000)
    device = session.alloc(src.nbytes, kind="device")
    session.copy(src, device)
    session.copy(device, dst).wait(10)
    assert np.array_equal(dst, src)


def test_program_interface_comes_from_the_spirv(session):
    program = session.load_program(libshare.shaders.path("matmul"))
    assert (program.bindings, program.push_size, program.local_size) == (3, 12, (16, 16, 1))


def test_wait_idle_waits_for_everything(session):
    program = session.load_program(libshare.shaders.path("busy"))
    data = session.array(4096, np.uint32)
    tickets = [session.dispatch(program, groups=64, buffers=[data], push=struct.pack("II", 4096, 50))
               for _ in range(20)]
    session.wait_idle(timeout=60)
    assert all(t.done() for t in tickets)
    assert np.array_equal(data, workloads.busy_reference(4096, 50))


def test_wait_times_out_with_a_libshare_timeout(session):
    [ticket] = long_queue(session, count=1)
    with pytest.raises(libshare.Timeout):
        ticket.wait(timeout=0.01)
    ticket.wait(timeout=120)


def test_free_while_in_flight_completes_the_work(session):
    program = session.load_program(libshare.shaders.path("busy"))
    data = session.array(1 << 16, np.uint32)
    ticket = session.dispatch(program, groups=1024, buffers=[data], push=struct.pack("II", 1 << 16, 500))
    session.free(data)
    ticket.wait(60)
    assert np.array_equal(data[:4096], workloads.busy_reference(4096, 500))
    with pytest.raises(ValueError, match="not a view on a live buffer"):
        session.dispatch(program, groups=1, buffers=[data], push=struct.pack("II", 1, 1))


class TestInvalidSubmissions:
    """Each bad descriptor completes with a clear error for that ticket only."""

    @pytest.fixture
    def parts(self, session):
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(1024), session.array(1024)
        return session, program, x, y

    def expect(self, ticket, text):
        with pytest.raises(libshare.InvalidSubmission, match=text):
            ticket.wait(10)

    def test_wrong_binding_count(self, parts):
        session, program, x, _ = parts
        self.expect(session.dispatch(program, 1, [x], struct.pack("If", 1, 1.0)), "bindings")

    def test_unknown_program(self, parts):
        session, program, x, y = parts
        fake = libshare.Program(9999, 2, 8, (64, 1, 1))
        self.expect(session.dispatch(fake, 1, [x, y], b""), "unknown program")

    def test_foreign_buffer_id(self, parts):
        session, program, x, _ = parts
        foreign = libshare.Buffer(session, 7777, 4096, "device")
        self.expect(session.dispatch(program, 1, [x, foreign], b""), "unknown or freed buffer")

    def test_group_count_beyond_device_limit(self, parts):
        session, program, x, y = parts
        self.expect(session.dispatch(program, (2**31, 1, 1), [x, y], b""), "group count")
        self.expect(session.dispatch(program, (0, 1, 1), [x, y], b""), "group count")

    def test_push_constants_larger_than_declared(self, parts):
        session, program, x, y = parts
        self.expect(session.dispatch(program, 1, [x, y], bytes(16)), "push-constant")

    def test_copy_out_of_range(self, parts):
        session, _, x, y = parts
        self.expect(session.copy(x, y, nbytes=1 << 20), "outside the buffer")

    def test_good_work_after_bad_still_runs(self, parts):
        session, program, x, y = parts
        x[:], y[:] = 1.0, 1.0
        bad = session.dispatch(program, 1, [x], b"")
        good = session.dispatch(program, 16, [x, y], struct.pack("If", 1024, 2.0))
        self.expect(bad, "bindings")
        good.wait(10)
        assert np.all(y == 3.0)


def test_garbage_spirv_is_refused(session):
    with pytest.raises(libshare.InvalidSubmission):
        session.load_program(b"\x03\x02\x23\x07" + bytes(64))


def test_bad_alloc_requests_are_refused(session):
    with pytest.raises(libshare.InvalidSubmission):
        session.alloc(0)
    with pytest.raises(libshare.InvalidSubmission):
        session.alloc(4096, kind="vram")


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
def test_await_ticket_on_asyncio_and_trio(session, anyio_backend):
    import anyio

    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(1024), session.array(1024)
    x[:], y[:] = 2.0, 1.0

    async def main():
        ticket = session.dispatch(program, 16, [x, y], struct.pack("If", 1024, 3.0))
        return await ticket

    done = anyio.run(main, backend=anyio_backend)
    assert done.device_ns is not None and np.all(y == 7.0)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
def test_many_tasks_await_tickets_of_one_session_at_once_without_threads(session, anyio_backend):
    """Twenty tasks each await a chain of five dispatches on their own slice: every result is right,
    and no thread was started for them (an await waits on the session's doorbell socket)."""
    import threading

    import anyio

    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(20 * 64), session.array(20 * 64)
    x[:], y[:] = 1.0, 0.0
    threads = threading.active_count()
    most = []

    async def chain(k):
        for _ in range(5):
            await session.dispatch(program, 1, [x[k * 64:], y[k * 64:]], struct.pack("If", 64, float(k)))
            most.append(threading.active_count())

    async def main():
        async with anyio.create_task_group() as group:
            for k in range(20):
                group.start_soon(chain, k)

    anyio.run(main, backend=anyio_backend)
    assert np.array_equal(y.reshape(20, 64), np.repeat(5.0 * np.arange(20.0), 64).reshape(20, 64))
    assert max(most) == threads, "an await started a thread"


def test_submit_cost_does_not_depend_on_buffer_size(session):
    """Zero-copy: the control socket carries the same few bytes for 4 KiB and 128 MiB."""
    program = session.load_program(libshare.shaders.path("saxpy"))
    sent = []
    for n in (1024, 32 << 20):
        before = session.stats()["control_bytes"]
        x, y = session.array(n), session.array(n)
        x[:], y[:] = 1.0, 1.0
        session.dispatch(program, 16, [x, y], struct.pack("If", 1024, 1.0)).wait(30)
        assert np.all(y[:1024] == 2.0)
        sent.append(session.stats()["control_bytes"] - before)
        session.free(x), session.free(y)
    assert sent[0] == sent[1] and sent[1] < 4096


def test_mode_daemon_without_a_daemon_raises(tmp_path):
    with pytest.raises(libshare.ArbiterUnavailable, match="no arbiter answers"):
        libshare.connect(mode="daemon", pipe_directory=tmp_path)


def test_bad_mode_is_a_value_error():
    with pytest.raises(ValueError, match="mode must be one of"):
        libshare.connect(mode="sometimes")


def test_pipelining_past_the_completion_ring_loses_nothing(tmp_path):
    """More dispatches than completion slots, none read until the end: every one completes."""
    from libshare.arbiter import Arbiter

    arbiter = Arbiter(timed=False)
    try:
        arbiter.serve(tmp_path / "control")
        with libshare.connect(mode="daemon", pipe_directory=tmp_path) as session:
            program = session.load_program(libshare.shaders.path("saxpy"))
            x, y = session.array(64), session.array(64)
            x[:], y[:] = 1.0, 0.0
            tickets = [session.dispatch(program, 1, [x, y], struct.pack("If", 64, 1.0)) for _ in range(4000)]
            session.wait_idle(timeout=120)
            assert all(t.done() for t in tickets)
            assert np.all(y == 4000.0)
    finally:
        arbiter.close()


def test_sessions_closed_after_their_arbiter_stopped_end_quietly(tmp_path):
    """A connection ending after close() must not wait on the stopped drain thread (it used to, 30 s)."""
    from libshare.arbiter import Arbiter

    tmp_path.chmod(0o700)
    arbiter = Arbiter()
    arbiter.serve(tmp_path / "control")
    sessions = [libshare.connect(mode="daemon", pipe_directory=tmp_path) for _ in range(3)]
    arbiter.close()
    queued = arbiter.drainer.tasks.queue.qsize()
    ran = []
    with pytest.raises(libshare.ServerNotReady, match="shutting down"):  # refused at once, not waited for
        arbiter.drainer.call(lambda: ran.append(True))
    assert arbiter.drainer.tasks.queue.qsize() == queued and not ran, "the call was queued for a stopped thread"
    for s in sessions:
        s.close()
    for thread in threading.enumerate():  # an exception in a connection thread fails the test (warnings are errors)
        if thread.name.startswith("libshare-client"):
            thread.join(timeout=30)
            assert not thread.is_alive(), "a connection thread outlived its closed session"


def test_a_quiet_arbiter_goes_back_to_its_threads(tmp_path):
    """A departed client's session thread waits a while for the next client, then ends: after a
    burst of clients, a quiet arbiter has no more threads than before it (none is left behind)."""
    from libshare.arbiter import Arbiter

    from tests.arbiter.conftest import wait_until

    tmp_path.chmod(0o700)
    arbiter = Arbiter()
    try:
        earlier = {t.ident for t in threading.enumerate()}  # another arbiter here (the embedded one) has its own
        arbiter.serve(tmp_path / "control")
        with libshare.connect(mode="daemon", pipe_directory=tmp_path):
            pass  # the gate's and the spare regions' threads exist from now on
        wait_until(lambda: [t for t in threading.enumerate() if t.name == "libshare-spares" and t.ident not in earlier],
                   60, "the spare regions' thread to start")  # a standing thread, started by the first hello
        wait_until(lambda: not [t for t in threading.enumerate() if t.name == "libshare-idle"], 60,
                   "the first session thread to end")
        before = {t.ident for t in threading.enumerate()}
        sessions = [libshare.connect(mode="daemon", pipe_directory=tmp_path) for _ in range(8)]
        for s in sessions:
            s.close()
        wait_until(lambda: not [t for t in threading.enumerate() if t.name in ("libshare-idle", "libshare-client")],
                   60, "the session threads to end")
        assert [t.name for t in threading.enumerate() if t.ident not in before] == []
    finally:
        arbiter.close()
