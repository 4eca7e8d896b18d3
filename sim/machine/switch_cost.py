"""A policy's switch cost: what the pause, the weight sync and the wake add to one RL step.

[Note: the switch cost] The switch window (``sleep + update_weights + wake_up``, the three phases
the Relax report times) is not all a step pays for a process-group policy. Groups destroyed at the
pause and rebuilt at the wake come back lazily: torch initialises their NCCL communicators at their
first collective, which is the training step's, after the window. So the **switch cost** of a step
is everything from the start of the pause to the end of training's first collective on every group
after the wake, less the roles' own work (the rollout between pause and wake, and what those same
collectives cost on groups that stayed live):

    switch cost = sleep + update_weights + wake_up + first-use extra
    first-use extra = max(0, first collectives after the wake - the same collectives on live groups)

A deferred port cooldown, a lazy wake's bring-up, or a wait on a slower rank land in one of those
terms wherever they fall: a rank's first collective ends when the slowest member arrives, so taking
each step's slowest rank (the sum per rank, then the max over ranks) counts the waits once. The
live reference is the same collectives timed again right after the first ones (``steady_use``);
records measured before that second pass existed use the ``PAUSED_LIVE`` row's first collectives
of the same run (:func:`live_reference`).

Everything that ranks or prints a policy's cost calls :func:`switch_cost` (one step, one rank) or
:func:`steady_switch_cost` (the steady mean over steps, slowest rank): the switch-window benchmark's
rows, :class:`sim.calibrate.switch_window.PolicyResult`, ``timeshare plan``, ``timeshare sim compare`` and
``timeshare sim validate``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


class SwitchCostError(ValueError):
    """A switch cost was asked for without the figures it is made of; the message says which."""


@dataclass(frozen=True)
class SwitchCost:
    """One step's (or a mean step's) switch cost and the window's phases beside it, in seconds."""

    sleep: float
    update_weights: float
    wake_up: float
    #: the first collectives after the wake beyond the same collectives on live groups (lazy NCCL init, bring-up)
    first_use_extra: float

    @property
    def window(self) -> float:
        """The switch window: ``sleep + update_weights + wake_up``."""
        return self.sleep + self.update_weights + self.wake_up

    @property
    def total(self) -> float:
        """The switch cost: the window plus the first-use extra ([Note: the switch cost])."""
        return self.window + self.first_use_extra


def switch_cost(sleep: float, update_weights: float, wake_up: float, first_use: float,
                steady_use: float = 0.0) -> SwitchCost:
    """The switch cost of one step on one rank: its three phases, and the first collectives after its wake
    (``first_use``) against the same collectives on live groups (``steady_use``)."""
    for name, v in (("sleep", sleep), ("update_weights", update_weights), ("wake_up", wake_up),
                    ("first_use", first_use), ("steady_use", steady_use)):
        if v is None or v < 0:
            raise SwitchCostError(f"switch cost: {name} must be a non-negative number of seconds, got {v!r}")
    return SwitchCost(sleep, update_weights, wake_up, max(0.0, first_use - steady_use))


def steady_switch_cost(per_rank: Sequence[Sequence[Any]], warmup: int) -> SwitchCost:
    """The mean over the steps after ``warmup`` of each step's slowest rank (``StepTimes`` rows with ``sleep``,
    ``update_weights``, ``wake_up``, ``first_use_after`` and ``steady_use_after``).

    Each step's figures are those of its rank with the largest switch cost (a rank that waits in its first
    collective for a slower one is counted where it waits), so the phases add up to the total exactly. Raises
    SwitchCostError if a step lacks its first collectives after the wake.
    """
    steps = range(warmup, len(per_rank[0]))
    if not len(steps):
        raise SwitchCostError(f"switch cost: no step after the {warmup} warm-up step(s)")
    slowest = []
    for i in steps:
        costs = []
        for r in per_rank:
            s = r[i]
            if s.first_use_after is None:
                raise SwitchCostError(f"switch cost: step {i} has no timed first collectives after its wake")
            costs.append(switch_cost(s.sleep, s.update_weights, s.wake_up, s.first_use_after, s.steady_use_after or 0.0))
        slowest.append(max(costs, key=lambda c: c.total))
    return SwitchCost(*(statistics.mean(getattr(c, f) for c in slowest)
                        for f in ("sleep", "update_weights", "wake_up", "first_use_extra")))


def live_reference(results: Mapping[str, Mapping[str, Any]], policy: str) -> float | None:
    """What the first collectives after the wake cost on live groups, for ``policy``'s row of a record's results:
    the row's own ``steady_use_after_wake`` where measured, else the ``PAUSED_LIVE`` row's ``first_use_after_wake``
    (its groups stay live), else None."""
    own = results[policy].get("steady_use_after_wake")
    if own is not None:
        return float(own)
    live = results.get("PAUSED_LIVE", {}).get("first_use_after_wake")
    return None if live is None else float(live)


def recorded_switch_cost(results: Mapping[str, Mapping[str, Any]], policy: str) -> SwitchCost | None:
    """The switch cost of ``policy``'s row of a record's measured results (None where the record did not time the
    first collectives after the wake, or has neither live reference; a missing phase counts 0, as ``PAUSED_LIVE``'s
    do in the transcribed table)."""
    row = results[policy]
    first, live = row.get("first_use_after_wake"), live_reference(results, policy)
    if first is None or live is None:
        return None
    return switch_cost(row.get("sleep") or 0.0, row.get("update_weights") or 0.0, row.get("wake_up") or 0.0,
                       float(first), live)


__all__ = ["SwitchCost", "SwitchCostError", "live_reference", "recorded_switch_cost", "steady_switch_cost",
           "switch_cost"]
