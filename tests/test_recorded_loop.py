"""Issue 16's targets, checked on the recorded 2 x H200 run of ``bash bench/gpu/run_loop.sh``.

The run cannot be repeated in CI (it needs the H200s), but every claim docs/store.md makes from it is
recomputed here from the raw numbers of the record (bytes, seconds, line rates), and the defaults the
code ships are checked to be the ones the record favours. A new record that misses a target, or a
default changed against the measurements, fails here.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

LOOP = Path(__file__).resolve().parents[1] / "bench" / "results" / "2026-11-30-h200x2-all-policies" / "loop"
RELOAD_GOAL = 0.92  # x line, right after another role freed >= 40 GB
PIN_GOAL_BPS = 8e9  # pinning setup, bytes of state per second


def _load(name: str) -> dict:
    return json.loads((LOOP / name).read_text())


def _reload_x_line(rec: dict, mode: str) -> float:
    m = rec["modes"][mode]
    return statistics.median(rec["state_bytes"] / t for t in m["reload_s"]) / (rec["line_gbps"] * 1e9)


def test_reload_after_40_gb_freed_meets_the_goal_in_one_way_and_the_others_are_measured():
    rec = _load("reload.json")
    assert rec["device"].startswith("cuda") and rec["other_bytes"] >= 40e9 and rec["state_bytes"] > 10e9
    ratios = {mode: _reload_x_line(rec, mode) for mode in ("driver", "allocator", "mempool")}
    for mode, r in ratios.items():  # the flags the probe wrote agree with its raw times
        assert r == pytest.approx(rec["modes"][mode]["median_x_line"], rel=1e-6)
        assert len(rec["modes"][mode]["reload_s"]) == rec["repeat"] == 3
        assert r <= 1.05  # no reload beats the measured line rate by more than noise
    assert max(ratios.values()) >= RELOAD_GOAL
    assert ratios["driver"] < RELOAD_GOAL  # the way the issue found slow is still slow: the others matter


def test_the_rl_step_frees_the_way_the_record_favours():
    from bench.rl import StepConfig, parse_args

    rec = _load("reload.json")
    best = max(("driver", "allocator"), key=lambda m: _reload_x_line(rec, m))
    assert StepConfig().free == parse_args([]).free == best == "allocator"


def test_pinning_setup_meets_the_goal_with_the_default_prefault_mode():
    from refimpl.torch_runtime.pinning import DEFAULT_CUDA_PREFAULT

    rec = _load("pin.json")
    assert rec["bytes"] == 8 << 30
    ahead = {k.removeprefix("store_pin_ahead_"): v for k, v in rec["variants"].items()
             if k.startswith("store_pin_ahead_")}
    gbps = {mode: v["bytes"] / v["s"] for mode, v in ahead.items()}
    assert set(gbps) == {"touch", "thp", "none"}
    assert max(gbps, key=gbps.get) == DEFAULT_CUDA_PREFAULT
    assert gbps[DEFAULT_CUDA_PREFAULT] >= PIN_GOAL_BPS
    assert all(v["bytes"] == rec["bytes"] for v in ahead.values())


@pytest.mark.parametrize("name", ["rl1/rl_step_1.json", "rl2/rl_step_2.json", "rl1_alloc/rl_step_1.json"])
def test_the_colocated_step_is_recorded_per_phase_with_bitwise_weights(name):
    from bench.rl.record import PHASES, summarize

    rec = _load(name)
    assert rec["device"].startswith("cuda") and 0.5e9 <= rec["params"] <= 1.5e9
    assert (LOOP / name).with_suffix(".png").stat().st_size > 10_000  # the timeline
    assert {(s["step"], s["phase"]) for s in rec["spans"]} == {(i, p) for i in range(3) for p in PHASES}
    again = summarize(rec)  # recomputed from the spans and bytes, not the stored summary
    for ph in PHASES:
        assert again["phase_s"][ph] == pytest.approx(rec["summary"]["phase_s"][ph]) and again["phase_s"][ph] > 0
    line = rec["line"]
    copies = rec["steps"][-1]["offload_bytes"] * (1 / (line["d2h_gbps"] * 1e9) + 1 / (line["h2d_gbps"] * 1e9))
    assert again["copy_time_at_line_s"] == pytest.approx(copies, rel=1e-6)
    assert again["switch_overhead_s"] > again["copy_time_at_line_s"]  # overhead includes the copies
    assert again["weights_bitwise_equal_every_sync"] is True
    assert all(s["weight_check"]["tensors"] == rec["initial_sync"]["tensors"] > 0 for s in rec["steps"])
    # the rollout's KV cache took the memory the trainer's offload gave back
    for s in rec["steps"][1:]:
        assert s["rollout_peak_extra_bytes"] >= 0.9 * s["freed_measured"] > 0
