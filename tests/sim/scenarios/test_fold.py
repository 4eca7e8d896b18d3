"""Symmetry folding (sim/scenarios/fold.py) gives the full simulation's result bit for bit; the scale guards work.

Golden files (tests/sim/golden/) are results of the simulator before folding existed; "bit for bit"
means the result JSON text is identical apart from the one wall-clock field, ``wall_time_s``.
"""
import gzip
import json
from pathlib import Path

import pytest

from refimpl.cli import main
from sim.scenarios.fold import FoldBroken, _units_apart, plan_fold
from sim.scenarios.fold_run import run_folded
from sim.presets import scenario_path
from sim.scenarios.runner import run_scenario
from sim.scenarios.scale import MAX_RANKS, BudgetError, estimate, run_auto
from sim.scenarios.scenario import parse_scenario

GOLDEN = Path(__file__).parents[1] / "golden"


def _text(result) -> str:
    d = result.to_dict()
    d.pop("wall_time_s")
    return json.dumps(d, indent=1)


def _golden(name: str) -> str:
    return gzip.decompress((GOLDEN / f"{name}.json.gz").read_bytes()).decode()


def _multinode(n: int) -> dict:
    return {"world_size": n, "topology": "hgx-h200-8x-ib"}


def _store_scale(n: int, **changes) -> dict:
    """The shipped scale scenario without the lifecycle (TP8 x DP n/8, 5 contiguous buffers per rank)."""
    raw = json.loads(scenario_path("scale_1024").read_text())
    raw.update(name=f"store_{n}", world_size=n, topology={"preset": "hgx-h200-8x-ib", "nodes": n // 8},
               mesh={"dp": n // 8, "tp": 8}, pg_policy="none")
    raw.update(changes)
    return raw


@pytest.mark.parametrize("n", [256, 1024])
def test_folded_default_multinode_scenario_is_bit_identical_to_the_golden_full_run(n):
    result, world, _, how = run_auto(parse_scenario(_multinode(n)))
    # the dp group spans every node; a node's two sockets share no copy path or host memory, so the units
    # are sockets: socket 0 of node 0 (whose rank 0 initialises the communicator first) runs as itself,
    # socket 1 of node 0 stands for every later socket
    assert how.folded and how.simulated_ranks == 8 and len(world.runtimes) == 8
    assert "unit(s) of 4 ranks" in how.reason
    assert _text(result) == _golden(f"multinode_{n}")


def test_full_run_still_matches_the_golden_result():
    result, world, _ = run_scenario(parse_scenario(_multinode(64)))
    assert len(world.runtimes) == 64
    assert _text(result) == _golden("multinode_64")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "fault_drill_8xh200", "relax_4xa6000_qwen3_4b",
                                  "relax_4xa6000_qwen3_4b_baseline", "scale_1024", "suspend_8xh200"])
def test_shipped_examples_are_unchanged(name):
    from sim.scenarios.scenario import load_scenario

    result, _, _, how = run_auto(load_scenario(name))
    assert not how.folded  # single nodes, faults or the lifecycle: none of them folds
    assert _text(result) == _golden(name)


def test_folded_and_full_agree_at_2048_ranks_with_tp_groups_and_an_export():
    raw = _store_scale(2048, workload={"train_s": 1.0, "rollout_s": 5.0, "rollout_memory_fraction": 0.6,
                                       "touch_groups": True,
                                       "export": {"group": "tp", "bucket_bytes": 2**30, "ipc_s": 0.01}})
    scn = parse_scenario(raw)
    fold, why = plan_fold(scn)
    assert fold is not None and fold.active == 16, why
    folded, _, _ = run_folded(scn, fold)
    full, _, _ = run_scenario(parse_scenario(raw))
    assert full.ok and full.data["events"] > 2048 * 10
    assert _text(folded) == _text(full)


def test_socket_units_agree_with_the_full_run_through_an_export_and_two_steps():
    # [Note: units smaller than a node]: the two sockets of an HGX node share no copy path and no host
    # memory, so a socket stands for a socket; an export over the dp group (its first use inside
    # update_weights, where a head-less fold once moved a memory peak) and per-kind copy streams
    raw = dict(_multinode(64), steps=2, transport={"streams": "per_kind"},
               workload={"train_s": 1.0, "rollout_s": 5.0, "rollout_memory_fraction": 0.5, "touch_groups": True,
                         "export": {"group": "dp", "bucket_bytes": 2**30, "ipc_s": 0.01}})
    scn = parse_scenario(raw)
    fold, why = plan_fold(scn)
    assert fold is not None and (fold.unit, fold.head, fold.active) == (4, 1, 8), why
    folded, world, _ = run_folded(scn, fold)
    full, _, _ = run_scenario(parse_scenario(raw))
    assert len(world.runtimes) == 8 and full.ok and full.data["events"] > 64 * 10
    assert _text(folded) == _text(full)


def test_sockets_that_share_host_memory_fold_as_whole_nodes():
    from sim.presets import load_preset_data

    topo = load_preset_data("hgx-h200-8x-ib")
    for e in topo["node"]["elements"]:
        if e["name"] in ("gpu4", "gpu5", "gpu6", "gpu7"):
            e["numa"] = "numa0"  # socket 1's GPUs stage through socket 0's memory (over UPI)
    raw = dict(_multinode(32), topology=dict(topo, nodes=4))
    scn = parse_scenario(raw)
    fold, why = plan_fold(scn)
    assert fold is not None and (fold.unit, fold.active) == (8, 16), why
    assert _units_apart(scn, scn.topo, 4) == "ranks 0-3 and rank 4 share 'link:n0/cpu0>n0/numa0'"
    result, _, _, how = run_auto(scn)
    assert how.folded and _text(result) == _text(run_scenario(parse_scenario(raw))[0])


@pytest.mark.parametrize("n, mesh, active", [
    (256, {"dp": 16, "tp": 16}, 32),  # tp groups span two nodes: a head of two nodes, then a period of two
    (256, {"tp": 8, "dp": 32}, 64),  # dp innermost: tp groups stride 32 ranks, dp groups span 4 nodes
    (24, {"dp": 8, "tp": 3}, None),  # tp groups of 3 straddle node borders: no two nodes look alike
])
def test_group_layouts_fold_only_where_every_rank_looks_like_its_representative(n, mesh, active):
    raw = _store_scale(n, mesh=mesh, groups=[{"name": "tp", "dims": ["tp"]}, {"name": "dp", "dims": ["dp"]}],
                       topology={"preset": "hgx-h200-8x-ib", "nodes": n // 8})
    scn = parse_scenario(raw)
    fold, why = plan_fold(scn)
    assert (fold.active if fold else None) == active, why
    result, _, _, how = run_auto(scn)
    full, _, _ = run_scenario(parse_scenario(raw))
    assert how.folded == (active is not None) and full.ok
    assert _text(result) == _text(full)


@pytest.mark.parametrize("change, why", [
    # the lifecycle's node-local groups: their votes in the agreements come from ranks that do not run
    # (a lifecycle whose groups span the units folds: tests/sim/scenarios/test_fold_crash.py)
    ({"pg_policy": "paused_live", "mesh": {"dp": 2, "tp": 8}}, "no symmetric fold"),
    ({"payload": "real", "model": {"tensors": [{"name": "w", "shape": [64], "dtype": "float32"}]}}, "real payloads"),
    # one crashed rank folds (test_fold_crash.py); a hang, like any other fault, does not
    ({"faults": [{"kind": "hang", "ranks": [9], "at_point": "store.offload.begin"}]}, "fault plan"),
])
def test_what_breaks_the_symmetry_is_simulated_in_full(change, why):
    raw = dict(_multinode(16), **change)
    fold, reason = plan_fold(parse_scenario(raw))
    assert fold is None and why in reason
    result, world, _, how = run_auto(parse_scenario(raw))
    assert not how.folded and len(world.runtimes) == 16 and len(result.data["ranks"]) == 16


def test_a_fold_the_run_cannot_honour_falls_back_to_the_full_run():
    # forced past plan_fold: the lifecycle's control group moves real bytes (rank ids), which a fold refuses
    raw = _store_scale(32, pg_policy="paused_live")
    scn = parse_scenario(raw)
    with pytest.raises(FoldBroken, match="real bytes"):
        run_folded(scn, plan_fold(parse_scenario(_store_scale(32)))[0])
    result, world, _, how = run_auto(parse_scenario(raw), planned=plan_fold(parse_scenario(_store_scale(32))))
    assert not how.folded and "fold abandoned" in how.reason and len(world.runtimes) == 32
    assert _text(result) == _text(run_scenario(parse_scenario(raw))[0])
    # the fallback is budgeted too: a full run past the budget is refused, not started
    with pytest.raises(BudgetError, match="fold abandoned"):
        run_auto(parse_scenario(raw), planned=plan_fold(parse_scenario(_store_scale(32))),
                 check_full=lambda est: est.check(max_seconds=0.001))


def test_estimate_and_budget():
    big = parse_scenario(_multinode(16384))
    folded = estimate(big)
    assert folded.folded and folded.simulated_ranks == 8 and folded.tensors_per_rank == 1455
    assert folded.seconds < 60 and folded.gb < 4
    folded.check()  # within the default budget
    full = estimate(big, None, "folding turned off")
    assert full.seconds > 600 and full.gb > 50
    with pytest.raises(BudgetError, match="--force"):
        full.check()


def test_cli_prints_the_estimate_refuses_past_the_budget_and_rejects_absurd_sizes(tmp_path, capsys, monkeypatch):
    small = tmp_path / "s.json"
    small.write_text(json.dumps(_multinode(64)))
    assert main(["sim", "run", str(small), "--quiet", "--max-est-seconds", "0.01"]) == 2  # nothing was run
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: refusing to run: estimated") and "\n" not in err
    assert "64 ranks, 1,455 tensors per rank" in err and "--force" in err
    monkeypatch.setattr("sim.scenarios.scale.ANNOUNCE_SECONDS", 0.0)  # print the estimate even for this small run
    out = tmp_path / "r.json"
    assert main(["sim", "run", str(small), "--quiet", "--max-est-seconds", "0.01", "--force", "--out", str(out),
                 "--progress-every", "0.01"]) == 0
    err = capsys.readouterr().err
    assert "estimate: 64 ranks" in err and "simulated ranks stand for all" in err
    assert "events run" in err  # progress lines came
    assert json.loads(out.read_text())["world_size"] == 64
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(_multinode(10**7)))
    assert main(["sim", "run", str(huge)]) == 2
    err = capsys.readouterr().err
    assert f"{MAX_RANKS:,}" in err and "10,000,000" in err
