"""The old policy's log-prob pass in the N-GPU prediction (sim.calibrate.logprob_pass): taken from a record that ran
it, assumed as long as the training forward for one that did not, and composed as docs/comm.md states: the rollout's
copy serves it, so the creation hides under it too; the resume joined in its first all-gather otherwise."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sim.calibrate.logprob_pass import logprob_pass, measured_pass_s
from sim.calibrate.records import RecordError
from sim.calibrate.switch_modes import overlapped_reload_wait
from sim.calibrate.switch_ngpu import FORWARD_SHARE, plain_step_s, predict_ngpu, rollout_fill_s

ROOT = Path(__file__).resolve().parents[3]
INPUT = "bench/results/2026-12-05-h200-pending/run4/rl_today.json"


@pytest.fixture(scope="module")
def rec():
    return json.loads((ROOT / INPUT).read_text())


def _with_pass(rec, seconds):
    """``rec`` as if it had run the pass: its config says so and its plain steps time it."""
    r = copy.deepcopy(rec)
    r["config"]["logprob_pass"] = True
    for s in r["after_steps"]:
        s["logprob_pass"] = {"s": seconds, "sum": -1.0, "tokens": 1}
    return r


def test_the_pass_is_the_records_or_as_long_as_the_forward(rec):
    plain = plain_step_s(rec)
    none = logprob_pass(rec, plain, FORWARD_SHARE)
    assert none.seconds == 0.0 and none.train_s == plain
    assumed = logprob_pass(rec, plain, FORWARD_SHARE, True)
    assert assumed.seconds == pytest.approx(FORWARD_SHARE * plain) and not assumed.measured
    assert assumed.train_s == plain  # the record's step holds no pass: it is added to it
    ran = _with_pass(rec, 0.1)
    ran["after_steps"][0]["logprob_pass"]["s"] = 9.0  # the step after a switch is not a plain one
    assert measured_pass_s(ran) == pytest.approx(0.1)
    got = logprob_pass(ran, plain, FORWARD_SHARE)
    assert got.measured and got.seconds == pytest.approx(0.1) and got.train_s == pytest.approx(plain - 0.1)
    with pytest.raises(RecordError, match="cannot come from this record"):
        logprob_pass(ran, plain, FORWARD_SHARE, False)
    untimed = copy.deepcopy(ran)
    for s in untimed["after_steps"]:
        del s["logprob_pass"]
    with pytest.raises(RecordError, match="time none"):
        logprob_pass(untimed, plain, FORWARD_SHARE)


def test_the_rollout_copy_hides_the_creation_under_the_pass_too(rec):
    """forward_from_rollout's join waits for what of the thread outlasts the issue, the pass and the forward; new's
    joins in the pass's first all-gather, as it joined in the forward's; the fill copies every unit once more."""
    kw = dict(mechanisms=("new", "forward_from_rollout"), bytes_per_rank="one-gpu", overlap_reload=False)
    base = {r["mechanism"]: r for r in predict_ngpu(rec, 8, "fsdp", **kw)}
    lp = {r["mechanism"]: r for r in predict_ngpu(rec, 8, "fsdp", logprob_pass=True, **kw)}
    f, f0 = lp["forward_from_rollout"], base["forward_from_rollout"]
    L = f["logprob_pass_s"]
    assert L == pytest.approx(FORWARD_SHARE * plain_step_s(rec)) and not f["logprob_pass_measured"]
    assert f["detail"]["hidden_creation_s"] == pytest.approx(f0["detail"]["hidden_creation_s"] + L)
    assert f["terms"]["join_wait"] == pytest.approx(max(0.0, f0["terms"]["join_wait"] - L), abs=1e-6)
    assert f["switch_cost_x_copy_time"] < f0["switch_cost_x_copy_time"]
    assert lp["new"]["terms"]["join_wait"] == pytest.approx(base["new"]["terms"]["join_wait"])
    assert base["new"]["logprob_pass_s"] == 0.0
    units = len(rec["early_units_bytes"])
    r = {"early_units_bytes": rec["early_units_bytes"]}
    assert rollout_fill_s(r, 8, logprob_pass=True) / rollout_fill_s(r, 8) == pytest.approx(
        (3 * (units - 1) + 2) / (2 * (units - 1) + 1), rel=0.05)


def test_a_measured_pass_takes_the_step_apart(rec):
    """From a record that ran the pass, its measured seconds, and the step's shares of the plain step less it."""
    ran = _with_pass(rec, 0.05)
    (f,) = predict_ngpu(ran, 8, "fsdp", mechanisms=("forward_from_rollout",), bytes_per_rank="one-gpu")
    assert f["logprob_pass_measured"] and f["logprob_pass_s"] == pytest.approx(0.05)
    plain = plain_step_s(ran)
    reload_issue = f["terms"]["reload"]
    assert f["detail"]["hidden_creation_s"] == pytest.approx(reload_issue + 0.05 + FORWARD_SHARE * (plain - 0.05))


def test_with_a_pass_the_params_are_read_in_it_and_the_backward_comes_later():
    """The overlapped reload's wait: the pass reads the params first (at its own pace), and the backward's uses
    move later by the pass, so a reload the backward outran lands in time."""
    units = [100, 100, 100, 100]
    no_pass = overlapped_reload_wait(1.0, units, 1.0, forward_share=0.3, window_s=0.0)
    with_pass = overlapped_reload_wait(1.0, units, 1.0, forward_share=0.3, pass_s=0.5, window_s=0.0)
    assert no_pass > 0 and with_pass < no_pass
    # a pass so short that it reads the params before they land: the wait is the params' own
    short = overlapped_reload_wait(1.0, units, 1.0, forward_share=0.3, pass_s=0.01, window_s=0.0)
    assert short >= overlapped_reload_wait(1.0, units, 1.0, forward_share=0.3, pass_s=0.2, window_s=0.0)


#: the predictions with the pass, committed before any run with it (docs/comm.md quotes them)
PREDICTIONS = "bench/results/2026-12-05-cpu-predictions-logprob-pass"


@pytest.mark.parametrize("rule", ["log2", "ring"])
@pytest.mark.parametrize("scaling", ["sharded", "one-gpu"])
def test_the_committed_predictions_with_the_pass_are_what_the_code_gives_today(rule, scaling, capsys):
    from sim.calibrate.switch_ngpu import main

    args = [str(ROOT / INPUT), "--ranks", "1,2,4,8", "--mechanisms", "forward_from_rollout", "--comm-rule", rule,
            "--bytes-per-rank", scaling, "--logprob-pass"]
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    committed = json.loads((ROOT / PREDICTIONS / f"logprob-{rule}-{scaling}.json").read_text())
    assert [(r["ranks"], r["mesh"]) for r in rows] == [(r["ranks"], r["mesh"]) for r in committed]
    for got, want in zip(rows, committed):
        assert got["terms"] == pytest.approx(want["terms"], abs=1e-9), (got["ranks"], got["mesh"])
    assert main(args) == 0
    assert capsys.readouterr().out == (ROOT / PREDICTIONS / f"logprob-{rule}-{scaling}.md").read_text()
