"""A hostile client that fills its ring with seeded random descriptors: ``python -m tests.arbiter._descriptor_fuzz``.

Usage: ``python -m tests.arbiter._descriptor_fuzz PIPE_DIR SEED COUNT``. It connects, loads
saxpy, allocates two buffers, then pushes ``COUNT`` descriptors straight into its ring
(past the session's own checks), each field either valid or hostile (a fifth of them through a
bind group, flags LS_DESC_GROUP), and reads every
completion itself. It prints one JSON line: how many it pushed, how many came back, how
many were answered more than once or never, the statuses seen, and how many through the bind
group ran (and how many timestamps). Groups are either small or invalid, so that no descriptor that passes validation
runs for long; every opcode is drawn (fills, updates, barriers, timestamps and indirect dispatches too,
whose counts on the device are whatever the buffers hold: clamped there, never run for long either).
"""

from __future__ import annotations

import collections
import json
import sys
import time

import numpy as np

import libshare
from libshare.ring import C, CQE_DTYPE, DESC_DTYPE

_TICKET_BASE = 1 << 40  # far from the session's own ticket numbers
_BATCH = 128


def hostile_descriptors(rng: np.random.Generator, count: int, first_ticket: int, program: int,
                        buffers: list[int], buffer_size: int, group: int = 0) -> np.ndarray:
    """``count`` descriptors, each field valid with some probability and hostile otherwise."""
    d = np.zeros(count, DESC_DTYPE)
    d["ticket"] = np.arange(first_ticket, first_ticket + count, dtype=np.uint64)
    pick = lambda p: rng.random(count) < p  # noqa: E731
    others = [C.OP_NOP, C.OP_COPY, C.OP_FILL, C.OP_UPDATE, C.OP_BARRIER, C.OP_DISPATCH_INDIRECT, C.OP_TIMESTAMP]
    d["opcode"] = np.where(pick(0.5), C.OP_DISPATCH, np.where(pick(0.7), rng.choice(others, count),
                                                              rng.integers(0, 1 << 16, count)))
    d["program"] = np.where(pick(0.7), program, rng.integers(0, 1 << 32, count, dtype=np.uint64))
    d["nbuffers"] = np.where(pick(0.6), 2, rng.integers(0, 256, count))
    d["push_size"] = np.where(pick(0.6), 8, rng.integers(0, 256, count))
    small = rng.integers(1, 5, (count, 3))
    invalid = rng.choice(np.array([0, 1 << 31, (1 << 32) - 1], dtype=np.uint64), (count, 3))
    d["groups"] = np.where(pick(0.8)[:, None], small, invalid)
    # an indirect dispatch's groups: a buffer of its own (or not), a counts offset aligned (or not) and in the
    # buffer (or not); the counts there are whatever saxpy and the fills left, clamped on the device
    indirect = (d["opcode"] == C.OP_DISPATCH_INDIRECT) & pick(0.6)
    d["groups"][:, 0] = np.where(indirect, rng.choice(np.array(buffers, dtype=np.uint32), count), d["groups"][:, 0])
    d["groups"][:, 1] = np.where(indirect, rng.integers(0, buffer_size // 4, count) * 4, d["groups"][:, 1])
    d["groups"][:, 2] = np.where(indirect & pick(0.9), 0, d["groups"][:, 2])
    d["flags"] = np.where(pick(0.9), 0, rng.integers(0, 1 << 32, count, dtype=np.uint64))
    ids = np.array(buffers, dtype=np.uint32)
    d["buffer"] = np.where(pick(0.7)[:, None], rng.choice(ids, (count, 8)),
                           rng.integers(0, 1 << 32, (count, 8), dtype=np.uint64))
    hostile = np.array([buffer_size, buffer_size - 4, 1 << 63, (1 << 64) - 1, 3], dtype=np.uint64)
    d["offset"] = np.where(pick(0.7)[:, None], rng.integers(0, 4, (count, 8)).astype(np.uint64) * np.uint64(256),
                           rng.choice(hostile, (count, 8)))
    sizes = rng.integers(1, 256, count).astype(np.uint64) * np.uint64(4)
    d["offset"][:, 2] = np.where(pick(0.5), sizes, d["offset"][:, 2])  # a copy's size
    grouped = pick(0.2)  # a dispatch through bind group ``group`` (LS_DESC_GROUP), each field valid or not
    d["flags"] = np.where(grouped, C.DESC_GROUP, d["flags"])
    d["nbuffers"] = np.where(grouped & pick(0.7), 0, d["nbuffers"])
    d["buffer"][:, 0] = np.where(grouped & pick(0.7), group, d["buffer"][:, 0])
    d["push"] = rng.integers(0, 256, (count, 128), dtype=np.uint8)
    d["push"][:, :4] = np.frombuffer(np.uint32(64).tobytes(), np.uint8)  # n = 64: stays inside the buffers
    d["push_size"] = np.where((d["opcode"] == C.OP_FILL) & pick(0.6), 4, d["push_size"])  # a fill's value
    d["nbuffers"] = np.where(np.isin(d["opcode"], [C.OP_FILL, C.OP_UPDATE]) & pick(0.6), 1, d["nbuffers"])
    stamp = (d["opcode"] == C.OP_TIMESTAMP) & pick(0.6)  # a timestamp's fields, each valid or not
    d["nbuffers"] = np.where(stamp & pick(0.8), 1, d["nbuffers"])
    d["push_size"] = np.where(stamp & pick(0.8), 0, d["push_size"])
    d["program"] = np.where(stamp & pick(0.8), 0, d["program"])
    d["groups"] = np.where((stamp & pick(0.8))[:, None], 0, d["groups"])
    return d


def fuzz(pipe_dir: str, seed: int, count: int, timeout: float = 120.0) -> dict:
    """Push ``count`` hostile descriptors and collect their completions; return the tally."""
    rng = np.random.default_rng(seed)
    with libshare.connect(name=f"fuzz-{seed}", mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        size = 4096
        buffers = [session.alloc(size), session.alloc(size)]
        group = session.bind_group(program, [(buffers[0], 256, 1024), buffers[1]])
        region = session._gate.attached.region  # past the session's own checks: what a hostile client writes
        producer = region.lanes.producer()
        answers: collections.Counter = collections.Counter()
        statuses: collections.Counter = collections.Counter()
        grouped: set[int] = set()  # tickets of descriptors through the group
        stamps: set[int] = set()  # ... and of timestamps
        group_ok = stamp_ok = 0
        pushed = 0
        deadline = time.monotonic() + timeout
        while pushed < count or sum(answers.values()) < pushed:
            if time.monotonic() > deadline:
                break
            if pushed < count and pushed - sum(answers.values()) < 512:
                batch = hostile_descriptors(rng, min(_BATCH, count - pushed), _TICKET_BASE + pushed,
                                            program.id, [b.id for b in buffers], size, group.id)
                taken = producer.try_push(batch)
                grouped.update(int(t) for t in batch["ticket"][:taken][batch["flags"][:taken] == C.DESC_GROUP])
                stamps.update(int(t) for t in batch["ticket"][:taken][batch["opcode"][:taken] == C.OP_TIMESTAMP])
                pushed += taken
            for cqe in region.completions.take():
                answers[int(cqe["ticket"])] += 1
                statuses[int(cqe["status"])] += 1
                group_ok += int(cqe["status"]) == 0 and int(cqe["ticket"]) in grouped
                stamp_ok += int(cqe["status"]) == 0 and int(cqe["ticket"]) in stamps
            if pushed >= count:
                try:
                    region.completions.wait(1, timeout=0.05)
                except libshare.Timeout:
                    pass
        expected = set(range(_TICKET_BASE, _TICKET_BASE + pushed))
        return {"pushed": pushed, "answered": len(answers),
                "twice": sum(1 for n in answers.values() if n > 1),
                "unknown": len(set(answers) - expected), "missing": len(expected - set(answers)), "group_ok": group_ok,
                "stamp_ok": stamp_ok,
                "statuses": {str(k): v for k, v in sorted(statuses.items())}}


if __name__ == "__main__":
    print(json.dumps(fuzz(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))), flush=True)
