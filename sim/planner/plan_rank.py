"""What ``timeshare plan`` ranks: a :class:`Candidate`, its :class:`Outcome`, and the ranking, Pareto front
and recommendation over outcomes (:mod:`sim.planner.plan` evaluates them)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ROLE_ABBREV = {"reference": "ref", "reward": "rm", "critic": "critic"}


@dataclass(frozen=True)
class Candidate:
    """One configuration of the step."""

    offload: tuple[str, ...]
    backend: str = "local"
    score_offload: bool = True
    pg_policy: str = "none"
    order: tuple[str, ...] = ()

    def label(self) -> str:
        """Short name used in tables, e.g. ``params+optimizer/local, ref off, suspend``."""
        off = "+".join(self.offload) if self.offload else "no offload"
        if self.offload and self.offload != ("fsdp_cpu",):
            off += f"/{self.backend}"
        text = f"{off}; scoring {'offloaded' if self.score_offload else 'resident'}; pg {self.pg_policy}"
        middle = [r for r in self.order if r not in ("rollout", "actor_train")]
        if len(middle) > 1:  # the order only varies when there are two or more roles between rollout and update
            text += "; " + ">".join(ROLE_ABBREV.get(r, r) for r in middle)
        return text


@dataclass
class Outcome:
    """What a candidate costs. Memory in GiB per GPU (pinned host per rank and per node), times in s."""

    candidate: Candidate
    feasible: bool
    reason: str
    step_s: float
    switch_s: float
    compute_s: dict[str, float]
    rollout_s: float
    peak_gpu_gib: float
    rollout_gib: float
    pinned_rank_gib: float
    pinned_node_gib: float
    timeline: list[tuple[str, str, float]] = field(default_factory=list)  # (role, kind, seconds) in step order

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the candidate's fields inline)."""
        d = asdict(self)
        d["candidate"] = {**asdict(self.candidate), "label": self.candidate.label()}
        d["timeline"] = [{"role": r, "kind": k, "s": s} for r, k, s in self.timeline]
        return d


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


__all__ = ["Candidate", "Outcome", "ROLE_ABBREV", "pareto", "rank", "recommend"]
