"""The ticket book (tickets.c): records made with the push, completions filed once, outcomes taken once.

The region is real and this test plays the arbiter: it pops what the book's push wrote and posts
completions (well-formed, hostile and repeated) for the book to file.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from libshare import ArbiterLost
from libshare.ring import CQE_DTYPE, C, Region, TicketBook
from libshare.ring._binding import lib

from tests._wait import wait_until

NONE, PENDING, DONE = TicketBook.NONE, TicketBook.PENDING, TicketBook.DONE


@pytest.fixture
def ring():
    with Region.create(lanes=2, lane_entries=64, cq_entries=256) as region:
        yield region, TicketBook(), region.lanes.producer()


def push(book: TicketBook, producer, ticket: int, opcode: int = C.OP_NOP) -> int:
    return book.pusher(producer)(ticket, opcode, 0, 0, 0, 0, 0, [], 0, [], b"", 0)


def answer(region: Region, *completions: tuple[int, int]) -> None:
    """Post (ticket, status) completions, as the arbiter would."""
    cqes = np.zeros(len(completions), CQE_DTYPE)
    for i, (ticket, status) in enumerate(completions):
        cqes[i]["ticket"], cqes[i]["status"], cqes[i]["device_ns"] = ticket, status, (1000 + ticket) % 2**64
    assert region.completions.post(cqes) == len(completions)


def test_a_push_records_its_ticket_and_the_completion_settles_it_once(ring):
    region, book, producer = ring
    assert push(book, producer, 7) == 1
    assert book.take(7) == (PENDING, 0, 0)
    assert book.pending() == 1
    assert list(region.lanes.pop()["ticket"]) == [7]
    answer(region, (7, -C.EPUSH), (7, 0))  # the second answer of one ticket is ignored
    assert book.collect(region) == 2
    assert book.take(7) == (DONE, -C.EPUSH, 1007)
    assert book.take(7) == (NONE, 0, 0), "an outcome is taken once"
    assert book.pending() == 0


def test_a_refused_push_records_nothing(ring):
    region, book, producer = ring
    assert book.pusher(producer)(3, 99, 0, 0, 0, 0, 0, [], 0, [], b"", 0) == -C.EBADSLOT  # bad opcode
    assert book.take(3) == (NONE, 0, 0) and book.pending() == 0
    assert push(book, producer, 3) == 1
    assert push(book, producer, 3) == -17, "a ticket recorded twice is refused (EEXIST)"


def test_completions_of_tickets_never_pushed_are_ignored(ring):
    region, book, producer = ring
    push(book, producer, 1)
    answer(region, (2, 0), (0, 0), (2**64 - 1, -C.EFAULT), (1, 0))
    assert book.collect(region) == 4
    assert book.take(1)[0] == DONE
    assert all(book.take(t)[0] == NONE for t in (0, 2, 2**64 - 1))


def test_forgotten_tickets_leave_no_record(ring):
    region, book, producer = ring
    for ticket in (1, 2, 3):
        push(book, producer, ticket)
    answer(region, (1, 0))
    book.collect(region)
    book.forget([1, 2, 99])  # done: goes now; pending: its completion is dropped when read; unknown: nothing
    assert book.take(1)[0] == NONE
    assert book.in_flight() == {2: TicketBook.ORPHAN, 3: 0}
    answer(region, (2, 0), (3, 0))
    book.collect(region)
    assert book.take(2)[0] == NONE and book.take(3)[0] == DONE
    assert book.pending() == 0


def test_moved_tickets_stay_pending_marked_until_resent(ring):
    region, book, producer = ring
    push(book, producer, 5)
    push(book, producer, 6)
    answer(region, (5, -C.EMOVED))
    book.collect(region)
    assert book.in_flight() == {5: TicketBook.MOVED, 6: 0}
    assert book.settle(6, -C.EMOVED) and book.in_flight() == {5: TicketBook.MOVED, 6: TicketBook.MOVED}
    book.resent()
    assert book.in_flight() == {5: 0, 6: 0}
    assert book.settle(5, 0, 42) and not book.settle(5, 0)
    assert book.take(5) == (DONE, 0, 42)


def test_cancelled_completions_are_counted(ring):
    region, book, producer = ring
    push(book, producer, 1)
    answer(region, (1, -C.ECANCELED), (9, -C.ECANCELED))
    book.collect(region)
    assert book.cancelled() == 2
    assert book.take(1) == (DONE, -C.ECANCELED, 1001)


def test_the_table_grows_and_shrinks_through_many_tickets(ring):
    region, book, producer = ring
    numbers = list(range(1, 5001))
    for first in range(0, len(numbers), 50):  # 50 in flight at a time, a lane's worth
        batch = numbers[first:first + 50]
        for ticket in batch:
            assert push(book, producer, ticket) == 1
        region.lanes.pop()
        answer(region, *[(ticket, -(ticket % 7)) for ticket in reversed(batch)])
        book.collect(region)
    book.forget(numbers[::2])
    assert book.pending() == 0
    assert all(book.take(t) == (DONE, -(t % 7), 1000 + t) for t in numbers[1::2])
    assert all(book.take(t)[0] == NONE for t in numbers)


def test_a_wait_step_returns_when_the_ticket_is_answered_from_another_thread(ring):
    """A waiter asleep on the completion ring (its wake-up flag set, still waiting) is woken by
    completions posted from another thread, and files both: its own ticket's and the other one's."""
    region, book, producer = ring
    push(book, producer, 11)
    push(book, producer, 12)
    assert book.wait(region, 11, 0) == PENDING  # nothing posted: a zero-length step
    states = []
    # One step, whose timeout (120 s) outlasts the join below: only the wake-up ends it in time.
    thread = threading.Thread(target=lambda: states.append(book.wait(region, 11, 120_000_000_000)), daemon=True)
    thread.start()
    bells = lib.ls_region_bells(region._c())
    wait_until(lambda: bells.cq_flags & lib.LS_NEED_WAKEUP, 30, "the waiter to sleep on the completion ring")
    assert thread.is_alive() and not states, f"the wait step came back with nothing posted: {states}"
    answer(region, (12, 0), (11, 0))
    thread.join(60)
    if thread.is_alive():
        region.peers.close_consumer(0)  # wakes it (ArbiterLost) before the region goes away
        thread.join(30)
        pytest.fail("the completions posted did not wake the waiter")
    assert states == [DONE] and book.take(12)[0] == DONE


def test_a_wait_notices_a_closed_consumer(ring):
    region, book, producer = ring
    push(book, producer, 1)
    region.peers.close_consumer(0)
    with pytest.raises(ArbiterLost):
        book.wait(region, 1, 5_000_000_000)
