"""No module of the protocol packages writes another object's private fields or hands a private method
to another class: the owner gets a public method instead (issue 15). Read from the source (ast)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("refimpl/store", "refimpl/comm")
#: attributes a module puts on objects it does not own as its own markers (``parking`` marks tensors)
OWN_MARKERS = ("_timeshare_",)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith(OWN_MARKERS)


def _written(target: ast.AST):
    """The attribute nodes a statement target writes into (``a._x =``, ``a._x[i] =``, ``a, b._y =``)."""
    if isinstance(target, ast.Attribute):
        yield target
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from _written(t)
    elif isinstance(target, ast.Subscript):
        yield from _written(target.value)
    elif isinstance(target, ast.Starred):
        yield from _written(target.value)


def violations(source: str, filename: str = "<src>") -> list[str]:
    """Writes to a private attribute of anything but ``self``/``cls``, calls of another object's private
    method (``layout._cut()``), and private methods of ``self`` passed to a class's constructor
    (``Other(..., self._hook)``)."""
    tree = ast.parse(source)
    out = []
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] + [tree]:
        methods = {f.name for f in getattr(cls, "body", []) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in ast.walk(cls):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id[:1].isupper():
                for a in [*node.args, *(k.value for k in node.keywords)]:
                    if (isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self"
                            and _private(a.attr) and a.attr in methods):
                        out.append(f"{filename}:{a.lineno}: passes private method {ast.unparse(a)} to {node.func.id}")
    for node in ast.walk(tree):
        fn = getattr(node, "func", None)
        if (isinstance(node, ast.Call) and isinstance(fn, ast.Attribute) and _private(fn.attr)
                and not (isinstance(fn.value, ast.Name) and fn.value.id in ("self", "cls"))):
            out.append(f"{filename}:{fn.lineno}: calls {ast.unparse(fn)}")
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            for attr in _written(t):
                owner = attr.value
                if _private(attr.attr) and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    out.append(f"{filename}:{attr.lineno}: writes {ast.unparse(attr)}")
    return sorted(set(out))


def test_the_check_finds_what_it_forbids():
    bad = ("class A:\n    def _hook(self): pass\n    def f(self, b, layout):\n"
           "        b._x = 1\n        layout._segs[0] = 2\n        self._ok = 3\n        B(self._hook)\n"
           "        layout._cut([0])\n        self._hook()\n")
    found = violations(bad)
    assert any("writes b._x" in v for v in found) and any("writes layout._segs" in v for v in found)
    assert any("passes private method self._hook to B" in v for v in found)
    assert any("calls layout._cut" in v for v in found) and not any("calls self._hook" in v for v in found)
    assert not any("self._ok" in v for v in found)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_writes_another_objects_private_fields(package):
    files = sorted((ROOT / package).glob("*.py"))
    assert files
    found = [v for f in files for v in violations(f.read_text(), str(f.relative_to(ROOT)))]
    assert not found, "give the owner a public method instead:\n" + "\n".join(found)
