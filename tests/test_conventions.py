"""The conventions of CONTRIBUTION.md, checked: each test fails on a violation anywhere in the tree.

Each rule is a function over source text, so that it is also shown to catch a synthetic
violation (the ``*_is_caught`` tests): a convention test that cannot fail checks nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "libshare"

SYNC_H = PACKAGE / "ring" / "sync.h"
"""The one file that may touch memory ordering."""

BINDING_MODULES = {
    PACKAGE / "ring" / "_binding.py",
    PACKAGE / "arbiter" / "engine" / "binding.py",
    PACKAGE / "arbiter" / "drain" / "emergency.py",
}
"""The modules that may name a cffi module's ``ffi`` and ``lib``."""

MAX_MODULE_LINES = 650
"""A module's size ("about 600 lines"), generated and vendored files aside."""

MAX_METHODS = 25
"""A class's method count ("about 25")."""


def _c_sources() -> list[Path]:
    return sorted(p for pattern in ("*.c", "*.h") for p in (*PACKAGE.rglob(pattern), *(ROOT / "bindings").rglob(pattern))
                  if "build" not in p.parts and not p.name.endswith("_cffi.c"))


def _python_sources(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py") if "_stubs" not in p.parts)


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -------------------------------------------------------------------- atomics only in sync.h

_ATOMIC = re.compile(r"\b(__atomic_\w+|__sync_\w+|atomic_\w+|_Atomic)\b")


def atomic_uses(text: str) -> list[str]:
    """The atomic builtins named in C source ``text`` (comments included: keep them out of prose too)."""
    return _ATOMIC.findall(text)


def test_atomics_live_only_in_sync_h():
    """In the library's C. The C tests and benchmarks are programs written against the public
    header alone, as a user's would be (sync.h is not installed), and count with their own atomics."""
    found = {_relative(p): atomic_uses(p.read_text()) for p in _c_sources()
             if p != SYNC_H and "tests" not in p.parts}
    assert {k: v for k, v in found.items() if v} == {}


def test_an_atomic_outside_sync_h_is_caught():
    assert atomic_uses("x = __atomic_load_n(&w, __ATOMIC_ACQUIRE);") == ["__atomic_load_n"]
    assert atomic_uses("x = ls_load_acquire(&w);") == []


# -------------------------------------------------------------------- ffi and lib only in binding modules

def ffi_imports(source: str) -> list[str]:
    """Where ``source`` imports a cffi module's ``ffi`` or ``lib`` (from a ``_*_cffi`` module or a binding)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = {a.name for a in node.names}
            if module.endswith("_cffi") or names & {"ffi", "lib"}:
                found.append(f"line {node.lineno}: from {'.' * node.level}{module} import {', '.join(sorted(names))}")
    return found


def test_ffi_and_lib_appear_only_in_binding_modules():
    found = {_relative(p): ffi_imports(p.read_text()) for p in _python_sources(PACKAGE)
             if p not in BINDING_MODULES and not p.name.endswith("_build.py")}
    assert {k: v for k, v in found.items() if v} == {}


def test_an_ffi_import_outside_a_binding_is_caught():
    assert ffi_imports("from ._binding import check, ffi, lib\n")
    assert ffi_imports("from ._engine_cffi import lib\n")
    assert not ffi_imports("from ._binding import check\n")


# -------------------------------------------------------------------- no descriptor offsets spelled out

_DESC_WORDS = re.compile(r"desc|slot|sqe|cqe", re.IGNORECASE)


def spelled_offsets(source: str) -> list[str]:
    """Byte offsets into a descriptor or completion written as numbers: ``struct.unpack_from(fmt, desc, 32)``
    or ``slot[32:40]`` on a name that says it holds one (``DESC_DTYPE`` field names are the way)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("unpack_from", "pack_into") and len(node.args) >= 3:
            target, offset = ast.unparse(node.args[1]), node.args[2]
            if _DESC_WORDS.search(target) and isinstance(offset, ast.Constant) and offset.value:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and \
                _DESC_WORDS.search(ast.unparse(node.value)):
            bounds = [b for b in (node.slice.lower, node.slice.upper) if b is not None]
            if bounds and all(isinstance(b, ast.Constant) and isinstance(b.value, int) for b in bounds) and \
                    any(b.value for b in bounds):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_or_test_spells_a_descriptor_offset():
    found = {_relative(p): spelled_offsets(p.read_text()) for p in _python_sources(PACKAGE, ROOT / "tests",
                                                                                  ROOT / "bench", ROOT / "tools")
             if p != Path(__file__)}
    assert {k: v for k, v in found.items() if v} == {}


def test_a_spelled_descriptor_offset_is_caught():
    assert spelled_offsets("struct.unpack_from('<I', desc, 32)\n")
    assert spelled_offsets("x = slot_bytes[64:80]\n")
    assert not spelled_offsets("x = slot['groups']\nstruct.unpack_from('<I', header, 4)\n")


# -------------------------------------------------------------------- sizes and shapes

def long_classes(source: str) -> list[str]:
    """Classes of ``source`` with more than MAX_METHODS methods."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if len(methods) > MAX_METHODS:
                found.append(f"{node.name}: {len(methods)} methods")
    return found


def test_no_class_has_more_than_about_25_methods():
    found = {_relative(p): long_classes(p.read_text()) for p in _python_sources(PACKAGE)}
    assert {k: v for k, v in found.items() if v} == {}


def test_no_module_is_longer_than_about_600_lines():
    sources = [*_python_sources(PACKAGE), *_c_sources()]
    generated = {ROOT / "bindings" / "c" / "libshare.h"}
    found = {_relative(p): n for p in sources if p not in generated
             if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert found == {}


def test_a_long_class_is_caught():
    body = "".join(f"    def m{i}(self): pass\n" for i in range(MAX_METHODS + 1))
    assert long_classes("class Big:\n" + body)
    assert not long_classes("class Small:\n    def m(self): pass\n")


def foreign_bases(modules: dict[str, str]) -> list[str]:
    """Classes of ``modules`` (a package's module name -> source) that inherit from a class defined
    in another module of the same package: a mixin, one class spread over several files."""
    defined = {name: {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}
               for name, source in modules.items()}
    found = []
    for name, source in modules.items():
        elsewhere = set().union(*(classes for other, classes in defined.items() if other != name))
        for node in ast.walk(ast.parse(source)):
            for base in node.bases if isinstance(node, ast.ClassDef) else ():
                base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
                if base_name in elsewhere and base_name not in defined[name]:
                    found.append(f"{name}.{node.name}({ast.unparse(base)})")
    return found


def test_no_class_inherits_from_a_class_of_another_module_of_its_package():
    found = []
    for package in sorted({p.parent for p in _python_sources(PACKAGE)}):
        modules = {p.stem: p.read_text() for p in sorted(package.glob("*.py"))}
        found += [f"{_relative(package)}/{f}" for f in foreign_bases(modules)]
    assert found == []


def test_a_mixin_from_another_module_is_caught():
    modules = {"_memory": "class _Memory:\n    pass\n",
               "_device": "from x import _memory\nclass Device(_Memory, _memory._Memory, Local):\n    pass\n"
                          "class Local:\n    pass\n"}
    assert foreign_bases(modules) == ["_device.Device(_Memory)", "_device.Device(_memory._Memory)"]
    assert foreign_bases({"a": "class A(Exception):\n    pass\nclass B(A):\n    pass\n"}) == []


# -------------------------------------------------------------------- no import cycles

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(name: str, source: str, is_package: bool) -> set[str]:
    """The libshare modules that module ``name`` imports when it is loaded (top-level statements only:
    an import inside a function runs later and cannot close a loop at load time)."""
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("libshare")}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The loops in a module import ``graph`` (depth-first; each loop reported once)."""
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_libshare_modules_import_no_cycle():
    files = _python_sources(PACKAGE)
    names = {_module_name(p) for p in files}
    graph = {}
    for path in files:
        name = _module_name(path)
        imported = module_imports(name, path.read_text(), path.name == "__init__.py")
        # A package imports its __init__ on the way to any of its modules; that edge is no loop.
        graph[name] = {m for m in imported if m in names and m != name and not name.startswith(m + ".")}
    assert import_cycles(graph) == []


def test_an_import_cycle_is_caught():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


# -------------------------------------------------------------------- CONTRIBUTION.md maps the tree

def mapped_paths(text: str) -> set[str]:
    """The repository paths that a Markdown ``text`` names in backquotes (``libshare/...``, ``tests/...``)."""
    return set(re.findall(r"`((?:libshare|tests|bench|bindings|tools|shaders|docs)/[\w./*-]*)`", text))


def test_contribution_names_only_paths_that_exist():
    text = (ROOT / "CONTRIBUTION.md").read_text()
    missing = sorted(p for p in mapped_paths(text) if not any(ROOT.glob(p.rstrip("/"))))
    assert missing == []


def test_contribution_maps_every_package_folder():
    text = (ROOT / "CONTRIBUTION.md").read_text()
    folders = sorted(_relative(p.parent) + "/" for p in PACKAGE.rglob("__init__.py")
                     if "_stubs" not in p.parts)
    assert [f for f in folders if f"`{f}`" not in text] == []


def test_a_stale_path_in_a_map_is_caught():
    assert mapped_paths("see `libshare/arbiter/_server.py` and `tests/ring/`") == \
        {"libshare/arbiter/_server.py", "tests/ring/"}
    assert not any(ROOT.glob("libshare/arbiter/_server.py"))
