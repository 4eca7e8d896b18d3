"""PGLifecycle: a role's process groups through pause, weight sync and resume, agreed by every rank.

Theory of operation
-------------------
The lifecycle owns a role's groups (by name, walked in sorted order on every
rank) and a Gloo control group it never destroys. Its three operations follow
the RL step (see :mod:`refimpl.comm.states` for the states and the table):

* :meth:`PGLifecycle.pause` before the rollout engine takes the GPU, its
  stages as methods in order: decide (policy, gates, two-phase switch) and
  agree (:meth:`~PGLifecycle._decide_pause`); bring up what a lazy wake left
  down (:meth:`~PGLifecycle._bring_up_left_down`); keep the groups
  (PAUSED_LIVE), suspend them (SUSPENDED), apply a plan per group
  (SYNC_READY) or destroy them (DESTROYED) (:meth:`~PGLifecycle._take_down`);
  run the caller's memory release; check the groups kept live with a canary
  (:meth:`~PGLifecycle._check_kept_live`). docs/design.md, "The walk of a
  pause", follows it file by file.
* :meth:`PGLifecycle.weight_sync` runs the caller's sync function with the
  groups up (resumed or rebuilt first if needed, transient RELOADING), then
  returns them to the paused state. The first sync that succeeds on every rank
  after an eligible pause arms preservation (phase two).
* :meth:`PGLifecycle.resume` brings the groups back for training (ACTIVE).

Rules that keep every rank in step:

1. Every branch is agreed: the pause decision, the caller's functions, the
   canary and each walk over the groups (suspend, resume, destroy, rebuild)
   end with one ``all_reduce(MIN)`` on the control group of ``[succeeded,
   first failing rank, votes...]``. Walks that synchronise ranks inside NCCL
   are preceded by an agreed preflight and never stop at a local failure (see
   :mod:`refimpl.comm.role_groups`).
2. Every rank runs the same sequence of agreements: loops go over all role
   groups on every rank; a rank that is not a member of a group does nothing
   for it but still votes. Each agreement carries its point, sequence
   number and scope (this lifecycle's role, named by its groups), so ranks at
   different agreements, or in another role's lifecycle of the process, fail
   together with :class:`~refimpl.comm.agreement.AgreementMismatchError` (see
   :mod:`refimpl.comm.agreement`), and no group is created before an agreement
   of its operation; decisions that change what ranks do next
   (suspending again after a sync) are voted, never read from a per-process flag.
3. Any exception (an interrupt too: ``KeyboardInterrupt``, a cancelled call), on
   any rank, ends the same way everywhere: abort the role's
   groups without delay, turn preservation off for the life of the process,
   state FAILED, re-raise (the failing rank its own error, the others
   :class:`PeerFailedError`). A rank that never arrives makes the others fail
   with :class:`AgreementTimeoutError` within ``agree_timeout_s``.
4. A canary failure is not an exception: the groups are aborted, preservation
   is turned off, the state becomes DESTROYED and the lifecycle carries on by
   rebuilding when groups are needed.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import weakref
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

from refimpl.comm.agreement import ControlGroup
from refimpl.comm.blocking import BlockingPGLifecycle
from refimpl.comm.cooldown import PortCooldown
from refimpl.comm.decisions import (
    Preservation,
    after_gates,
    after_good_sync,
    disabled,
    inline_cooldown,
    local_vote,
    needs_bring_up,
    pause_event,
)
from refimpl.comm.errors import (
    LifecycleError,
    LifecycleFailedError,
    LifecycleStateError,
    PeerFailedError,
    PolicyMismatchError,
    ResumeMemoryError,
)
from refimpl.comm.gates import Gate, GateContext, failing_gates, unique_names
from refimpl.comm.group_plan import GroupAction, GroupPlan, GroupPlanRules, PlannedGroups
from refimpl.comm.lazy_wake import LazyWake
from refimpl.comm.lifecycle_arguments import check_lifecycle_arguments
from refimpl.comm.lifecycle_config import LifecycleConfig, LifecycleStats
from refimpl.comm.role_groups import RoleGroups
from refimpl.comm.states import PGEvent, PGPolicy, PGState, allowed_states, transition_for
from refimpl.runtime.base import CommMemory, GroupError, GroupSpec, Runtime

log = logging.getLogger(__name__)


# Preservation is switched off "for the life of the process": keyed by runtime, because the
# simulator runs every rank in one process, each with its own runtime.
_DISABLED: "weakref.WeakKeyDictionary[Runtime, str]" = weakref.WeakKeyDictionary()


def preservation_disabled_reason(rt: Runtime) -> str | None:
    """Why preservation was turned off on this runtime's process, or None."""
    return _DISABLED.get(rt)


# The lifecycle managing each group of a runtime: two lifecycles of one group would destroy and rebuild it under each
# other, and would share one scope of agreements (refimpl.comm.agreement).
_MANAGED: "weakref.WeakKeyDictionary[Runtime, dict[str, weakref.ref[PGLifecycle]]]" = weakref.WeakKeyDictionary()


def _claim(rt: Runtime, lifecycle: "PGLifecycle") -> None:
    """Record ``lifecycle`` as the manager of its groups on ``rt``; ValueError if a live one already manages one."""
    managed = _MANAGED.setdefault(rt, {})
    for name in lifecycle.groups:
        ref = managed.get(name)
        other = ref() if ref is not None else None
        if other is not None and other is not lifecycle and other.state is not PGState.FAILED:
            raise ValueError(
                f"group {name!r} is already managed by another PGLifecycle on this runtime (groups "
                f"{list(other.groups)}, {other.state.name}); one lifecycle per role: pass each group to one of them"
            )
    for name in lifecycle.groups:
        managed[name] = weakref.ref(lifecycle)


async def _call(fn: Callable[[], Any] | None) -> Any:
    if fn is None:
        return None
    result = fn()
    if inspect.isawaitable(result):
        result = await result
    return result


class PGLifecycle:
    """A role's process groups, driven through pause / weight sync / resume on every rank at once.

    ``groups``: the role's groups, as names the runtime knows or as
    :class:`GroupSpec` s to create in :meth:`start`. ``resident``: groups the
    lifecycle must never touch (cross-role weight-update groups), checked to be
    disjoint. ``gates`` / ``facts``: static eligibility gates and what they look at.
    ``plan``: how SUSPEND_PLANNED chooses each group's action and which groups
    the weight sync needs (:class:`refimpl.comm.group_plan.GroupPlanRules`); with its
    ``wake_groups`` the wake leaves the others down until :meth:`use` names them
    (:attr:`lazy`, a :class:`refimpl.comm.lazy_wake.LazyWake`). Each operation
    first checks the state against :data:`refimpl.comm.states.OPERATIONS`.
    """

    def __init__(
        self,
        rt: Runtime,
        groups: Iterable[GroupSpec | str],
        *,
        config: LifecycleConfig | None = None,
        gates: Sequence[Gate] = (),
        facts: Mapping[str, Any] | None = None,
        resident: Iterable[str] = (),
        plan: GroupPlanRules | None = None,
    ) -> None:
        groups, resident = check_lifecycle_arguments(rt, groups, config, gates, facts, resident, plan)
        self.rt = rt
        self.config = config or LifecycleConfig()
        self._given: dict[str, GroupSpec | None] = {}
        for g in groups:
            name = g.name if isinstance(g, GroupSpec) else g
            if name in self._given:
                raise ValueError(f"group {name!r} listed twice")
            self._given[name] = g if isinstance(g, GroupSpec) else None
        self.groups: tuple[str, ...] = tuple(sorted(self._given))
        self.resident = frozenset(resident)
        clash = self.resident & set(self.groups)
        if clash:
            raise ValueError(f"groups {sorted(clash)} are both role groups and resident; resident groups are never touched")
        if self.config.control_group in self._given or self.config.control_group in self.resident:
            raise ValueError(f"{self.config.control_group!r} is the control group; it cannot be a role or resident group")
        unique_names(gates)
        self.gates = tuple(gates)
        self.facts = dict(facts or {})
        # agreements scoped by the role (its group names, the same on every rank): another role's lifecycle met on a
        # shared control group, or paired with it by creation order, is a mismatch on every rank
        self.control = ControlGroup(self.config.control_group, self.config.agree_timeout_s,
                                    scope=f"the lifecycle of groups {list(self.groups)}")
        self.cooldown = PortCooldown(self.config.cooldown_s)
        self.state = PGState.ACTIVE
        self.history: list[tuple[float, PGState, PGEvent, PGState]] = []
        self.stats = LifecycleStats()
        self.failure: BaseException | None = None
        self._preservation = Preservation()
        #: the thread running a public operation and how deeply it nests there (see :meth:`_operation`)
        self._running: tuple[int, int] | None = None
        self._running_lock = threading.Lock()
        self._pause_policy: PGPolicy = self.config.policy
        self._started = False
        self.role = RoleGroups(rt, self.groups, self.control, self.config, self.stats, self.cooldown, on_failure=self)
        self.plan_rules = plan or GroupPlanRules()
        unknown = self.plan_rules.unknown(self.groups)
        if unknown:
            raise ValueError(f"GroupPlanRules name groups {unknown} that are not role groups {list(self.groups)}")
        #: the lazy wake: the groups a wake left down and their bring-up (see refimpl.comm.lazy_wake)
        self.lazy = LazyWake(self.role, self.stats, self.plan_rules.wake_groups, host=self)
        #: SUSPEND_PLANNED's agreed per-group plan and its walks (see refimpl.comm.group_plan)
        self.planned = PlannedGroups(self.role, self.plan_rules, left_down=self.lazy.left_down)
        _claim(rt, self)

    # ------------------------------------------------------------------ facts

    @property
    def preservation(self) -> Preservation:
        """The two-phase switch on this rank (disabled if the process turned it off)."""
        reason = preservation_disabled_reason(self.rt)
        if reason and self._preservation.disabled is None:
            self._preservation = disabled(self._preservation, reason)
        return self._preservation

    def comm_memory(self) -> CommMemory:
        """NCCL memory the role's live groups hold on this rank (runtime's view)."""
        return self.role.comm_memory()

    @property
    def sync(self) -> "BlockingPGLifecycle":
        """The synchronous facade (TorchRuntime): same operations, driven with ``runtime.run``."""
        return BlockingPGLifecycle(self)

    # ------------------------------------------------------------------ public operations

    async def start(self) -> None:
        """Create the control group, agree with every rank, then create any role group given as a spec.

        The agreement checks that every rank manages the same groups (the lifecycle's scope,
        :mod:`refimpl.comm.agreement`) and that it is in this lifecycle, not another role's, before
        any group is created ([Note: no creation before an agreement] in :mod:`refimpl.comm.role_groups`).
        A failed agreement fails every rank (FAILED).
        """
        if self._started:
            return
        if self.state is PGState.FAILED:
            self._require("start")
        await self.control.ensure(self.rt)
        async with self._operation("start"):
            await self._start_agreed()
        self._started = True

    async def _start_agreed(self) -> None:
        """:meth:`start`'s agreement (same groups, in this lifecycle, values combined), then its agreed creations."""
        error: BaseException | None = None
        rank = self.rt.rank
        create: list[str] = []
        try:
            missing = [n for n in self.groups if not self._known(n) and self._given[n] is None]
            if missing:
                raise GroupError(f"rank {rank}: groups {missing} are unknown to the runtime; pass their GroupSpecs "
                                 "so the lifecycle creates them")
            create = [n for n in self.groups if not self._known(n)]
        except Exception as exc:  # noqa: BLE001 - agreed below: every rank fails together
            error = exc
        low_rank, neg_high_rank, none_to_create = await self.role.outcome("start", error, [rank, -rank, int(not create)])
        if (low_rank, -neg_high_rank) != (0, self.rt.world_size - 1):
            raise LifecycleError(
                f"rank {rank}: an all_reduce(MIN) of the ranks on control group {self.control.name!r} gave "
                f"[{low_rank}, {-neg_high_rank}], not [0, {self.rt.world_size - 1}]: the runtime does not combine "
                "values, so ranks cannot agree (in the simulator, a payload='meta' world has meta tensors that carry no data "
                "and its collectives move no bytes; the lifecycle needs host values combined)"
            )
        if none_to_create:
            return

        async def one(name: str) -> None:  # every rank walks every group, in order (group creation is collective)
            spec = self._given[name]
            if spec is not None and not self._known(name):
                await self.rt.new_group(spec)

        await self.role.walk("create", one)

    async def agree(self, flag: bool) -> bool:
        """True on every rank iff every rank passed True (``all_reduce(MIN)`` on the control group)."""
        await self.start()
        return await self.control.agree(self.rt, flag, "user")

    async def pause(self, release_memory: Callable[[], Any] | None = None, *, policy: PGPolicy | None = None) -> PGState:
        """Leave ACTIVE before the rollout: keep, suspend or destroy the groups, then release trainer memory.

        ``release_memory`` (sync or async callable) pauses/offloads the trainer's
        own memory; with PAUSED_LIVE the canary runs after it. Returns the new state.
        Its stages, in order, each agreed by every rank where it acts:
        :meth:`_decide_pause`, :meth:`_bring_up_left_down`, :meth:`_take_down`,
        the caller's ``release_memory``, :meth:`_check_kept_live`.
        """
        await self.start()
        self._require("pause")
        policy = policy or self.config.policy
        async with self._operation("pause", span="lifecycle.pause"):
            self.stats.pauses += 1
            event = await self._decide_pause(policy)
            event = await self._bring_up_left_down(event)
            plan = await self._take_down(event, policy)
            await self.role.step("release_memory", lambda: _call(release_memory))
            await self._check_kept_live(event, plan)
            self._pause_policy = policy
        return self.state

    async def _decide_pause(self, policy: PGPolicy) -> PGEvent:
        """Pause stage 1: this rank's gates and vote, agreed with every rank into the event the pause takes.

        Ranks that asked for different policies fail together (:class:`PolicyMismatchError`,
        after the fallback); the first pause whose gates pass everywhere makes
        preservation eligible (phase one of :mod:`refimpl.comm.decisions`).
        """
        rt = self.rt
        failing: list[str] = []
        vote = False
        error: BaseException | None = None
        try:
            await rt.point("lifecycle.pause.decide")
            if policy.preserves:
                failing = failing_gates(self.gates, GateContext(policy, self.groups, self.facts, rt.rank))
                if failing:
                    log.warning("rank %d: preservation gates failed: %s", rt.rank, ", ".join(failing))
            vote = local_vote(policy, failing, self.preservation, two_phase=self.config.two_phase)
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - agreed below (an interrupt too), so every rank fails together
            error = exc
        lo, neg_hi, gates_all, vote_all = await self.role.outcome(
            "pause.decide", error, [policy.code, -policy.code, int(not failing), int(vote)]
        )
        if lo != -neg_hi:
            err = PolicyMismatchError(
                f"rank {rt.rank}: ranks asked for different pause policies ({PGPolicy.from_code(lo).name} to "
                f"{PGPolicy.from_code(-neg_hi).name}); every rank must pause with the same policy"
            )
            await self.fall_back("pause.decide", err)
            raise err
        if policy.preserves:
            self._preservation = after_gates(self.preservation, bool(gates_all))
        if vote and not vote_all:
            log.warning("rank %d voted to keep the groups but a peer did not; all ranks destroy them", rt.rank)
        return pause_event(policy, bool(vote_all))

    async def _bring_up_left_down(self, event: PGEvent) -> PGEvent:
        """Pause stage 2 (from ACTIVE_LAZY only): the groups a lazy wake left down come up before they are taken
        down again: the sync's groups if the pause follows the plan, else all. A failed canary of that bring-up
        (agreed) turns the pause into a DESTROY."""
        if self.state is not PGState.ACTIVE_LAZY:
            return event
        if not await self.lazy.bring(self.plan_rules.sync_groups if event is PGEvent.PAUSE_PLANNED else None):
            return PGEvent.DESTROY
        return event

    async def _take_down(self, event: PGEvent, policy: PGPolicy) -> GroupPlan | None:
        """Pause stage 3: keep the groups (PAUSE_LIVE), suspend them all (SUSPEND), agree and apply a plan per group
        (PAUSE_PLANNED; the plan is returned) or destroy them all (DESTROY), then take the event's transition."""
        plan = None
        if event is PGEvent.SUSPEND:
            await self.role.suspend_all()
        elif event is PGEvent.PAUSE_PLANNED:
            plan = await self.planned.agree()
            await self.planned.apply(plan.acted(sync=False))
        elif event is PGEvent.DESTROY:
            await self.role.destroy_all(inline_wait=inline_cooldown(policy))
        # PAUSE_LIVE: the groups stay as they are
        self.transition(event)
        return plan

    async def _check_kept_live(self, event: PGEvent, plan: GroupPlan | None) -> None:
        """Pause stage 5, after the caller's memory release: the canary on the groups the rollout keeps live (all of
        them after PAUSE_LIVE, the plan's ``kept_live`` after PAUSE_PLANNED); an agreed failure destroys them."""
        if event is PGEvent.PAUSE_LIVE:
            await self._check_canary()
        elif plan is not None and plan.kept_live:
            await self._check_canary(only=sorted(plan.kept_live))

    async def weight_sync(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (sync or async) with the role's groups up, then return them to the paused state.

        An exception in ``fn`` on any rank fails every rank (groups aborted,
        preservation off, re-raised). The first sync that succeeds everywhere
        after an eligible pause arms preservation. Where the plan rules say the
        sync needs no role group (``GroupPlanRules(sync_groups=set())``), a sync
        from SUSPENDED or DESTROYED leaves the groups down: no resume or rebuild
        before it, no suspend or destroy (and no new cooldown) after it.
        """
        await self.start()
        self._require("weight_sync")
        paused = self.state
        async with self._operation("weight_sync", span="lifecycle.weight_sync"):
            self.stats.weight_syncs += 1
            stay_down = self.plan_rules.sync_groups == frozenset() and paused in (PGState.SUSPENDED, PGState.DESTROYED)
            if stay_down:  # the sync uses none of the role's groups: they stay as the pause left them
                pass
            elif paused is PGState.ACTIVE_LAZY:
                await self.lazy.bring(self.plan_rules.sync_groups)
            elif needs_bring_up(paused):
                await self._bring_up()
            elif paused is PGState.PLANNED:
                await self._bring_up_planned(sync_only=True)
            # whether the groups are kept after the sync is agreed: a process may turn preservation off meanwhile
            result, kept = await self.role.step("weight_sync", lambda: self._sync_call(fn),
                                                vote=lambda _: self.preservation.disabled is None)
            if not kept and self.preservation.disabled is None:
                self._preservation = disabled(self._preservation, "preservation is off on a peer (agreed at the sync)")
            self._preservation = after_good_sync(self.preservation)
            if stay_down:
                pass
            elif paused is PGState.SUSPENDED and kept:
                await self.role.suspend_all()
                self.transition(PGEvent.SUSPEND)
            elif self.state is PGState.SYNC_READY:
                assert self.planned.plan is not None
                await self.planned.apply(self.planned.plan.acted(sync=True), preflight=True)
                self.transition(PGEvent.APPLY_PLAN)
            elif needs_bring_up(paused) or paused in (PGState.SYNC_READY, PGState.PLANNED):
                await self.role.destroy_all(inline_wait=inline_cooldown(self._pause_policy))
                self.transition(PGEvent.DESTROY)
        return result

    async def resume(self) -> PGState:
        """Bring the groups back for training (ACTIVE): resume, rebuild, or nothing if they stayed live."""
        await self.start()
        self._require("resume")
        async with self._operation("resume", span="lifecycle.resume"):
            self.stats.resumes += 1
            if self.state is PGState.PAUSED_LIVE:
                self.transition(PGEvent.RESUME)
            elif self.state is PGState.ACTIVE_LAZY:  # everything the lazy wake left down, now
                await self.lazy.bring(None)
            elif self.state in (PGState.SYNC_READY, PGState.PLANNED):
                await self._bring_up_planned(sync_only=False)
            else:
                await self._bring_up()
        return self.state

    async def use(self, names: Iterable[str] | None = None) -> PGState:
        """Bring up the groups named here on any rank that a lazy wake left down; every rank calls it at once.

        ``names``: the groups this rank is about to use (None: every group).
        In ACTIVE nothing is down and nothing is agreed. Returns the state
        (ACTIVE once nothing is left down, else ACTIVE_LAZY). See :mod:`refimpl.comm.lazy_wake`.
        """
        await self.start()
        self._require("use")
        async with self._operation("use"):
            return await self.lazy.use(names)

    async def run_on(self, names: Iterable[str] | None, fn: Callable[[], Any]) -> Any:
        """:meth:`use` ``names``, then run ``fn`` (sync or async) as one agreed step on every rank.

        A collective in ``fn`` on a group still left down fails every rank with
        :class:`~refimpl.comm.lazy_wake.LazyGroupError` naming the group (instead
        of one rank raising and its peers waiting); any other failure fails every rank as usual.
        """
        await self.start()
        self._require("use")
        async with self._operation("run_on"):
            return await self.lazy.run_on(names, fn)

    # ------------------------------------------------------------------ performing transitions

    @contextlib.asynccontextmanager
    async def _operation(self, op: str, *, span: str | None = None) -> AsyncIterator[None]:
        """One public operation (inside the runtime's ``span``): no group created before one of its agreements; an
        interrupt (``KeyboardInterrupt``, a cancelled call) that no agreed step took to its peers still ends this
        rank FAILED, groups aborted ([Note: interrupts] in :mod:`refimpl.comm.role_groups`). One thread at a time:
        an operation entered from another thread while one runs (a resume started on a worker thread and not joined
        yet) is refused before it does anything, since the two threads' agreements would pair on the control group."""
        me = threading.get_ident()
        with self._running_lock:
            if self._running is not None and self._running[0] != me:
                raise LifecycleStateError(
                    f"rank {self.rt.rank}: {op}() while another thread runs an operation of this lifecycle (a "
                    "resume started in the background and not joined?); join it first: nothing was done")
            self._running = (me, 1 if self._running is None else self._running[1] + 1)
        try:
            self.role.begin_operation()
            with self.rt.span(span) if span is not None else contextlib.nullcontext():
                yield
        except GeneratorExit:
            raise
        except BaseException as exc:
            if not isinstance(exc, Exception) and self.state is not PGState.FAILED:
                await self.fall_back(op, exc)
            raise
        finally:
            with self._running_lock:
                depth = self._running[1] - 1 if self._running is not None else 0
                self._running = (me, depth) if depth > 0 else None

    def _known(self, name: str) -> bool:
        try:
            self.rt.group_spec(name)
            return True
        except GroupError:
            return False

    def _require(self, op: str) -> None:
        """Refuse ``op`` unless the state is one :data:`refimpl.comm.states.OPERATIONS` allows for it."""
        if self.state is PGState.FAILED:
            raise LifecycleFailedError(
                f"rank {self.rt.rank}: {op}() after the lifecycle failed ({self.failure!r}); its groups were "
                "aborted and preservation is off. Restart the workers."
            ) from self.failure
        allowed = allowed_states(op)
        if self.state not in allowed:
            raise LifecycleStateError(
                f"rank {self.rt.rank}: {op}() needs state {' or '.join(sorted(s.name for s in allowed))}, "
                f"lifecycle is {self.state.name}"
            )

    def transition(self, event: PGEvent) -> None:
        """Apply ``event`` by its row of the transition table (for the lifecycle and its lazy wake)."""
        t = transition_for(self.state, event)
        self.history.append((self.rt.now(), t.source, event, t.target))
        log.info("rank %d: %s --%s--> %s", self.rt.rank, t.source.name, event.name, t.target.name)
        self.state = t.target

    def _disable(self, reason: str) -> None:
        if self.rt not in _DISABLED:
            _DISABLED[self.rt] = reason
            log.warning("rank %d: group preservation off for the life of the process: %s", self.rt.rank, reason)
        self._preservation = disabled(self._preservation, reason)

    async def fall_back(self, point: str, cause: BaseException) -> None:
        """The agreed fallback, on every rank once any rank failed at ``point``: abort the role's groups at
        once, preservation off for the life of the process, state FAILED (its
        :class:`~refimpl.comm.role_groups.AgreedFailureHandler` for :class:`RoleGroups`)."""
        self.failure = cause
        self.stats.fallbacks += 1
        self._disable(f"failure at {point}: {cause!r}")
        await self.role.abort_all()
        if self.state is not PGState.FAILED:
            self.transition(PGEvent.FAULT)

    async def _bring_up(self) -> None:
        if self.state is PGState.SUSPENDED:
            self.transition(PGEvent.RELOAD)
            await self.role.resume_all()
            if await self._check_canary():
                self.transition(PGEvent.RELOADED)
                return
        if self.state is PGState.DESTROYED:
            self.transition(PGEvent.RELOAD)
            await self.role.rebuild_all()
            self.transition(PGEvent.RELOADED)

    async def _sync_call(self, fn: Callable[[], Any]) -> Any:
        """The caller's weight sync; a group the planned pause took down is named in a clear error."""
        try:
            return await _call(fn)
        except GroupError as exc:
            clear = self.planned.explain(exc) or self.lazy.explain(exc)
            if clear is not None:
                raise clear from exc
            raise

    async def _bring_up_planned(self, *, sync_only: bool) -> None:
        """From SYNC_READY or PLANNED: resume (one walk, one canary pass) and rebuild what the plan took down.

        ``sync_only``: only the groups the weight sync needs (PLANNED -> SYNC_READY);
        otherwise every group (-> ACTIVE), or with a lazy wake (the plan's
        ``at_wake``) only those, the others left down (-> ACTIVE_LAZY). A canary
        failure aborts everything, turns preservation off and rebuilds
        (DESTROYED -> ACTIVE), as for SUSPEND.
        """
        plan = self.planned.plan
        assert plan is not None, "a planned state always has an agreed plan"
        all_groups = set(self.groups)
        wanted = plan.for_sync if sync_only else (all_groups if plan.at_wake is None else plan.at_wake)
        up_already = plan.for_sync if self.state is PGState.SYNC_READY else frozenset()
        wanted = set(wanted) - up_already  # in SYNC_READY the sync groups are live
        suspended, destroyed = self.planned.down(wanted)
        left = {} if sync_only else {g: a for g, a in plan.actions.items()
                                     if a is not GroupAction.KEEP and g not in wanted and g not in up_already}
        self.transition(PGEvent.RELOAD)
        if not await self.bring_up_groups(suspended, destroyed):
            return
        if sync_only:
            self.transition(PGEvent.SYNC_GROUPS_UP)
            return
        self.lazy.leave_down(left)
        self.transition(PGEvent.RELOADED_LAZY if left else PGEvent.RELOADED)

    async def bring_up_groups(self, suspended: Sequence[str], destroyed: Sequence[str]) -> bool:
        """Resume ``suspended`` (one walk, one canary pass) and rebuild ``destroyed``; False if the canary failed.

        On a failed canary everything was aborted (``_check_canary``): nothing
        is left down, every group is rebuilt and the state ends RELOADED.
        """
        if suspended:
            await self.role.resume_all(only=suspended)
            if not await self._check_canary(only=suspended):
                self.lazy.clear()
                self.transition(PGEvent.RELOAD)
                await self.role.rebuild_all()
                self.transition(PGEvent.RELOADED)
                return False
        if destroyed:
            await self.role.rebuild_all(only=destroyed)
        return True

    async def _check_canary(self, only: Sequence[str] | None = None) -> bool:
        """Canary on every group this rank belongs to (or those in ``only``); on an agreed failure abort and go to DESTROYED."""
        with self.rt.span("lifecycle.canary"):
            problems, ok_all = await self.role.step("canary", lambda: self.role.canary(only), vote=lambda p: not p)
        self.stats.canaries += 1
        if ok_all:
            return True
        for p in problems:
            log.error("rank %d: canary: %s", self.rt.rank, p)
        self.stats.canary_failures += 1
        self._disable("canary failed: " + ("; ".join(problems) or "on another rank"))
        await self.role.abort_all()
        self.transition(PGEvent.CANARY_FAILED)
        return False


__all__ = [
    "BlockingPGLifecycle",
    "LifecycleConfig",
    "LifecycleError",
    "LifecycleFailedError",
    "LifecycleStateError",
    "LifecycleStats",
    "PGLifecycle",
    "PeerFailedError",
    "PolicyMismatchError",
    "ResumeMemoryError",
    "preservation_disabled_reason",
]
