"""Folds of a job with the lifecycle and one crashed rank (sim/scenarios/fold.py, [Note: a fold with a crashed rank
and the lifecycle]): the folded run reports every rank as the full run does, and every rank ends in one agreed state,
having learned of the crash at once.

The shipped ``lifecycle_fault_131072`` scenario itself is run by ``bench/sim_scale_bench.py --fault`` (its time and
memory are a benchmark's business); here it is shrunk to sizes whose full run takes a second or two.
"""
import copy
import json

import pytest

from sim.presets import scenario_path
from sim.scenarios.fold import plan_fold
from sim.scenarios.fold_run import run_folded
from sim.scenarios.runner import run_scenario
from sim.scenarios.scale import run_auto
from sim.scenarios.scenario import parse_scenario

SHIPPED = json.loads(scenario_path("lifecycle_fault_131072").read_text())
AGREE_TIMEOUT_S = 300.0  # LifecycleConfig.agree_timeout_s, what the scenario runner uses


def _shrunk(n: int, crashed: int, **changes) -> dict:
    """The shipped scenario on ``n`` ranks (TP8 x DP n/8), rank ``crashed`` dying as its second destroy walk starts."""
    raw = copy.deepcopy(SHIPPED)
    raw.update(name=f"lifecycle_fault_{n}", world_size=n, mesh={"dp": n // 8, "tp": 8},
               topology={"preset": "hgx-h200-8x-ib", "nodes": n // 8})
    raw["faults"][0]["ranks"] = [crashed]
    raw.update(changes)
    return raw


def _text(result) -> str:
    d = result.to_dict()
    d.pop("wall_time_s")
    return json.dumps(d, indent=1)


@pytest.mark.parametrize("n, crashed, active", [
    (256, 209, 32),  # a node of the tail: the head node, the period node, the crashed rank's node, the last node
    (256, 11, 48),  # the period's node: the fold takes a head of two nodes, so that the crashed rank stands for itself
    (256, 255, 32),  # the last node: the one before it is the last of the period's class
])
def test_the_folded_run_reports_every_rank_as_the_full_run_does(n, crashed, active):
    raw = _shrunk(n, crashed)
    scn = parse_scenario(raw)
    fold, why = plan_fold(scn)
    assert fold is not None and fold.active == active, why
    assert fold.stands_alone(crashed) and fold.ends
    folded, world, _ = run_folded(scn, fold)
    full, _, _ = run_scenario(parse_scenario(raw))
    assert len(world.runtimes) == active and full.ok
    assert _text(folded) == _text(full)  # every rank's status, state, error, phases, memory; the event count


def test_every_rank_ends_in_one_agreed_state_having_learned_of_the_crash_at_once():
    result, _, _, how = run_auto(parse_scenario(_shrunk(1024, 977)))
    assert how.folded and result.ok, result.violations
    d = result.to_dict()
    ranks = d["ranks"]
    assert len(ranks) == 1024
    (fired,) = d["faults_fired"]
    assert (fired["rank"], fired["kind"]) == (977, "crash") and fired["time"] > 10.0  # in the second step's pause
    assert ranks[977]["status"] == "crashed"
    others = [r for r in ranks if r["rank"] != 977]
    assert {(r["status"], r["lifecycle_state"]) for r in others} == {("failed", "FAILED")}
    for r in others:  # each names itself and the rank that is gone
        assert r["error"].startswith(f"AgreementError: rank {r['rank']}: agreement at 'destroy' failed")
        assert "rank 977, a member of group 'lifecycle.control', is gone" in r["error"]
    # the peers learned it from the closed connections (comm.peer_loss_s, 1 ms after they reached the walk's
    # agreement, their own destroys done), not from the agreement timeout
    assert d["simulated_time_s"] - fired["time"] < 1.0 < AGREE_TIMEOUT_S


def test_without_the_closed_connections_the_peers_wait_out_the_agreement_timeout():
    # comm.peer_loss_s null: a crashed rank is one that never arrives; every other rank fails its agreement after
    # agree_timeout_s, and still all in one state (the folded run times out for the whole job: the same result)
    raw = _shrunk(64, 41, comm={"peer_loss_s": None})
    result, _, _, how = run_auto(parse_scenario(raw))
    full, _, _ = run_scenario(parse_scenario(raw))
    assert how.folded and _text(result) == _text(full)
    d = result.to_dict()
    fired = d["faults_fired"][0]["time"]
    assert d["simulated_time_s"] == pytest.approx(fired + AGREE_TIMEOUT_S, abs=0.1)
    others = [r for r in d["ranks"] if r["rank"] != 41]
    assert {r["lifecycle_state"] for r in others} == {"FAILED"}
    assert all("timed out after 300s" in r["error"] for r in others)


@pytest.mark.parametrize("policy", ["paused_live", "suspend_planned"])
def test_agreements_with_a_lane_per_group_and_the_canary_fold_exactly(policy):
    # a walk's vote per group, the plan's action per group, the canary's sum over a group: the folded rendezvous
    # reduces the active members' values as the whole group's; no fault, two steps
    raw = _shrunk(128, 0, pg_policy=policy, faults=[])
    scn = parse_scenario(raw)
    fold, why = plan_fold(scn)
    assert fold is not None and fold.active < 128, why
    folded, _, _ = run_folded(scn, fold)
    full, _, _ = run_scenario(parse_scenario(raw))
    assert full.ok and {r["lifecycle_state"] for r in full.to_dict()["ranks"]} == {"ACTIVE"}
    assert _text(folded) == _text(full)


@pytest.mark.parametrize("change, why", [
    ({"lifecycle": {"min_ranks": 1}}, "votes would be lost"),  # node-local groups in the lifecycle
    ({"faults": [{"kind": "crash", "ranks": [3, 47]}]}, "one crash of one rank"),
    ({"faults": [{"kind": "hang", "ranks": [3], "at_point": "lifecycle.destroy"}]}, "one crash of one rank"),
])
def test_what_a_fold_cannot_reduce_is_simulated_in_full(change, why):
    raw = _shrunk(64, 3, **change)
    fold, reason = plan_fold(parse_scenario(raw))
    assert fold is None and why in reason


def test_the_estimate_counts_the_lifecycles_groups_and_the_whole_jobs_ranks():
    from sim.scenarios.scale import estimate, run_size
    from sim.scenarios.scenario import load_scenario

    scn = load_scenario("lifecycle_fault_131072")
    fold, why = plan_fold(scn)
    assert fold is not None and fold.active == 32, why  # head, period, the crashed rank's and the last node
    size = run_size(scn, fold)
    # dp, dp_cp and edp: 8 groups of 16,384 each; tp_dp and tp_dp_cp: one of 131,072; the control group: every rank
    assert (size.lifecycle_groups, size.lifecycle_members) == (26, 24 * 16384 + 3 * 131072)
    assert size.simulated_ranks == 32 and size.world_ranks == 131072 and size.tensors_per_rank == 5
    # the CLI's run peaked at 0.535 GB (bench/sim_scale_bench.py --fault, the record of 2026-12-04): within 30 %
    assert 0.535 / 1.3 < estimate(scn, fold, why).gb < 0.535 * 1.3
