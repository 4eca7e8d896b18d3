"""SUSPEND_PLANNED: one plan per group (keep / suspend / destroy), agreed once per pause.

Theory of operation
-------------------
The SUSPEND policy resumes every group for every weight sync, runs a canary
on each and suspends them all again: two suspends and two resumes per group
and RL step where one of each is enough, and a suspend even where a destroy
costs less (a one-rank communicator has no peer to wait for). docs/comm.md
counts them per step and gives their measured cost. SUSPEND_PLANNED does only
what is needed:

* At the pause every rank reads each group's ``ncclCommMemStats`` (the
  preflight of a suspend: a communicator in error fails here, before any
  barrier) and votes an action per group with :func:`choose_action`, plus
  whether its weight sync needs the group. One ``all_reduce(MIN)`` turns the
  votes into one :class:`GroupPlan` on every rank: a group's action is the
  smallest any member voted (KEEP < SUSPEND < DESTROY, so ranks that disagree
  take the cheaper-to-undo choice) and a group is needed by the sync if any
  rank said so.
* The groups the sync does not need get their action at the pause, in one
  ordered walk with one agreement (walk, don't stop: see
  :mod:`refimpl.comm.role_groups`). The sync groups stay live through the
  sync and get theirs right after it, in a second walk. Undeclared (the
  default, ``sync_groups=None``) means the sync may use every group, so all
  are kept through it.
* At wake the suspended groups are resumed in one walk (after the agreed
  memory preflight), one canary step checks all of them before any carries
  real data, and the destroyed ones are rebuilt (cooldown rule). A canary
  failure is handled as for SUSPEND: abort, preservation off, rebuild.
* A collective on a group the plan suspended or destroyed is refused by the
  runtime (``GroupSuspendedError`` / ``GroupError``) at once, never a hang;
  a weight sync that does so fails on every rank with
  :class:`UndeclaredGroupError` naming the group and the fix.

The states and events are rows of :data:`refimpl.comm.states.TRANSITIONS`
(SYNC_READY, PLANNED; PAUSE_PLANNED, APPLY_PLAN, SYNC_GROUPS_UP).
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from refimpl.arguments import ArgumentTypeError, expect, expect_bool, expect_int, expect_names
from refimpl.runtime.base import GroupError

if TYPE_CHECKING:  # pragma: no cover
    from refimpl.comm.role_groups import RoleGroups

log = logging.getLogger(__name__)

MiB = 1 << 20


class GroupAction(enum.IntEnum):
    """What a planned pause does with one group (ordered: the MIN over ranks is the agreed action)."""

    KEEP = 0  #: stays live: negligible NCCL memory, or the rollout uses it
    SUSPEND = 1  #: ncclCommSuspend now, ncclCommResume + canary at wake
    DESTROY = 2  #: destroyed now, rebuilt at wake (deferred port cooldown)


class UndeclaredGroupError(GroupError):
    """The weight sync used a group that the SUSPEND_PLANNED pause suspended or destroyed."""


@dataclass(frozen=True)
class SwitchCosts:
    """Per-communicator costs that decide suspend against destroy (seconds; see :func:`cheaper_to_destroy`).

    A suspend and a resume cost about in proportion to the suspendable bytes
    (``ncclCommMemStats``); a destroy and the re-creation (torch's lazy NCCL
    init at the first collective, counted although it lands outside the
    switch window) cost about the same whatever the size; ``_single`` is a
    communicator of one rank, ``_multi`` one of more. The defaults are the
    simulator's calibrated constants, from records that no validation scores,
    for a runtime with the proxy waker on (its default);
    ``tests/comm/test_switch_costs_records.py`` recomputes them and docs/comm.md
    gives them with their sources. A runtime without the proxy waker waits
    about half a poll period more per destroy: pass ``destroy_s_single`` and
    ``destroy_s_multi`` with that added.
    """

    suspend_s_per_gib: float = 0.736
    resume_s_per_gib: float = 0.519
    destroy_s_single: float = 0.0167
    destroy_s_multi: float = 0.0165
    init_s_single: float = 0.0284
    init_s_multi: float = 0.175

    def __post_init__(self) -> None:
        for name, v in vars(self).items():
            if not (isinstance(v, (int, float)) and v >= 0 and v == v and v != float("inf")):
                raise ValueError(f"SwitchCosts.{name} must be a finite number of seconds >= 0, got {v!r}")

    def keep_cost(self, suspendable: int) -> float:
        """Seconds per step to suspend and resume a communicator holding ``suspendable`` bytes."""
        return suspendable / 2**30 * (self.suspend_s_per_gib + self.resume_s_per_gib)

    def destroy_cost(self, size: int) -> float:
        """Seconds per step to destroy a communicator of ``size`` ranks and create it again at first use."""
        return (self.destroy_s_single + self.init_s_single) if size == 1 else (self.destroy_s_multi + self.init_s_multi)


def cheaper_to_destroy(costs: SwitchCosts | None, size: int, suspendable: int) -> bool:
    """True if destroying and re-creating the communicator costs less per step than suspending and resuming it."""
    return costs is not None and costs.destroy_cost(size) < costs.keep_cost(suspendable)


@dataclass(frozen=True)
class GroupPlanRules:
    """How SUSPEND_PLANNED chooses each group's action (see :func:`choose_action`).

    ``sync_groups``: the groups the weight sync uses on this rank (None: any
    group, so all stay live through the sync). Read by every policy where it is
    empty: a sync that needs none of the role's groups brings none up
    (:meth:`PGLifecycle.weight_sync`). ``keep_live``: groups the
    rollout uses; never suspended. ``destroy``: groups not needed until the
    next training step that should be destroyed rather than suspended.
    ``keep_below_bytes``: a group whose suspendable NCCL memory is at most this
    stays live (nothing worth a barrier to free; a Gloo group or an NCCL group
    whose communicator was never created holds 0). ``destroy_single_rank``:
    destroy NCCL groups of one rank instead of suspending them (no peer to wait
    for, and a fraction of a suspend's time: docs/comm.md; torch creates the
    communicator again lazily at its first collective). ``costs``: destroy
    any group for which :func:`cheaper_to_destroy` says so with these
    :class:`SwitchCosts` (None: never by cost). ``wake_groups``: the groups
    this rank's training needs right at the wake (None: every group, the
    wake brings all back). The others the plan took down stay down after the
    wake (lazy wake, state ACTIVE_LAZY) until :meth:`PGLifecycle.use` names
    them; a group left down and never used is not suspended or destroyed
    again at the next pause.
    """

    sync_groups: frozenset[str] | None = None
    wake_groups: frozenset[str] | None = None
    keep_live: frozenset[str] = frozenset()
    destroy: frozenset[str] = frozenset()
    keep_below_bytes: int = 1 * MiB
    destroy_single_rank: bool = True
    costs: SwitchCosts | None = field(default_factory=SwitchCosts)

    def __post_init__(self) -> None:
        for name in ("sync_groups", "wake_groups", "keep_live", "destroy"):
            v = getattr(self, name)
            if v is None and name in ("sync_groups", "wake_groups"):
                continue
            if isinstance(v, str):
                raise ArgumentTypeError(
                    f"GroupPlanRules.{name} must be a collection of group names, not the string {v!r}")
            object.__setattr__(self, name, frozenset(expect_names(v, "GroupPlanRules(...)", name)))
        expect_int(self.keep_below_bytes, "GroupPlanRules(...)", "keep_below_bytes")
        expect_bool(self.destroy_single_rank, "GroupPlanRules(...)", "destroy_single_rank")
        expect(self.costs, SwitchCosts, "GroupPlanRules(...)", "costs", "a SwitchCosts or None", optional=True)
        both = self.keep_live & self.destroy
        if both:
            raise ValueError(f"GroupPlanRules: groups {sorted(both)} are both in keep_live and destroy; pick one")
        if self.keep_below_bytes < 0:
            raise ValueError(f"GroupPlanRules.keep_below_bytes must be >= 0, got {self.keep_below_bytes}")

    def unknown(self, groups: Iterable[str]) -> list[str]:
        """Names in the rules that are not among ``groups`` (a typo would silently change the plan)."""
        known = set(groups)
        named = set(self.keep_live) | set(self.destroy) | set(self.sync_groups or ()) | set(self.wake_groups or ())
        return sorted(named - known)


@dataclass(frozen=True)
class PlanRow:
    """One row of the per-group choice: the first row whose ``guard`` holds gives the group its ``action``.

    ``down`` / ``up``: what the pause (or the walk after the weight sync) and
    the wake do with a group that got this action.
    """

    guard: str
    action: GroupAction
    down: str
    up: str
    holds: Callable[[GroupPlanRules, str, int, int], bool] = field(repr=False, compare=False)


_DOWN = {GroupAction.KEEP: "nothing", GroupAction.SUSPEND: "ncclCommSuspend (members)",
         GroupAction.DESTROY: "destroy (every rank), cooldown deferred"}
_UP = {GroupAction.KEEP: "nothing", GroupAction.SUSPEND: "ncclCommResume, then the canary pass",
       GroupAction.DESTROY: "rebuild with its original arguments (cooldown rule)"}


def _row(guard: str, action: GroupAction, holds: Callable[[GroupPlanRules, str, int, int], bool]) -> PlanRow:
    return PlanRow(guard, action, _DOWN[action], _UP[action], holds)


#: the per-group choice of SUSPEND_PLANNED, in order (name, size, suspendable bytes of this rank)
PLAN_ROWS: tuple[PlanRow, ...] = (
    _row("declared in keep_live (the rollout uses it)", GroupAction.KEEP,
         lambda r, name, size, mem: name in r.keep_live),
    _row("declared in destroy (not needed until the next training step)", GroupAction.DESTROY,
         lambda r, name, size, mem: name in r.destroy),
    _row("ncclCommMemStats suspendable <= keep_below_bytes (Gloo, never-created or tiny communicator)",
         GroupAction.KEEP, lambda r, name, size, mem: mem <= r.keep_below_bytes),
    _row("one rank and destroy_single_rank (no peer to wait for)", GroupAction.DESTROY,
         lambda r, name, size, mem: size == 1 and r.destroy_single_rank),
    _row("destroy and re-create (with its lazy NCCL init) cheaper than suspend and resume, by costs "
         "(SwitchCosts: suspend + resume in proportion to the bytes)", GroupAction.DESTROY,
         lambda r, name, size, mem: cheaper_to_destroy(r.costs, size, mem)),
    _row("otherwise", GroupAction.SUSPEND, lambda r, name, size, mem: True),
)


def choose_action(rules: GroupPlanRules, name: str, size: int, suspendable: int) -> GroupAction:
    """This rank's vote for one group it is a member of: the action of the first row of :data:`PLAN_ROWS` that holds."""
    for row in PLAN_ROWS:
        if row.holds(rules, name, size, suspendable):
            return row.action
    raise AssertionError("PLAN_ROWS ends with a row that always holds")  # pragma: no cover


def format_plan_rows() -> str:
    """:data:`PLAN_ROWS` as a markdown table (docs/comm.md embeds it; a test checks they match)."""
    lines = ["| guard (first that holds) | action | pause / after the sync | wake |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.guard} | {r.action.name} | {r.down} | {r.up} |" for r in PLAN_ROWS]
    return "\n".join(lines)


def local_votes(
    rules: GroupPlanRules, names: tuple[str, ...], members: Mapping[str, bool], sizes: Mapping[str, int],
    suspendable: Mapping[str, int],
) -> list[int]:
    """``[action, not-needed-by-sync, not-declared-keep-live, not-needed-at-wake]`` per group, for the plan
    agreement (MIN over ranks).

    A non-member votes the largest action and "no" three times, so the members decide.
    """
    actions, unneeded, undeclared, unwoken = [], [], [], []
    for name in names:
        if not members[name]:
            actions.append(int(GroupAction.DESTROY))
            unneeded.append(1)
            undeclared.append(1)
            unwoken.append(1)
            continue
        actions.append(int(choose_action(rules, name, sizes[name], suspendable[name])))
        needed = rules.sync_groups is None or name in rules.sync_groups
        unneeded.append(int(not needed))
        undeclared.append(int(name not in rules.keep_live))
        unwoken.append(int(not (rules.wake_groups is None or name in rules.wake_groups)))
    return actions + unneeded + undeclared + unwoken


@dataclass(frozen=True)
class GroupPlan:
    """The agreed plan (same on every rank): every group's action, which groups the weight sync needs,
    and which kept groups were declared ``keep_live`` (checked by a canary after the pause, as
    PAUSED_LIVE's groups are). ``at_wake``: the groups some rank needs right at the wake (None: all)."""

    actions: Mapping[str, GroupAction]
    for_sync: frozenset[str] = field(default_factory=frozenset)
    kept_live: frozenset[str] = field(default_factory=frozenset)
    at_wake: frozenset[str] | None = None

    @classmethod
    def from_agreed(cls, names: tuple[str, ...], agreed: list[int]) -> "GroupPlan":
        """The plan from the MIN-reduced :func:`local_votes` (3 values per group without the wake lane)."""
        n = len(names)
        if len(agreed) not in (3 * n, 4 * n):
            raise ValueError(f"plan agreement has {len(agreed)} values, expected {4 * n} (or {3 * n} without "
                             f"the wake lane) for {n} groups")
        actions = {name: GroupAction(agreed[i]) for i, name in enumerate(names)}
        for_sync = frozenset(name for i, name in enumerate(names) if agreed[n + i] == 0)
        kept_live = frozenset(name for i, name in enumerate(names)
                              if agreed[2 * n + i] == 0 and actions[name] is GroupAction.KEEP)
        at_wake = None
        if len(agreed) == 4 * n and any(agreed[3 * n + i] for i in range(n)):
            at_wake = frozenset(name for i, name in enumerate(names) if agreed[3 * n + i] == 0)
        return cls(actions, for_sync, kept_live, at_wake)

    def acted(self, *, sync: bool) -> list[str]:
        """Groups (in walk order) that are suspended or destroyed at the pause (``sync=False``) or after the sync."""
        return [g for g, a in self.actions.items() if a is not GroupAction.KEEP and (g in self.for_sync) == sync]

    def counts(self) -> dict[str, int]:
        """How many groups get each action (for logs and benchmarks)."""
        out = {a.name: 0 for a in GroupAction}
        for a in self.actions.values():
            out[a.name] += 1
        return out


class PlannedGroups:
    """The agreed operations of SUSPEND_PLANNED on a role's groups (one rank's side)."""

    def __init__(self, role: "RoleGroups", rules: GroupPlanRules,
                 left_down: Mapping[str, GroupAction] | None = None) -> None:
        self.role = role
        self.rules = rules
        self.plan: GroupPlan | None = None
        #: groups a lazy wake left down (same on every rank), with the action that took them down: a read-only
        #: view of what :class:`refimpl.comm.lazy_wake.LazyWake` owns (they come back at their first use)
        self.left_down: Mapping[str, GroupAction] = left_down if left_down is not None else {}

    async def agree(self) -> GroupPlan:
        """Read every member group's NCCL memory (the suspend preflight), vote, agree on one plan.

        A group a lazy wake left down votes the action that took it down (its
        memory is already released; it is not suspended or destroyed again).
        """
        role, rt = self.role, self.role.rt
        names = role.names
        suspendable: dict[str, int] = {}

        async def facts() -> list[int]:
            for name in names:
                if name in self.left_down:
                    suspendable[name] = role.suspended_bytes.get(name, 0)
                elif role.member(name) and rt.group_live(name):
                    suspendable[name] = rt.comm_memory(name).suspendable  # ncclCommMemStats: fails if in error
                else:
                    suspendable[name] = 0
            members = {n: role.member(n) for n in names}
            sizes = {n: rt.group_size(n) if members[n] else 0 for n in names}
            votes = local_votes(self.rules, names, members, sizes, suspendable)
            for i, name in enumerate(names):
                if name in self.left_down and members[name]:
                    votes[i] = int(self.left_down[name])
            return votes

        error: BaseException | None = None
        votes = [int(GroupAction.DESTROY)] * len(names) + [1] * (3 * len(names))
        try:
            await rt.point("lifecycle.plan")
            votes = await facts()
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - agreed below (an interrupt too): every rank fails together
            error = exc
            log.error("rank %d: planning the pause failed: %r", rt.rank, exc)
        agreed = await role.outcome("plan", error, votes)
        plan = GroupPlan.from_agreed(names, agreed)
        for name, action in plan.actions.items():
            if action is GroupAction.SUSPEND and role.member(name) and name not in self.left_down:
                role.suspended_bytes[name] = suspendable[name]
        self.plan = plan
        log.info("rank %d: planned pause: %s; weight sync keeps %s live", rt.rank, plan.counts(),
                 sorted(plan.for_sync) if len(plan.for_sync) < len(names) else "every group")
        return plan

    async def apply(self, names: list[str], *, preflight: bool = False) -> None:
        """Suspend or destroy ``names`` as planned: one walk over all groups in order, one agreement.

        A destroy is done by every rank that knows the group (members and
        non-members, so generations stay equal); a suspend by the members. The
        port cooldown deadline moves if anything was destroyed. ``preflight``:
        first read the NCCL memory of the groups to suspend in an agreed step
        (a communicator in error fails there, before any barrier); the pause
        needs none, its plan agreement read them.
        """
        plan = self._plan()
        role, rt = self.role, self.role.rt
        todo = set(names)
        to_suspend = [n for n in names if plan.actions[n] is GroupAction.SUSPEND]
        # decided from the agreed plan, not from membership: every rank takes the same agreements
        if preflight and to_suspend:
            async def read() -> None:
                for name in to_suspend:
                    if role.member(name):
                        role.suspended_bytes[name] = rt.comm_memory(name).suspendable

            await role.step("plan.preflight", read)

        destroyed: list[str] = []
        # with parallel_destroy the walk suspends in order and destroys its DESTROY groups all together at its end
        together = [n for n in names if n in todo and plan.actions[n] is not GroupAction.SUSPEND
                    and rt.group_live(n)] if role.config.parallel_destroy else []

        async def one(name: str) -> None:
            if name not in todo:
                return
            await rt.point("lifecycle.plan.group")  # between groups: where a rank may die mid-walk
            if plan.actions[name] is GroupAction.SUSPEND:
                if role.member(name) and not rt.group_suspended(name):
                    await rt.suspend_group(name)
                    role.stats.comm_suspends += 1
            elif name in together:
                return
            elif rt.group_live(name):
                await rt.destroy_group(name)
                role.stats.destroys += 1
                destroyed.append(name)

        if not todo:
            return
        with rt.span("lifecycle.plan.apply"):
            await role.walk("plan.apply", one, destroy_after=together)
        role.stats.destroys += len(together)  # the walk returns only if every rank destroyed them all
        destroyed.extend(together)
        if destroyed or any(plan.actions[n] is GroupAction.DESTROY and n not in self.left_down for n in todo):
            role.cooldown.defer(rt.now())

    def down(self, names: Iterable[str]) -> tuple[list[str], list[str]]:
        """Of ``names``, the groups this plan suspended and those it destroyed (walk order)."""
        plan = self._plan()
        wanted = set(names)
        suspended = [g for g, a in plan.actions.items() if g in wanted and a is GroupAction.SUSPEND]
        destroyed = [g for g, a in plan.actions.items() if g in wanted and a is GroupAction.DESTROY]
        return suspended, destroyed

    def _plan(self) -> GroupPlan:
        if self.plan is None:
            raise RuntimeError("no plan agreed yet: SUSPEND_PLANNED operations need a planned pause first")
        return self.plan

    def explain(self, exc: BaseException) -> UndeclaredGroupError | None:
        """A clear error if ``exc`` came from using a group this plan took down during the weight sync."""
        plan = self.plan
        if plan is None or not isinstance(exc, GroupError):
            return None
        for group in plan.actions:
            if plan.actions[group] is not GroupAction.KEEP and group not in plan.for_sync and repr(group) in str(exc):
                return UndeclaredGroupError(
                    f"rank {self.role.rt.rank}: the weight sync used group {group!r}, which the SUSPEND_PLANNED "
                    f"pause {plan.actions[group].name.lower()}ed because it is not in GroupPlanRules.sync_groups "
                    f"{sorted(self.rules.sync_groups or ())}; add it there (or leave sync_groups=None) ({exc})"
                )
        return None


__all__ = [
    "GroupAction",
    "GroupPlan",
    "GroupPlanRules",
    "PLAN_ROWS",
    "PlanRow",
    "PlannedGroups",
    "SwitchCosts",
    "UndeclaredGroupError",
    "cheaper_to_destroy",
    "choose_action",
    "format_plan_rows",
    "local_votes",
]
