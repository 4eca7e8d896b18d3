"""What the lifecycle does for a switch that hides its work under the copies, in the simulator:
a weight sync that needs none of the role's groups leaves them down (no rebuild, no destroy, no new
cooldown), and ``warm_rebuilt`` creates rebuilt communicators inside the resume, so training's first
collective after the wake pays no lazy initialisation."""
from __future__ import annotations

import pytest
import torch

from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.comm.group_plan import GroupPlanRules
from refimpl.runtime import GroupSpec, ReduceOp
from sim.machine.collectives import NcclComm, TopologyCollectiveCost
from sim.machine.topology import Topology
from sim.world import SimWorld

GROUPS = [GroupSpec("tp", (0, 1), backend="nccl"), GroupSpec("one0", (0,), backend="nccl"),
          GroupSpec("one1", (1,))]  # one1: the backend left to the runtime's default, as the RL step leaves it


def world(n: int = 2) -> SimWorld:
    topo = Topology.from_preset("calibrated/hgx-h200-8x")
    return SimWorld(n, trace=False, collective_cost=TopologyCollectiveCost(topo),
                    comm=NcclComm(topo, lazy_init=True, init_at_collective=True))


async def _use(rt, lc) -> float:
    """One all-reduce on each of this rank's role groups; seconds it took."""
    t0 = rt.now()
    for name in lc.groups:
        if rt.is_member(name):
            await rt.all_reduce(torch.ones(1), ReduceOp.SUM, name)
    return rt.now() - t0


@pytest.mark.parametrize("policy", ["DESTROY_DEFERRED", "DESTROY", "SUSPEND"])
def test_a_sync_that_needs_no_group_leaves_the_groups_down(policy):
    async def job(rt):
        lc = PGLifecycle(rt, GROUPS, plan=GroupPlanRules(sync_groups=set()), config=LifecycleConfig(
            policy=PGPolicy[policy], cooldown_s=0.5, two_phase=False, agree_timeout_s=60, canary_timeout_s=10))
        await lc.start()
        await _use(rt, lc)
        await lc.pause()
        down = lc.state
        before = (lc.stats.rebuilds, lc.stats.destroys, lc.stats.comm_resumes, lc.stats.comm_suspends)
        ran = []
        await lc.weight_sync(lambda: ran.append(rt.rank))
        after_sync = (lc.stats.rebuilds, lc.stats.destroys, lc.stats.comm_resumes, lc.stats.comm_suspends)
        state_after_sync = lc.state
        await lc.resume()
        await _use(rt, lc)
        return down, before, after_sync, state_after_sync, ran, lc.state

    for down, before, after, state, ran, final in world().run(job):
        assert down in (PGState.DESTROYED, PGState.SUSPENDED)
        assert ran and before == after  # nothing brought up for the sync, nothing taken down after it
        assert state is down
        assert final is PGState.ACTIVE


def test_without_the_rule_the_sync_brings_every_group_up_and_down():
    async def job(rt):
        lc = PGLifecycle(rt, GROUPS, config=LifecycleConfig(policy=PGPolicy.DESTROY_DEFERRED, cooldown_s=0.5,
                                                             agree_timeout_s=60, canary_timeout_s=10))
        await lc.start()
        await _use(rt, lc)
        await lc.pause()
        before = (lc.stats.rebuilds, lc.stats.destroys)
        await lc.weight_sync(lambda: None)
        return before, (lc.stats.rebuilds, lc.stats.destroys)

    for before, after in world().run(job):
        assert after[0] > before[0] and after[1] > before[1]


@pytest.mark.parametrize("warm", [False, True])
def test_warm_rebuilt_moves_the_lazy_init_into_the_resume(warm):
    async def job(rt):
        lc = PGLifecycle(rt, GROUPS, plan=GroupPlanRules(sync_groups=set()), config=LifecycleConfig(
            policy=PGPolicy.DESTROY_DEFERRED, cooldown_s=0.0, agree_timeout_s=60, canary_timeout_s=10,
            warm_rebuilt=warm))
        await lc.start()
        await _use(rt, lc)
        steady = await _use(rt, lc)
        await lc.pause()
        await lc.weight_sync(lambda: None)
        t0 = rt.now()
        await lc.resume()
        resume_s = rt.now() - t0
        first = await _use(rt, lc)
        return steady, resume_s, first, lc.stats.warm_ups

    for steady, resume_s, first, warm_ups in world().run(job):
        if warm:
            assert first == pytest.approx(steady, abs=1e-9)  # the communicators already exist
            assert warm_ups == 2  # this rank's two groups: tp and its own one-rank group
        else:
            assert first > steady + 1e-3  # the lazy init lands on the first use
            assert warm_ups == 0
