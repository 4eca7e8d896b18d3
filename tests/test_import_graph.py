"""The floors hold: no circle of imports, no upward or undeclared sideways import, no unseen import.

The floors and the declared exceptions are data in :mod:`tests.import_graph`; the
drawing in docs/design.md is generated from the same data and checked here.
"""
from __future__ import annotations

import ast
import subprocess
import sys

from tests import import_graph as ig


def test_every_module_stands_on_a_floor_and_imports_only_down():
    modules, edges, _ = ig.read_graph()
    assert "refimpl.torch_runtime.runtime" in modules and "sim.world" in modules and "bench.cli" in modules
    assert len(edges) > 300, "the graph reader found too few imports: did the layout move?"
    violations = ig.floor_violations(modules, edges)
    assert not violations, "imports against the floors (see docs/design.md, Floors):\n" + "\n".join(violations)


def test_no_import_is_hidden_from_the_graph():
    _, _, problems = ig.read_graph()
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    _, edges, _ = ig.read_graph()
    cycles = ig.find_cycles(edges)
    new = [c for c in cycles if not any(set(c) <= known for known in ig.KNOWN_CYCLES)]
    assert not new, "import cycles (annotation-only and lazy imports count):\n" + "\n".join(" <-> ".join(c) for c in new)
    for known, why in ig.KNOWN_CYCLES.items():
        assert any(set(c) & known for c in cycles), (
            f"the known circle {sorted(known)} ({why}) is broken now: remove it from KNOWN_CYCLES in tests/import_graph.py"
        )


def test_the_design_doc_drawing_is_generated_from_the_floors():
    text = ig.DESIGN_DOC.read_text()
    assert ig.doc_section(text) == ig.doc_block(), (
        "docs/design.md's floor drawing differs from tests/import_graph.py's FLOORS; "
        "run `python -m tests.import_graph --write-docs`"
    )


def test_the_lower_floors_never_load_the_torch_runtime_and_offer_none_of_its_names():
    code = (
        "import sys, refimpl.runtime, refimpl.comm, refimpl.store, refimpl.worker\n"
        "assert 'refimpl.torch_runtime' not in sys.modules, 'a lower floor loaded the torch runtime'\n"
        "for pkg, name in ((refimpl.runtime, 'TorchRuntime'), (refimpl.runtime, 'dcp'),\n"
        "                  (refimpl.comm, 'validate_offload_nccl'), (refimpl.comm, 'nccl')):\n"
        "    assert not hasattr(pkg, name), (pkg.__name__, name)\n"
        "assert 'refimpl.torch_runtime' not in sys.modules, 'asking for a name loaded the torch runtime'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ig.REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# ---- the checker itself can fail -------------------------------------------------------------------------


def _targets(source: str, module: str = "refimpl.store.backends.pool") -> set[str]:
    modules = ig.module_files()
    return {name for node in ast.walk(ast.parse(source)) for name, _ in ig._targets(node, module, modules)}


def test_reader_sees_every_import_form():
    assert "sim.world" in _targets("def f():\n    from sim.world import SimWorld\n")  # lazy
    assert "sim.world" in _targets("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sim.world\n")
    assert "refimpl.store.backends.local" in _targets("from .local import LocalBackend\n")  # relative
    assert "refimpl.store.state.layout" in _targets("from ..state.layout import FlatLayout\n")
    assert "refimpl.store.backends.dedup" in _targets("from . import dedup\n")
    assert "bench.cli" in _targets("import importlib\nimportlib.import_module('bench.cli')\n")
    assert "sim" in _targets("__import__('sim')\n")
    assert "<computed>" in _targets("import importlib\nname = 'x'\nimportlib.import_module(name)\n")


def test_rules_catch_upward_sideways_and_circles():
    modules = ig.module_files()
    up = ig.Edge("refimpl.store.backends.pool", "refimpl.torch_runtime.pinning", 1, "import")
    side = ig.Edge("sim.scenarios.runner", "refimpl.torch_runtime.runtime", 1, "import")
    down = ig.Edge("sim.scenarios.runner", "refimpl.store.store", 1, "import")
    found = ig.floor_violations(modules, [up, side, down])
    assert len(found) == 2 and "upward" in found[0] and "sideways" in found[1]
    circle = [ig.Edge("a", "b", 1, "import"), ig.Edge("b", "c", 1, "import"), ig.Edge("c", "a", 1, "import"),
              ig.Edge("c", "d", 1, "import")]
    assert ig.find_cycles(circle) == [["a", "b", "c"]]


def test_rules_catch_imports_up_and_across_the_rooms_of_sim():
    modules = ig.module_files()
    up = ig.Edge("sim.machine.flows", "sim.world", 1, "from-import")  # a model reaching above the ranks
    side = ig.Edge("sim.scenarios.runner", "sim.calibrate.records", 1, "import")  # rooms side by side
    down = ig.Edge("sim.planner.plan", "sim.scenarios.runner", 1, "import")
    found = ig.room_violations(modules, [up, side, down])
    assert len(found) == 2 and "up the rooms" in found[0] and "sideways" in found[1], found


def test_rules_catch_imports_up_and_across_the_rooms_of_the_store():
    modules = ig.module_files()
    up = ig.Edge("refimpl.store.backends.local", "refimpl.store.moves.early", 1, "from-import")  # a backend in a move
    side = ig.Edge("refimpl.store.config", "refimpl.store.errors", 1, "import")  # leaves side by side
    down = ig.Edge("refimpl.store.moves.offload", "refimpl.store.state.layout", 1, "from-import")
    face = ig.Edge("refimpl.store.store", "refimpl.store.moves.offload", 1, "from-import")
    found = ig.room_violations(modules, [up, side, down, face])
    assert len(found) == 2 and "up the rooms" in found[0] and "sideways" in found[1], found
    assert [r.name for r in ig.ROOMS["refimpl.store"]] == ["leaves", "state", "backends", "moves", "face", "clients"]
