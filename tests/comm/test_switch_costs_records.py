"""``SwitchCosts`` (the SUSPEND_PLANNED cost row's inputs) against the 2 x H200 wave2 record.

The defaults are not the measured costs (suspend 0.8 against 1.02 s/GiB, resume 0.3 against 0.55 s/GiB, one-rank
init 0.25 against 0.033 s, multi-rank destroy 0.2 against 0.25 s), but for every communicator measured on 2 x H200
the measured costs choose what the defaults choose: the break-even size of a two-rank communicator moves from
354 MiB to 276 MiB, and the measured ones hold 192 MiB (GPU.md's run) and 480 MiB (the multigpu records).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from refimpl.comm.group_plan import SwitchCosts, cheaper_to_destroy

ROOT = Path(__file__).resolve().parents[2]
WAVE2 = ROOT / "bench" / "results" / "2026-11-30-h200x2-wave2" / "multigpu-2026-11-30-nvidia-h200x2.json"
MiB = 2**20


def measured_costs() -> SwitchCosts:
    """The cost row's inputs from wave2: per communicator suspend/resume over its suspendable GiB (comm_raw.per_comm,
    480 MiB two-rank), the two-rank init (first collective) and destroy (after suspend and resume, so at a random
    poll phase) of comm_raw, and the one-rank init and destroy of the lifecycle's walk (comm_raw.mesh_walk)."""
    raw = json.loads(WAVE2.read_text())["comm_raw"]
    per = raw["per_comm"]
    gib = statistics.mean(r["suspendable_bytes"] for r in per) / 2**30
    one = [g for m in raw["mesh_walk"] for g in m["groups"] if g["member"] and g["size"] == 1]
    return SwitchCosts(
        suspend_s_per_gib=statistics.mean(r["suspend_s"] for r in per) / gib,
        resume_s_per_gib=statistics.mean(r["resume_s"] for r in per) / gib,
        destroy_s_single=statistics.median(g["destroy_s"] for g in one),
        destroy_s_multi=raw["destroy_s"] / raw["n_comms"],
        init_s_single=statistics.median(g["first_collective_s"] for g in one),
        init_s_multi=raw["first_collective_s"] / raw["n_comms"],
    )


def test_the_defaults_are_not_the_measured_costs():
    m, d = measured_costs(), SwitchCosts()
    assert m.suspend_s_per_gib == pytest.approx(1.02, abs=0.01) and d.suspend_s_per_gib == 0.8
    assert m.resume_s_per_gib == pytest.approx(0.55, abs=0.01) and d.resume_s_per_gib == 0.3
    assert m.init_s_single == pytest.approx(0.033, abs=0.002) and d.init_s_single == 0.25
    assert m.destroy_s_multi == pytest.approx(0.247, abs=0.002) and d.destroy_s_multi == 0.2
    assert m.init_s_multi == pytest.approx(0.175, abs=0.002) and m.destroy_s_single == pytest.approx(0.034, abs=0.002)


@pytest.mark.parametrize("size, suspendable", [(2, 480 * MiB), (2, 192 * MiB), (1, 384 * MiB)])
def test_measured_costs_choose_what_the_defaults_choose_for_every_measured_communicator(size, suspendable):
    assert cheaper_to_destroy(measured_costs(), size, suspendable) == cheaper_to_destroy(SwitchCosts(), size, suspendable)


def test_break_even_of_a_two_rank_communicator():
    def break_even(c: SwitchCosts) -> float:
        return c.destroy_cost(2) / (c.suspend_s_per_gib + c.resume_s_per_gib) * 1024  # MiB

    assert break_even(SwitchCosts()) == pytest.approx(354, abs=1)
    assert break_even(measured_costs()) == pytest.approx(276, abs=2)
    assert 192 < break_even(measured_costs()) < break_even(SwitchCosts()) < 480
