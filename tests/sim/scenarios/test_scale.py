"""1,024 simulated ranks: one RL step with the offload store and the lifecycle completes and is right.

How run time grows with ranks is measured by bench/sim_scale_bench.py, not asserted here.
"""
import json

import pytest

from sim.presets import scenario_path
from sim.scenarios.runner import run_scenario
from sim.scenarios.scenario import parse_scenario

PER_RANK = 68359000 * (2 + 2 + 4 + 4 + 4)  # bytes of the five contiguous buffers
# the H200's pinned D2H line rate measured in /work/shared/GPU.md (1-4 GiB copies: 55.2 GB/s); on an HGX node
# two GPUs share one PCIe switch uplink to the host, so each gets half when both offload at once
MEASURED_D2H = 55.2e9
SHARED_UPLINK = MEASURED_D2H / 2


def _scale(**changes):
    raw = json.loads(scenario_path("scale_1024").read_text())
    raw.update(changes)
    return raw


def test_store_cycle_of_1024_ranks_with_meta_payloads():
    result, world, _ = run_scenario(parse_scenario(_scale(pg_policy="none")))
    d = result.to_dict()
    assert result.ok, result.violations[:3]
    assert len(d["ranks"]) == 1024 and {r["status"] for r in d["ranks"]} == {"finished"}
    # every GPU pair shares a switch uplink: 1.09 GB per rank at half the measured line, on every one of the 128 nodes
    assert d["phases"]["sleep"]["min"] == pytest.approx(PER_RANK / SHARED_UPLINK, rel=0.02)
    assert d["phases"]["sleep"]["max"] == pytest.approx(d["phases"]["sleep"]["min"], rel=1e-6)
    assert all(r["peak_host_pinned_bytes"] >= PER_RANK for r in d["ranks"])
    assert d["host_memory"]["n127/numa1"]["pinned_peak_bytes"] >= 4 * PER_RANK


def test_the_shipped_scale_scenario_keeps_1024_ranks_groups_live_through_the_pause():
    result, _, _ = run_scenario(parse_scenario(_scale()))
    d = result.to_dict()
    assert result.ok, result.violations[:3]
    assert {r["lifecycle_state"] for r in d["ranks"]} == {"ACTIVE"}
    assert all(r["lifecycle_stats"]["canaries"] == 1 and r["lifecycle_stats"]["destroys"] == 0 for r in d["ranks"])
    # live communicators (world, tp, dp: 3 x 388 MiB) stay on the GPU through the rollout
    assert all(r["phase_peak_device_bytes"]["rollout"] >= 0.6 * 141e9 + 3 * (388 << 20) for r in d["ranks"])
    copy = PER_RANK / SHARED_UPLINK  # the offload, plus the lifecycle's agreement and canary (microseconds)
    assert 0.98 * copy <= d["phases"]["sleep"]["min"] <= d["phases"]["sleep"]["max"] < 1.02 * copy + 2e-3


def test_the_growth_benchmark_measures_whole_cli_processes(tmp_path):
    # bench/sim_scale_bench.py --growth: each row is a fresh `python -m refimpl sim run` whose cost is read
    # from outside (os.wait4); the record keeps every run of --repeat and the load before it
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "growth.json"
    proc = subprocess.run([sys.executable, "bench/sim_scale_bench.py", "--growth", "--ranks", "16", "--repeat", "2",
                           "--out", str(out), "--note", "test"], cwd=root, capture_output=True, text=True, check=True)
    assert "ratio" in proc.stdout
    record = json.loads(out.read_text())
    assert record["repeat"] == 2 and record["note"] == "test" and [r["ranks"] for r in record["rows"]] == [16]
    for row in record["rows"]:
        assert row["ok"] and row["folded"] and row["events"] > 0 and len(row["runs"]) == 2
        assert row["wall_s"] == min(r["wall_s"] for r in row["runs"])
        assert 0 < row["cpu_s"] and 0.05 < row["peak_rss_gb"] < 4  # a whole interpreter with torch, not this one
