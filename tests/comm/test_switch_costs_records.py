"""``SwitchCosts`` (the SUSPEND_PLANNED cost row's inputs) against the 2 x H200 lazy-wake record.

The defaults are the costs measured there (suspend 1.02 s/GiB, resume 0.55 s/GiB, two-rank destroy 0.247 s and
init 0.175 s, one-rank destroy 0.034 s and init 0.033 s). Every communicator measured on 2 x H200 gets the choice
the earlier, partly assumed defaults gave; the break-even size of a two-rank communicator moved from 354 MiB to
276 MiB (the measured ones hold 192 MiB and 480 MiB).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from refimpl.comm.group_plan import SwitchCosts, cheaper_to_destroy

ROOT = Path(__file__).resolve().parents[2]
LAZY_WAKE = ROOT / "bench" / "results" / "2026-11-30-h200x2-lazy-wake" / "multigpu-2026-11-30-nvidia-h200x2.json"
MiB = 2**20


def measured_costs() -> SwitchCosts:
    """The cost row's inputs from lazy-wake: per communicator suspend/resume over its suspendable GiB (comm_raw.per_comm,
    480 MiB two-rank), the two-rank init (first collective) and destroy (after suspend and resume, so at a random
    poll phase) of comm_raw, and the one-rank init and destroy of the lifecycle's walk (comm_raw.mesh_walk)."""
    raw = json.loads(LAZY_WAKE.read_text())["comm_raw"]
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


OLD = SwitchCosts(suspend_s_per_gib=0.8, resume_s_per_gib=0.3, destroy_s_single=0.036, destroy_s_multi=0.2,
                  init_s_single=0.25, init_s_multi=0.18)  # the defaults before the lazy-wake record


def test_the_defaults_are_the_measured_costs():
    m, d = measured_costs(), SwitchCosts()
    for name in ("suspend_s_per_gib", "resume_s_per_gib", "destroy_s_single", "destroy_s_multi", "init_s_single",
                 "init_s_multi"):
        assert getattr(d, name) == pytest.approx(getattr(m, name), rel=0.02), name


@pytest.mark.parametrize("size, suspendable, destroy", [(2, 480 * MiB, True), (2, 192 * MiB, False),
                                                        (1, 384 * MiB, True)])
def test_every_measured_communicator_gets_the_choice_it_got_before(size, suspendable, destroy):
    """192 MiB two-rank (GPU.md's run), 480 MiB two-rank (the multigpu records), 384 MiB one-rank (run 1)."""
    assert cheaper_to_destroy(SwitchCosts(), size, suspendable) is destroy
    assert cheaper_to_destroy(OLD, size, suspendable) is destroy


def test_break_even_of_a_two_rank_communicator():
    def break_even(c: SwitchCosts) -> float:
        return c.destroy_cost(2) / (c.suspend_s_per_gib + c.resume_s_per_gib) * 1024  # MiB

    assert break_even(OLD) == pytest.approx(354, abs=1)
    assert break_even(SwitchCosts()) == pytest.approx(break_even(measured_costs()), abs=2)
    assert break_even(SwitchCosts()) == pytest.approx(276, abs=2)
    assert 192 < break_even(SwitchCosts()) < 480
