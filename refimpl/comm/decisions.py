"""Pure decisions of the lifecycle, separate from the code that performs them.

Nothing here awaits or touches a runtime: each function maps facts (the policy,
failing gates, the preservation phase, what every rank agreed) to a choice, so
the choices can be read, tested and drawn on their own. :class:`PGLifecycle`
gathers the facts, agrees on them across ranks, then asks these functions.
"""
from __future__ import annotations

from dataclasses import dataclass

from refimpl.comm.states import PGEvent, PGPolicy, PGState


@dataclass(frozen=True)
class Preservation:
    """The two-phase switch for keeping groups through a pause, on this rank.

    ``eligible``: every rank's gates passed at a pause. ``ready``: a weight sync
    succeeded on every rank after that. ``disabled``: why preservation was turned
    off for the life of the process (None while it is allowed).
    """

    eligible: bool = False
    ready: bool = False
    disabled: str | None = None

    @property
    def armed(self) -> bool:
        """True when a keeping policy may be used now."""
        return self.ready and self.disabled is None


def local_vote(policy: PGPolicy, failing: list[str], preservation: Preservation, *, two_phase: bool) -> bool:
    """This rank's vote for keeping the groups through the coming pause."""
    if not policy.preserves or failing or preservation.disabled is not None:
        return False
    return preservation.ready or not two_phase


def after_gates(preservation: Preservation, all_gates_pass: bool) -> Preservation:
    """Phase one: a pause at which every rank's gates passed makes preservation eligible."""
    if all_gates_pass and preservation.disabled is None and not preservation.eligible:
        return Preservation(eligible=True, ready=preservation.ready, disabled=None)
    return preservation


def after_good_sync(preservation: Preservation) -> Preservation:
    """Phase two: a weight sync that succeeded on every rank arms an eligible switch."""
    if preservation.eligible and preservation.disabled is None and not preservation.ready:
        return Preservation(eligible=True, ready=True, disabled=None)
    return preservation


def disabled(preservation: Preservation, reason: str) -> Preservation:
    """Preservation turned off for the life of the process (the first reason is kept)."""
    return Preservation(preservation.eligible, False, preservation.disabled or reason)


def pause_event(policy: PGPolicy, preserve_agreed: bool) -> PGEvent:
    """The event a pause takes once the ranks agreed whether to keep the groups."""
    if preserve_agreed and policy is PGPolicy.PAUSED_LIVE:
        return PGEvent.PAUSE_LIVE
    if preserve_agreed and policy is PGPolicy.SUSPEND:
        return PGEvent.SUSPEND
    if preserve_agreed and policy is PGPolicy.SUSPEND_PLANNED:
        return PGEvent.PAUSE_PLANNED
    return PGEvent.DESTROY


def inline_cooldown(policy: PGPolicy) -> bool:
    """True if a destroy waits for the port cooldown at once (the baseline) instead of deferring it."""
    return policy is PGPolicy.DESTROY


def needs_bring_up(state: PGState) -> bool:
    """True if the groups must be resumed or rebuilt before they can be used."""
    return state in (PGState.SUSPENDED, PGState.DESTROYED)


__all__ = [
    "Preservation",
    "after_gates",
    "after_good_sync",
    "disabled",
    "inline_cooldown",
    "local_vote",
    "needs_bring_up",
    "pause_event",
]
