"""The switch-window benchmark: the mesh it builds and what its simulated policies must show."""
from __future__ import annotations

import argparse
import json

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


def test_simulated_policies_order_and_memory():
    kw = dict(dp=2, tp=2, steps=3, train_s=5.0, rollout_s=10.0, cooldown_s=2.0, topology="hgx-h200-8x")
    res = {p: sw.summarize(p, sw.simulate(p, **kw), warmup=1) for p in PGPolicy}
    d, dd, pl, su = (res[p] for p in (PGPolicy.DESTROY, PGPolicy.DESTROY_DEFERRED, PGPolicy.PAUSED_LIVE, PGPolicy.SUSPEND))
    assert d.sleep - dd.sleep >= 2.0 * 0.99, "the baseline waits the 2 s cooldown inside the pause"
    assert dd.total < d.total and su.total < d.total and pl.total < su.total
    assert pl.states[1:] == ["PAUSED_LIVE"] * 2 and su.states[1:] == ["SUSPENDED"] * 2
    assert d.held_in_rollout_gib == dd.held_in_rollout_gib == 0
    assert pl.held_in_rollout_gib * 2**30 == 14 * 388 * MiB, "every communicator stays whole through the rollout"
    assert su.held_in_rollout_gib * 2**30 == 14 * 4 * MiB, "only the persistent part stays"


def test_cli_prints_ratios_and_writes_json(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    sw.add_arguments(parser)
    out = tmp_path / "sw.json"
    args = parser.parse_args(["--dp", "1", "--tp", "2", "--steps", "2", "--warmup", "1", "--rollout-s", "5",
                              "--policy", "DESTROY", "--policy", "SUSPEND", "--json", str(out)])
    assert sw.run(args) == 0
    text = capsys.readouterr().out
    assert "1.000x" in text and "SUSPEND" in text and "2 ranks, 14 groups per rank" in text
    data = json.loads(out.read_text())
    assert data["format"] == "timeshare/1" and data["command"] == "bench switch-window"
    assert [r["policy"] for r in data["data"]["results"]] == ["DESTROY", "SUSPEND"]
    assert sw.run(parser.parse_args(["--steps", "2", "--warmup", "2"])) == 2
