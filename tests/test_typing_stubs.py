"""The stubs in typings/ (mypy's view of PyYAML and pynvml, which ship no types) say only what
the libraries have: every module, class, method and constant a stub names exists, each class is
a class with the bases named, and each constant annotated ``int`` is an int. A stub that drifted
from the library would let mypy --strict pass code that fails at run time."""

from __future__ import annotations

import ast
import builtins
import ctypes
import importlib
import inspect
from pathlib import Path

import pytest

TYPINGS = Path(__file__).resolve().parent.parent / "typings"
STUBS = sorted(TYPINGS.rglob("*.pyi"))


def _module_name(stub: Path) -> str:
    parts = list(stub.relative_to(TYPINGS).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_there_are_stubs() -> None:
    assert {_module_name(s) for s in STUBS} >= {"pynvml", "yaml", "yaml.constructor", "yaml.nodes"}


@pytest.mark.parametrize("stub", STUBS, ids=_module_name)
def test_stub_names_exist_in_the_library(stub: Path) -> None:
    module = importlib.import_module(_module_name(stub))
    tree = ast.parse(stub.read_text())
    checked = 0
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            cls = getattr(module, node.name)
            assert inspect.isclass(cls), node.name
            for base in node.bases:
                name = ast.unparse(base)
                expected = eval(name, {"ctypes": ctypes, **vars(builtins), **vars(module)})  # noqa: S307 - the stub's own text
                assert issubclass(cls, expected), f"{node.name} is not a {name}"
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AnnAssign) and not (
                        isinstance(item, ast.FunctionDef) and item.name == "__init__"):
                    attr = item.name if isinstance(item, ast.FunctionDef) else ast.unparse(item.target)
                    assert hasattr(cls, attr) or attr in getattr(cls, "__annotations__", {}) \
                        or _instance_attribute(cls, attr), f"{node.name}.{attr}"
            checked += 1
        elif isinstance(node, ast.AnnAssign):
            name = ast.unparse(node.target)
            value = getattr(module, name)
            if ast.unparse(node.annotation) == "int":
                assert isinstance(value, int), name
            checked += 1
        elif isinstance(node, ast.FunctionDef) and node.name != "__getattr__":
            assert callable(getattr(module, node.name)), node.name
            checked += 1
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                if alias.asname == alias.name:  # a re-export ("X as X"), not a name the stub only uses
                    assert hasattr(module, alias.name), alias.name
                    checked += 1
    assert checked, f"{stub} names nothing"


def _instance_attribute(cls: type, attr: str) -> bool:
    """Attributes set in an ``__init__`` (a node's value, an error's marks) are not on the class."""
    for klass in cls.__mro__:
        try:
            if f"self.{attr} =" in inspect.getsource(klass):
                return True
        except (OSError, TypeError):  # builtins and C types have no Python source
            continue
    return False
