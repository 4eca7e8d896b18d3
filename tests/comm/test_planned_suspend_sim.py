"""SUSPEND_PLANNED in the simulator: what it does per step, the declared sync groups, and its failures.

The simulator's default communicator model gives every NCCL group 384 MiB
suspendable + 4 MiB persistent per member; the lifecycle code is the code that
runs on TorchRuntime. Counts are per rank and per RL step.
"""
from __future__ import annotations

import pytest
import torch

import sim
from bench.switch_window import mesh_groups
from refimpl.comm import AgreementTimeoutError, LifecycleConfig, PeerFailedError, PGLifecycle, PGPolicy, PGState
from refimpl.comm.group_plan import GroupAction, GroupPlanRules, UndeclaredGroupError
from refimpl.runtime.base import GroupSpec

MiB = 2**20
PERSISTENT = 4 * MiB


def config(policy: str = "SUSPEND_PLANNED", **kw) -> LifecycleConfig:
    kw.setdefault("agree_timeout_s", 60.0)
    kw.setdefault("canary_timeout_s", 10.0)
    kw.setdefault("cooldown_s", 2.0)
    return LifecycleConfig(policy=PGPolicy[policy], **kw)


async def sums(rt, names) -> dict[str, float]:
    """all_reduce(SUM) of the rank + 1 on every member group (real payloads): checks each communicator."""
    out = {}
    for g in names:
        if rt.is_member(g):
            t = torch.full((3,), float(rt.rank + 1))
            await rt.all_reduce(t, group=g, timeout_s=5)
            out[g] = t.tolist()
    return out


def want(rt_rank_groups, specs):
    by_name = {s.name: s for s in specs}
    return {g: [float(sum(r + 1 for r in by_name[g].ranks))] * 3 for g in rt_rank_groups}


class PointFaults:
    """Fire one action the ``nth`` time a rank reaches a point; corrupt one rank's next canary."""

    def __init__(self, rank=None, point=None, action=None, nth=1, corrupt_canary_rank=None):
        self.rank, self.point, self.action, self.nth = rank, point, action, nth
        self.seen = 0
        self.corrupt_canary_rank = corrupt_canary_rank
        self._armed = False

    def on_point(self, rank, name):
        if name == "lifecycle.canary" and rank == self.corrupt_canary_rank:
            self._armed = True
        if rank == self.rank and name == self.point:
            self.seen += 1
            if self.seen == self.nth:
                return self.action
        return None

    def on_collective(self, rank, group, op, seq):
        if self._armed and rank == self.corrupt_canary_rank and op == "all_reduce" and group != "lifecycle.control":
            self._armed = False
            self.corrupt_canary_rank = None
            return sim.FaultAction.corrupt()
        return None

    def on_group_create(self, rank, spec):
        return None

    def on_pin(self, rank, nbytes):
        return None


def run_steps(policy: str, steps: int = 3, **lc_kw):
    """``steps`` RL steps on 2 ranks x 14 groups (the 2-GPU benchmark's mesh); per-step counts and checks."""
    specs = mesh_groups(2, 1)
    world = sim.SimWorld(2)

    async def job(rt):
        if policy == "SUSPEND_PLANNED":
            lc_kw.setdefault("plan", GroupPlanRules(costs=None))  # suspend every multi-rank group (no cost rule)
        lc = PGLifecycle(rt, specs, config=config(policy), **lc_kw)
        await lc.start()
        mine = [g for g in lc.groups if rt.is_member(g)]
        before = rt.memory_info().used
        per_step = []
        for _ in range(steps):
            s0 = dict(vars(lc.stats))
            a0 = lc.control.count
            await lc.pause()
            await lc.weight_sync(lambda: sums(rt, [f"tp{rt.rank}"]))
            rollout = dict(state=lc.state, held=lc.comm_memory(), used=rt.memory_info().used)
            await rt.sleep(3.0)
            await lc.resume()
            after = await sums(rt, lc.groups)  # every group's collective right after every wake
            delta = {k: v - s0[k] for k, v in vars(lc.stats).items()}
            per_step.append(dict(rollout, delta=delta, agreements=lc.control.count - a0, sums=after))
        return dict(mine=mine, steps=per_step, before=before, end=rt.memory_info().used, state=lc.state,
                    want=want(mine, specs))

    return world.run(job)


def test_planned_suspend_does_each_group_once_per_step_and_frees_the_memory():
    planned = run_steps("SUSPEND_PLANNED")
    old = run_steps("SUSPEND")
    for r, o in zip(planned, old):
        assert len(r["mine"]) == 14
        multi = [g for g in r["mine"] if not g[-1].isdigit()]  # dp, dp_cp, tp_dp, tp_dp_cp, edp: both ranks
        assert len(multi) == 5
        for step in r["steps"][1:]:  # step 1 is two-phase enabling (destroy path)
            d = step["delta"]
            assert step["state"] is PGState.PLANNED
            assert d["comm_suspends"] == 5 and d["comm_resumes"] == 5, "each multi-rank group suspended and resumed once"
            assert d["destroys"] == 9 + 9 and d["rebuilds"] == 9 + 9, (
                "the 9 one-rank groups of this rank and the 9 of the other (as a non-member) are destroyed, not suspended")
            assert d["canaries"] == 1, "one canary pass at wake"
            assert step["held"].suspendable == 0 and step["held"].persistent == 5 * PERSISTENT
            assert step["sums"] == r["want"], "every group's all-reduce is right after every wake"
        assert r["state"] is PGState.ACTIVE and r["end"] == r["before"], "communicator memory returns exactly"
        for step, ostep in zip(r["steps"][1:], o["steps"][1:]):
            assert ostep["delta"]["comm_suspends"] == 28 and ostep["delta"]["canaries"] == 2
            assert step["agreements"] <= ostep["agreements"]


def test_planned_suspend_keeps_gloo_and_declared_groups_and_can_suspend_single_rank_groups():
    specs = [GroupSpec("pair", (0, 1)), GroupSpec("solo0", (0,)), GroupSpec("solo1", (1,)),
             GroupSpec("ctl", (0, 1), backend="gloo"), GroupSpec("rollout", (0, 1))]
    world = sim.SimWorld(2)
    rules = GroupPlanRules(keep_live={"rollout"}, destroy_single_rank=False, costs=None)

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(two_phase=False), plan=rules)
        await lc.pause()
        await lc.weight_sync(lambda: None)
        during = {g: ("suspended" if rt.group_suspended(g) else "live" if rt.group_live(g) else "destroyed")
                  for g in lc.groups if rt.is_member(g)}
        await lc.resume()
        return during, dict(lc.planned.plan.actions), await sums(rt, lc.groups), lc.planned.plan, lc.stats.canaries

    for rank, (during, actions, after, plan, canaries) in enumerate(world.run(job)):
        assert during == {"pair": "suspended", f"solo{rank}": "suspended", "ctl": "live", "rollout": "live"}
        assert plan.kept_live == {"rollout"} and canaries == 2, "the kept-live group is checked after the pause"
        assert actions["ctl"] is GroupAction.KEEP, "a Gloo group holds no NCCL memory: kept"
        assert set(after) == set(during)


def test_declared_sync_groups_stay_live_the_rest_go_down_at_the_pause():
    specs = mesh_groups(2, 1)
    world = sim.SimWorld(2)

    async def job(rt):
        rules = GroupPlanRules(sync_groups={f"tp{rt.rank}", "dp"}, costs=None)
        lc = PGLifecycle(rt, specs, config=config(two_phase=False), plan=rules)
        await lc.pause()
        at_pause = lc.state
        live = sorted(g for g in lc.groups if rt.is_member(g) and rt.group_live(g) and not rt.group_suspended(g))
        synced = await lc.weight_sync(lambda: sums(rt, [f"tp{rt.rank}", "dp"]))
        live_after = [g for g in lc.groups if rt.is_member(g) and rt.group_live(g) and not rt.group_suspended(g)]
        # a second weight sync in the same pause brings up only the sync groups
        s0 = dict(vars(lc.stats))
        await lc.weight_sync(lambda: sums(rt, ["dp"]))
        second = {k: v - s0[k] for k, v in vars(lc.stats).items()}
        state2 = lc.state
        await lc.resume()
        return at_pause, live, synced, live_after, second, state2, await sums(rt, lc.groups)

    for rank, (at_pause, live, synced, live_after, second, state2, after) in enumerate(world.run(job)):
        assert at_pause is PGState.SYNC_READY
        assert live == sorted([f"tp{rank}", "dp"]), "only the declared sync groups stay up through the pause"
        assert synced == {f"tp{rank}": [float(rank + 1)] * 3, "dp": [3.0] * 3}
        assert live_after == [] and state2 is PGState.PLANNED
        assert second["comm_resumes"] == 1 and second["comm_suspends"] == 1, "dp only; tp is rebuilt, not resumed"
        assert second["rebuilds"] == 2 and second["canaries"] == 1, "tp0 and tp1 (the union of the declared sets)"
        assert len(after) == 14


def test_a_weight_sync_on_an_undeclared_group_is_refused_clearly_and_every_rank_fails_together():
    specs = mesh_groups(2, 1)
    world = sim.SimWorld(2)

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(two_phase=False), plan=GroupPlanRules(sync_groups={"dp"}))
        await lc.pause()
        try:
            await lc.weight_sync(lambda: sums(rt, ["edp"]))  # suspended at the pause: not declared
        except Exception as exc:  # noqa: BLE001
            return lc.state, exc
        return lc.state, None

    for state, exc in world.run(job):
        assert state is PGState.FAILED
        assert isinstance(exc, (UndeclaredGroupError, PeerFailedError)), exc
        if isinstance(exc, UndeclaredGroupError):
            assert "'edp'" in str(exc) and "sync_groups" in str(exc)


def test_ranks_that_vote_differently_get_one_plan():
    specs = [GroupSpec("pair", (0, 1)), GroupSpec("other", (0, 1))]
    world = sim.SimWorld(2)

    async def job(rt):
        rules = GroupPlanRules(keep_live={"pair"}, costs=None) if rt.rank == 0 else GroupPlanRules(destroy={"pair"},
                                                                                                   costs=None)
        lc = PGLifecycle(rt, specs, config=config(two_phase=False), plan=rules)
        await lc.pause()
        await lc.weight_sync(lambda: None)
        return dict(lc.planned.plan.actions), rt.group_live("pair") and not rt.group_suspended("pair")

    (a0, live0), (a1, live1) = world.run(job)
    assert a0 == a1 and a0["pair"] is GroupAction.KEEP and a0["other"] is GroupAction.SUSPEND
    assert live0 and live1


def test_a_corrupted_canary_at_wake_falls_back_to_a_rebuild_on_every_rank():
    specs = mesh_groups(2, 1)
    world = sim.SimWorld(2, faults=PointFaults(corrupt_canary_rank=1))

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(two_phase=False), plan=GroupPlanRules(costs=None))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        await lc.resume()
        after = await sums(rt, lc.groups)
        second = await lc.pause()
        return lc.state, after, lc.stats.canary_failures, second, want([g for g in lc.groups if rt.is_member(g)], specs)

    for state, after, failures, second, expected in world.run(job):
        assert failures == 1 and after == expected
        assert second is PGState.DESTROYED, "preservation is off after a canary failure"


@pytest.mark.parametrize("point,nth", [("lifecycle.plan.group", 3), ("lifecycle.plan", 1),
                                       ("lifecycle.plan.apply", 1), ("lifecycle.plan.preflight", 1)])
def test_a_rank_dying_in_the_planned_walk_fails_every_other_rank_within_the_agreement_timeout(point, nth):
    specs = mesh_groups(2, 1)
    world = sim.SimWorld(2, faults=PointFaults(rank=1, point=point, action=sim.FaultAction.crash(), nth=nth))

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(two_phase=False, agree_timeout_s=20.0), plan=GroupPlanRules(costs=None))
        try:
            await lc.pause()
            await lc.weight_sync(lambda: None)
            await lc.resume()
        except Exception as exc:  # noqa: BLE001
            return lc.state, exc, rt.now()
        return lc.state, None, rt.now()

    r0, r1 = world.run(job, return_exceptions=True)
    assert isinstance(r1, sim.RankCrashedError)
    state, exc, end = r0
    assert state is PGState.FAILED and isinstance(exc, AgreementTimeoutError)
    assert end < 60.0


def test_rules_are_checked():
    with pytest.raises(ValueError, match="both in keep_live and destroy"):
        GroupPlanRules(keep_live={"a"}, destroy={"a"})
    with pytest.raises(TypeError, match="not the string"):
        GroupPlanRules(sync_groups="tp0")
    world = sim.SimWorld(1)

    async def job(rt):
        PGLifecycle(rt, [GroupSpec("a", (0,))], config=config(), plan=GroupPlanRules(keep_live={"b"}))

    with pytest.raises(sim.RankFailedError, match=r"\['b'\] that are not role groups"):
        world.run(job)


def test_switch_window_benchmark_runs_the_planned_policy_beside_the_old_ones():
    from bench import switch_window as sw

    kw = dict(dp=2, tp=1, steps=3, train_s=0.0, rollout_s=3.0, cooldown_s=2.0, topology="hgx-h200-8x")
    res = {p: sw.summarize(p, sw.simulate(p, **kw), warmup=1) for p in
           (PGPolicy.DESTROY_DEFERRED, PGPolicy.PAUSED_LIVE, PGPolicy.SUSPEND, PGPolicy.SUSPEND_PLANNED)}
    planned, old = res[PGPolicy.SUSPEND_PLANNED], res[PGPolicy.SUSPEND]
    assert planned.states[1:] == ["PLANNED"] * 2
    assert planned.total < old.total and planned.total < res[PGPolicy.DESTROY_DEFERRED].total
    assert planned.held_in_rollout_gib <= 0.02 * res[PGPolicy.PAUSED_LIVE].held_in_rollout_gib
    assert PGPolicy.SUSPEND_PLANNED.suspends and PGPolicy.SUSPEND.suspends and not PGPolicy.PAUSED_LIVE.suspends


def test_a_corrupted_canary_on_a_kept_live_group_after_the_pause_destroys_everywhere():
    specs = mesh_groups(2, 1)
    world = sim.SimWorld(2, faults=PointFaults(corrupt_canary_rank=0))

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(two_phase=False), plan=GroupPlanRules(keep_live={"dp"}))
        state = await lc.pause()
        await lc.weight_sync(lambda: sums(rt, ["dp"]))
        await rt.sleep(3.0)
        await lc.resume()
        return state, lc.state, await sums(rt, lc.groups), want([g for g in lc.groups if rt.is_member(g)], specs)

    for state, end, after, expected in world.run(job):
        assert state is PGState.DESTROYED and end is PGState.ACTIVE and after == expected


def test_first_use_after_wake_is_the_slowest_ranks_mean_over_steady_steps():
    from bench.switch_window import StepTimes, first_use_after_wake

    def steps(*after):  # each step's first collectives after its own wake
        return [StepTimes(0, 0, 0, 0, 0, "PLANNED", first_use_after=f) for f in after]

    per_rank = [steps(1.0, 2.0, 3.0, 4.0), steps(2.0, 1.0, 5.0, 3.0)]
    assert first_use_after_wake(per_rank, warmup=2) == 4.5  # max of (3, 5) and of (4, 3), mean
    assert first_use_after_wake(per_rank, warmup=0) == (2.0 + 2.0 + 5.0 + 4.0) / 4


def test_the_cost_row_destroys_a_communicator_whose_suspend_and_resume_cost_more():
    from refimpl.comm.group_plan import SwitchCosts, cheaper_to_destroy

    c = SwitchCosts()
    assert cheaper_to_destroy(c, 2, 480 * MiB), "2 x H200 multigpu run 1: 480 MiB two-rank communicators"
    assert cheaper_to_destroy(c, 2, 192 * MiB), "GPU.md's 2 x H200 run: 192 MiB, destroyed with the proxy waker"
    assert not cheaper_to_destroy(c, 2, 128 * MiB), "below the break-even size (156 MiB)"
    assert not cheaper_to_destroy(None, 2, 480 * MiB)
    with pytest.raises(ValueError, match="SwitchCosts.resume_s_per_gib"):
        SwitchCosts(resume_s_per_gib=-1.0)
    specs = [GroupSpec("big", (0, 1)), GroupSpec("solo0", (0,)), GroupSpec("solo1", (1,))]
    world = sim.SimWorld(2)  # 384 MiB per communicator: 0.41 s to suspend and resume, 0.38 s to destroy and init

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(two_phase=False))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        held = lc.comm_memory()
        await lc.resume()
        return dict(lc.planned.plan.actions), held, await sums(rt, lc.groups), lc.stats.comm_suspends

    for rank, (actions, held, after, suspends) in enumerate(world.run(job)):
        assert actions["big"] is GroupAction.DESTROY and suspends == 0
        assert held.suspendable == held.persistent == 0, "destroyed communicators hold nothing"
        assert after == {"big": [3.0] * 3, f"solo{rank}": [float(rank + 1)] * 3}


def test_on_the_calibrated_preset_the_planned_window_is_at_most_half_of_destroy_deferred():
    """The recorded 2 x H200 settings on the constants fitted on the H200 records (a prediction, not a measurement)."""
    from bench import switch_window as sw

    kw = dict(dp=2, tp=1, steps=4, train_s=0.0, rollout_s=3.0, cooldown_s=2.0, topology="calibrated/hgx-h200-8x")
    res = {p: sw.summarize(p, sw.simulate(p, **kw), warmup=2) for p in
           (PGPolicy.DESTROY_DEFERRED, PGPolicy.PAUSED_LIVE, PGPolicy.SUSPEND_PLANNED)}
    planned = res[PGPolicy.SUSPEND_PLANNED]
    assert planned.total <= 0.5 * res[PGPolicy.DESTROY_DEFERRED].total
    assert planned.held_in_rollout_gib <= 0.02 * res[PGPolicy.PAUSED_LIVE].held_in_rollout_gib
