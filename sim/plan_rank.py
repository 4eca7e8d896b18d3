"""Ranking, Pareto front and recommendation of ``timeshare plan``'s outcomes (:mod:`sim.plan`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from sim.plan import Outcome


def rank(outcomes: list[Outcome]) -> list[Outcome]:
    """Feasible first, then by step time; ties (1 ms) broken by more rollout memory, then less pinned host."""
    return sorted(outcomes, key=lambda o: (not o.feasible, round(o.step_s, 3), -o.rollout_gib, o.pinned_node_gib))


def pareto(outcomes: list[Outcome]) -> list[Outcome]:
    """Feasible outcomes no other beats on all of step time, rollout memory and pinned host per node."""
    ok = [o for o in outcomes if o.feasible]
    front = []
    for o in ok:
        dominated = any(
            p.step_s <= o.step_s and p.rollout_gib >= o.rollout_gib and p.pinned_node_gib <= o.pinned_node_gib
            and (p.step_s < o.step_s or p.rollout_gib > o.rollout_gib or p.pinned_node_gib < o.pinned_node_gib)
            for p in ok)
        if not dominated:
            front.append(o)
    return rank(front)


def recommend(ranked: list[Outcome]) -> tuple[Outcome | None, str]:
    """The fastest feasible candidate and a sentence saying why."""
    ok = [o for o in ranked if o.feasible]
    if not ok:
        why = ranked[0].reason if ranked else "no candidates"
        return None, f"no candidate fits: the best one fails because {why}"
    best = ok[0]
    base = next((o for o in ranked if o.candidate.offload == () and o.candidate.pg_policy == best.candidate.pg_policy
                 and not o.candidate.score_offload), None)
    parts = [f"fastest step that fits ({best.step_s:.2f} s, of which {best.switch_s:.2f} s switching)"]
    if base is not None and base is not best:
        if base.feasible:
            parts.append(f"{base.step_s - best.step_s:.2f} s faster than offloading nothing "
                         f"(rollout memory {best.rollout_gib:.1f} vs {base.rollout_gib:.1f} GiB)")
        else:
            parts.append(f"offloading nothing does not fit ({base.reason})")
    elif base is best:
        parts.append("offloading would only add switch time: the rollout already has the KV cache it needs")
    return best, "; ".join(parts)


__all__ = ["pareto", "rank", "recommend"]
