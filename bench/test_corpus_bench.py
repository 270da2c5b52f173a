"""The corpus of real compute shaders (tests/corpus/, tools/corpus.py): how many libshare accepts,
and what loading each costs; figures in the summary.

Every figure comes from blocks (bench/_compare.py: ``LIBSHARE_BENCH_BLOCKS``, 5 by default), and
is printed as the median over blocks with its range.

1. acceptance: the share of the corpus's programs that an embedded arbiter accepts (loads
   without a refusal), per block; the same in every block unless a load fails by chance. The
   counts per project and per refusal reason are printed beside it.
2. load time: a block loads every corpus program once through a fresh embedded session (a new
   arbiter, so its cache of programs shared by content is empty) and, alternated with it (ABBA),
   creates every program's pipeline on a private device (descriptor set layouts, pipeline
   layout, shader module, compute pipeline; tools.corpus.Direct). Each program is freed (its
   pipeline destroyed) before the next. The block values are the medians over the programs that
   both sides take; the figure is their ratio, libshare / direct. What a load through libshare
   adds is admission (reflection, the whitelist, spirv-val in a child process), the vetting
   compile in a child process and the request over the socket. Mesa's on-disk shader cache, if
   enabled, serves both sides alike. The median of each program's load through libshare over
   the blocks is printed per project, with the slowest programs.
"""

from __future__ import annotations

import statistics

import pytest

from bench._compare import compare, note, record, repeat
from tools import corpus

ENTRIES = corpus.entries()


@pytest.fixture(scope="module")
def direct():
    with corpus.Direct() as device:
        yield device


def _through_libshare() -> dict[str, corpus.Outcome]:
    import libshare

    with libshare.connect(name="corpus-bench", mode="embedded") as session:
        return {e["name"]: corpus.load_libshare(session, e) for e in ENTRIES}


def test_corpus_acceptance():
    found = repeat(_through_libshare)
    shares = [100.0 * sum(o.accepted for o in block.values()) / len(ENTRIES) for block in found]
    record("corpus programs accepted (embedded)", shares, "%",
           method=f"{len(ENTRIES)} programs from {len({e['project'] for e in ENTRIES})} projects, loaded once per block")
    last = found[-1]
    for project in sorted({e["project"] for e in ENTRIES}):
        mine = [e["name"] for e in ENTRIES if e["project"] == project]
        note(f"  {project}: {sum(last[n].accepted for n in mine)} of {len(mine)} accepted")
    reasons: dict[str, list[str]] = {}
    for name, outcome in last.items():
        if not outcome.accepted:
            reasons.setdefault(corpus.reason(outcome.refusal), []).append(name)
    for heading, names in sorted(reasons.items()):
        note(f"  refused for {heading}: {', '.join(names)}")


def test_corpus_load_time(direct):
    per_program: dict[str, list[float]] = {}

    def libshare_block() -> float:
        outcomes = _through_libshare()
        times = []
        for name, outcome in outcomes.items():
            if outcome.accepted and name in both:
                per_program.setdefault(name, []).append(outcome.load_s)
                times.append(outcome.load_s)
        return statistics.median(times)

    def direct_block() -> float:
        return statistics.median(direct.load_time(e) for e in ENTRIES if e["name"] in both)

    accepted = {n for n, o in _through_libshare().items() if o.accepted}
    both = {e["name"] for e in ENTRIES if e["name"] in accepted and direct.load_time(e) is not None}
    assert both, "no corpus program is taken by both libshare and the direct runs"
    compare("corpus program load, libshare / direct pipeline creation (median program)", libshare_block,
            direct_block, a="libshare", b="direct", side_unit="ms", side_scale=1e3,
            method=f"median over the {len(both)} programs both take; fresh embedded arbiter per block")
    medians = {name: statistics.median(values) for name, values in per_program.items()}
    for project in sorted({e["project"] for e in ENTRIES}):
        mine = [medians[e["name"]] for e in ENTRIES if e["project"] == project and e["name"] in medians]
        if mine:
            note(f"  {project}: load through libshare, median {statistics.median(mine) * 1e3:.1f} ms, "
                 f"max {max(mine) * 1e3:.1f} ms over {len(mine)} programs")
    slowest = sorted(medians.items(), key=lambda kv: -kv[1])[:5]
    note("  slowest loads: " + ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in slowest))
