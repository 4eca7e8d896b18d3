"""Every public function, class and method in ``refimpl/``, ``sim/`` and ``bench/`` has a docstring.

Read from the source (ast), nothing imported: module bodies and class bodies (nested classes too, and
the public methods of a private class, which callers still use), not functions nested in functions.
Public means no leading underscore; dunders such as ``__init__`` and ``__call__`` are skipped (the class
docstring covers them). A failure names each ``path:line name`` that needs one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("refimpl", "sim", "bench")
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def missing(source: str, filename: str = "<src>") -> list[str]:
    """``"filename:line Qualified.name"`` for each public def/class in ``source`` without a docstring."""
    out: list[str] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, DEFS):
                continue
            name = node.name
            if not name.startswith("_") and ast.get_docstring(node) is None:
                out.append(f"{filename}:{node.lineno} {prefix}{name}")
            if isinstance(node, ast.ClassDef):  # class bodies, not function bodies
                walk(node.body, f"{prefix}{name}.")

    walk(ast.parse(source, filename).body, "")
    return out


def sources() -> list[Path]:
    """The ``.py`` files of the three packages, sorted."""
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_the_walk_finds_what_it_should_and_nothing_else():
    src = '''
def public(): pass
def _private(): pass
class C:
    def __init__(self): pass
    def m(self): pass
    def _p(self): pass
    @property
    def prop(self): return 1
    class Inner:
        def deep(self):
            def nested(): pass
class _Hidden:
    """doc"""
    def used(self): pass
async def coro():
    """doc"""
'''
    assert missing(src, "m.py") == [
        "m.py:2 public", "m.py:4 C", "m.py:6 C.m", "m.py:9 C.prop", "m.py:10 C.Inner",
        "m.py:11 C.Inner.deep", "m.py:15 _Hidden.used",
    ]


def test_the_packages_are_all_walked():
    files = {str(p.relative_to(ROOT)) for p in sources()}
    for expected in ("refimpl/runtime/base.py", "sim/kernel/engine.py", "bench/gpu/multigpu.py"):
        assert expected in files
    assert len(files) > 50


def test_every_public_function_class_and_method_has_a_docstring():
    bad = [m for p in sources() for m in missing(p.read_text(), str(p.relative_to(ROOT)))]
    assert not bad, (
        f"{len(bad)} public functions/classes/methods have no docstring; add a short, true one to each:\n"
        + "\n".join(bad)
    )
