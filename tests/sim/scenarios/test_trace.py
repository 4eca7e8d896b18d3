"""Traces: Chrome trace JSON that Perfetto opens, and a PNG timeline per rank."""
import json
import sys

import pytest

from sim.scenarios.runner import run_scenario
from sim.scenarios.scenario import parse_scenario
from sim.scenarios.trace import Timeline, TraceError, chrome_trace, write_chrome_trace, write_png

SMALL = {
    "name": "trace_small",
    "topology": "hgx-h200-8x",
    "world_size": 4,
    "model": {"tensors": [{"name": "w", "shape": [1024, 256], "dtype": "float32", "category": "params"},
                          {"name": "m", "shape": [1024, 256], "dtype": "float32", "category": "optimizer"}]},
    "offload": {"backend": "local", "include": ["params", "optimizer"]},
    "workload": {"rollout_s": 0.5, "rollout_memory_gib": 10},
    "faults": [{"kind": "slow_link", "link": "n0/pcisw0", "factor": 0.5, "at_time": 0.0}],
    "payload": "real",
}


@pytest.fixture(scope="module")
def run():
    result, world, plan = run_scenario(parse_scenario(SMALL))
    assert result.ok, result.violations
    return Timeline.from_world(world, faults=plan)


def test_chrome_trace_has_each_ranks_phases_copies_and_memory(run, tmp_path):
    path = write_chrome_trace(run, tmp_path / "trace.json")
    data = json.loads(path.read_text())
    ev = data["traceEvents"]
    phases = [e for e in ev if e.get("cat") == "phase"]
    assert {e["pid"] for e in phases} == {0, 1, 2, 3}
    for rank in range(4):
        names = [e["name"] for e in phases if e["pid"] == rank]
        for p in ("train", "sleep", "update_weights", "rollout", "wake_up", "offload", "reload"):
            assert p in names
    rollout = next(e for e in phases if e["pid"] == 0 and e["name"] == "rollout")
    assert rollout["dur"] == pytest.approx(0.5e6)  # microseconds
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ev if e.get("ph") == "X")
    copies = [e for e in ev if e.get("cat") == "copy" and e["pid"] == 1]
    assert {e["name"] for e in copies} == {"d2h", "h2d"} and all(e["args"]["bytes"] > 0 for e in copies)
    assert any(e["ph"] == "C" and e["args"]["GiB"] > 9 for e in ev)  # the rollout engine's 10 GiB shows
    assert any(e.get("cat") == "fault" and e["name"] == "slow_link" for e in ev)
    assert chrome_trace(run)["traceEvents"] == ev


def test_png_timeline_is_written(run, tmp_path):
    path = write_png(run, tmp_path / "t.png", title="small")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5000


def test_png_without_matplotlib_says_how_to_get_it(run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(TraceError, match="pip install matplotlib"):
        write_png(run, tmp_path / "t.png")
