"""A communicator's creation measured past two ranks (sim.calibrate.creation_measured, CommParams.with_measured_init):
read from a run's warm-up, put in place of the size rule's, extended by log2 of the ranks, and fed to the N-GPU
prediction of the switch only from records it is not checked against."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sim.calibrate.creation_measured import creations_from, measured_creation
from sim.calibrate.records import RecordError
from sim.calibrate.switch_ngpu import CHECKED_FIGURE, predict_ngpu
from sim.machine.topology import Topology

ROOT = Path(__file__).resolve().parents[3]
INPUT = "bench/results/2026-12-02-h200-offload-in-backward/sf_r1.json"
MULTI = "calibrated/hgx-h200-8x"


def _record(mesh, warm):
    """A record of the RL step as bench.rl writes the fields read here: its mesh and each step's resume ahead."""
    return {"world_size": math.prod(mesh) if mesh else 1, "mesh": mesh,
            "steps": [{"step": i, "resume_ahead": {"warm_s": w}} for i, w in enumerate(warm)]}


@pytest.fixture(scope="module")
def comm():
    return Topology.from_preset(MULTI).comm


def test_the_measured_figure_replaces_the_rule_and_extends_it_by_log2(comm):
    """At the measured size the figure itself; past it the line through it and the two-rank figure in log2 of the
    ranks, between two sizes the line through them; one and two ranks keep the preset's; every other cost the
    rule's."""
    t2 = comm.for_size(2).init_s
    m = comm.with_measured_init({4: 0.40})
    assert m.for_size(4).init_s == 0.40
    assert m.for_size(8).init_s == pytest.approx(0.40 + (0.40 - t2))
    assert m.for_size(16).init_s == pytest.approx(0.40 + 2 * (0.40 - t2))
    assert m.for_size(1).init_s == comm.for_size(1).init_s and m.for_size(2).init_s == t2
    assert m.for_size(8).destroy_s == comm.for_size(8).destroy_s
    two = comm.with_measured_init({4: 0.30, 16: 0.50})
    assert two.for_size(8).init_s == pytest.approx(0.40)
    assert two.for_size(32).init_s == pytest.approx(0.60)


def test_a_measured_figure_equal_to_a_rules_gives_that_rules_costs(comm):
    """The log2 rule's and the ring rule's creation at four ranks, taken as measured, give each rule's at eight:
    both rules are lines in log2 of the ranks past two."""
    from sim.calibrate.nccl_init_log import CONNECT_SHARE_2X_H200

    ring = comm.with_size_rule("ring", CONNECT_SHARE_2X_H200)
    for rule in (comm, ring):
        m = comm.with_measured_init({4: rule.for_size(4).init_s})
        assert m.for_size(8).init_s == pytest.approx(rule.for_size(8).init_s)


def test_bad_measured_figures_are_refused(comm):
    with pytest.raises(ValueError, match="more than two ranks"):
        comm.with_measured_init({2: 0.2})
    with pytest.raises(ValueError, match="positive"):
        comm.with_measured_init({4: 0.0})
    with pytest.raises(ValueError, match="positive"):
        comm.with_measured_init({4: float("nan")})


def test_the_creation_is_the_mean_steady_warm_up_less_the_small_groups():
    """The first step's warm-up is left out (the steady steps'); a group of two ranks beside the one past two is
    taken off at the preset's figure."""
    n, s = measured_creation(_record([4], [0.9, 0.30, 0.34]), MULTI)
    assert n == 4 and s == pytest.approx(0.32)
    t2 = Topology.from_preset(MULTI).comm.for_size(2).init_s
    n, s = measured_creation(_record([2, 4], [0.9, 0.60, 0.60]), MULTI)
    assert n == 4 and s == pytest.approx(0.60 - t2)


@pytest.mark.parametrize("mesh, warm, match", [
    ([2], [0.2, 0.2], "no group past two ranks"),
    ([2, 2], [0.4, 0.4], "no group past two ranks"),
    ([4, 4], [0.8, 0.8], "which took what"),
    ([4], [], "warm-up timed"),
    ([2, 4], [0.1, 0.1], "not more than"),
    (None, [0.3, 0.3], "names no mesh"),
])
def test_a_record_that_does_not_say_the_creation_past_two_ranks_is_refused(mesh, warm, match):
    with pytest.raises(RecordError, match=match):
        measured_creation(_record(mesh, warm), MULTI)


def test_the_prediction_takes_the_measured_creation(tmp_path):
    """With a four-rank creation measured at the log2 rule's figure the 8-GPU prediction is the log2 rule's; a
    cheaper one lowers the join; the row says what it took."""
    rec = json.loads((ROOT / INPUT).read_text())
    kw = dict(mechanisms=("forward_from_rollout",), bytes_per_rank="one-gpu")
    (log2,) = predict_ngpu(rec, 8, "fsdp", **kw)
    t4 = Topology.from_preset(MULTI).comm.for_size(4).init_s
    (same,) = predict_ngpu(rec, 8, "fsdp", init_measured={4: t4}, **kw)
    assert same["switch_cost_s"] == pytest.approx(log2["switch_cost_s"], abs=1e-4)
    assert same["init_measured"] == [[4, t4]] and log2["init_measured"] == []
    (cheap,) = predict_ngpu(rec, 8, "fsdp", init_measured={4: 0.18}, **kw)
    assert cheap["terms"]["join_wait"] < log2["terms"]["join_wait"] - 0.1


def test_the_command_reads_the_records_and_refuses_a_checked_one(tmp_path, capsys):
    from sim.calibrate.switch_ngpu import main

    four = tmp_path / "rl_step_4.json"
    four.write_text(json.dumps(_record([4], [0.5, 0.25, 0.25])))
    assert creations_from([four], MULTI) == {4: pytest.approx(0.25)}
    args = [str(ROOT / INPUT), "--ranks", "8", "--meshes", "fsdp", "--mechanisms", "forward_from_rollout"]
    assert main([*args, "--creation-from", str(four)]) == 0
    assert "creation measured at 4 ranks 250 ms" in capsys.readouterr().out
    assert main([*args, "--creation-from", str(ROOT / CHECKED_FIGURE)]) == 2
    assert "checked against" in capsys.readouterr().err
    two = tmp_path / "rl_step_2.json"
    two.write_text(json.dumps(_record([2], [0.2, 0.2])))
    assert main([*args, "--creation-from", str(two)]) == 2
    err = capsys.readouterr().err
    assert "rl_step_2.json" in err and "no group past two ranks" in err

