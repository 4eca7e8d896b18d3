"""sim.colocated: the simulated colocated RL step's invariants, on a record shaped like bench/rl_loop.py's."""
from __future__ import annotations

import copy

import pytest

from sim.colocated import PHASES, RecordError, compare, measured_phases, predict_step

GB = 1e9


def _record(params_bytes=2 * GB, world=2, free="driver", kv=10 * GB, phase_s=None):
    phase_s = phase_s or {"train": 0.5, "offload": 0.2, "rollout": 3.0, "weight_sync": 0.3, "reload": 0.25}
    spans, steps, t = [], [], 0.0
    for step in range(2):
        for ph in PHASES:
            spans.append({"step": step, "phase": ph, "start_s": t, "end_s": t + phase_s[ph]})
            t += phase_s[ph]
        steps.append({"step": step, "offload_bytes": 3 * params_bytes, "params_bytes": params_bytes,
                      "offload_store_s": 0.15, "reload_params_store_s": 0.05, "gather_copy_s": 0.05,
                      "reload_rest_store_s": 0.2, "rollout_peak_extra_bytes": kv})
    return {"world_size": world, "config": {"free": free}, "line": {"d2h_gbps": 50.0, "h2d_gbps": 55.0},
            "initial_sync": {"tensors": 40}, "spans": spans, "steps": steps}


@pytest.fixture(scope="module")
def driver_pred():
    return predict_step(_record())


def test_compute_phases_come_from_the_record(driver_pred):
    assert driver_pred["phase_s"]["train"] == 0.5 and driver_pred["phase_s"]["rollout"] == 3.0
    assert set(driver_pred["phase_s"]) == set(PHASES)


def test_copies_take_at_least_the_line_time(driver_pred):
    off = driver_pred["parts"]["offload"]["sim_copies_s"]
    assert off >= 6 * GB / (50 * GB) * 0.999
    assert driver_pred["parts"]["weight_sync"]["sim_copies_s"] >= 2 * GB / (55 * GB) * 0.999
    assert driver_pred["parts"]["reload"]["sim_copies_s"] >= 4 * GB / (55 * GB) * 0.999


def test_driver_free_costs_the_scrub_of_the_kv_cache(driver_pred):
    alloc = predict_step(_record(), free="allocator")
    diff = driver_pred["phase_s"]["weight_sync"] - alloc["phase_s"]["weight_sync"]
    assert diff == pytest.approx(10 * GB / 443e9, rel=1e-6)
    assert alloc["parts"]["weight_sync"]["scrub_s"] == 0.0
    assert driver_pred["phase_s"]["offload"] == alloc["phase_s"]["offload"]


def test_copy_time_scales_with_the_state():
    small = predict_step(_record(params_bytes=1 * GB))
    big = predict_step(_record(params_bytes=4 * GB))
    ratio = big["parts"]["offload"]["sim_copies_s"] / small["parts"]["offload"]["sim_copies_s"]
    assert 3.5 < ratio < 4.5


def test_one_rank_gathers_nothing():
    assert predict_step(_record(world=1))["parts"]["weight_sync"]["gather_s"] == 0.0


def test_compare_flags_phases_off_by_more_than_the_tolerance(driver_pred):
    exact = _record()
    for sp in exact["spans"]:  # a record that measured exactly what the model predicts
        sp["end_s"] = sp["start_s"] + driver_pred["phase_s"][sp["phase"]]
    res = compare(exact, predict_step(exact))
    assert res["predicted_phases_within"] is True
    assert all(r["ratio"] == pytest.approx(1.0) for r in res["phases"].values())
    slow = copy.deepcopy(exact)
    for sp in slow["spans"]:
        if sp["phase"] == "reload":
            sp["end_s"] = sp["start_s"] + 1.3 * (sp["end_s"] - sp["start_s"])
    res = compare(slow, predict_step(slow))
    assert res["phases"]["reload"]["within"] is False and res["predicted_phases_within"] is False
    assert res["phases"]["offload"]["within"] is True


def test_the_lifecycle_share_comes_from_the_simulated_lifecycle(driver_pred):
    # DESTROY_DEFERRED: the rebuilds wait out the cooldown, in the weight sync and in the resume
    slow_cool = _record()
    slow_cool["config"].update(lifecycle_policy="DESTROY_DEFERRED", cooldown_s=0.5)
    fast_cool = _record()
    fast_cool["config"].update(lifecycle_policy="DESTROY_DEFERRED", cooldown_s=0.2)
    a, b = predict_step(slow_cool), predict_step(fast_cool)
    assert a["phase_s"]["weight_sync"] - b["phase_s"]["weight_sync"] == pytest.approx(0.3, abs=0.01)
    assert a["phase_s"]["reload"] - b["phase_s"]["reload"] == pytest.approx(0.3, abs=0.01)
    assert a["lifecycle_preset"] == "hgx-h200-8x"  # two ranks need a preset with two GPUs
    # the measured remainder is reported beside, not used
    assert set(driver_pred["lifecycle_measured_s"]) == {"offload", "weight_sync", "reload"}


def test_missing_fields_are_named():
    with pytest.raises(RecordError, match="no 'steps'"):
        predict_step({"line": {"d2h_gbps": 1, "h2d_gbps": 1}})
    rec = _record()
    del rec["line"]
    with pytest.raises(RecordError, match="line"):
        predict_step(rec)
    rec = _record()
    rec["spans"] = [s for s in rec["spans"] if s["phase"] != "rollout"]
    with pytest.raises(RecordError, match="rollout"):
        measured_phases(rec)
