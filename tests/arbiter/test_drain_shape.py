"""The control thread's package (libshare/arbiter/drain/) is made of objects: Drainer owns a
Tasks, a Planner and a Containment and talks to each through a few methods and attributes.

The rules every package follows (no class over 25 methods, no mixin from another module) are in
tests/test_conventions.py.
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

DRAIN = ROOT / "libshare" / "arbiter" / "drain"


def _classes(source: str) -> list[ast.ClassDef]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]


def test_the_drainer_owns_its_parts():
    from libshare.arbiter.drain.containment import Containment
    from libshare.arbiter.drain.drainer import Drainer
    from libshare.arbiter.drain.planner import Planner
    from libshare.arbiter.drain.tasks import Tasks

    assert Drainer.__bases__ == (object,)
    init = next(n for n in _classes((DRAIN / "drainer.py").read_text())[0].body
                if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    made = {ast.unparse(n.value.func) for n in ast.walk(init)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)}
    assert {Tasks.__name__, Planner.__name__, Containment.__name__} <= made
