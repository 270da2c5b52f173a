"""Conventions of tests/ itself: mechanisms, not elapsed time (CONTRIBUTION.md, issue 31).

A test that asserts on elapsed time fails when the machine is fast, slow or loaded; a test that
waits a fixed time for something to happen does too. So, in every Python file under tests/:

- no ``threading.Timer``: an action that must come after something waits for that something
  (``wait_until``, an event, a ticket's state), not for a delay;
- no loop that sleeps: a poll is ``tests._wait.wait_until``, the one loop that may (its timeout
  a bound against a hang, never a measure);
- no timing assertion: no ``assert`` (nor ``pytest.fail`` under an ``if``) on a difference of two
  clock readings (``time.monotonic()``, ``perf_counter()``, ``time.time()``, their ``_ns`` forms,
  ``thread_time()``, ``process_time()``), on a name that holds one (directly, or through other
  names, lists and dicts it went into), or on a name that says it is one (``elapsed``, ``took``,
  ``duration``). A deadline compared with the clock is a bound against a
  hang, not a measure, and passes. What a time, a share or a rate says belongs in bench/.

A justified exception carries ``# not-a-timing-assertion: <why>`` on the assert (or the line
above it). Each rule is also run on a small snippet that breaks it, to show that it catches it.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
POLL_HELPER = TESTS / "_wait.py"  # the one loop that sleeps
MARKER = re.compile(r"#\s*not-a-timing-assertion:\s*\S")
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns", "thread_time",
          "thread_time_ns", "process_time", "process_time_ns"}
TIMING_WORDS = {"elapsed", "took", "duration"}


def sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


# ---------------------------------------------------------------- what the rules look for

def _time_names(tree: ast.AST) -> tuple[set[str], set[str], set[str], set[str]]:
    """Names bound in the module to the ``time`` module, to its clocks, to ``time.sleep``, and to
    ``threading.Timer``."""
    modules, clocks, sleeps, timers = {"time"}, set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "time":
                    modules.add(alias.asname or "time")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            for alias in node.names:
                if alias.name in CLOCKS:
                    clocks.add(alias.asname or alias.name)
                elif alias.name == "sleep":
                    sleeps.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module == "threading":
            timers.update(alias.asname or alias.name for alias in node.names if alias.name == "Timer")
    return modules, clocks, sleeps, timers


class _Names:
    def __init__(self, tree: ast.AST):
        self.modules, self.clocks, self.sleeps, self.timers = _time_names(tree)

    def is_clock(self, node: ast.AST) -> bool:
        """``time.monotonic()`` and the like (or a clock imported by name), called."""
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        return (isinstance(f, ast.Attribute) and f.attr in CLOCKS and isinstance(f.value, ast.Name)
                and f.value.id in self.modules) or (isinstance(f, ast.Name) and f.id in self.clocks)

    def is_sleep(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        return (isinstance(f, ast.Attribute) and f.attr == "sleep" and isinstance(f.value, ast.Name)
                and f.value.id in self.modules) or (isinstance(f, ast.Name) and f.id in self.sleeps)

    def is_timer(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "Timer" and isinstance(node.value, ast.Name)
                and node.value.id == "threading") or (isinstance(node, ast.Name) and node.id in self.timers)


def _walk_here(node: ast.AST):
    """The nodes under ``node`` that run as part of it: not the bodies of functions, lambdas and
    classes it defines (they run when called, not in its loop)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield child
        yield from _walk_here(child)


def _target_names(target: ast.AST) -> set[str]:
    """The variables an assignment target stores into (``x``, ``x[k]``, ``x.attr``: x)."""
    while isinstance(target, (ast.Subscript, ast.Attribute, ast.Starred)):
        target = target.value
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(t) for t in target.elts))
    return set()


def _is_timing_word(name: str) -> bool:
    return any(word in TIMING_WORDS for word in name.lower().split("_"))


class _Timing:
    """Which expressions of a scope measure time: a difference of clock readings, a name that
    holds one (followed through assignments, ``+=``, ``.append``/``.extend``/``.setdefault``,
    closures included: a nested function's ``seen[way] = ...`` taints ``seen``), or a call of a
    function of the module (``functions``) that returns one. A scope is a function defined at
    the top of the module or of a class, with everything nested in it; or the module's own code."""

    def __init__(self, names: _Names, scope: ast.AST, functions: set[str] = frozenset()):
        self.names = names
        self.tainted: set[str] = set()
        self.functions: set[str] = set(functions)
        stores, returns = [], []
        nodes = ast.walk(scope) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else _walk_here(scope)
        for node in nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List)) \
                            and len(target.elts) == len(node.value.elts):
                        stores += [(_target_names(t), v) for t, v in zip(target.elts, node.value.elts)]
                    else:
                        stores.append((_target_names(target), node.value))
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                stores.append((_target_names(node.target), node.value))
            elif isinstance(node, ast.NamedExpr):
                stores.append((_target_names(node.target), node.value))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("append", "extend", "add", "setdefault", "insert"):
                stores += [(_target_names(node.func.value), arg) for arg in node.args]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                returns += [(node.name, n.value) for n in _walk_here(node)
                            if isinstance(n, ast.Return) and n.value is not None]
        while True:  # until nothing new: a chain of names and calls is followed to its end
            before = len(self.tainted) + len(self.functions)
            self.tainted |= set().union(*(targets for targets, value in stores if self.measures(value)))
            self.functions |= {name for name, value in returns if self.measures(value)}
            if len(self.tainted) + len(self.functions) == before:
                return

    def measures(self, expr: ast.AST) -> bool:
        for node in ast.walk(expr):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and \
                    (self.names.is_clock(node.left) or self.names.is_clock(node.right)):
                return True
            if isinstance(node, ast.Name) and (node.id in self.tainted or _is_timing_word(node.id)):
                return True
            if isinstance(node, ast.Call) and self.functions and (
                    (isinstance(node.func, ast.Name) and node.func.id in self.functions)
                    or (isinstance(node.func, ast.Attribute) and node.func.attr in self.functions)):
                return True
        return False


# ---------------------------------------------------------------- the rules

def timers(source: str) -> list[int]:
    """Lines that use ``threading.Timer``."""
    tree = ast.parse(source)
    names = _Names(tree)
    return sorted({node.lineno for node in ast.walk(tree) if names.is_timer(node)})


def sleeping_loops(source: str) -> list[int]:
    """Lines of ``for``/``while`` loops whose body (or condition) sleeps."""
    tree = ast.parse(source)
    names = _Names(tree)
    return sorted(loop.lineno for loop in ast.walk(tree)
                  if isinstance(loop, (ast.For, ast.AsyncFor, ast.While))
                  and any(names.is_sleep(node) for node in _walk_here(loop)))


def timing_assertions(source: str) -> list[int]:
    """Lines of assertions on measured time (an ``assert``, or an ``if`` whose body calls
    ``pytest.fail``), less those marked ``# not-a-timing-assertion: <why>``."""
    tree = ast.parse(source)
    names, lines = _Names(tree), source.splitlines()
    scopes = [tree, *_top_functions(tree)]
    functions: set[str] = set()
    while True:  # the module's functions that return a measure, whichever scope calls them
        before = len(functions)
        for scope in scopes:
            functions |= _Timing(names, scope, functions).functions
        if len(functions) == before:
            break
    found = set()
    for scope in scopes:
        timing = _Timing(names, scope, functions)
        found |= _asserts_on(timing, scope, lines)
    return sorted(found)


def _top_functions(tree: ast.AST) -> list[ast.AST]:
    """The functions defined at the top of the module or of a class (not inside another function)."""
    found, todo = [], list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
        elif not isinstance(node, ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _asserts_on(timing: _Timing, scope: ast.AST, lines: list[str]) -> set[int]:
    """Lines of the scope's assertions that check what ``timing`` says measures time, unmarked."""
    found = set()
    nodes = ast.walk(scope) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else _walk_here(scope)
    for node in nodes:
        if isinstance(node, ast.Assert):
            checked = node.test
        elif isinstance(node, ast.If) and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "fail"
                for statement in node.body for n in ast.walk(statement)):
            checked = node.test
        else:
            continue
        if not timing.measures(checked):
            continue
        span = lines[max(node.lineno - 2, 0):(node.end_lineno or node.lineno)]
        if not any(MARKER.search(line) for line in span):
            found.add(node.lineno)
    return found


# ---------------------------------------------------------------- tests/ keeps them

def _violations(rule, exempt: Path | None = None) -> list[str]:
    return [f"{path.relative_to(TESTS.parent)}:{line}" for path in sources() if path != exempt
            for line in rule(path.read_text())]


def test_no_threading_timer_in_tests():
    assert _violations(timers) == [], "a Timer's delay stands in for the condition it waits for: wait_until"


def test_no_loop_in_tests_sleeps_but_wait_until():
    assert sleeping_loops(POLL_HELPER.read_text()), "tests/_wait.py lost its poll loop: the rule checks nothing"
    assert _violations(sleeping_loops, exempt=POLL_HELPER) == [], "poll with tests._wait.wait_until instead"


def test_no_timing_assertion_in_tests():
    assert _violations(timing_assertions) == [], "assert the mechanism; what took how long belongs in bench/"


# ---------------------------------------------------------------- the rules catch what they should

def _code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


@pytest.mark.parametrize("snippet, lines", [
    ("import threading\nthreading.Timer(0.2, print).start()\n", [2]),
    ("from threading import Timer as Later\nLater(0.2, print).start()\n", [2]),
    ("import threading\nthreading.Thread(target=print).start()\n", []),
])
def test_the_timer_rule(snippet, lines):
    assert timers(snippet) == lines


@pytest.mark.parametrize("snippet, lines", [
    ("""
     import time
     while not done():
         time.sleep(0.05)
     """, [2]),
    ("""
     from time import sleep
     for _ in range(10):
         if ready():
             break
         sleep(0.01)
     """, [2]),
    ("""
     import time as t
     while True:
         try:
             connect()
         except OSError:
             t.sleep(0.05)
     """, [2]),
    ("""
     import time
     time.sleep(1.0)  # not in a loop: the rule is about polls
     for item in items:
         worker = lambda: time.sleep(1)  # defined here, run elsewhere
     """, []),
    ("""
     from tests._wait import wait_until
     wait_until(lambda: path.exists(), 30, "the file")
     """, []),
])
def test_the_sleeping_loop_rule(snippet, lines):
    assert sleeping_loops(_code(snippet)) == lines


@pytest.mark.parametrize("snippet, lines", [
    ("""
     import time
     def test():
         started = time.monotonic()
         work()
         took = time.monotonic() - started
         assert took > 4, f"took {took:.1f} s"
     """, [6]),
    ("""
     import time
     def test():
         start = time.monotonic()
         work()
         assert 0.18 <= time.monotonic() - start < 1.0
     """, [5]),
    ("""
     import time
     def test():
         times = []
         for _ in range(10):
             begun = time.perf_counter()
             work()
             times.append(time.perf_counter() - begun)
         slowest = max(times)
         assert slowest < 1.0
     """, [9]),
    ("""
     import time
     def test():
         seen = {}
         seen["wait"] = time.time() - killed_at
         assert seen["wait"] < 5
     """, [5]),
    ("""
     from time import perf_counter as now
     def test():
         a = now()
         work()
         gap = now() - a
         ratio = gap / 2
         if ratio > 1:
             pytest.fail("slow")
     """, [7]),
    ("""
     def test(report):
         elapsed = report.seconds
         assert elapsed < 1.0
     """, [3]),
    ("""
     import time
     def timed(work):
         started = time.perf_counter()
         work()
         return [time.perf_counter() - started]
     def test():
         times = timed(job)
         assert max(times) < 1.0
     """, [8]),
    ("""
     import time
     def test():
         seen = {}
         def record():
             seen["wait"] = time.monotonic() - killed_at
         record()
         assert seen["wait"] < 5
     def test_other():
         seen = wait_until(ready)
         assert seen != "gone"
     """, [7]),
    ("""
     import time
     def test():
         deadline = time.monotonic() + 30
         while not done():
             assert time.monotonic() < deadline, "a bound against a hang"
         assert result() == 42
     """, []),
    ("""
     import time
     def test():
         started = time.monotonic()
         work()
         took = time.monotonic() - started
         print(f"it took {took:.1f} s")  # a figure printed, not asserted
         assert took is not None  # not-a-timing-assertion: checks that it was measured at all
     """, []),
])
def test_the_timing_assertion_rule(snippet, lines):
    assert timing_assertions(_code(snippet)) == lines
