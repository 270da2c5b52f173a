"""The public API: each name exported once from libshare/__init__.py, and every exception public."""

from __future__ import annotations

import ast

import libshare
from libshare import errors

from tests.conftest import ROOT


def _imported_names(path) -> list[str]:
    """The names a module's top-level ``from ... import`` statements bind."""
    tree = ast.parse(path.read_text())
    return [alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
            if node.module != "__future__" for alias in node.names]


def test_each_public_name_is_exported_once_and_importable():
    names = libshare.__all__
    assert sorted(name for name in set(names) if names.count(name) > 1) == []
    imported = _imported_names(ROOT / "libshare" / "__init__.py")
    assert sorted(name for name in set(imported) if imported.count(name) > 1) == [], "a name is imported twice"
    assert sorted(imported) == sorted(names), "__init__.py imports a name __all__ lacks, or the reverse"
    for name in names:
        assert getattr(libshare, name) is not None, name
    namespace: dict = {}
    exec("from libshare import *", namespace)  # noqa: S102 - what a user's star import gets
    assert sorted(k for k in namespace if not k.startswith("__")) == sorted(names)


def test_every_exception_of_errors_py_is_exported():
    defined = [node.name for node in ast.parse((ROOT / "libshare" / "errors.py").read_text()).body
               if isinstance(node, ast.ClassDef)]
    exceptions = [name for name in defined if issubclass(getattr(errors, name), BaseException)]
    assert len(errors.__all__) == len(set(errors.__all__))
    assert sorted(exceptions) == sorted(errors.__all__), "errors.__all__ lists exactly the exception classes"
    for name in exceptions:
        assert name in libshare.__all__ and getattr(libshare, name) is getattr(errors, name), name
