"""Benchmark helpers: a place to print the ratios that side-by-side benches compute."""

from __future__ import annotations

import pytest

_RATIOS: list[str] = []


@pytest.fixture
def report_ratio():
    """Record a line (a ratio, a rate) that is printed after the benchmark table."""
    return _RATIOS.append


def pytest_terminal_summary(terminalreporter):
    if _RATIOS:
        terminalreporter.section("libshare ratios")
        for line in _RATIOS:
            terminalreporter.write_line(line)
