"""Waiting for a condition in tests: the one poll loop of tests/.

A test that needs something to have happened (a file written, a process gone, a counter
moved) waits for that condition with :func:`wait_until`, never with a bare ``time.sleep`` or a
``threading.Timer``: the timeout is only a bound against a hang, and the test goes on the moment
the condition holds, whatever the machine's speed or load. tests/test_conventions_tests.py
checks that no other loop in tests/ sleeps.

Importable from child processes that the tests start (``python -m tests...``): it needs nothing
but the standard library.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

INTERVAL = 0.05  # seconds between two looks at the condition


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, what: str | Callable[[], str] = "condition",
               *, interval: float = INTERVAL, fail: Callable[[str], object] | None = None) -> T:
    """Call ``predicate`` until it returns something true, and return that.

    After ``timeout`` seconds without it: ``fail(message)`` when given (it may raise, or return
    what the wait returns instead), else AssertionError. ``what`` (a text, or a callable that
    makes one only then: logs, a diagnosis) names the condition in the message. ``predicate`` may
    raise to end the wait early (pytest.fail when the process it waits on has died)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}"
            if fail is None:
                raise AssertionError(message)
            return fail(message)
        time.sleep(interval)
    return value
