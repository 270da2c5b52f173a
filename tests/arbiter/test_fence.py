"""LS_OP_NOP is a fence: answered after every earlier descriptor of its client, or at once when none runs."""

from __future__ import annotations

import struct

import numpy as np

import libshare
from libshare.ring import C, DESC_DTYPE


def descriptor(ticket: int, opcode: int, program: int = 0, buffers=(), push: bytes = b"", groups=(1, 1, 1)):
    d = np.zeros(1, DESC_DTYPE)
    d["ticket"], d["opcode"], d["program"] = ticket, opcode, program
    d["nbuffers"], d["push_size"], d["groups"] = len(buffers), len(push), groups
    d["buffer"][0, :len(buffers)] = buffers
    d["push"][0, :len(push)] = np.frombuffer(push, np.uint8)
    return d


def answers(region, count: int) -> list[tuple[int, int]]:
    """The next ``count`` completions, in the order the arbiter posted them."""
    got = []
    while len(got) < count:
        region.completions.wait(1, timeout=60)
        got += [(int(c["ticket"]), int(c["status"])) for c in region.completions.take()]
    return got


def test_a_nop_is_answered_after_the_work_pushed_before_it_and_at_once_alone(daemon):
    _, pipe_dir = daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        busy = session.load_program(libshare.shaders.path("busy"))
        data = session.alloc(4096)
        region = session._gate.attached.region
        producer = region.lanes.producer()  # raw, as a C client would
        base = 1 << 40
        assert producer.try_push(descriptor(base, C.OP_NOP)) == 1
        assert answers(region, 1) == [(base, 0)], "a fence with nothing before it is answered at once"
        slow = descriptor(base + 1, C.OP_DISPATCH, busy.id, [data.id], struct.pack("II", 1024, 200_000), (4, 1, 1))
        batch = np.concatenate([slow, descriptor(base + 2, C.OP_NOP), descriptor(base + 3, C.OP_NOP)])
        batch[2]["flags"] = 1  # a malformed NOP is refused like any descriptor
        assert producer.try_push(batch) == 3
        got = answers(region, 3)
        assert got[0] == (base + 3, -C.EBADSLOT), got  # refused at once, ahead of the running work
        assert got[1:] == [(base + 1, 0), (base + 2, 0)], f"the fence came before the work it follows: {got}"
