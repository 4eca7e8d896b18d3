"""The switch-window benchmark: the mesh it builds and what its simulated policies must show."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from bench import switch_window as sw
from refimpl.comm import PGPolicy

MiB = 2**20


def test_every_rank_is_in_the_relax_reports_14_groups():
    specs = sw.mesh_groups(4, 2)
    for rank in range(8):
        mine = [s for s in specs if rank in s.ranks]
        assert len(mine) == 14
        assert {s.name.rstrip("0123456789") for s in mine} == {f for f, _ in sw.RELAX_FAMILIES}
    tp = [s.ranks for s in specs if s.name.startswith("tp") and s.name[2:].isdigit()]
    assert tp == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [s.ranks for s in specs if s.name.startswith("dp") and s.name[2:].isdigit()] == [(0, 2, 4, 6), (1, 3, 5, 7)]


RECORD = (Path(__file__).resolve().parents[2]
          / "bench/results/2026-11-30-h200x2-all-policies/multigpu-2026-11-30-nvidia-h200x2.json")


def test_simulated_switch_window_against_the_2xh200_record():
    """The recorded settings on the calibrated preset, checked against what 2 x H200 measured (the all-policies record,
    outside the preset's fit set; tests/sim/calibrate/test_validate_records.py checks every phase).

    The order of the policies, the inline cooldown (DESTROY sleeps the 2 s that DESTROY_DEFERRED defers),
    each policy's total and SUSPEND's pause within 15% (SUSPEND_PLANNED: its destroy walk missed one 0.5 s
    proxy poll in both measured steps, [Note: the proxy's 500 ms poll] in sim.presets), and the memory each
    policy keeps.
    """
    rec = json.loads(RECORD.read_text())
    st = rec["switch_window"]["settings"]
    measured = {r["policy"]: r for r in rec["switch_window"]["results"]}
    kw = dict(dp=st["dp"], tp=st["tp"], steps=st["steps"], train_s=st["train_s"], rollout_s=st["rollout_s"],
              cooldown_s=st["cooldown_s"], topology="calibrated/hgx-h200-8x",
              wake_proxies=False)  # the records predate the runtime's proxy waker
    res = {p.name: sw.summarize(p, sw.simulate(p, **kw), warmup=st["warmup"]) for p in PGPolicy if p.name in measured}
    assert set(res) == {p.name for p in PGPolicy}  # the record measured every policy
    assert sorted(res, key=lambda p: res[p].total) == sorted(measured, key=lambda p: measured[p]["total"])
    # measured: the 2 s wait, less the 0.5 s proxy poll DESTROY_DEFERRED's destroy walk missed in one of its steps
    assert measured["DESTROY"]["sleep"] - measured["DESTROY_DEFERRED"]["sleep"] >= st["cooldown_s"] - 0.5 / 2 - 0.01
    assert res["DESTROY"].sleep - res["DESTROY_DEFERRED"].sleep == pytest.approx(st["cooldown_s"], abs=0.01)
    assert res["SUSPEND"].sleep == pytest.approx(measured["SUSPEND"]["sleep"], rel=0.15)
    for p in res:
        if p == "SUSPEND_PLANNED":
            assert measured[p]["total"] - res[p].total == pytest.approx(0.5, abs=0.05)
        else:
            assert res[p].total == pytest.approx(measured[p]["total"], rel=0.15, abs=0.015), p
    assert res["PAUSED_LIVE"].states[1:] == ["PAUSED_LIVE"] * 3 and res["SUSPEND"].states[1:] == ["SUSPENDED"] * 3
    assert res["DESTROY"].held_in_rollout_gib == res["DESTROY_DEFERRED"].held_in_rollout_gib == 0
    # per rank 9 one-rank groups (384 + 4 MiB on one GPU) and 5 two-rank groups (480 + 4 MiB on 2 x H200)
    assert res["PAUSED_LIVE"].held_in_rollout_gib * 2**30 == 9 * 388 * MiB + 5 * 484 * MiB
    assert res["PAUSED_LIVE"].held_in_rollout_gib == pytest.approx(measured["PAUSED_LIVE"]["held_in_rollout_gib"],
                                                                   rel=0.01)
    assert res["SUSPEND"].held_in_rollout_gib == pytest.approx(measured["SUSPEND"]["held_in_rollout_gib"], abs=0.005)


def test_cli_prints_ratios_and_writes_json(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    sw.add_arguments(parser)
    out = tmp_path / "sw.json"
    args = parser.parse_args(["--dp", "1", "--tp", "2", "--steps", "2", "--warmup", "1", "--rollout-s", "5",
                              "--policy", "DESTROY", "--policy", "SUSPEND", "--json", str(out)])
    assert sw.run(args) == 0
    text = " ".join(capsys.readouterr().out.split())  # the table wraps at 100 columns
    assert "(x)" in text and "DESTROY" in text and "SUSPEND" in text
    assert re.search(r"DESTROY [\d.]+ 1\.000 ", text)  # the first policy against itself
    assert "2 ranks (tp 2 cp 1 dp 1 pp 1 ep 1), 14 Megatron groups per rank" in text
    data = json.loads(out.read_text())
    assert data["format"] == "timeshare/1" and data["command"] == "bench switch-window"
    assert [r["policy"] for r in data["data"]["results"]] == ["DESTROY", "SUSPEND"]
    assert sw.run(parser.parse_args(["--steps", "2", "--warmup", "2"])) == 2


ALL_POLICIES = (Path(__file__).resolve().parents[2]
        / "bench/results/2026-11-30-h200x2-all-policies/multigpu-2026-11-30-nvidia-h200x2.json")


def test_variant_rows_resolve_and_every_wake_is_checked_bitwise():
    assert sw.resolve("suspend-planned-lazy") == ("SUSPEND_PLANNED_LAZY", PGPolicy.SUSPEND_PLANNED)
    assert sw.resolve(PGPolicy.SUSPEND) == ("SUSPEND", PGPolicy.SUSPEND)
    with pytest.raises(ValueError, match="SUSPEND_PLANNED_LAZY"):
        sw.resolve("suspend_sometimes")
    kw = dict(dp=2, tp=1, steps=3, train_s=0.0, rollout_s=3.0, cooldown_s=2.0, topology="calibrated/hgx-h200-8x",
              wake_proxies=False)  # the destroys wait for the proxies' polls, as without the runtime's waker
    planned = sw.summarize("SUSPEND_PLANNED", sw.simulate("SUSPEND_PLANNED", **kw), warmup=1)
    lazy_runs = sw.simulate("SUSPEND_PLANNED_LAZY", **kw)
    lazy = sw.summarize("SUSPEND_PLANNED_LAZY", lazy_runs, warmup=1)
    for r in (planned, lazy):
        assert r.bitwise_after_wake is True, f"{r.policy}: first collectives after every wake bitwise right"
        assert r.held_in_rollout_gib == 0.0
    assert lazy.policy == "SUSPEND_PLANNED_LAZY" and lazy.wake_up == 0.0, "a lazy wake brings nothing back itself"
    assert lazy.states[1:] == ["PLANNED", "PLANNED"]
    assert lazy.first_use_after_wake >= planned.first_use_after_wake, "its bring-up lands in the first collectives"
    assert lazy.sleep > planned.sleep, "with the sync group declared, the other groups go down at the pause"
    # on 480 MiB communicators both destroy every group once per step; the lazy row destroys the sync group apart,
    # after the weight sync, so it also waits out that group's own NCCL proxy poll (less than one 0.5 s period)
    assert 0 <= lazy.total - planned.total < 0.5, "on 480 MiB communicators both destroy everything once"


def test_suspend_planned_on_2xh200_meets_the_goal_and_the_simulator_ranks_it_the_same():
    """The all-policies record (2 x H200, 13:27-13:45 UTC): SUSPEND_PLANNED's window against DESTROY_DEFERRED's in
    the same run (goal <= 0.5 x) and its NCCL memory in the rollout (goal <= 2% of PAUSED_LIVE's); the
    simulator on the shipped calibrated preset orders them the same and holds the same memory."""
    rec = json.loads(ALL_POLICIES.read_text())
    st = rec["switch_window"]["settings"]
    m = {r["policy"]: r for r in rec["switch_window"]["results"]}
    assert m["SUSPEND_PLANNED"]["total"] <= 0.5 * m["DESTROY_DEFERRED"]["total"]
    assert m["SUSPEND_PLANNED"]["held_in_rollout_gib"] <= 0.02 * m["PAUSED_LIVE"]["held_in_rollout_gib"]
    kw = dict(dp=st["dp"], tp=st["tp"], steps=st["steps"], train_s=st["train_s"], rollout_s=st["rollout_s"],
              cooldown_s=st["cooldown_s"], topology="calibrated/hgx-h200-8x",
              wake_proxies=False)  # the records predate the runtime's proxy waker
    sim_ = {p: sw.summarize(p, sw.simulate(p, **kw), warmup=st["warmup"])
            for p in ("DESTROY_DEFERRED", "PAUSED_LIVE", "SUSPEND_PLANNED")}
    assert sim_["SUSPEND_PLANNED"].total < sim_["DESTROY_DEFERRED"].total
    assert sim_["SUSPEND_PLANNED"].held_in_rollout_gib == m["SUSPEND_PLANNED"]["held_in_rollout_gib"] == 0.0


RECORDS = [Path(__file__).resolve().parents[2] / "bench/results" / d / "multigpu-2026-11-30-nvidia-h200x2.json"
           for d in ("2026-11-30-h200x2-all-policies", "2026-11-30-h200x2-lazy-wake", "2026-11-30-h200x2-walk-probes")]


def test_simulated_suspend_planned_window_within_its_range_on_every_two_gpu_record():
    """SUSPEND_PLANNED on 2 x H200 in three runs: 2.016 and 2.022 s (its destroy walk one proxy poll late in every
    step), 1.515 s (never late). The simulator gives 1.516 s and marks the weight sync, and only it, as a phase that
    may end one 0.5 s poll period later ([Note: a phase one poll period late] in bench.validate): every measured
    window lies between the on-time figure and a period more, and the on-time run is within 1% of the model's."""
    for path in RECORDS:
        rec = json.loads(path.read_text())
        st = rec["switch_window"]["settings"]
        measured = next(r for r in rec["switch_window"]["results"] if r["policy"] == "SUSPEND_PLANNED")
        kw = dict(dp=st["dp"], tp=st["tp"], steps=st["steps"], train_s=st["train_s"], rollout_s=st["rollout_s"],
                  cooldown_s=st["cooldown_s"], topology="calibrated/hgx-h200-8x",
              wake_proxies=False)  # the records predate the runtime's proxy waker
        got = sw.summarize("SUSPEND_PLANNED", sw.simulate("SUSPEND_PLANNED", **kw), warmup=st["warmup"])
        assert got.poll_late == ("update_weights",)
        assert got.total - 0.01 < measured["total"] < got.total + 0.5 + 0.01, path
    probes = json.loads(RECORDS[-1].read_text())
    m = {r["policy"]: r for r in probes["switch_window"]["results"]}
    assert got.total == pytest.approx(m["SUSPEND_PLANNED"]["total"], rel=0.01)
