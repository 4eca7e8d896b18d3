"""bench/gpu/reload_probe.py's code path on CPU (the GPU run happens once; its code must not fail there).

The modes' timings on CPU mean nothing; what is checked is that every mode runs its cycles, brings
the state back bit-exact (the probe raises otherwise), records its figures and skips MemPool
without CUDA with the reason.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _probe():
    path = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "reload_probe.py"
    spec = importlib.util.spec_from_file_location("reload_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reload_probe_runs_every_mode_on_cpu(tmp_path):
    out = tmp_path / "reload.json"
    res = _probe().run("cpu", 3 << 20, 5 << 20, 2, str(out), seg=1 << 20, chunk=2 << 20)
    assert res["state_bytes"] == 3 << 20 and res["line_gbps"] > 0
    for mode in ("driver", "allocator"):
        r = res["modes"][mode]
        assert "error" not in r, r
        assert len(r["reload_s"]) == 2 and r["median_gbps"] > 0 and r["median_x_line"] > 0
    assert "needs CUDA" in res["modes"]["mempool"]["skipped"]
    assert json.loads(out.read_text())["modes"].keys() == res["modes"].keys()
