"""``SwitchCosts`` (the SUSPEND_PLANNED cost row's inputs) against the records they come from, none of them scored.

The defaults are the simulator's calibrated constants (``sim/presets/calibrated/hgx-h200-8x.json``: a destroy's own
cost with the runtime's proxy waker, the lazy inits) and the suspend and resume rates of the old 2 x H200 record's
``comm_raw`` (14 two-rank communicators of 480 MiB, NCCL 2.32.3), which ``timeshare sim calibrate`` fitted too: every
record behind them is in the calibrated preset's fit set, which ``timeshare sim validate`` refuses, so no default is
fitted on a record that validation scores. Before, the defaults came from the lazy-wake record, which validation
scores, and their two-rank destroy (0.247 s) held the wait for NCCL's proxy poll that the runtime's waker removes.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from refimpl.comm.group_plan import SwitchCosts, cheaper_to_destroy

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "sim" / "presets" / "calibrated" / "hgx-h200-8x.json"
OLD = ROOT / "bench" / "results" / "2026-11-30-h200x2-multigpu" / "multigpu-2026-11-30-nvidia-h200x2.json"
MiB = 2**20
_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def _seconds(constants: dict, name: str) -> float:
    c = constants[name]
    return float(c["value"]) * _SCALE[c["unit"]]


def fit_set_costs() -> SwitchCosts:
    """The cost row's inputs from the fit set: suspend/resume per GiB of the old record's comm_raw, and the calibrated
    preset's destroy (with the waker: the destroy's own cost) and lazy init of each size."""
    raw = json.loads(OLD.read_text())["comm_raw"]
    gib = raw["suspendable_bytes"] / raw["n_comms"] / 2**30
    consts = json.loads(PRESET.read_text())["constants"]
    return SwitchCosts(
        suspend_s_per_gib=raw["suspend_s"] / raw["n_comms"] / gib,
        resume_s_per_gib=raw["resume_s"] / raw["n_comms"] / gib,
        destroy_s_single=_seconds(consts, "nccl_destroy"),
        destroy_s_multi=_seconds(consts, "nccl_destroy_multi"),
        init_s_single=_seconds(consts, "nccl_init"),
        init_s_multi=_seconds(consts, "nccl_init_multi"),
    )


def test_the_defaults_are_the_fit_set_costs():
    m, d = fit_set_costs(), SwitchCosts()
    for name in ("suspend_s_per_gib", "resume_s_per_gib", "destroy_s_single", "destroy_s_multi", "init_s_single",
                 "init_s_multi"):
        assert getattr(d, name) == pytest.approx(getattr(m, name), rel=0.01), name


def test_no_default_comes_from_a_record_validation_scores():
    """The records behind the defaults are all in the calibrated preset's fit set (validate refuses them whole); the
    records validation scores are none of them."""
    from sim.calibrate.records import VALIDATION_SET

    fitted = set(json.loads(PRESET.read_text())["fitted_on"]["records"])
    assert str(OLD.relative_to(ROOT)) in fitted
    behind = {"nccl_destroy", "nccl_destroy_multi", "nccl_init", "nccl_init_multi"}
    consts = json.loads(PRESET.read_text())["constants"]
    for name in behind:
        assert "fitted by timeshare sim calibrate" in consts[name]["source"], name
    assert not fitted & set(VALIDATION_SET)
    assert str(OLD.relative_to(ROOT)) not in VALIDATION_SET
    lazy_wake = "bench/results/2026-11-30-h200x2-lazy-wake/multigpu-2026-11-30-nvidia-h200x2.json"
    assert lazy_wake in VALIDATION_SET  # where the defaults came from before: scored, so no longer a source


@pytest.mark.parametrize("size, suspendable, destroy", [(2, 480 * MiB, True), (2, 192 * MiB, True),
                                                        (2, 128 * MiB, False), (1, 384 * MiB, True)])
def test_the_choice_for_the_measured_communicators(size, suspendable, destroy):
    """480 MiB two-rank (the multigpu records), 192 MiB two-rank (GPU.md's run): destroying and re-creating costs less
    than suspending and resuming once a destroy no longer waits for the proxy poll; a small two-rank communicator is
    still suspended; one-rank (run 1's 384 MiB) destroyed."""
    assert cheaper_to_destroy(SwitchCosts(), size, suspendable) is destroy


def test_break_even_of_a_two_rank_communicator():
    def break_even(c: SwitchCosts) -> float:
        return c.destroy_cost(2) / (c.suspend_s_per_gib + c.resume_s_per_gib) * 1024  # MiB

    assert break_even(SwitchCosts()) == pytest.approx(break_even(fit_set_costs()), abs=2)
    assert break_even(SwitchCosts()) == pytest.approx(156, abs=2)
    with_wait = SwitchCosts(destroy_s_single=0.0167 + 0.25, destroy_s_multi=0.0165 + 0.25)  # without the waker
    assert break_even(with_wait) == pytest.approx(statistics.fmean([360, 360]), abs=5)
