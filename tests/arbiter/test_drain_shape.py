"""The control thread's package (libshare/arbiter/drain/) is made of objects, not mixins.

Drainer owns a Tasks, a Planner and a Containment and talks to each through a few methods
and attributes; no class there grows past 25 methods, and none inherits from a class of
another drain module (which would make one class of several files again, calling each other
through ``self``). Each rule is a function over source text, also shown to catch a synthetic
violation.
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

DRAIN = ROOT / "libshare" / "arbiter" / "drain"

MAX_METHODS = 25


def _modules() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(DRAIN.glob("*.py"))}


def _classes(source: str) -> list[ast.ClassDef]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]


def method_counts(source: str) -> dict[str, int]:
    """Each class of ``source`` and its number of methods (properties and static methods included)."""
    return {c.name: sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in c.body)
            for c in _classes(source)}


def cross_module_bases(modules: dict[str, str]) -> list[str]:
    """Classes of ``modules`` (name: source) with a base class defined in another of them."""
    defined = {name: {c.name for c in _classes(source)} for name, source in modules.items()}
    found = []
    for name, source in modules.items():
        elsewhere = set().union(*(classes for other, classes in defined.items() if other != name))
        for cls in _classes(source):
            for base in cls.bases:
                base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
                if base_name in elsewhere and base_name not in defined[name]:
                    found.append(f"{name}.{cls.name}({ast.unparse(base)})")
    return found


def test_no_drain_class_has_more_than_25_methods():
    counts = {f"{module}.{cls}": n for module, source in _modules().items()
              for cls, n in method_counts(source).items()}
    assert "drainer.Drainer" in counts  # the rule looks at the real package
    assert {k: n for k, n in counts.items() if n > MAX_METHODS} == {}


def test_no_drain_class_inherits_from_another_drain_module():
    modules = _modules()
    assert {"drainer", "tasks", "containment", "planner"} <= set(modules)
    assert cross_module_bases(modules) == []


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


def test_a_long_class_and_a_mixin_are_caught():
    body = "".join(f"    def m{i}(self): pass\n" for i in range(MAX_METHODS + 1))
    assert method_counts("class Big:\n" + body) == {"Big": MAX_METHODS + 1}
    mixins = {"tasks": "class Tasks:\n    pass\n",
              "drainer": "from x import tasks\nclass Drainer(Tasks, tasks.Tasks, Local):\n    pass\n"
                         "class Local:\n    pass\n"}
    assert cross_module_bases(mixins) == ["drainer.Drainer(Tasks)", "drainer.Drainer(tasks.Tasks)"]
    assert cross_module_bases({"a": "class A(Exception):\n    pass\n"}) == []
