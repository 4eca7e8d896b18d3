"""Static eligibility gates for keeping process groups through a pause.

A gate is a named predicate. Preservation (PAUSED_LIVE or SUSPEND) is only voted
for by a rank whose gates all pass; the names of the failing ones are logged so
an operator sees *why* the fallback path was taken. The list is configuration:
pass your own, or start from :data:`RELAX_GATES`, the static conditions of the
Relax implementation written as facts to look up.

A predicate that raises counts as failing (its error is logged); a gate must
never break the protocol, because the vote that follows has to happen on every
rank.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from refimpl.comm.states import PGPolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateContext:
    """What a gate may look at: the policy asked for, the role's groups and free-form facts."""

    policy: PGPolicy
    groups: tuple[str, ...]
    facts: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 0


@dataclass(frozen=True)
class Gate:
    """A named condition that must hold for this rank to vote for preservation."""

    name: str
    predicate: Callable[[GateContext], bool]
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a gate needs a name (it is how a failure is reported)")


def failing_gates(gates: Iterable[Gate], ctx: GateContext) -> list[str]:
    """Names of the gates that do not pass in ``ctx`` (a raising predicate fails)."""
    failed = []
    for gate in gates:
        try:
            ok = bool(gate.predicate(ctx))
        except Exception:  # noqa: BLE001 - reported by name, never propagated
            log.exception("rank %d: gate %r raised; counting it as failed", ctx.rank, gate.name)
            ok = False
        if not ok:
            failed.append(gate.name)
    return failed


_MISSING = object()


def fact_gate(name: str, key: str, expected: Any, description: str = "") -> Gate:
    """A gate that passes when ``ctx.facts[key] == expected`` (a missing fact fails)."""

    def check(ctx: GateContext) -> bool:
        return ctx.facts.get(key, _MISSING) == expected

    return Gate(name, check, description or f"{key} == {expected!r}")


def unique_names(gates: Iterable[Gate]) -> None:
    """Raise ``ValueError`` if two gates share a name (their failures could not be told apart)."""
    seen: set[str] = set()
    for g in gates:
        if g.name in seen:
            raise ValueError(f"duplicate gate name {g.name!r}")
        seen.add(g.name)


RELAX_GATES: tuple[Gate, ...] = (
    fact_gate("actor_role", "role", "actor"),
    fact_gate("colocate", "colocate", True),
    fact_gate("offload_train", "offload_train", True),
    fact_gate("per_step_rollout", "per_step_rollout", True),
    fact_gate("tms_offloader", "uses_tms", True),
    fact_gate("no_critic", "use_critic", False),
    fact_gate("not_fully_async", "fully_async", False),
    fact_gate("weights_backuper", "enable_weights_backuper", True),
    fact_gate("tensor_weight_updater", "weight_updater", "UpdateWeightFromTensor"),
    fact_gate("pp_1", "pipeline_parallel_size", 1),
    fact_gate("cp_1", "context_parallel_size", 1),
    fact_gate("ep_1", "expert_parallel_size", 1),
    fact_gate("not_klx", "is_klx", False),
)
"""The Relax report's static conditions for keeping groups live, as fact gates."""


__all__ = ["Gate", "GateContext", "RELAX_GATES", "fact_gate", "failing_gates", "unique_names"]
