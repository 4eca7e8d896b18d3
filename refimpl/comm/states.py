"""States, events and the transition table of the process-group lifecycle, as data.

Theory of operation
-------------------
A role's process groups (TP, DP, CP, EP ... of the trainer) go through one cycle
per RL step: train (ACTIVE) -> pause while the rollout engine takes the GPU ->
weight sync (needs the groups) -> rollout -> resume for training. Four
policies decide what "pause" does with the groups:

* ``DESTROY``: the baseline of the Relax report. Destroy the groups and wait
  2 s inline for the sockets' ports to leave TIME_WAIT; rebuild them for the
  weight sync and destroy them again (another 2 s); rebuild for training.
* ``DESTROY_DEFERRED``: the same, but the 2 s become a deadline; a rebuild
  waits only for what is left of it, usually nothing after a rollout.
* ``PAUSED_LIVE``: keep the groups alive through the pause (their NCCL memory
  stays allocated); a canary collective checks them afterwards.
* ``SUSPEND``: keep the groups, release their NCCL memory with
  ``ncclCommSuspend`` and take it back with ``ncclCommResume`` when needed.
* ``SUSPEND_PLANNED``: a plan per group, agreed at the pause
  (:mod:`refimpl.comm.group_plan`): keep live the groups whose NCCL memory is
  negligible or that the rollout uses, destroy the one-rank groups (cheaper to
  destroy than to suspend) and those declared unneeded until training, suspend
  the rest. Groups the weight sync needs stay live through it (SYNC_READY) and
  get their plan afterwards (PLANNED); each group is suspended once and
  resumed once per RL step, with one canary pass at wake. With
  ``GroupPlanRules.wake_groups`` declared, the wake brings back only those
  (ACTIVE_LAZY); every other group stays down until ``PGLifecycle.use`` names
  it (its resume and canary then run right before its first collective), and
  a group never used stays down through the next pause, costing nothing.

The two keeping policies are only taken when every rank agrees they are
possible (gates pass, preservation is "ready" after one good weight sync, it
was not switched off by an earlier failure); otherwise the pause destroys the
groups with a deferred cooldown. Any failure ends in FAILED after the groups
are aborted. RELOADING is transient: the groups are being resumed or rebuilt.

The table below is the single source of truth: :func:`next_state` looks
transitions up in it, :func:`format_table` prints it and :func:`mermaid` draws
it (``docs/comm.md`` embeds that drawing). Beside it, :data:`OPERATIONS` says in
which states each public operation of the lifecycle may be called;
:func:`allowed_states` is the one check every operation runs first, and
:func:`format_operations` prints it for the docs. Guards and actions are written here
as text for people; the code that *decides* them is
:mod:`refimpl.comm.decisions` and the code that *performs* them is
:class:`refimpl.comm.PGLifecycle`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class PGState(enum.Enum):
    """Where a role's process groups are."""

    ACTIVE = "active"  #: groups live and usable; training runs
    PAUSED_LIVE = "paused_live"  #: trainer memory paused, groups live (NCCL memory kept)
    SUSPENDED = "suspended"  #: groups live, NCCL memory released (ncclCommSuspend)
    DESTROYED = "destroyed"  #: groups destroyed; specs kept for a rebuild
    RELOADING = "reloading"  #: transient: groups being resumed or rebuilt
    SYNC_READY = "sync_ready"  #: planned pause: weight-sync groups live, the others as planned
    PLANNED = "planned"  #: every group as its plan says: kept live, suspended or destroyed
    ACTIVE_LAZY = "active_lazy"  #: training runs; groups the lazy wake left down come back at their first use
    FAILED = "failed"  #: a failure aborted the groups; terminal


class PGEvent(enum.Enum):
    """What moves the lifecycle from one state to another."""

    PAUSE_LIVE = "pause_live"
    SUSPEND = "suspend"
    DESTROY = "destroy"
    CANARY_FAILED = "canary_failed"
    RESUME = "resume"
    RELOAD = "reload"
    RELOADED = "reloaded"
    PAUSE_PLANNED = "pause_planned"
    APPLY_PLAN = "apply_plan"
    SYNC_GROUPS_UP = "sync_groups_up"
    RELOADED_LAZY = "reloaded_lazy"
    USE = "use"
    FAULT = "fault"


class PGPolicy(enum.Enum):
    """What a pause does with the role's groups (see the module docstring)."""

    DESTROY = "destroy"
    DESTROY_DEFERRED = "destroy_deferred"
    PAUSED_LIVE = "paused_live"
    SUSPEND = "suspend"
    SUSPEND_PLANNED = "suspend_planned"

    @classmethod
    def _missing_(cls, value: object) -> "PGPolicy | None":
        # one spelling everywhere: the CLI's and scenarios' lower-case names, the enum's names, dashes or underscores
        if isinstance(value, str):
            key = value.strip().lower().replace("-", "_")
            for member in cls:
                if member.value == key:
                    return member
        return None

    @classmethod
    def parse(cls, value: "str | PGPolicy") -> "PGPolicy":
        """A policy from ``"suspend"``, ``"SUSPEND"``, ``"destroy-deferred"`` or a member; ValueError lists the names."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown process-group policy {value!r}; expected one of "
                             f"{[m.value for m in cls]} (any case)") from None

    @property
    def preserves(self) -> bool:
        """True for the policies that keep the groups through a pause."""
        return self in (PGPolicy.PAUSED_LIVE, PGPolicy.SUSPEND, PGPolicy.SUSPEND_PLANNED)

    @property
    def suspends(self) -> bool:
        """True for the policies that call ``ncclCommSuspend`` (they need NCCL >= 2.29.7)."""
        return self in (PGPolicy.SUSPEND, PGPolicy.SUSPEND_PLANNED)

    @property
    def code(self) -> int:
        """A small integer naming the policy, so ranks can agree on it with a MIN/MAX reduction."""
        return list(PGPolicy).index(self)

    @classmethod
    def from_code(cls, code: int) -> "PGPolicy":
        """The policy whose :attr:`code` is ``code``."""
        return list(cls)[code]


@dataclass(frozen=True)
class Transition:
    """One row of the table: in ``source``, ``event`` leads to ``target``.

    ``guard`` says when the event is taken, ``action`` what is done on the way.
    """

    source: PGState
    event: PGEvent
    target: PGState
    guard: str
    action: str


_S, _E = PGState, PGEvent

TRANSITIONS: tuple[Transition, ...] = (
    Transition(_S.ACTIVE, _E.PAUSE_LIVE, _S.PAUSED_LIVE,
               "policy PAUSED_LIVE; gates pass and preservation ready on every rank (agreed)",
               "keep groups; pause trainer memory; canary on each group"),
    Transition(_S.ACTIVE, _E.SUSPEND, _S.SUSPENDED,
               "policy SUSPEND; gates pass and preservation ready on every rank (agreed)",
               "ncclCommSuspend each group in name order, agreed per group"),
    Transition(_S.ACTIVE, _E.DESTROY, _S.DESTROYED,
               "policy DESTROY or DESTROY_DEFERRED, or preservation not agreed",
               "destroy each group; DESTROY waits the cooldown inline, others defer it"),
    Transition(_S.PAUSED_LIVE, _E.CANARY_FAILED, _S.DESTROYED,
               "canary wrong or late on some rank (agreed)",
               "abort groups at once; preservation off for the process"),
    Transition(_S.PAUSED_LIVE, _E.RESUME, _S.ACTIVE,
               "always", "nothing: the groups are live"),
    Transition(_S.SUSPENDED, _E.RELOAD, _S.RELOADING,
               "groups needed (weight sync or training)",
               "ncclCommResume each group in name order, agreed per group; canary"),
    Transition(_S.DESTROYED, _E.RELOAD, _S.RELOADING,
               "groups needed (weight sync or training)",
               "wait what is left of the cooldown; rebuild each group with its original "
               "arguments under the next generation's store prefix, agreed per group"),
    Transition(_S.RELOADING, _E.CANARY_FAILED, _S.DESTROYED,
               "canary after resume wrong or late on some rank (agreed)",
               "abort groups; preservation off for the process; a rebuild follows"),
    Transition(_S.RELOADING, _E.RELOADED, _S.ACTIVE,
               "every group up on every rank (agreed)", "none"),
    Transition(_S.ACTIVE, _E.PAUSE_PLANNED, _S.SYNC_READY,
               "policy SUSPEND_PLANNED; gates pass and preservation ready on every rank (agreed)",
               "agree one plan per group (group_plan.PLAN_ROWS: keep / suspend / destroy, from ncclCommMemStats "
               "and declared use) "
               "and which groups the weight sync needs; suspend or destroy the others in one ordered walk, "
               "one agreement"),
    Transition(_S.SYNC_READY, _E.CANARY_FAILED, _S.DESTROYED,
               "canary after the pause on the groups declared keep_live wrong or late on some rank (agreed)",
               "abort groups at once; preservation off for the process"),
    Transition(_S.SYNC_READY, _E.APPLY_PLAN, _S.PLANNED,
               "the weight sync succeeded on every rank (agreed)",
               "suspend or destroy the weight-sync groups as planned, one ordered walk, one agreement"),
    Transition(_S.SYNC_READY, _E.RELOAD, _S.RELOADING,
               "resume without a weight sync",
               "resume the planned-suspended groups (one walk); one canary pass over them; rebuild the destroyed"),
    Transition(_S.PLANNED, _E.RELOAD, _S.RELOADING,
               "groups needed (training, or another weight sync)",
               "resume the needed suspended groups (agreed memory preflight, one walk); one canary pass over "
               "them; rebuild the needed destroyed groups (cooldown rule)"),
    Transition(_S.RELOADING, _E.SYNC_GROUPS_UP, _S.SYNC_READY,
               "a weight sync from PLANNED: its groups up and their canary right on every rank (agreed)",
               "none"),
    Transition(_S.RELOADING, _E.RELOADED_LAZY, _S.ACTIVE_LAZY,
               "a wake with GroupPlanRules.wake_groups: those groups up and their canary right on every rank, "
               "the others the plan took down left down (agreed)",
               "none: a group left down comes back at its first use (USE); a collective on it is refused at once"),
    Transition(_S.ACTIVE_LAZY, _E.USE, _S.RELOADING,
               "use() / run_on(), a weight sync or a pause names a group left down, on some rank (agreed union of "
               "the names)",
               "resume the named suspended groups (agreed memory preflight, one walk) and one canary pass over them "
               "before any carries data; rebuild the named destroyed groups (cooldown rule)"),
    Transition(_S.ACTIVE_LAZY, _E.PAUSE_PLANNED, _S.SYNC_READY,
               "policy SUSPEND_PLANNED, preservation agreed, after the weight sync's groups left down came up (USE)",
               "agree the plan as from ACTIVE; groups still down vote the action that took them down and are not "
               "touched again (no suspend, no destroy)"),
) + tuple(
    Transition(s, _E.FAULT, _S.FAILED,
               "an exception or agreement timeout on any rank",
               "abort groups without delay; preservation off for the process; re-raise")
    for s in PGState if s is not _S.FAILED
)


@dataclass(frozen=True)
class Operation:
    """A public operation of the lifecycle and the states it may be called in (see :data:`OPERATIONS`).

    ``does``: what it does from those states, for people (the code that does it
    is :class:`refimpl.comm.PGLifecycle`).
    """

    name: str
    allowed: frozenset[PGState]
    does: str


OPERATIONS: tuple[Operation, ...] = (
    Operation("pause", frozenset({_S.ACTIVE, _S.ACTIVE_LAZY}),
              "decide and agree keep / suspend / destroy / plan; from ACTIVE_LAZY the sync's groups come up first"),
    Operation("weight_sync", frozenset({_S.ACTIVE, _S.PAUSED_LIVE, _S.SUSPENDED, _S.DESTROYED, _S.SYNC_READY,
                                        _S.PLANNED, _S.ACTIVE_LAZY}),
              "bring the sync's groups up (RELOADING), run the sync, return to the paused state"),
    Operation("resume", frozenset({_S.PAUSED_LIVE, _S.SUSPENDED, _S.DESTROYED, _S.SYNC_READY, _S.PLANNED,
                                   _S.ACTIVE_LAZY}),
              "bring the groups back for training (ACTIVE, or ACTIVE_LAZY with wake_groups)"),
    Operation("use", frozenset({_S.ACTIVE, _S.ACTIVE_LAZY}),
              "agree the union of the named groups; bring up those a lazy wake left down (nothing in ACTIVE)"),
)
"""Where each public operation may be called; every other state (FAILED included) refuses it."""

_OPERATIONS: dict[str, Operation] = {o.name: o for o in OPERATIONS}


def allowed_states(operation: str) -> frozenset[PGState]:
    """The states in which ``operation`` (a name in :data:`OPERATIONS`) may be called; KeyError if unknown."""
    try:
        return _OPERATIONS[operation].allowed
    except KeyError:
        raise KeyError(f"no operation {operation!r} in OPERATIONS (known: {sorted(_OPERATIONS)})") from None


def format_operations() -> str:
    """:data:`OPERATIONS` as a markdown table (docs/comm.md embeds it; a test checks they match)."""
    order = [s for s in PGState]
    lines = ["| operation | allowed in | what it does |", "| --- | --- | --- |"]
    for o in OPERATIONS:
        states = ", ".join(f"`{s.name}`" for s in order if s in o.allowed)
        lines.append(f"| `{o.name}()` | {states} | {o.does} |")
    return "\n".join(lines)


class InvalidTransitionError(RuntimeError):
    """An event was applied in a state where the table has no row for it (a protocol bug)."""


_TABLE: dict[tuple[PGState, PGEvent], Transition] = {(t.source, t.event): t for t in TRANSITIONS}
if len(_TABLE) != len(TRANSITIONS):  # pragma: no cover - guards edits of the table above
    raise AssertionError("duplicate (state, event) rows in TRANSITIONS")


def transition_for(state: PGState, event: PGEvent) -> Transition:
    """The table row for ``event`` in ``state``; raises :class:`InvalidTransitionError` if none."""
    try:
        return _TABLE[(state, event)]
    except KeyError:
        allowed = sorted(e.name for (s, e) in _TABLE if s is state)
        raise InvalidTransitionError(
            f"event {event.name} is not allowed in state {state.name} (allowed: {', '.join(allowed) or 'none'})"
        ) from None


def next_state(state: PGState, event: PGEvent) -> PGState:
    """The state ``event`` leads to from ``state``."""
    return transition_for(state, event).target


def events_from(state: PGState) -> list[PGEvent]:
    """Events the table allows in ``state``."""
    return [t.event for t in TRANSITIONS if t.source is state]


def format_table() -> str:
    """The table as aligned text, one row per line."""
    rows = [("from", "event", "to", "guard", "action")]
    rows += [(t.source.name, t.event.name, t.target.name, t.guard, t.action) for t in TRANSITIONS]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + f"  | {r[3]} | {r[4]}")
    return "\n".join(lines)


def mermaid(*, include_fault: bool = False) -> str:
    """A mermaid ``stateDiagram-v2`` of the table (FAULT rows folded into one note unless asked)."""
    lines = ["stateDiagram-v2", "    [*] --> ACTIVE"]
    for t in TRANSITIONS:
        if t.event is PGEvent.FAULT and not include_fault:
            continue
        lines.append(f"    {t.source.name} --> {t.target.name}: {t.event.name}")
    if not include_fault:
        lines.append("    note right of FAILED: FAULT from every other state (exception or agreement timeout)")
    lines.append("    FAILED --> [*]")
    return "\n".join(lines)


__all__ = [
    "InvalidTransitionError",
    "OPERATIONS",
    "Operation",
    "allowed_states",
    "PGEvent",
    "PGPolicy",
    "PGState",
    "TRANSITIONS",
    "Transition",
    "events_from",
    "format_operations",
    "format_table",
    "mermaid",
    "next_state",
    "transition_for",
]

