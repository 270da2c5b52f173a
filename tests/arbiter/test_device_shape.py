"""The device layer's layering (libshare/arbiter/device/__init__.py): each module imports only
those below it, so that the parts a Device composes never reach up to it.

The rules every package follows (no class over 25 methods, no mixin from another module) are in
tests/test_conventions.py. The layering rule is a function over source text, shown to catch a
synthetic violation too.
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

PACKAGE = ROOT / "libshare" / "arbiter" / "device"

LAYERS = ["_binding", "_instance", "_queue", "_memory", "_pipelines", "_timestamps", "_recordings", "_submission",
          "_device", "__init__"]
"""The package's modules, lowest first: each may import only those before it (the order of the
overview in __init__.py)."""


def _modules() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(PACKAGE.glob("*.py"))}


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




def test_device_modules_import_only_the_layers_below():
    modules = _modules()
    assert sorted(modules) == sorted(LAYERS), "a module was added or removed: place it in LAYERS"
    assert [f for name, source in modules.items() for f in upward_imports(name, source)] == []




def test_an_upward_import_is_caught():
    assert upward_imports("_memory", "from libshare.arbiter.device._submission import Submission\n")
    assert upward_imports("_memory", "if TYPE_CHECKING:\n    from libshare.arbiter.device._device import Device\n")
    assert not upward_imports("_memory", "from libshare.arbiter.device._queue import Queue\n")
