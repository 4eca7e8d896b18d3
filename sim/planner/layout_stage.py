"""``timeshare plan``'s layout stage: which parallel layout, before which offload settings.

:func:`compare_layouts` runs the offload stage of the search (every offload setting the user's
framework can express, PG policy ``none``) on each layout of ``PlanInputs.layouts`` (and the
user's own), and picks the layout whose best candidate is fastest; layouts tied with it inside
the estimate's error (:func:`sim.planner.plan_rank.tie_margin`) are settled in favour of the user's layout,
then of the one with the fewest model-parallel ranks (less to change and less to go wrong). A layout
that the model or the cluster cannot take (heads not divisible by TP, layers by PP) is skipped with
its reason.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from sim.planner.layout_cost import describe
from sim.planner.plan_inputs import Layout, PlanInputError
from sim.planner.plan_rank import rank, recommend, ties


#: layouts besides the user's that get the simulated offload stage (the rest are ranked by compute and communication)
SHORTLIST = 4


def _analytic_s(planner: Any) -> float:
    """Compute and layout communication of every role's turn (no switches, no rollout), plus a large penalty when
    even the role's state alone does not fit the GPU."""
    roles = [r for r in planner.states]
    worst = max(st.total for st in planner.states.values())
    penalty = 1e9 if worst > 4 * planner.m.gpu_bytes else 0.0
    return sum(planner._compute_s(r) for r in roles) + penalty


def _size(lay: Layout) -> int:
    return lay.tp * lay.pp * lay.cp * lay.ep


def compare_layouts(inputs: Any, planner_class: Any, progress: Callable[[str], None] | None,
                    tick: Callable[[str], None] | None = None) -> tuple[Layout, list[dict[str, Any]]]:
    """(the chosen layout, one row per layout compared: its best candidate's step and memory, or why it was skipped).

    ``planner_class`` is :class:`sim.planner.plan.Planner` (passed in: that module imports this one)."""
    Planner = planner_class  # noqa: N806
    own = inputs.layout
    seen, rows, best_of, planners = [], [], [], []
    for lay in [own, *(inputs.layouts or [])]:
        key = (lay.tp, lay.pp, lay.cp, lay.dp, lay.ep, lay.fsdp, lay.shard)
        if key in seen:
            continue
        seen.append(key)
        try:
            planner = Planner(replace(inputs, layout=lay, layouts=None), progress)
        except PlanInputError as exc:
            rows.append({"layout": describe(lay), "mine": lay is own, "fits": False, "reason": str(exc)})
            continue
        planners.append((lay, planner))
    # the simulations only for the user's layout and the SHORTLIST layouts whose compute and communication are least
    shortlist = sorted(planners[1:], key=lambda lp: _analytic_s(lp[1]))[:SHORTLIST]
    for lay, planner in planners[:1] + shortlist:
        planner.tick = tick
        ranked = rank(planner._run(planner.offload_candidates(), f"layout {describe(lay)}"))
        best, _why = recommend(ranked)
        row = {"layout": describe(planner.lay), "mine": lay is own, "fits": best is not None}
        if best is None:
            row["reason"] = ranked[0].reason if ranked else "no candidates"
        else:
            row.update(step_s=best.step_s, layout_s=sum(v["total"] for v in best.layout_s.values()),
                       peak_gpu_gib=best.peak_gpu_gib, rollout_gib=best.rollout_gib, candidate=best.candidate.label())
            best_of.append((best, lay, row))
        rows.append(row)
    stats = {"simulations": sum(len(p.sims) for _lay, p in planners[:1] + shortlist),
             "simulation_wall_s": sum(p.sim_wall_s for _lay, p in planners[:1] + shortlist),
             "ranked_without_simulation": max(0, len(planners) - 1 - len(shortlist))}
    rows.append({"stats": stats})
    if not best_of:
        return own, rows
    fastest = min(best_of, key=lambda b: b[0].step_s)[0]
    tied = [b for b in best_of if b[0] in ties([fastest, b[0]]) or b[0] is fastest]
    best, chosen, row = min(tied, key=lambda b: (b[1] is not own, _size(b[1]), b[0].step_s))
    row["chosen"] = True
    mine = next((b for b in best_of if b[1] is own), None)
    stats["why"] = _layout_reason(best, chosen, row, mine, own)
    return chosen, rows


def _layout_reason(best: Any, chosen: Layout, row: dict[str, Any], mine: Any, own: Layout) -> str:
    """One sentence: why the chosen layout, against the user's."""
    if chosen is own:
        return "your layout: no other layout compared is faster by more than the estimate's error"
    if mine is None:
        return f"{row['layout']}: your layout does not fit"
    m, mrow = mine[0], mine[2]
    parts = [f"{row['layout']} is {m.step_s - best.step_s:.2f} s a step ({(m.step_s - best.step_s) / m.step_s:.1%}) "
             f"faster than yours ({mrow['layout']})"]
    if row["layout_s"] < mrow["layout_s"]:
        parts.append(f"less communication ({row['layout_s']:.1f} vs {mrow['layout_s']:.1f} s: TP all-reduces, "
                     "FSDP gathers, EP all-to-alls, the PP bubble)")
    if row["rollout_gib"] > mrow["rollout_gib"] + 0.5:
        parts.append(f"more KV cache for the rollout ({row['rollout_gib']:.0f} vs {mrow['rollout_gib']:.0f} GiB per GPU)")
    return "; ".join(parts)


__all__ = ["SHORTLIST", "compare_layouts"]
