"""Every name README.md and docs/ show can be imported from the path they show it at.

Read from the Markdown: ``from X import a, b`` and ``import X`` lines (in code
blocks or inline code) and dotted names in inline code such as
``refimpl.torch_runtime.nccl_validation.validate_offload_nccl(True)`` or ``sim.SimWorld``, for the packages
``refimpl``, ``sim`` and ``bench``. Each is imported in a fresh interpreter, so a
name that only works after something else was imported is caught too.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOT = r"(?:refimpl|sim|bench)"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
FROM_IMPORT = re.compile(rf"\bfrom\s+({ROOT}(?:\.{IDENT})*)\s+import\s+(\([^)]*\)|[A-Za-z0-9_*, ]+)")
PLAIN_IMPORT = re.compile(rf"(?:^|[\s`;])import\s+({ROOT}(?:\.{IDENT})*)")
INLINE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(rf"^({ROOT}(?:\.{IDENT})+)")


def shown_names() -> dict[str, list[str]]:
    """``"module:name"`` (or ``"dotted.path"``) -> the pages that show it."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        text = page.read_text()
        where = str(page.relative_to(REPO))
        for module, names in FROM_IMPORT.findall(text):
            for name in names.strip("()").replace("\n", " ").split(","):
                name = name.split(" as ")[0].strip()
                if name:
                    found.setdefault(f"{module}:{name}", []).append(where)
        for module in PLAIN_IMPORT.findall(text):
            found.setdefault(module, []).append(where)
        for span in INLINE.findall(text):
            m = DOTTED.match(span.strip())
            if m and "/" not in span and not span.strip().endswith((".py", ".json", ".md")):
                found.setdefault(m.group(1), []).append(where)
    return found


CHECK = r"""
import importlib, json, sys
bad = {}
for item in json.loads(sys.argv[1]):
    try:
        if ":" in item:
            module, name = item.split(":")
            mod = importlib.import_module(module)
            if name != "*":
                getattr(mod, name)
            continue
        parts = item.split(".")
        obj, i = None, len(parts)
        while i:  # the longest importable module prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ModuleNotFoundError:
                i -= 1
        if obj is None:
            raise ModuleNotFoundError(parts[0])
        for attr in parts[i:]:
            obj = getattr(obj, attr)
    except Exception as exc:
        bad[item] = f"{type(exc).__name__}: {exc}"
print(json.dumps(bad))
"""


def test_docs_show_names_at_least_from_the_main_faces():
    names = shown_names()
    # the reader really reads the pages: names every page set relies on
    for expected in ("refimpl.torch_runtime:TorchRuntime", "refimpl.store:OffloadStore", "sim:SimWorld",
                     "refimpl.torch_runtime.nccl_validation.validate_offload_nccl"):
        assert expected in names, f"{expected} is no longer shown in the docs; update this test's list"


def test_every_name_the_docs_show_imports_from_the_path_shown():
    names = shown_names()
    out = subprocess.run([sys.executable, "-c", CHECK, json.dumps(sorted(names))], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    bad = json.loads(out.stdout.strip().splitlines()[-1])
    assert not bad, "names shown in the docs that do not import from the path shown:\n" + "\n".join(
        f"  {item} ({', '.join(sorted(set(names[item])))}): {err}" for item, err in sorted(bad.items())
    )
