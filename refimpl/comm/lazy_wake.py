"""Lazy wake of SUSPEND_PLANNED: groups the wake left down come back at their first use.

Theory of operation
-------------------
With ``GroupPlanRules.wake_groups`` declared, a SUSPEND_PLANNED wake resumes
(or rebuilds) only the groups some rank needs right away; the plan's other
suspended or destroyed groups stay down and the lifecycle is ACTIVE_LAZY. A
group comes back when :meth:`LazyWake.use` names it, right before its first
collective:

1. **One agreement on what is wanted.** Every rank calls ``use(names)`` at the
   same point of its program, naming the groups *it* is about to use (names may
   differ per rank: ``tp0`` on one, ``tp1`` on another). One ``all_reduce(MIN)``
   of ``[not wanted per group]`` gives every rank the union; an unknown name
   fails that step on every rank.
2. **Up as at a wake.** The wanted suspended groups are resumed in one walk
   after the agreed memory preflight, then one canary pass checks all of them
   before any carries data; the wanted destroyed groups are rebuilt (cooldown
   rule). Rows ``ACTIVE_LAZY --USE--> RELOADING --RELOADED(_LAZY)--> ACTIVE(_LAZY)``
   of :data:`refimpl.comm.states.TRANSITIONS`. A canary failure aborts, turns
   preservation off and rebuilds everything, as at any wake.
3. **Refused, never hung.** Until then a collective on a group left down is
   refused by the runtime at once (``GroupSuspendedError`` for a suspended
   communicator, ``GroupError`` for a destroyed group): its peers are not in
   that collective, because nobody resumes a group except inside the agreed walk
   of step 2, which no rank passes before every rank has reached it.
   :meth:`LazyWake.run_on` wraps "use, then run" as one agreed step and turns
   such a refusal into :class:`LazyGroupError` (naming the group and the fix) on
   every rank.

A pause from ACTIVE_LAZY first brings up the left-down groups the weight sync
needs (``GroupPlanRules.sync_groups``; all of them if undeclared), then agrees a
new plan in which each group still down votes the action that took it down and
is not touched again: a group the training step never used costs nothing in
the next switch.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Iterable

from refimpl.comm.group_plan import GroupAction
from refimpl.comm.states import PGEvent, PGState
from refimpl.runtime.base import GroupError

log = logging.getLogger(__name__)


class LazyGroupError(GroupError):
    """A collective used a group the lazy wake left down, without naming it in ``PGLifecycle.use`` first."""


def request_votes(groups: tuple[str, ...], names: Iterable[str] | None) -> list[int]:
    """``[not wanted]`` per role group for the union agreement (``names`` None: every group).

    Raises ValueError naming any name that is not a role group.
    """
    if names is None:
        return [0] * len(groups)
    if isinstance(names, str):
        raise TypeError(f"use() takes a collection of group names, not the string {names!r}")
    wanted = set(names)
    unknown = sorted(wanted - set(groups))
    if unknown:
        raise ValueError(f"use() names groups {unknown} that are not role groups {list(groups)}")
    return [int(g not in wanted) for g in groups]


class LazyWake:
    """The lazy-wake operations of :class:`refimpl.comm.PGLifecycle` (a mixin: it uses the lifecycle's state,
    role groups, plan, canary and transitions; not imported here, so no import cycle)."""

    async def use(self, names: Iterable[str] | None = None) -> PGState:
        """Bring up the groups named here on any rank that a lazy wake left down; every rank calls it at once.

        ``names``: the groups this rank is about to use (None: every group).
        In ACTIVE nothing is down and nothing is agreed. Returns the state
        (ACTIVE once nothing is left down, else ACTIVE_LAZY).
        """
        await self.start()
        self._require("use", {PGState.ACTIVE, PGState.ACTIVE_LAZY})
        if self.state is PGState.ACTIVE:
            request_votes(self.groups, names)  # a typo still fails here, on the rank that made it
            return self.state
        with self.rt.span("lifecycle.use"):
            await self._bring_lazy(names)
        return self.state

    async def run_on(self, names: Iterable[str] | None, fn: Callable[[], Any]) -> Any:
        """:meth:`use` ``names``, then run ``fn`` (sync or async) as one agreed step on every rank.

        A collective in ``fn`` on a group still left down fails every rank with
        :class:`LazyGroupError` naming the group (instead of one rank raising
        and its peers waiting); any other failure fails every rank as usual.
        """
        await self.use(names)
        result, _ = await self.role.step("run_on", lambda: self._lazy_call(fn))
        return result

    # ------------------------------------------------------------------ performing it

    async def _lazy_call(self, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
            return result
        except GroupError as exc:
            clear = self._explain_lazy(exc)
            if clear is not None:
                raise clear from exc
            raise

    def _explain_lazy(self, exc: BaseException) -> LazyGroupError | None:
        """A clear error if ``exc`` came from a collective on a group the lazy wake left down."""
        if not isinstance(exc, GroupError) or isinstance(exc, LazyGroupError):
            return None
        for group, action in self.planned.left_down.items():
            if repr(group) in str(exc):
                how = "suspended" if action is GroupAction.SUSPEND else "destroyed"
                return LazyGroupError(
                    f"rank {self.rt.rank}: a collective on group {group!r}, which the lazy wake left {how} "
                    f"(GroupPlanRules.wake_groups {sorted(self.plan_rules.wake_groups or ())}); name it in "
                    f"PGLifecycle.use() or run_on() on every rank before its first collective, or add it to "
                    f"wake_groups ({exc})"
                )
        return None

    async def _bring_lazy(self, names: Iterable[str] | None) -> None:
        """ACTIVE_LAZY: agree the union of the wanted groups, then bring up those left down (one walk, one canary)."""
        rt = self.rt
        error: Exception | None = None
        votes = [1] * len(self.groups)
        try:
            await rt.point("lifecycle.use")
            votes = request_votes(self.groups, names)
        except Exception as exc:  # noqa: BLE001 - agreed below: every rank fails together
            error = exc
            log.error("rank %d: use(%r) failed: %r", rt.rank, names, exc)
        agreed = await self.role.outcome("use.request", error, votes)
        down = self.planned.left_down
        bring = [g for g, v in zip(self.groups, agreed) if v == 0 and g in down]
        if not bring:
            return
        self.stats.lazy_bring_ups += len(bring)
        suspended = [g for g in bring if down[g] is GroupAction.SUSPEND]
        destroyed = [g for g in bring if down[g] is GroupAction.DESTROY]
        log.info("rank %d: lazy wake brings up %s", rt.rank, bring)
        self._transition(PGEvent.USE)
        if not await self._bring_up_groups(suspended, destroyed):  # everything was aborted and rebuilt, as at any failed wake
            return
        for g in bring:
            del down[g]
        self._transition(PGEvent.RELOADED_LAZY if down else PGEvent.RELOADED)


__all__ = ["LazyGroupError", "LazyWake", "request_votes"]
