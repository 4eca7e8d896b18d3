"""``sim``'s face: its names load on first use, are the objects of the modules that define them, and the
cyclic garbage collector paused while they load is on again after."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_face_loads_on_first_use_and_leaves_the_collector_as_it_found_it():
    code = (
        "import gc, importlib, sys, sim\n"
        "assert 'sim.world' not in sys.modules, 'importing sim loaded its face at once'\n"
        "for name in sim.__all__:\n"
        "    value = getattr(sim, name)\n"
        "    assert value is getattr(importlib.import_module(sim._FACE[name]), name), name\n"
        "    assert gc.isenabled(), f'the collector is off after loading {name}'\n"
        "gc.disable()\n"
        "del sim.Engine\n"
        "sim.Engine\n"
        "assert not gc.isenabled(), 'a collector the caller switched off was switched on'\n"
        "try:\n    sim.no_such_name\nexcept AttributeError as e:\n    assert 'no_such_name' in str(e)\n"
        "else:\n    raise SystemExit('an unknown name must raise AttributeError')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
