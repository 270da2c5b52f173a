"""Figures from repeated, interleaved blocks: the one way bench/ measures and reports a number.

A figure is measured in blocks (``LIBSHARE_BENCH_BLOCKS``, 5 unless set): one value per block,
and the figure is the median of those values, printed with their range (min-max) and judged
against its target on the median. A ratio of A to B (libshare against direct Vulkan, loaded
against alone) is measured with A and B alternated block by block, in the order A B, B A, A B,
... (ABBA), so that the machine's drift and noise fall on both sides alike; the ratio of each
block's pair is one value of the figure. With three or more sides the order rotates.

    from bench._compare import at_most, compare

    compare("tiny round trip, daemon / direct", daemon_block, direct_block, target=at_most(1.15),
            a="daemon", b="direct", method="...")

``interleave`` runs the blocks and returns every side's block values, for a bench that makes
several figures from the same blocks (``ratio`` and ``record`` then record them). Each side's
callable runs one block (or, with ``turns``, one of a block's shorter alternating turns) and
returns its value: a number, a list of samples (reduced to a block value), or anything that a
``reduce`` of the bench's own turns into one.

Every figure is printed in the "libshare ratios" section at the end of the run and written, with
the device's name, to the run's JSON file (bench/conftest.py; ``python -m bench.plot`` draws it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

BLOCKS_ENV = "LIBSHARE_BENCH_BLOCKS"
DEFAULT_BLOCKS = 5


def blocks(default: int = DEFAULT_BLOCKS) -> int:
    """The blocks each figure is measured in: ``LIBSHARE_BENCH_BLOCKS`` if set, else ``default``."""
    text = os.environ.get(BLOCKS_ENV, "").strip()
    if not text:
        return default
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"{BLOCKS_ENV}={text!r}: give a whole number of blocks, 5 or more for a figure "
                         "to be judged") from None
    if count < 1:
        raise ValueError(f"{BLOCKS_ENV}={text!r}: give at least 1 block (5 or more for a figure to be judged)")
    return count


# ---------------------------------------------------------------- targets

@dataclass(frozen=True)
class Target:
    """What a figure's median must be: ``op`` one of <=, <, >=, >, or "within" [value, high]."""

    op: str
    value: float
    high: float | None = None

    def met(self, x: float) -> bool:
        if self.op == "<=":
            return x <= self.value
        if self.op == "<":
            return x < self.value
        if self.op == ">=":
            return x >= self.value
        if self.op == ">":
            return x > self.value
        return self.value <= x <= self.high

    def text(self, unit: str = "") -> str:
        """As printed: "<= 1.15x", ">= 1,000,000/s", "20-30%", "< 0.5%", "<= 2 us"."""
        if self.op == "within":
            return f"{_plain(self.value)}-{with_unit(self.high, unit, _plain)}"
        return f"{self.op} {with_unit(self.value, unit, _plain)}"

    def as_json(self) -> dict:
        return {"op": self.op, "value": self.value, **({"high": self.high} if self.high is not None else {})}


def at_most(value: float) -> Target:
    return Target("<=", value)


def below(value: float) -> Target:
    return Target("<", value)


def at_least(value: float) -> Target:
    return Target(">=", value)


def within(low: float, high: float) -> Target:
    return Target("within", low, high)


def fmt(value: float, unit: str = "") -> str:
    """A figure's value as printed: three decimals for a ratio, else about three significant digits."""
    if value is None or not math.isfinite(value):
        return str(value)
    if unit == "x":
        return f"{value:.3f}"
    if float(value).is_integer():
        return f"{int(value):,}"
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _plain(value: float, unit: str = "") -> str:
    """A target's value: as written (1.15, 0.5, 1,000,000)."""
    return f"{value:,.0f}" if abs(value) >= 10000 else f"{value:g}"


def with_unit(value: float, unit: str, form: Callable[[float, str], str] = fmt) -> str:
    if not unit:
        return form(value, unit)
    if unit in ("x", "%", "/s"):
        return f"{form(value, unit)}{unit}"
    return f"{form(value, unit)} {unit}"


# ---------------------------------------------------------------- figures

@dataclass
class Figure:
    """One figure: a value per block, in ``unit``; judged on the median against ``target``."""

    name: str
    unit: str
    values: list[float]
    target: Target | None = None
    method: str = ""
    sides: dict[str, dict] = field(default_factory=dict)  # a ratio's A and B: median, min, max, unit
    detail: str = ""
    test: str = ""

    @property
    def median(self) -> float:
        return float(np.median(self.values))

    @property
    def min(self) -> float:
        return float(np.min(self.values))

    @property
    def max(self) -> float:
        return float(np.max(self.values))

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.median)

    def line(self) -> str:
        u = self.unit
        text = (f"{self.name}: {with_unit(self.median, u)} median, range {fmt(self.min, u)}-"
                f"{with_unit(self.max, u)} over {len(self.values)} block{'s' if len(self.values) != 1 else ''}")
        if self.target is not None:
            text += f" (target {self.target.text(u)}: {'met' if self.met else 'MISSED'})"
        if self.sides:
            text += "; " + ", ".join(f"{name} {with_unit(s['median'], s['unit'])} ({fmt(s['min'], s['unit'])}-"
                                     f"{fmt(s['max'], s['unit'])})" for name, s in self.sides.items())
        if self.detail:
            text += f"; {self.detail}"
        return text

    def as_json(self) -> dict:
        return {"name": self.name, "unit": self.unit, "median": self.median, "min": self.min, "max": self.max,
                "blocks": len(self.values), "values": [float(v) for v in self.values],
                "target": self.target.as_json() if self.target else None,
                "target_text": self.target.text(self.unit) if self.target else None, "met": self.met,
                "method": self.method, "sides": self.sides, "detail": self.detail, "test": self.test}


FIGURES: list[Figure] = []
LINES: list[str | Figure] = []  # what the summary prints, in order: figures and notes


def _current_test() -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit(" (", 1)[0]


def record(name: str, values: Iterable[float], unit: str, *, target: Target | None = None, method: str = "",
           scale: float = 1.0, detail: str = "", sides: dict[str, dict] | None = None) -> Figure:
    """Record a figure from its block values (each multiplied by ``scale``: seconds to "us" is 1e6)."""
    values = [float(v) * scale for v in values]
    if not values:
        raise ValueError(f"{name}: no block values")
    figure = Figure(name, unit, values, target, method, sides or {}, detail, _current_test())
    FIGURES.append(figure)
    LINES.append(figure)
    return figure


def note(text: str) -> None:
    """A line printed with the figures (what a figure alone does not say); not in the JSON."""
    LINES.append(text)


def spread(values: Sequence[float], unit: str, scale: float = 1.0) -> dict:
    """Median, min and max of ``values`` times ``scale``: how a ratio's side is recorded."""
    v = np.asarray(values, dtype=float) * scale
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "unit": unit}


def ratio(name: str, a: Sequence[float], b: Sequence[float], *, target: Target | None = None, method: str = "",
          names: tuple[str, str] = ("A", "B"), side_unit: str = "us", side_scale: float = 1e6,
          detail: str = "") -> Figure:
    """Record the per-block ratio a[i] / b[i] of two sides measured in the same blocks."""
    if len(a) != len(b):
        raise ValueError(f"{name}: {len(a)} blocks of {names[0]} against {len(b)} of {names[1]}")
    values = [x / y for x, y in zip(a, b)]
    sides = {names[0]: spread(a, side_unit, side_scale), names[1]: spread(b, side_unit, side_scale)}
    return record(name, values, "x", target=target, method=method, sides=sides, detail=detail)


# ---------------------------------------------------------------- running blocks

def samples_median(results: list) -> float:
    """The median of every sample in a block's turns (each turn a list of samples, or one number)."""
    flat: list[float] = []
    for r in results:
        flat.extend(r if isinstance(r, (list, tuple, np.ndarray)) else [r])
    return float(np.median(flat))


def order(names: list[str], turn: int) -> list[str]:
    """The sides' order in the ``turn``-th turn overall: ABBA for two, rotated for more."""
    if len(names) == 2:
        return names if turn % 2 == 0 else names[::-1]
    k = turn % len(names)
    return names[k:] + names[:k]


def interleave(sides: Mapping[str, Callable[[], Any]], count: int | None = None, *, turns: int = 1,
               reduce: Callable[[list], Any] | None = None) -> dict[str, list]:
    """Run ``count`` blocks (default ``blocks()``) of every side, alternated; each side's block values.

    With ``turns`` > 1 each block is that many alternating turns of every side, and ``reduce`` makes
    one block value from a side's results of that block (default: the median of all their samples).
    With one turn and no ``reduce`` a side's block value is what its callable returned."""
    count = blocks() if count is None else count
    names = list(sides)
    values: dict[str, list] = {name: [] for name in names}
    turn = 0
    for _ in range(count):
        results: dict[str, list] = {name: [] for name in names}
        for _ in range(turns):
            for name in order(names, turn):
                results[name].append(sides[name]())
            turn += 1
        for name in names:
            if reduce is not None:
                values[name].append(reduce(results[name]))
            elif turns == 1:
                values[name].append(results[name][0])
            else:
                values[name].append(samples_median(results[name]))
    return values


def repeat(run: Callable[[], Any], count: int | None = None) -> list:
    """``run()`` once per block: a figure that is not a comparison."""
    return [run() for _ in range(blocks() if count is None else count)]


def measure(name: str, run: Callable[[], float], unit: str, *, count: int | None = None,
            target: Target | None = None, method: str = "", scale: float = 1.0, detail: str = "") -> Figure:
    """Record a figure that is not a ratio: ``run()`` returns one block's value."""
    return record(name, repeat(run, count), unit, target=target, method=method, scale=scale, detail=detail)


def compare(name: str, run_a: Callable[[], Any], run_b: Callable[[], Any], *, count: int | None = None,
            turns: int = 1, reduce: Callable[[list], Any] | None = None, target: Target | None = None,
            method: str = "", a: str = "A", b: str = "B", side_unit: str = "us", side_scale: float = 1e6,
            detail: str = "") -> Figure:
    """A against B in interleaved blocks (ABBA); record and return the figure of the ratios A/B.

    ``run_a`` and ``run_b`` each run one block (or turn) and return a number or a list of samples
    (a time, a rate: the ratio is of what they return); ``side_unit`` and ``side_scale`` say how A
    and B are printed beside the ratio (seconds as "us" by default)."""
    values = interleave({a: run_a, b: run_b}, count, turns=turns, reduce=reduce)
    return ratio(name, values[a], values[b], target=target, method=method, names=(a, b), side_unit=side_unit,
                 side_scale=side_scale, detail=detail)


def pick(values: Sequence[Mapping], key: str) -> list[float]:
    """One entry of every block value, where a side's block values are dicts."""
    return [v[key] for v in values]
