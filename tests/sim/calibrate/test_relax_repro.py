"""The Relax report's 4xA6000 table (seeds/004, section 4.3), reproduced by simulation.

Baseline (commit 1f33585): sleep destroys the 14 groups and waits 2 s; update_weights rebuilds
them for the TP all-gather export and destroys them again with another 2 s wait. Optimized
(053a678): groups kept live through the TMS pause (paused_live, two-phase) with the deferred
port cooldown. Report, steady steps 2-5: sleep 5.34 -> 2.46 s (-2.88), update_weights
3.99 -> 2.17 s (-1.82), wake_up 2.24 -> 2.15 s (-0.09).
"""
import json

import pytest

from sim.presets import scenario_path
from sim.scenarios.runner import run_scenario
from sim.scenarios.scenario import load_scenario, parse_scenario

COMM = 388 << 20  # 384 MiB suspendable + 4 MiB persistent per live NCCL communicator


@pytest.fixture(scope="module")
def runs():
    out = {}
    for arm, name in (("baseline", "relax_4xa6000_qwen3_4b_baseline"), ("optimized", "relax_4xa6000_qwen3_4b")):
        result, _, _ = run_scenario(load_scenario(name))
        assert result.ok, result.violations
        out[arm] = result.to_dict()
    return out


def _steady(run, phase):
    """Mean over ranks of the last step (the report's steady state; steps before it warm up)."""
    return run["phases"][phase]["mean"]


def test_sleep_and_update_weights_differences_match_the_report_within_20_percent(runs):
    b, o = runs["baseline"], runs["optimized"]
    d_sleep = _steady(o, "sleep") - _steady(b, "sleep")
    d_upd = _steady(o, "update_weights") - _steady(b, "update_weights")
    d_wake = _steady(o, "wake_up") - _steady(b, "wake_up")
    assert d_sleep == pytest.approx(-2.88, rel=0.20)
    assert d_upd == pytest.approx(-1.82, rel=0.20)
    assert abs(d_wake) < 0.2  # the report: -0.09 s, within its own noise
    # absolute times land near the report's too
    assert _steady(b, "sleep") == pytest.approx(5.34, rel=0.10)
    assert _steady(b, "update_weights") == pytest.approx(3.99, rel=0.15)


def test_every_rank_has_14_groups_and_the_arms_do_what_the_report_says(runs):
    for arm in ("baseline", "optimized"):
        for r in runs[arm]["ranks"]:
            assert r["status"] == "finished" and r["lifecycle_state"] == "ACTIVE"
    steps = runs["baseline"]["steps"]
    stats_b = runs["baseline"]["ranks"][0]["lifecycle_stats"]
    stats_o = runs["optimized"]["ranks"][0]["lifecycle_stats"]
    assert stats_b["destroys"] >= 2 * steps and stats_b["rebuilds"] >= 2 * steps
    assert stats_o["canaries"] >= steps - 1  # preserved from the step after the first good sync (two-phase)
    assert stats_o["destroys"] < stats_b["destroys"] / 2
    raw = json.loads(scenario_path("relax_4xa6000_qwen3_4b").read_text())
    assert len(raw["groups"]) == 14


def test_the_paused_window_holds_the_live_groups_memory(runs):
    """What the review objected to: kept groups hold their NCCL memory while the rollout runs."""
    for rank in range(4):
        base = runs["baseline"]["ranks"][rank]["phase_peak_device_bytes"]["rollout"]
        opt = runs["optimized"]["ranks"][rank]["phase_peak_device_bytes"]["rollout"]
        assert opt - base == 14 * COMM


def test_a_corrupted_canary_makes_the_optimized_arm_fall_back_and_still_finish(runs):
    raw = json.loads(scenario_path("relax_4xa6000_qwen3_4b").read_text())
    raw["faults"] = [{"kind": "canary_corruption", "ranks": [3], "at_point": "lifecycle.canary*", "nth": 1}]
    raw["steps"] = 3
    result, _, _ = run_scenario(parse_scenario(raw))
    d = result.to_dict()
    assert result.ok, result.violations
    assert [f["kind"] for f in d["faults_fired"]] == ["canary_corruption"]
    assert all(r["lifecycle_stats"]["canary_failures"] == 1 for r in d["ranks"])
    steps = d["ranks"][0]["phases_by_step"]
    # step 1: the canary after the pause fails, the groups are aborted, update_weights rebuilds them
    # and waits out the port cooldown the abort left (2 s)
    assert steps[1]["update_weights"] > 2.17 + 2.0
    # step 2: preservation is off for the life of the process: sleep destroys the groups again
    # (deferred cooldown, so no 2 s wait, but the 14 destroys cost what they cost in the baseline)
    # so it is the baseline's sleep (same destroys) without the baseline's inline 2 s port wait (report section
    # 4.3: Relax's baseline sleeps 2 s after destroying the groups); derived from the other arm, not fitted
    baseline_sleep = runs["baseline"]["ranks"][0]["phases_by_step"][2]["sleep"]
    assert steps[2]["sleep"] == pytest.approx(baseline_sleep - 2.0, abs=0.05)
    assert steps[2]["sleep"] > steps[1]["sleep"] + 0.8
