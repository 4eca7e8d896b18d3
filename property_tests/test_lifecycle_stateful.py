"""The lifecycle on several simulated ranks as a Hypothesis state machine, with faults at its points.

Every rank of a small mesh (TP pairs, DP groups, one-rank groups) runs one
:class:`PGLifecycle`. Hypothesis picks the story, one operation at a time on
every rank (each a ``world.run`` of the same world): pauses with any policy
(``SUSPEND_PLANNED`` with a lazy wake that leaves some groups down), weight
syncs, resumes, ``use()`` with per-rank names, rollouts, and before any
operation one fault on one rank at one lifecycle point (crash, hang, raise,
delay, a corrupted canary, an address in use or an error at one rank's
rebuild). The deployment's watchdog is on (``group_timeouts``).

After every step, on the ranks that did not crash or hang:

* they agree on where they are: one state and, unless FAILED, one history of
  transitions and the same groups left down;
* a step fails on one of them iff it fails on all (FAILED everywhere), and
  none fails a step without a fault;
* where they are is recoverable: FAILED on every rank (restart the workers),
  or a state in which some operation is allowed (``states.OPERATIONS``);
  in ACTIVE every member group carries a correct all-reduce.
"""
from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import sim
from property_tests.test_lifecycle_properties import DrawnFault, FaultPlan
from refimpl.comm import LifecycleConfig, LifecycleFailedError, LifecycleStateError, PGLifecycle, PGPolicy, PGState
from refimpl.comm.group_plan import GroupPlanRules
from refimpl.comm.states import OPERATIONS, allowed_states
from refimpl.runtime.base import GroupSpec, ReduceOp
from tests._hypothesis import BUDGET

AGREE_S, CANARY_S, CREATE_S = 40.0, 8.0, 20.0
KINDS = ["crash", "hang", "raise", "delay", "corrupt_canary", "addr_in_use", "create_error"]
def fault(*points: str):
    """One fault on one rank at one of ``points`` of the coming operation, or None (twice as likely)."""
    return st.one_of(st.none(), st.none(), st.tuples(st.sampled_from(KINDS), st.integers(0, 3), st.sampled_from(points),
                                                     st.integers(1, 2), st.sampled_from(["tp0", "dp1", "solo0"])))


_UP = ("lifecycle.resume.preflight", "lifecycle.resume", "lifecycle.rebuild", "lifecycle.canary")
PAUSE_FAULT = fault("lifecycle.pause.decide", "lifecycle.plan", "lifecycle.plan.group", "lifecycle.release_memory",
                    "lifecycle.canary", "lifecycle.suspend.preflight", "lifecycle.suspend", "lifecycle.destroy", *_UP)
SYNC_FAULT = fault("lifecycle.weight_sync", "lifecycle.plan.group", "lifecycle.plan.preflight", "lifecycle.suspend",
                   "lifecycle.destroy", "lifecycle.use.request", *_UP)
RESUME_FAULT = fault("lifecycle.use.request", *_UP)
USE_FAULT = fault("lifecycle.use", "lifecycle.use.request", *_UP)


def mesh(n: int) -> list[GroupSpec]:
    """TP pairs, two DP groups and a one-rank group per rank."""
    tp = [GroupSpec(f"tp{i}", (2 * i, 2 * i + 1), timeout_s=CREATE_S) for i in range(n // 2)]
    dp = [GroupSpec(f"dp{j}", tuple(range(j, n, 2)), timeout_s=CREATE_S) for j in range(2)]
    return tp + dp + [GroupSpec(f"solo{r}", (r,), timeout_s=CREATE_S) for r in range(n)]


class LifecycleMachine(RuleBasedStateMachine):
    """One job's lifecycle, step by step (see the module docstring)."""

    @initialize(n=st.sampled_from([2, 4]), wake=st.sampled_from([None, "dp0", "tp0"]), two_phase=st.booleans())
    def start(self, n, wake, two_phase):
        self.n = n
        self.plan = FaultPlan([])
        self.world = sim.SimWorld(n, faults=self.plan, group_timeouts=True)
        config = LifecycleConfig(agree_timeout_s=AGREE_S, canary_timeout_s=CANARY_S, cooldown_s=2.0,
                                 two_phase=two_phase)
        rules = GroupPlanRules(costs=None, wake_groups=None if wake is None else {wake})
        self.lcs = [PGLifecycle(rt, mesh(n), config=config, plan=rules) for rt in self.world.runtimes]
        self.armed: DrawnFault | None = None
        self.last: list = []
        self.gone: set[int] = set()
        self._step(lambda lc: lc.start(), "start")

    # ------------------------------------------------------------------ running one step on every rank

    def _step(self, op, name: str, operation: str | None = None) -> None:
        """Run ``op`` on every rank. An ``operation`` its state does not allow must be refused on every rank,
        before anything is agreed, the state unchanged."""
        lcs = self.lcs
        if operation is not None and self.last and self._state() not in allowed_states(operation):
            self.armed, before = None, self._state()
            self.plan.faults[:] = []
            results = self.world.run(lambda rt: self._refused(op, lcs[rt.rank]), return_exceptions=True)
            live = [res for res in results if not isinstance(res, (sim.RankCrashedError, sim.RankHungError))]
            want = LifecycleFailedError if before is PGState.FAILED else LifecycleStateError
            assert all(isinstance(res, want) for res in live), (name, before, live)
            assert all(lc.state is before for lc in lcs if lc.rt.rank not in self.gone)
            event(f"{name}: refused in {before.name}")
            return

        async def job(rt):
            try:
                await op(lcs[rt.rank])
                return None
            except Exception as exc:  # noqa: BLE001 - how ranks end is the property
                return exc

        fault, self.armed = self.armed, None
        results = self.world.run(job, return_exceptions=True)  # a deadlock or mismatch raises: the test fails
        self.last = [(r, res) for r, res in enumerate(results)
                     if not isinstance(res, (sim.RankCrashedError, sim.RankHungError))]
        self.gone = {r for r, res in enumerate(results) if isinstance(res, (sim.RankCrashedError, sim.RankHungError))}
        event(f"{name}: {'no fault' if fault is None else fault.kind + (' fired' if fault.fired else ' not reached')}")
        if fault is None or not fault.fired:
            assert all(res is None for _, res in self.last), f"{name} failed without a fault: {self.last}"

    @staticmethod
    async def _refused(op, lc):
        count = lc.control.count
        try:
            await op(lc)
        except Exception as exc:  # noqa: BLE001 - which error, is the assertion
            assert lc.control.count == count, "refused before any agreement"
            return exc
        return None

    def _state(self) -> PGState:
        return self.lcs[min(r for r, _ in self.last)].state if self.last else PGState.FAILED

    # ------------------------------------------------------------------ rules

    def _arm(self, fault) -> None:
        if fault is not None:
            kind, rank, point, nth, group = fault
            self.armed = DrawnFault(kind, rank % self.n, point, nth, group)
        self.plan.faults[:] = [] if self.armed is None else [self.armed]

    @rule(policy=st.sampled_from(list(PGPolicy)), fault=PAUSE_FAULT)
    def pause(self, policy, fault):
        self._arm(fault)
        self._step(lambda lc: lc.pause(policy=policy), f"pause {policy.name}", "pause")

    @rule(fault=SYNC_FAULT)
    def weight_sync(self, fault):
        self._arm(fault)
        self._step(lambda lc: lc.weight_sync(lambda: None), "weight_sync", "weight_sync")

    @rule(fault=RESUME_FAULT)
    def resume(self, fault):
        self._arm(fault)
        self._step(lambda lc: lc.resume(), "resume", "resume")

    @rule(names=st.lists(st.sampled_from(["tp0", "dp0", "dp1", "solo0", "solo1"]), max_size=2, unique=True),
          fault=USE_FAULT)
    def use(self, names, fault):
        self._arm(fault)
        self._step(lambda lc: lc.use([g for g in names if g in lc.groups and (lc.rt.rank + len(g)) % 2]), "use", "use")

    @rule(seconds=st.sampled_from([0.5, 5.0, 30.0]))
    def rollout(self, seconds):
        """Always possible (also once every rank failed): time passes, nothing is agreed."""
        self._arm(None)
        self._step(lambda lc: lc.rt.sleep(seconds), "rollout")

    # ------------------------------------------------------------------ after every step

    @invariant()
    def ranks_agree_on_where_they_are(self):
        if not getattr(self, "last", None):
            return
        lcs = [self.lcs[r] for r, _ in self.last]
        states = {lc.state for lc in lcs}
        assert len(states) == 1, f"ranks in different states: {[(r, self.lcs[r].state) for r, _ in self.last]}"
        (state,) = states
        failed = [res is not None for _, res in self.last]
        assert all(failed) or not any(failed), f"a step failed on some ranks only: {self.last}"
        if state is PGState.FAILED:
            return
        assert not any(failed), "a failed step leaves every rank FAILED"
        assert len({tuple((a, e, b) for _, a, e, b in lc.history) for lc in lcs}) == 1, "one history"
        assert len({tuple(sorted(lc.lazy.left_down)) for lc in lcs}) == 1, "the same groups left down"
        assert any(state in o.allowed for o in OPERATIONS), f"{state.name}: no operation can leave it"
        if self.gone:
            raise AssertionError(f"ranks {sorted(self.gone)} crashed or hung but the others carry on in {state.name}")

    @invariant()
    def active_groups_carry_data(self):
        if not getattr(self, "last", None) or self._state() is not PGState.ACTIVE:
            return

        async def check(rt):
            out = {}
            for g in self.lcs[rt.rank].groups:
                if rt.is_member(g):
                    t = torch.ones(1)
                    await rt.all_reduce(t, ReduceOp.SUM, g, timeout_s=CANARY_S)
                    out[g] = (t.item(), float(rt.group_size(g)))
            return out

        for res in self.world.run(check):
            assert all(got == want for got, want in res.values()), res


LifecycleMachine.TestCase.settings = BUDGET.settings(20, stateful_step_count=BUDGET.stateful_steps)
TestLifecycleMachine = LifecycleMachine.TestCase
