"""The old module names of ``sim/`` (before the rooms) still import, as the very modules of their new names."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sim

REPO = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_every_old_name_is_the_new_module_and_has_no_file():
    code = (
        "import importlib, sys, sim\n"
        # an old name as an attribute loads only when asked; an unknown one raises AttributeError
        "assert 'sim.planner.plan' not in sys.modules\nsim.plan\nassert 'sim.planner.plan' in sys.modules\n"
        "try:\n    sim.no_such_module\nexcept AttributeError as e:\n    assert 'no_such_module' in str(e)\n"
        "else:\n    raise SystemExit('an unknown name must raise AttributeError')\n"
        "for old, new in sim.MOVED.items():\n"
        "    a = importlib.import_module(old)\n"
        "    b = importlib.import_module(new)\n"
        "    assert a is b and sys.modules[old] is b, (old, new)\n"
        "    assert b.__spec__.name == new and b.__name__ == new, (old, b.__spec__)\n"
        "    assert getattr(sim, old.split('.')[1]) is b, old\n"
        "import sim.flows, sim.models.flows\n"
        "assert sim.flows is sim.models.flows\n"
        "from sim.engine import Engine\n"
        "from sim.kernel.engine import Engine as E2\n"
        "assert Engine is E2 and sim.Engine is E2\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    for old, new in sim.MOVED.items():
        assert not (REPO / (old.replace(".", "/") + ".py")).exists(), f"a file stands at the old path of {old}"
        assert (REPO / (new.replace(".", "/") + ".py")).is_file(), new


def test_python_dash_m_runs_an_old_name():
    out = subprocess.run([sys.executable, "-m", "sim.destroy_walks", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "RECORD" in out.stdout
