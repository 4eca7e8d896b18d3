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
    layout_s: dict[str, dict[str, float]] = field(default_factory=dict)  # per role: what the layout adds (layout_cost)
    memory_gib: dict[str, float] = field(default_factory=dict)  # GPU memory in use in each role's turn
    offloaded: dict[str, list[str]] = field(default_factory=dict)  # role -> what it moves out between its turns

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the candidate's fields inline)."""
        d = asdict(self)
        d["candidate"] = {**asdict(self.candidate), "label": self.candidate.label()}
        d["timeline"] = [{"role": r, "kind": k, "s": s} for r, k, s in self.timeline]
        if not self.feasible:  # a step that cannot run has no step time (the waves of a starved rollout are not one)
            d["step_s"] = d["rollout_s"] = None
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


#: the estimate's stated error on a step-time difference between two candidates (docs/plan.md, "Ties"):
#: the simulated switch windows are within 15% of the 2 x H200 measurement (docs/calibration.md) ...
SWITCH_REL_ERROR = 0.15
#: ... the layout's communication formulas are not measured here (assumption: 25%) ...
LAYOUT_REL_ERROR = 0.25
#: ... and the rest of the step (rollout waves, FSDP2 CPU offload's copies and CPU optimizer) is computed, not
#: measured (assumption: 25% of how much it differs between the two; what both share cancels in the difference)
STEP_REL_ERROR = 0.25


def _layout_total(o: Outcome) -> float:
    return sum(v.get("total", 0.0) for v in o.layout_s.values())


def tie_margin(a: Outcome, b: Outcome) -> float:
    """Seconds within which the step times of ``a`` and ``b`` are a tie: inside the estimate's stated error."""
    la, lb = _layout_total(a), _layout_total(b)
    rest = abs((a.step_s - a.switch_s - la) - (b.step_s - b.switch_s - lb))
    return SWITCH_REL_ERROR * max(a.switch_s, b.switch_s) + LAYOUT_REL_ERROR * max(la, lb) + STEP_REL_ERROR * rest


def moving_parts(c: Candidate) -> tuple[int, int, int]:
    """How much a candidate asks of the user and the machine: state moved, a PG lifecycle, scoring offload."""
    moved = 3 if c.offload == ("fsdp_cpu",) else len(c.offload)
    return moved + (c.backend != "local"), int(c.pg_policy != "none"), int(c.score_offload)


def ties(ranked: list[Outcome]) -> list[Outcome]:
    """The feasible outcomes whose step time is within :func:`tie_margin` of the fastest one (the fastest first)."""
    ok = [o for o in ranked if o.feasible]
    if not ok:
        return []
    return [o for o in ok if o.step_s - ok[0].step_s <= tie_margin(ok[0], o)]


def recommend(ranked: list[Outcome], kv_need_gib: float | None = None) -> tuple[Outcome | None, str]:
    """The recommended candidate and a sentence saying why.

    Among the candidates tied with the fastest (inside the estimate's error, :func:`ties`) the one with the
    fewest moving parts (:func:`moving_parts`) is recommended: a difference the estimate cannot resolve is
    no reason to offload more or to run a PG lifecycle. The sentence gives the margin to the fastest
    candidate that is not a tie, and what offloading nothing would cost; with ``kv_need_gib`` (the KV cache the
    rollout needs per GPU) it says the rollout has what it needs only when it does.
    """
    ok = [o for o in ranked if o.feasible]
    if not ok:
        why = ranked[0].reason if ranked else "no candidates"
        return None, f"does not fit: {why}"
    tied = ties(ranked)
    best = min(tied, key=lambda o: (moving_parts(o.candidate), o.step_s))
    parts = [f"step {best.step_s:.2f} s, of which {best.switch_s:.2f} s switching"]
    if len(tied) > 1:
        parts.append(f"{len(tied) - 1} other candidate(s) within the estimate's error of the fastest "
                     f"({tie_margin(tied[0], tied[-1]):.2f} s): a tie, so the one with the fewest moving parts")
    rest = [o for o in ok if o not in tied]
    if rest:
        nxt = rest[0]
        parts.append(f"margin {nxt.step_s - best.step_s:.2f} s a step ({(nxt.step_s - best.step_s) / nxt.step_s:.1%}) "
                     f"over the next that is not a tie ({nxt.candidate.label()})")
    base = next((o for o in ranked if o.candidate.offload == () and o.candidate.pg_policy == "none"
                 and not o.candidate.score_offload), None)
    if base is not None and base is not best:
        if not base.feasible:
            parts.append(f"offloading nothing does not fit ({base.reason})")
        elif base in tied:
            parts.append("offloading nothing is a tie")
        else:
            parts.append(f"{base.step_s - best.step_s:.2f} s faster than offloading nothing "
                         f"(KV cache {best.rollout_gib:.1f} vs {base.rollout_gib:.1f} GiB per GPU)")
    elif base is best:
        parts.append(_why_offload_nothing(best, ok, kv_need_gib))
    return best, "; ".join(parts)


def _why_offload_nothing(best: Outcome, ok: list[Outcome], kv_need_gib: float | None) -> str:
    """Why offloading nothing is recommended, in the numbers of the rollout's KV cache."""
    if kv_need_gib is None:
        return "offloading would only add switch time"
    if best.rollout_gib >= kv_need_gib:
        return (f"offloading would only add switch time: the rollout already has the KV cache it needs "
                f"({kv_need_gib:.1f} GiB; it gets {best.rollout_gib:.1f})")
    roomier = max(ok, key=lambda o: o.rollout_gib)
    text = f"the rollout gets {best.rollout_gib:.1f} of the {kv_need_gib:.1f} GiB of KV cache it needs"
    if roomier.rollout_gib > best.rollout_gib + 0.05:
        text += (f", but offloading to give it more does not pay: {roomier.candidate.label()} gives it "
                 f"{min(roomier.rollout_gib, kv_need_gib):.1f} GiB, {roomier.rollout_s - best.rollout_s:+.2f} s of "
                 f"rollout and {roomier.switch_s - best.switch_s:+.2f} s of switching a step")
    return text


__all__ = ["Candidate", "LAYOUT_REL_ERROR", "Outcome", "ROLE_ABBREV", "STEP_REL_ERROR", "SWITCH_REL_ERROR",
           "moving_parts", "pareto", "rank", "recommend", "tie_margin", "ties"]
