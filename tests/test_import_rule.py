"""The seam rule: protocol code never touches torch.distributed or torch.cuda directly.

Only the torch implementation of the seam (``refimpl/torch_runtime/``: TorchRuntime,
the NCCL ctypes binding, pinning, the copy stream, DCP) may; no single file is
exempt. Everything else goes through the Runtime, so the simulator runs the same
code. The checker reads each module's AST: it catches
every import form of ``torch.distributed`` / ``torch.cuda`` (``import``,
``from ... import``, ``importlib.import_module``, ``__import__``) and attribute
access ``<torch or an alias>.cuda`` / ``.distributed`` (also via ``getattr``).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "refimpl"
EXEMPT_DIRS = (PACKAGE / "torch_runtime",)
FORBIDDEN = ("torch.distributed", "torch.cuda")
FORBIDDEN_ATTRS = ("distributed", "cuda")


def _forbidden_module(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def find_violations(source: str, filename: str = "<source>") -> list[str]:
    """``"file:line: what"`` for every use of torch.distributed / torch.cuda in ``source``."""
    tree = ast.parse(source, filename=filename)
    torch_names = {"torch"}  # names bound to the torch module (import torch [as x])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" and alias.asname:
                    torch_names.add(alias.asname)
    found: list[str] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _forbidden_module(alias.name):
                    flag(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _forbidden_module(node.module):
                flag(node, f"from {node.module} import ...")
            elif node.module == "torch":
                for alias in node.names:
                    if alias.name in FORBIDDEN_ATTRS:
                        flag(node, f"from torch import {alias.name}")
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in torch_names and node.attr in FORBIDDEN_ATTRS:
                flag(node, f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            args = node.args
            if fname in ("import_module", "__import__") and args and isinstance(args[0], ast.Constant):
                if isinstance(args[0].value, str) and _forbidden_module(args[0].value):
                    flag(node, f"{fname}({args[0].value!r})")
            if fname == "getattr" and len(args) >= 2 and isinstance(args[0], ast.Name) \
                    and args[0].id in torch_names and isinstance(args[1], ast.Constant) \
                    and args[1].value in FORBIDDEN_ATTRS:
                flag(node, f"getattr({args[0].id}, {args[1].value!r})")
    return found


def _governed_files() -> list[Path]:
    files = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(d in path.parents for d in EXEMPT_DIRS):
            continue
        files.append(path)
    return files


def test_protocol_code_uses_only_the_runtime():
    files = _governed_files()
    assert PACKAGE / "cli.py" in files, "the walk missed refimpl/ (did the package move?)"
    violations = [v for f in files for v in find_violations(f.read_text(), str(f.relative_to(REPO)))]
    assert not violations, (
        "protocol code must reach CUDA and torch.distributed only through refimpl.runtime.Runtime "
        "(see refimpl/runtime/base.py); move these into refimpl/torch_runtime/:\n" + "\n".join(violations)
    )


def test_adapters_are_exempt_and_nothing_else():
    governed = _governed_files()
    assert not any("torch_runtime" in f.relative_to(PACKAGE).parts[:1] for f in governed)
    assert PACKAGE / "runtime" / "base.py" in governed  # the seam itself is held to the rule
    assert len(EXEMPT_DIRS) == 1


@pytest.mark.parametrize(
    "source",
    [
        "import torch.distributed",
        "import torch.distributed as dist",
        "import torch.distributed.fsdp",
        "from torch.distributed import all_reduce",
        "from torch.distributed.tensor import DTensor",
        "from torch import distributed",
        "from torch import distributed as dist",
        "from torch import cuda",
        "import torch.cuda",
        "from torch.cuda import Stream",
        "import importlib\nimportlib.import_module('torch.distributed.fsdp')",
        "from importlib import import_module\nimport_module('torch.cuda')",
        "__import__('torch.distributed')",
        "import torch\ntorch.cuda.synchronize()",
        "import torch\nif torch.cuda.is_available(): pass",
        "import torch\ntorch.distributed.barrier()",
        "import torch as th\nth.cuda.empty_cache()",
        "import torch.nn\nx = torch.cuda.current_stream()",
        "import torch\nc = getattr(torch, 'cuda')",
        "def f():\n    import torch\n    return torch.cuda.mem_get_info()",
    ],
)
def test_checker_flags_offending_source(source):
    assert find_violations(source), f"the checker missed: {source!r}"


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nt = torch.empty(3, device='cuda')",
        "import torch\nt = torch.zeros(2).cuda()",
        "import torch\nd = torch.device('cuda:0')",
        "import torch.nn as nn\nimport torch",
        "def f(t):\n    return hasattr(t, '_local_tensor') and t.device_mesh",
        "from refimpl.runtime import TorchRuntime",
        "x = some.cuda\ny = obj.distributed",
    ],
)
def test_checker_accepts_clean_source(source):
    assert find_violations(source) == []
