"""Command lists with parameters (engine/lists.c, client/lists.py): a command binds the buffer of a
submission's slot (``commands.argument(k)``, LS_LIST_ARG | k) or takes its push constants
(``commands.SUBMISSION_PUSH``); each submission's parameters are checked against what the list
uses, substituted into a private copy of each command and checked as a popped descriptor is.
Hostile parameters fail their own client only, beside an honest streaming client whose results
are checked (by hand, and seeded at random: ``LIBSHARE_FUZZ_SEED``); a long dispatch of a list
runs in pieces as a single one does, under a close and a hand-over too."""

from __future__ import annotations

import os
import signal
import struct

import numpy as np
import pytest

import libshare
from libshare.errors import InvalidSubmission, LibshareError, QuotaExceeded
from libshare.ring import C
from libshare.ring._binding import DESC_DTYPE
from libshare.workloads import busy_reference

from tests._busy import busy_iterations
from tests._wait import wait_until
from tests.arbiter.test_command_lists import _honest, serving
from tests.arbiter.test_reattach import exited, supervised  # noqa: F401 - a control daemon with a standby
from tests.arbiter.test_scheduling import low_and_realtime, low_slot

NO_PUSH = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Data { uint data[]; };
void main() { data[gl_GlobalInvocationID.x % 16] = 1u; }
"""
N = 1000  # floats per array: not a multiple of the workgroup (64), so the bounds check in saxpy matters
GROUPS = -(-N // 64)


def _record(session, saxpy, own):
    """y += a*x on two parameters (a from the submission), a copy of a slice of y into a third, then a
    fixed saxpy of the list's own array into the third: the list and the same commands inline."""
    with session.record() as commands:
        x, y, z = commands.argument(0), commands.argument(1), commands.argument(2)
        commands.dispatch(saxpy, GROUPS, [x, y], push=commands.SUBMISSION_PUSH)
        commands.copy(y, z, 400, src_offset=40, dst_offset=80)
        commands.dispatch(saxpy, GROUPS, [own, z], struct.pack("If", N, 0.5))

    def inline(arrays, push):
        x, y, z = arrays
        session.dispatch(saxpy, GROUPS, [x, y], push)
        session.copy(y, z, 400, src_offset=40, dst_offset=80)
        return session.dispatch(saxpy, GROUPS, [own, z], struct.pack("If", N, 0.5))
    return commands, inline


def test_parameters_give_the_bytes_of_the_same_commands_inline(tmp_path):
    """60 submissions of one list, each with other buffers (slices among them: an offset per slot)
    and another push constant, against the same commands dispatched with them inline."""
    rng = np.random.default_rng(11)
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        own = session.array(N)
        own[:] = rng.uniform(-1, 1, N).astype(np.float32)
        commands, inline = _record(session, saxpy, own)
        listed = [session.array(N + 64) for _ in range(5)]
        single = [session.array(N + 64) for _ in range(5)]
        start = rng.uniform(-1, 1, (5, N + 64)).astype(np.float32)
        for arrays in (listed, single):
            for array, values in zip(arrays, start):
                array[:] = values
        for _ in range(60):
            picks = rng.choice(5, 3, replace=False)
            shift = int(rng.choice([0, 16, 64]))  # a slice binds from its first element: offset[k]
            push = struct.pack("If", N, float(rng.choice([0.5, -0.75, 2.0])))
            ticket = commands.submit(push, [listed[picks[0]][shift:], listed[picks[1]], listed[picks[2]]])
            ticket.wait(30)
            assert ticket.device_ns > 0
            inline([single[picks[0]][shift:], single[picks[1]], single[picks[2]]], push).wait(30)
        for a, b in zip(listed, single):
            assert a.tobytes() == b.tobytes()
        stats = session.stats()
        assert stats["errors"] == 0 and stats["listed"] == 60 * 3


def _honest_stream(streams, pipe_dir):
    honest = streams(pipe_dir)
    wait_until(lambda: honest.served_by(os.getpid()), 120, "the honest client's first dispatch")
    return honest


def test_hostile_parameters_fail_their_own_client_only(tmp_path, streams):
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as victim, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as attacker:
        honest = _honest_stream(streams, pipe_dir)
        for _ in range(12):  # the victim holds ids the attacker never had (ids count per client)
            theirs = victim.array(N)
        theirs[:] = 7.0
        saxpy = attacker.load_program(libshare.shaders.path("saxpy"))
        busy = attacker.load_program(libshare.shaders.path("busy"))
        x, y, z = attacker.array(N), attacker.array(N), attacker.array(N)
        push = struct.pack("If", N, 1.0)
        with attacker.record() as commands:
            commands.dispatch(saxpy, GROUPS, [commands.argument(0), commands.argument(1)],
                              push=commands.SUBMISSION_PUSH)

        # Too few, too many parameter buffers: LS_EBINDINGS, nothing runs.
        for buffers in ([x], [x, y, z]):
            with pytest.raises(InvalidSubmission, match="number of buffers differs"):
                commands.submit(push, buffers).wait(30)
        # A push size past the program's (saxpy takes 8 bytes), or not a multiple of 4: LS_EPUSH.
        for bad_push in (push + bytes(8), push[:6]):
            with pytest.raises(InvalidSubmission, match="more push-constant bytes"):
                commands.submit(bad_push, [x, y]).wait(30)
        # A parameter naming the other client's buffer (its id means nothing here), or a freed one.
        others = victim._binding(theirs)[1]
        assert others > commands.id > attacker._binding(z)[1]
        with pytest.raises(InvalidSubmission, match="unknown or freed buffer"):
            attacker._push(C.OP_LIST, commands.id, 0, 0, 0, [attacker._binding(x)[1], others], [0, 0], push).wait(30)
        gone = attacker.array(N)
        gone_id = attacker._binding(gone)[1]
        attacker.free(gone)
        with pytest.raises(InvalidSubmission, match="unknown or freed buffer"):
            attacker._push(C.OP_LIST, commands.id, 0, 0, 0, [attacker._binding(x)[1], gone_id], [0, 0], push).wait(30)
        # A parameter offset past the buffer, or that wraps 2^64 past the command's own offset.
        with pytest.raises(InvalidSubmission, match="outside the buffer"):
            attacker._push(C.OP_LIST, commands.id, 0, 0, 0, [attacker._binding(x)[1]] * 2, [0, 1 << 20],
                           push).wait(30)

        # At registration: a slot past the eighth (LS_LIST_ARG | 9), a SUBMISSION_PUSH command whose
        # program takes no push constants (or with push bytes of its own), flags it does not know.
        raw = np.zeros(1, DESC_DTYPE)
        raw["opcode"], raw["program"], raw["nbuffers"], raw["groups"] = C.OP_DISPATCH, saxpy.id, 2, 1
        raw["buffer"][0, :2] = [C.LIST_ARG | 0, C.LIST_ARG | 9]
        with pytest.raises(InvalidSubmission, match="number of buffers differs"):
            attacker._request("load_list", raw.tobytes())
        with pytest.raises(InvalidSubmission, match="parameter slot is 0 to 7"):
            commands.argument(9)
        no_push = attacker.load_program(libshare.compile(NO_PUSH))
        bare = np.zeros(1, DESC_DTYPE)
        bare["opcode"], bare["program"], bare["nbuffers"], bare["groups"] = C.OP_DISPATCH, no_push.id, 1, 1
        bare["buffer"][0, 0], bare["flags"] = C.LIST_ARG | 0, C.DESC_SUBMISSION_PUSH
        with pytest.raises(InvalidSubmission, match="more push-constant bytes"):
            attacker._request("load_list", bare.tobytes())
        with pytest.raises(InvalidSubmission, match="more push-constant bytes"):
            with attacker.record() as refused:
                refused.dispatch(no_push, 1, [refused.argument(0)], push=refused.SUBMISSION_PUSH)
        own_push = raw.copy()
        own_push["buffer"][0, :2] = [C.LIST_ARG | 0, C.LIST_ARG | 1]
        own_push["flags"], own_push["push_size"] = C.DESC_SUBMISSION_PUSH, 8
        with pytest.raises(InvalidSubmission, match="more push-constant bytes"):
            attacker._request("load_list", own_push.tobytes())
        copy_push = np.zeros(1, DESC_DTYPE)  # a copy takes no push constants
        copy_push["opcode"], copy_push["nbuffers"], copy_push["flags"] = C.OP_COPY, 2, C.DESC_SUBMISSION_PUSH
        copy_push["buffer"][0, :2] = [C.LIST_ARG | 0, attacker._binding(y)[1]]
        copy_push["offset"][0, :3] = [0, 0, 64]
        with pytest.raises(InvalidSubmission, match="more push-constant bytes"):
            attacker._request("load_list", copy_push.tobytes())
        unknown = own_push.copy()
        unknown["push_size"], unknown["flags"] = 0, C.DESC_SUBMISSION_PUSH | 4
        with pytest.raises(InvalidSubmission, match="descriptor fields out of range"):
            attacker._request("load_list", unknown.tobytes())
        # A popped descriptor that names a parameter or takes the submission's push: not a list's.
        with pytest.raises(InvalidSubmission, match="unknown or freed buffer"):
            attacker._push(C.OP_DISPATCH, saxpy.id, 1, 1, 1, [C.LIST_ARG | 0, attacker._binding(y)[1]], [0, 0],
                           push).wait(30)
        # A list whose commands take no parameters takes none.
        with attacker.record() as plain:
            plain.dispatch(busy, 1, [x], struct.pack("II", 16, 1))
        with pytest.raises(InvalidSubmission, match="number of buffers differs"):
            plain.submit(b"", [x]).wait(30)
        with pytest.raises(InvalidSubmission, match="more push-constant bytes"):
            plain.submit(push).wait(30)

        x[:], y[:] = 2.0, 1.0
        commands.submit(push, [x, y]).wait(30)  # the attacker's own honest submission still runs
        assert np.array_equal(y, np.full(N, 3.0, np.float32))
        assert np.array_equal(theirs, np.full(N, 7.0, np.float32)), "the victim's buffer untouched"
        end = honest.finish()
        assert end["ok"] > 0 and end["restarted"] == 0
        assert victim.stats()["errors"] == 0


def test_a_long_dispatch_of_a_list_runs_in_pieces_while_a_realtime_client_is_active(tmp_path, vulkan_device_name):
    """A list's dispatch that would be cut alone is cut the same way: its pieces go in one at a time,
    the list's next command only after the last; the list is answered once, with the pieces'
    device time, and computes what it computes whole."""
    with low_and_realtime(tmp_path / "pipe") as pair:
        engine, slot, low = pair.arbiter.drainer.engine, low_slot(pair.arbiter), pair.low
        rounds = busy_iterations(4_000)  # 16 workgroups, ~2 ms on lavapipe
        pair.low_busy(16, 1024, rounds).wait(30)  # timed: the client has an estimate
        busy = low.load_program(libshare.shaders.path("busy"))
        first, second = low.array(1024, np.uint32), low.array(1024, np.uint32)
        with low.record() as commands:
            commands.dispatch(busy, 16, [commands.argument(0)], push=commands.SUBMISSION_PUSH)
            commands.dispatch(busy, 16, [commands.argument(1)], struct.pack("II", 1024, rounds))
            commands.copy(commands.argument(0), commands.argument(1), 256)
        before = engine.stats(slot)
        pair.tiny().wait(10)  # the realtime client is active
        ticket = commands.submit(struct.pack("II", 1024, rounds + 1), [first, second])
        ticket.wait(60)
        stats = engine.stats(slot)
        assert stats.cut - before.cut == 2 and stats.pieces - before.pieces >= 4, (before, stats)
        assert stats.listed - before.listed == 3 and stats.completed - before.completed == 1
        assert stats.outstanding == 0 and ticket.device_ns == stats.device_ns - before.device_ns > 0, "every piece's"
        assert np.array_equal(first, busy_reference(1024, rounds + 1)), "the pieces ran every workgroup once"
        expected = busy_reference(1024, rounds)
        assert not np.array_equal(expected[:64], first[:64])
        expected[:64] = first[:64]
        assert np.array_equal(second, expected), "the copy ran after the second dispatch's last piece"


def test_a_client_that_leaves_mid_cut_of_its_list_is_reclaimed(tmp_path):
    """A low session closed while a dispatch of its list runs in pieces: the cut ends with its list
    (the piece on the device answers the ticket, to no one), the rest never runs, the client is
    reclaimed, and its realtime neighbour runs on."""
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="realtime") as honest:
        _, _, check = _honest(honest)
        check()  # the realtime client is active: low work is cut
        leaving = libshare.connect(mode="daemon", pipe_directory=pipe_dir, priority="low")
        busy, data = leaving.load_program(libshare.shaders.path("busy")), leaving.array(4096, np.uint32)
        with leaving.record() as commands:  # none timed yet: as many pieces as may be, one a workgroup
            commands.dispatch(busy, 64, [commands.argument(0)], push=commands.SUBMISSION_PUSH)
            commands.dispatch(busy, 64, [commands.argument(0)], push=commands.SUBMISSION_PUSH)
        engine = arbiter.drainer.engine
        slot = next(c.slot for c in arbiter.drainer.clients.values() if c.id == leaving.client_id)
        commands.submit(struct.pack("II", 4096, busy_iterations(20_000)), [data])
        wait_until(lambda: engine.stats(slot).pieces >= 2, 30, "the list's dispatch to run in pieces")
        leaving.close()
        wait_until(lambda: leaving.client_id not in arbiter.drainer.clients, 60, "the leaving client's reclaim")
        totals = arbiter.drainer.totals
        assert 2 <= totals.pieces < 128 and totals.cut == 1 and totals.listed == 1, totals
        assert (totals.submitted, totals.completed, totals.errors) == (1, 0, 0), totals
        check()


def test_a_restart_finishes_a_list_whose_dispatch_runs_in_pieces(supervised):
    """A hand-over finishes what runs: the rest of the cut, then the rest of its list, on the old
    arbiter; the list's ticket is answered done, every workgroup and command run."""
    connect = lambda priority: libshare.connect(mode="daemon", pipe_directory=supervised.pipe,  # noqa: E731
                                                timeout=30, priority=priority)
    with connect("realtime") as realtime, connect("low") as low:
        saxpy, x, y = realtime.load_program(libshare.shaders.path("saxpy")), realtime.array(64), realtime.array(64)
        busy, data, copied = low.load_program(libshare.shaders.path("busy")), low.array(4096, np.uint32), \
            low.array(4096, np.uint32)
        push = struct.pack("II", 4096, busy_iterations(500_000))  # 64 workgroups, ~1 s on lavapipe
        low.dispatch(busy, 64, [data], push).wait(120)  # whole, and timed: the next one has an estimate
        whole = np.array(data)
        data[:] = 0
        with low.record() as commands:
            commands.dispatch(busy, 64, [commands.argument(0)], push=commands.SUBMISSION_PUSH)
            commands.copy(commands.argument(0), copied, 4096 * 4)
        realtime.dispatch(saxpy, 1, [x, y], struct.pack("If", 64, 1.0)).wait(60)  # active: low work is cut
        ticket = commands.submit(push, [data])
        wait_until(lambda: low.stats()["pieces"] >= 2, 60, "the list's dispatch to run in pieces")
        old = supervised.arbiter()
        assert "hands over" in supervised.run("restart")
        ticket.wait(120)
        assert np.array_equal(data, whole) and np.array_equal(copied, whole), "every workgroup and command ran"
        wait_until(lambda: supervised.arbiter() not in (old, None), 120, "the new arbiter")
        assert exited(old, 60) and low.reattached == 1


def test_a_list_with_parameters_goes_on_after_a_reattach(supervised):
    """A new arbiter gets the list's commands as they were (parameters and flags): it checks them
    again, and submissions with parameters go on after the restart."""
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(N), session.array(N)
        with session.record() as commands:
            commands.dispatch(saxpy, GROUPS, [commands.argument(0), commands.argument(1)],
                              push=commands.SUBMISSION_PUSH)
        x[:], y[:] = 1.0, 0.0
        commands.submit(struct.pack("If", N, 2.0), [x, y]).wait(60)
        assert np.array_equal(y, np.full(N, 2.0, np.float32))
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: supervised.arbiter() not in (before, None), 60, "the standby to take over")
        commands.submit(struct.pack("If", N, 3.0), [y, x]).wait(60)  # reattaches first, the list with it
        assert session.reattached == 1
        assert np.array_equal(x, np.full(N, 7.0, np.float32))
        with pytest.raises(InvalidSubmission, match="number of buffers differs"):
            commands.submit(struct.pack("If", N, 3.0), [y]).wait(60)


def test_no_object_id_has_the_parameter_bit(tmp_path):
    """Ids are below 2^31: a session that keeps the highest (as a reattach may ask) gets no more."""
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        saxpy = session.load_program(libshare.shaders.path("saxpy"))
        x = session.array(N)
        raw = np.zeros(1, DESC_DTYPE)
        raw["opcode"], raw["program"], raw["nbuffers"], raw["groups"] = C.OP_DISPATCH, saxpy.id, 2, 1
        raw["buffer"][0, :2] = session._binding(x)[1]
        reply = session._request("load_list", raw.tobytes(), id=C.LIST_ARG - 1)
        assert reply.fields["list_id"] == C.LIST_ARG - 1
        with pytest.raises(QuotaExceeded, match="used all"):
            session.array(N)
        with pytest.raises(LibshareError, match="id"):
            session._request("load_list", raw.tobytes(), id=C.LIST_ARG)
        assert session.stats()["errors"] == 0


FUZZ_SEED = int(os.environ.get("LIBSHARE_FUZZ_SEED", "20261128"))
_TICKET_BASE = 1 << 40  # far from the session's own ticket numbers
_KNOWN = {0} | {-code for code in (C.EBADSLOT, C.ENOPROGRAM, C.ENOBUFFER, C.EBINDINGS, C.ERANGE, C.EGROUPS,
                                   C.EPUSH)}


def _hostile_templates(rng, count: int, program: int, own: list[int]) -> np.ndarray:
    """``count`` list commands with parameters, each field valid with some probability."""
    d = np.zeros(count, DESC_DTYPE)
    pick = lambda p: rng.random(count) < p  # noqa: E731
    d["opcode"] = np.where(pick(0.7), C.OP_DISPATCH, C.OP_COPY)
    d["program"] = np.where(pick(0.9), program, rng.integers(0, 1 << 32, count, dtype=np.uint64))
    d["nbuffers"] = np.where(pick(0.7), 2, rng.integers(0, 10, count))
    d["groups"] = 1
    d["flags"] = np.where(pick(0.5), C.DESC_SUBMISSION_PUSH, rng.choice([0, 1, 4, 6, 1 << 31], count))
    d["push_size"] = np.where(pick(0.6), 0, rng.choice([4, 8, 12, 255], count))
    d["push"][:, :4] = np.frombuffer(np.uint32(64).tobytes(), np.uint8)
    slots = (C.LIST_ARG | rng.integers(0, 12, (count, 8))).astype(np.uint64)
    d["buffer"] = np.where(pick(0.6)[:, None], slots, rng.choice(np.array(own + [0, (1 << 31) - 1], np.uint64),
                                                                 (count, 8)))
    d["offset"][:, 2] = 256  # a copy's size
    return d


def _hostile_submissions(rng, count: int, list_id: int, own: list[int]) -> np.ndarray:
    """``count`` LS_OP_LIST descriptors for ``list_id`` (two slots, 8 push bytes), each field hostile at times."""
    d = np.zeros(count, DESC_DTYPE)
    pick = lambda p: rng.random(count) < p  # noqa: E731
    d["ticket"] = np.arange(_TICKET_BASE, _TICKET_BASE + count, dtype=np.uint64)
    d["opcode"] = C.OP_LIST
    d["program"] = np.where(pick(0.9), list_id, rng.integers(0, 1 << 32, count, dtype=np.uint64))
    d["nbuffers"] = np.where(pick(0.7), 2, rng.integers(0, 9, count))
    d["push_size"] = np.where(pick(0.7), 8, rng.choice([0, 4, 6, 12, 128], count))
    d["groups"][:, 0] = np.where(pick(0.95), 0, 1)
    d["buffer"] = np.where(pick(0.8)[:, None], rng.choice(np.array(own, np.uint64), (count, 8)),
                           rng.choice(np.array([0, C.LIST_ARG, C.LIST_ARG | 1, (1 << 32) - 1], np.uint64),
                                      (count, 8)))
    hostile = np.array([4096, 4092, 1 << 63, (1 << 64) - 1, 3], dtype=np.uint64)
    d["offset"] = np.where(pick(0.8)[:, None], rng.integers(0, 4, (count, 8)).astype(np.uint64) * np.uint64(256),
                           rng.choice(hostile, (count, 8)))
    d["push"][:, :4] = np.frombuffer(np.uint32(64).tobytes(), np.uint8)  # n = 64: inside the buffers
    d["push"][:, 4:8] = np.frombuffer(np.float32(0.5).tobytes(), np.uint8)
    return d


def test_hostile_templates_and_submissions_beside_an_honest_client(tmp_path, streams):
    """Seeded random list commands with parameters (each registered or refused), then seeded random
    LS_OP_LIST descriptors pushed straight into the ring for a list with parameters: each answered
    exactly once with a documented status, the arbiter alive, the honest client's results right."""
    rng = np.random.default_rng(FUZZ_SEED)
    print(f"list parameter fuzz: seed {FUZZ_SEED} (LIBSHARE_FUZZ_SEED)")
    with serving(tmp_path) as (arbiter, pipe_dir), \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as attacker:
        honest = _honest_stream(streams, pipe_dir)
        saxpy = attacker.load_program(libshare.shaders.path("saxpy"))
        buffers = [attacker.alloc(4096) for _ in range(3)]
        own = [b.id for b in buffers]
        registered = refused = 0
        for _ in range(200):
            commands = _hostile_templates(rng, int(rng.integers(1, 4)), saxpy.id, own)
            try:
                reply = attacker._request("load_list", commands.tobytes())
            except InvalidSubmission:
                refused += 1
                continue
            registered += 1
            attacker._request("free", list_id=reply.fields["list_id"])
        assert registered > 0 and refused > 0, (registered, refused, FUZZ_SEED)
        with attacker.record() as target:
            target.dispatch(saxpy, 1, [target.argument(0), target.argument(1)], push=target.SUBMISSION_PUSH)
            target.copy(target.argument(1), target.argument(0), 256)
        producer = attacker._gate.attached.region.lanes.producer()  # past the session's own checks
        count, answers, statuses = 3000, {}, {}
        batch = _hostile_submissions(rng, count, target.id, own)
        pushed = [0]

        def exchange() -> int:
            """Push the next few while at most 256 wait for answers, take the answers; how many came."""
            if pushed[0] < count and pushed[0] - len(answers) < 256:
                pushed[0] += producer.try_push(batch[pushed[0]:pushed[0] + 64])
            for cqe in attacker._gate.attached.region.completions.take():
                ticket, status = int(cqe["ticket"]), int(cqe["status"])
                answers[ticket] = answers.get(ticket, 0) + 1
                statuses[status] = statuses.get(status, 0) + 1
            return len(answers)
        wait_until(lambda: exchange() >= count, 120, f"every answer (seed {FUZZ_SEED})")
        assert set(answers) == set(range(_TICKET_BASE, _TICKET_BASE + count)), FUZZ_SEED
        assert max(answers.values()) == 1, f"seed {FUZZ_SEED}: answered twice"
        assert set(statuses) <= _KNOWN and statuses.get(0, 0) > 0 and len(statuses) > 3, (FUZZ_SEED, statuses)
        end = honest.finish()
        assert end["ok"] > 0 and end["restarted"] == 0
