"""The device layer's shape (libshare/arbiter/device/__init__.py): objects, not mixins.

Each concept of the package is a class of a few methods in a module of its own; a Device
composes them. Each rule is a function over source text, shown to catch a synthetic
violation too (the ``*_is_caught`` tests).
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

PACKAGE = ROOT / "libshare" / "arbiter" / "device"

MAX_METHODS = 25

LAYERS = ["_binding", "_instance", "_queue", "_memory", "_pipelines", "_timestamps", "_recordings", "_submission",
          "_device", "__init__"]
"""The package's modules, lowest first: each may import only those before it (the order of the
overview in __init__.py)."""


def _modules() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(PACKAGE.glob("*.py"))}


def crowded_classes(source: str) -> list[str]:
    """Classes of ``source`` with more than MAX_METHODS methods (properties and dunders count)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if len(methods) > MAX_METHODS:
                found.append(f"{node.name}: {len(methods)} methods")
    return found


def foreign_bases(modules: dict[str, str]) -> list[str]:
    """Classes that inherit from a class defined in another module of ``modules`` (name -> source)."""
    defined = {name: {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}
               for name, source in modules.items()}
    found = []
    for name, source in modules.items():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                owners = [other for other, classes in defined.items() if other != name and base_name in classes]
                if owners and base_name not in defined[name]:
                    found.append(f"{name}.{node.name} inherits {base_name} of {owners[0]}")
    return found


def upward_imports(name: str, source: str) -> list[str]:
    """Modules of the package that module ``name`` imports from its own layer or above (anywhere in
    the module: an import under TYPE_CHECKING or in a function counts too)."""
    prefix = "libshare.arbiter.device."
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix):
            target = node.module[len(prefix):]
            if target not in LAYERS or LAYERS.index(target) >= LAYERS.index(name):
                found.append(f"{name} imports {target} (line {node.lineno})")
    return found


def test_no_device_class_has_more_than_25_methods():
    found = {name: crowded_classes(source) for name, source in _modules().items()}
    assert {k: v for k, v in found.items() if v} == {}


def test_no_device_class_inherits_from_another_module():
    assert foreign_bases(_modules()) == []


def test_device_modules_import_only_the_layers_below():
    modules = _modules()
    assert sorted(modules) == sorted(LAYERS), "a module was added or removed: place it in LAYERS"
    assert [f for name, source in modules.items() for f in upward_imports(name, source)] == []


def test_a_crowded_class_is_caught():
    body = "".join(f"    def m{i}(self): pass\n" for i in range(MAX_METHODS + 1))
    assert crowded_classes("class Big:\n" + body)
    assert not crowded_classes("class Small:\n" + body.split("\n", 1)[1])


def test_a_mixin_from_another_module_is_caught():
    modules = {
        "_memory": "class _Memory:\n    pass\n",
        "_device": "from libshare.arbiter.device._memory import _Memory\nclass Device(_Memory):\n    pass\n",
    }
    assert foreign_bases(modules) == ["_device.Device inherits _Memory of _memory"]
    same = {"_recordings": "class Command:\n    pass\nclass Copy(Command):\n    pass\n"}
    assert foreign_bases(same) == []


def test_an_upward_import_is_caught():
    assert upward_imports("_memory", "from libshare.arbiter.device._submission import Submission\n")
    assert upward_imports("_memory", "if TYPE_CHECKING:\n    from libshare.arbiter.device._device import Device\n")
    assert not upward_imports("_memory", "from libshare.arbiter.device._queue import Queue\n")
