"""The program model's features used together: bind groups, list parameters, fills, updates and
indirect dispatches each meet the others in one command list, and give the bytes numpy gives.

Each feature has its own tests (test_bind_groups.py, test_list_parameters.py, test_fill_update.py,
test_indirect.py); these check the joints between them: an indirect dispatch through a bind group,
a list dispatch over a group that takes each submission's push constants, a fill and an update of
a list's argument, and an indirect dispatch whose bindings are a list's arguments.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare

N = 4096


@pytest.fixture
def session():
    with libshare.connect(mode="embedded") as opened:
        yield opened


def _saxpy(session):
    program = session.load_program(libshare.shaders.path("saxpy"))
    x, y = session.array(N), session.array(N)
    x[:] = np.arange(N, dtype=np.float32)
    return program, x, y


def test_an_indirect_dispatch_binds_a_group(session):
    program, x, y = _saxpy(session)
    group = session.bind_group(program, [(x, 0, None), (y, 0, None)])
    counts = session.array(4, np.uint32)
    counts[:3] = [10, 1, 1]
    y[:] = 1.0
    session.dispatch_indirect(program, counts, group, struct.pack("If", N, 2.0)).wait(60)
    expected = np.ones(N, np.float32)
    expected[:640] = 2.0 * x[:640] + 1.0
    np.testing.assert_array_equal(y, expected)


def test_a_group_dispatch_in_a_list_takes_each_submissions_push_constants(session):
    program, x, y = _saxpy(session)
    group = session.bind_group(program, [x, y])
    with session.record() as step:
        step.dispatch(program, N // 64, group, push=step.SUBMISSION_PUSH)
    y[:] = 0.0
    for a in (1.0, 2.0, 3.0):
        step.submit(struct.pack("If", N, a)).wait(60)
    np.testing.assert_array_equal(y, 6.0 * x)


def test_fills_updates_and_indirect_dispatches_take_a_lists_arguments(session):
    program, x, y = _saxpy(session)
    counts = session.array(4, np.uint32)
    counts[:3] = [N // 64, 1, 1]
    with session.record() as step:
        step.fill(step.argument(1), 1.0, nbytes=N * 4)                       # y = 1
        step.update(step.argument(0), np.full(4, 7.0, np.float32))          # x[0:4] = 7
        step.dispatch_indirect(program, counts, [step.argument(0), step.argument(1)], struct.pack("If", N, 2.0))
    for _ in range(2):
        x[:] = np.arange(N, dtype=np.float32)
        y[:] = -5.0
        step.submit(buffers=[x, y]).wait(60)
        expected_x = np.arange(N, dtype=np.float32)
        expected_x[:4] = 7.0
        np.testing.assert_array_equal(x, expected_x)
        np.testing.assert_array_equal(y, 2.0 * expected_x + 1.0)


def test_an_indirect_counts_buffer_cannot_be_an_argument(session):
    program, x, y = _saxpy(session)
    commands = session.record()
    with pytest.raises(libshare.InvalidSubmission, match="counts buffer cannot be"):
        commands.dispatch_indirect(program, commands.argument(0), [x, y])
