"""Lazy wake of SUSPEND_PLANNED: groups the wake left down come back at their first use.

Theory of operation
-------------------
With ``GroupPlanRules.wake_groups`` declared, a SUSPEND_PLANNED wake resumes
(or rebuilds) only the groups some rank needs right away; the plan's other
suspended or destroyed groups stay down and the lifecycle is ACTIVE_LAZY. A
group comes back when ``PGLifecycle.use`` names it, right before its first
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
4. **A rank that skips ``use()``.** ``use()`` is a collective of the lifecycle
   (every rank calls it, also one that needs nothing brought up), and the
   lifecycle cannot see a rank that does not call it. So the protocol makes a
   skip loud rather than impossible: the skipping rank's collective on a group
   left down is refused at once (step 3); the ranks waiting in ``use()`` fail
   at the agreement timeout with :class:`~refimpl.comm.agreement.AgreementTimeoutError`
   naming the ranks that never reached ``use.request`` (arrival marks, see
   :mod:`refimpl.comm.agreement`), their groups aborted (FAILED); the skipping
   rank's next lifecycle call fails too (a mismatch if it meets the peers'
   ``use``, else an error or timeout of the control group its peers gave up
   on), so every rank that calls the lifecycle again ends FAILED. A rank whose
   program stops at the refusal keeps ACTIVE_LAZY: its program has raised.
   ``run_on`` cannot be half skipped: it is the use and the collective in one
   call.

A pause from ACTIVE_LAZY first brings up the left-down groups the weight sync
needs (``GroupPlanRules.sync_groups``; all of them if undeclared), then agrees a
new plan in which each group still down votes the action that took it down and
is not touched again: a group the training step never used costs nothing in
the next switch.

[Note: the lazy wake as a component] :class:`LazyWake` is one object of the
lifecycle (``PGLifecycle.lazy``) that owns the lazy wake's state, the groups
left down (:attr:`LazyWake.left_down`, the same on every rank); only its methods
change it (:meth:`LazyWake.leave_down` at a wake, :meth:`LazyWake.bring` as
groups come up, :meth:`LazyWake.clear` after a failed canary). Readers (the plan
agreement, which lets a group still down vote the action that took it down)
get a read-only view. What it needs of the lifecycle is declared in
:class:`LazyWakeHost`: the state, one transition, and "bring these groups up as
at a wake".
"""
from __future__ import annotations

import inspect
import logging
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from refimpl.comm.group_plan import GroupAction
from refimpl.comm.lifecycle_config import LifecycleStats
from refimpl.comm.role_groups import RoleGroups
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


class LazyWakeHost(Protocol):
    """What the lazy wake needs from its lifecycle (:class:`refimpl.comm.PGLifecycle` implements it).

    ``state``: the lifecycle's state on this rank. :meth:`transition` applies one
    event of the transition table; :meth:`bring_up_groups` resumes (one walk, one
    canary pass) and rebuilds groups as at a wake, False if the canary failed
    (then everything was aborted and rebuilt, and :meth:`LazyWake.clear` was called).
    """

    state: PGState

    def transition(self, event: PGEvent) -> None:
        """Apply ``event`` (a row of :data:`refimpl.comm.states.TRANSITIONS`) to the state."""
        ...

    async def bring_up_groups(self, suspended: Sequence[str], destroyed: Sequence[str]) -> bool:
        """Resume ``suspended`` and rebuild ``destroyed`` as at a wake; False if the canary failed."""
        ...


class LazyWake:
    """The lazy wake of one lifecycle on one rank: which groups are left down, and bringing them up.

    It owns :attr:`left_down` (same on every rank: set from the agreed plan at
    the wake, shrunk by each agreed bring-up); nothing else writes it.
    ``role``: the role's groups (their agreements); ``stats``: the lifecycle's
    counters; ``wake_groups``: the declared wake groups (for error messages);
    ``host``: the lifecycle (:class:`LazyWakeHost`).
    """

    def __init__(self, role: RoleGroups, stats: LifecycleStats, wake_groups: Iterable[str] | None,
                 host: LazyWakeHost) -> None:
        self.role = role
        self.stats = stats
        self.wake_groups = frozenset(wake_groups or ())
        self.host = host
        self._left_down: dict[str, GroupAction] = {}
        #: a read-only live view of :attr:`_left_down` for readers (the plan agreement, tests)
        self.left_down: Mapping[str, GroupAction] = MappingProxyType(self._left_down)

    # ------------------------------------------------------------------ its state

    def leave_down(self, left: Mapping[str, GroupAction]) -> None:
        """After a wake (agreed plan): ``left`` stays down, with the action that took each group down."""
        self._left_down.clear()
        self._left_down.update(left)

    def clear(self) -> None:
        """Nothing is left down any more (a failed canary aborted and rebuilt every group)."""
        self._left_down.clear()

    # ------------------------------------------------------------------ its operations

    async def use(self, names: Iterable[str] | None) -> PGState:
        """:meth:`PGLifecycle.use` once its state was checked: agree and bring up (ACTIVE: check names only)."""
        host = self.host
        if host.state is PGState.ACTIVE:
            request_votes(self.role.names, names)  # a typo still fails here, on the rank that made it
            return host.state
        with self.role.rt.span("lifecycle.use"):
            await self.bring(names)
        return host.state

    async def run_on(self, names: Iterable[str] | None, fn: Callable[[], Any]) -> Any:
        """:meth:`use` ``names``, then ``fn`` as one agreed step (a refusal on a left-down group: LazyGroupError)."""
        await self.use(names)
        result, _ = await self.role.step("run_on", lambda: self._call(fn))
        return result

    async def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
            return result
        except GroupError as exc:
            clear = self.explain(exc)
            if clear is not None:
                raise clear from exc
            raise

    def explain(self, exc: BaseException) -> LazyGroupError | None:
        """A clear error if ``exc`` came from a collective on a group the lazy wake left down."""
        if not isinstance(exc, GroupError) or isinstance(exc, LazyGroupError):
            return None
        for group, action in self._left_down.items():
            if repr(group) in str(exc):
                how = "suspended" if action is GroupAction.SUSPEND else "destroyed"
                return LazyGroupError(
                    f"rank {self.role.rt.rank}: a collective on group {group!r}, which the lazy wake left {how} "
                    f"(GroupPlanRules.wake_groups {sorted(self.wake_groups)}); name it in "
                    f"PGLifecycle.use() or run_on() on every rank before its first collective, or add it to "
                    f"wake_groups ({exc})"
                )
        return None

    async def bring(self, names: Iterable[str] | None) -> bool:
        """ACTIVE_LAZY: agree the union of the wanted groups, then bring up those left down (one walk, one canary).

        False if their canary failed (agreed: every group was then aborted and rebuilt).
        """
        rt, groups = self.role.rt, self.role.names
        error: BaseException | None = None
        votes = [1] * len(groups)
        try:
            await rt.point("lifecycle.use")
            votes = request_votes(groups, names)
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - agreed below (an interrupt too): every rank fails together
            error = exc
            log.error("rank %d: use(%r) failed: %r", rt.rank, names, exc)
        agreed = await self.role.outcome("use.request", error, votes)
        down = self._left_down
        bring = [g for g, v in zip(groups, agreed) if v == 0 and g in down]
        if not bring:
            return True
        self.stats.lazy_bring_ups += len(bring)
        suspended = [g for g in bring if down[g] is GroupAction.SUSPEND]
        destroyed = [g for g in bring if down[g] is GroupAction.DESTROY]
        log.info("rank %d: lazy wake brings up %s", rt.rank, bring)
        self.host.transition(PGEvent.USE)
        if not await self.host.bring_up_groups(suspended, destroyed):  # all aborted and rebuilt, as at a failed wake
            return False
        for g in bring:
            del down[g]
        self.host.transition(PGEvent.RELOADED_LAZY if down else PGEvent.RELOADED)
        return True


__all__ = ["LazyGroupError", "LazyWake", "LazyWakeHost", "request_votes"]
