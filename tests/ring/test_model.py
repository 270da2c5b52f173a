"""Property test: any sequence of pushes and pops behaves like a bounded FIFO per lane."""

from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libshare.ring import CQE_DTYPE, DESC_DTYPE, Region

operations = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 20)),
        st.tuples(st.just("pop"), st.integers(1, 20)),
        st.tuples(st.just("post"), st.integers(0, 20)),
        st.tuples(st.just("take"), st.integers(1, 20)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=operations, entries_log2=st.integers(0, 4))
def test_push_pop_sequences_match_a_model_queue(ops, entries_log2):
    entries = 1 << entries_log2
    with Region.create(lanes=1, lane_entries=entries, cq_entries=entries) as region:
        producer = region.lanes.producer()
        sq_model, cq_model, next_ticket = deque(), deque(), 0
        for op, n in ops:
            if op == "push":
                d = np.zeros(n, DESC_DTYPE)
                d["ticket"] = np.arange(next_ticket, next_ticket + n)
                pushed = producer.try_push(d)
                assert pushed == min(n, entries - len(sq_model))
                sq_model.extend(range(next_ticket, next_ticket + pushed))
                next_ticket += pushed
            elif op == "pop":
                got = list(region.lanes.pop(n)["ticket"])
                assert got == [sq_model.popleft() for _ in range(min(n, len(sq_model)))]
            elif op == "post":
                c = np.zeros(n, CQE_DTYPE)
                c["ticket"] = np.arange(next_ticket, next_ticket + n)
                posted = region.completions.post(c)
                assert posted == min(n, entries - len(cq_model))
                cq_model.extend(range(next_ticket, next_ticket + posted))
                next_ticket += posted
            else:
                got = list(region.completions.take(n)["ticket"])
                assert got == [cq_model.popleft() for _ in range(min(n, len(cq_model)))]
            assert region.lanes.pending() == len(sq_model)
