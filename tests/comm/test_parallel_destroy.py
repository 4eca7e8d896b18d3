"""``LifecycleConfig.parallel_destroy``: a walk's destroys run together (``Runtime.destroy_groups``).

Every destroy of an initialised NCCL communicator waits for its proxy thread's next 500 ms poll timeout, so a walk
over groups the training step has just initialised takes whole poll periods one group after the other and about
one period with the destroys overlapped (2 x H200: ``bench/results/2026-11-30-h200x2-switch-8-steps/`` and ``-parallel-walks/``).
These tests check that the parallel walk does what the ordered one does (every group once, every rank, one
agreement, groups right after the wake), that a rank dying in it fails the others together, what the simulator
charges for it, and the real ``TorchRuntime.destroy_groups`` on Gloo processes.
"""
from __future__ import annotations

import pytest
import torch

import sim
from bench.switch_window import mesh_groups
from refimpl.comm import AgreementTimeoutError, LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.comm.group_plan import GroupPlanRules
from refimpl.runtime.base import GroupError, GroupSpec
from tests._dist import run_distributed
from tests.comm.test_lazy_wake_sim import rank_sums
from tests.comm.test_planned_suspend_sim import PointFaults


def _config(policy: str, parallel: bool, **kw) -> LifecycleConfig:
    kw.setdefault("agree_timeout_s", 60.0)
    return LifecycleConfig(policy=PGPolicy[policy], cooldown_s=2.0, parallel_destroy=parallel, **kw)


def _steps(policy: str, parallel: bool, steps: int = 3):
    specs = mesh_groups(2, 1)
    world = sim.SimWorld(2)

    async def job(rt):
        plan = GroupPlanRules(costs=None) if policy == "SUSPEND_PLANNED" else None
        lc = PGLifecycle(rt, specs, config=_config(policy, parallel), plan=plan)
        await lc.start()
        out = []
        for _ in range(steps):
            s0, a0 = dict(vars(lc.stats)), lc.control.count
            await rank_sums(rt, lc.groups)  # the training step: every group initialised
            await lc.pause()
            await lc.weight_sync(lambda: rank_sums(rt, [f"tp{rt.rank}"]))
            live = [g for g in lc.groups if rt.group_live(g)]
            await rt.sleep(3.0)
            await lc.resume()
            out.append(dict(delta={k: v - s0[k] for k, v in vars(lc.stats).items()}, live=live,
                            agreements=lc.control.count - a0, sums=await rank_sums(rt, lc.groups)))
        return out, [h[1:] for h in lc.history]

    return world.run(job)


@pytest.mark.parametrize("policy", ["DESTROY_DEFERRED", "SUSPEND_PLANNED"])
def test_a_parallel_walk_does_what_the_ordered_walk_does(policy):
    ordered, parallel = _steps(policy, False), _steps(policy, True)
    specs = {s.name: s for s in mesh_groups(2, 1)}
    for rank in (0, 1):
        (o_steps, o_hist), (p_steps, p_hist) = ordered[rank], parallel[rank]
        assert p_hist == o_hist, "the same transitions"
        for o, p in zip(o_steps, p_steps):
            assert p["delta"] == o["delta"], "every group destroyed (or suspended) once, as in the ordered walk"
            assert p["agreements"] == o["agreements"], "still one agreement per walk"
            assert p["live"] == o["live"]
            assert p["sums"] == {g: float(sum(r + 1 for r in specs[g].ranks)) for g in p["sums"]}
    assert parallel[0][0][-1]["delta"]["destroys"] >= 9


def test_on_the_calibrated_preset_a_parallel_walk_takes_one_poll_period():
    """The 2 x H200 benchmark's settings without the runtime's proxy waker (as parallel-walks ran): SUSPEND_PLANNED's
    weight sync walk (14 groups, right after the training step's inits) 1.51 s ordered, 0.51 s parallel;
    DESTROY_DEFERRED's pause the same. parallel-walks measured 0.518 s for both parallel walks
    (tests/sim/calibrate/test_validate_records.py holds the prediction to the record)."""
    from bench import switch_window as sw

    kw = dict(dp=2, tp=1, steps=4, train_s=0.0, rollout_s=3.0, cooldown_s=2.0, topology="calibrated/hgx-h200-8x",
              wake_proxies=False)
    res = {row: sw.summarize(row, sw.simulate(row, **kw), warmup=2) for row in
           ("DESTROY_DEFERRED", "DESTROY_DEFERRED_PARALLEL", "SUSPEND_PLANNED", "SUSPEND_PLANNED_PARALLEL")}
    assert res["SUSPEND_PLANNED"].update_weights == pytest.approx(1.513, abs=0.01)
    assert res["SUSPEND_PLANNED_PARALLEL"].update_weights == pytest.approx(0.513, abs=0.01)
    assert res["DESTROY_DEFERRED_PARALLEL"].sleep == pytest.approx(res["DESTROY_DEFERRED"].sleep - 1.0, abs=0.01)
    assert res["SUSPEND_PLANNED_PARALLEL"].total <= 0.15 * res["DESTROY_DEFERRED"].total
    assert res["SUSPEND_PLANNED_PARALLEL"].bitwise_after_wake is True
    assert res["SUSPEND_PLANNED_PARALLEL"].held_in_rollout_gib == 0.0


@pytest.mark.parametrize("policy,point", [("DESTROY_DEFERRED", "lifecycle.destroy"),
                                          ("SUSPEND_PLANNED", "lifecycle.plan.apply")])
def test_a_rank_dying_before_a_parallel_walk_fails_every_other_rank_within_the_agreement_timeout(policy, point):
    world = sim.SimWorld(2, faults=PointFaults(rank=1, point=point, action=sim.FaultAction.crash()))

    async def job(rt):
        plan = GroupPlanRules(costs=None) if policy == "SUSPEND_PLANNED" else None
        lc = PGLifecycle(rt, mesh_groups(2, 1), config=_config(policy, True, two_phase=False, agree_timeout_s=20.0),
                         plan=plan)
        try:
            await lc.start()
            await rank_sums(rt, lc.groups)
            await lc.pause()
            await lc.weight_sync(lambda: None)
            await lc.resume()
        except Exception as exc:  # noqa: BLE001
            return lc.state, exc, rt.now()
        return lc.state, None, rt.now()

    r0, r1 = world.run(job, return_exceptions=True)
    assert isinstance(r1, sim.RankCrashedError)
    state, exc, end = r0
    assert state is PGState.FAILED and isinstance(exc, AgreementTimeoutError) and end < 60.0


def test_the_simulated_destroy_groups_overlaps_the_waits_and_names_failures():
    """Two initialised two-rank groups, 0.1 s apart, destroyed later one first, without the runtime's proxy waker:
    one by one, the earlier one's timeout has passed when the first destroy ends, so it waits a whole period more;
    together, the call ends with the later one's timeout. A name that is not a group is reported, not raised, and
    the others are destroyed all the same."""
    from sim.machine.collectives import NcclComm, TopologyCollectiveCost
    from sim.presets import first_gpus, load_preset_data
    from sim.machine.topology import Topology

    def run(together: bool):
        topo = Topology(first_gpus(load_preset_data("calibrated/hgx-h200-8x"), 2))
        world = sim.SimWorld(2, collective_cost=TopologyCollectiveCost(topo),
                             comm=NcclComm(topo, lazy_init=True, init_at_collective=True, proxy_wake=False))

        async def job(rt):
            for g in ("a", "b"):
                await rt.new_group(GroupSpec(g, (0, 1), backend="nccl"))
            await rt.all_reduce(torch.ones(1), group="a")
            await rt.sleep(0.1)
            await rt.all_reduce(torch.ones(1), group="b")
            t0 = rt.now()
            errors = {}
            if together:
                errors = await rt.destroy_groups(["b", "nope", "a"])
            else:
                for g in ("b", "a"):  # b first: a's timeout has passed when b's destroy ends
                    await rt.destroy_group(g)
            return rt.now() - t0, sorted(errors), [rt.group_live(g) for g in ("a", "b")]

        return world.run(job)[0]

    one_by_one, (together_s, errors, live) = run(False), run(True)
    assert errors == ["nope"] and live == [False, False]
    assert together_s == pytest.approx(0.513, abs=0.005) and one_by_one[0] > together_s + 0.2, (together_s, one_by_one)


def _torch_destroy_groups(rank, world_size):
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    names = ["g.a", "g.b", "g.c"]
    for n in names:
        rt.run(rt.new_group(GroupSpec(n, tuple(range(world_size)))))
    for n in names:
        t = torch.ones(1)
        rt.run(rt.all_reduce(t, group=n, timeout_s=10))
    errors = rt.run(rt.destroy_groups(["g.a", "missing", "g.b", "g.c"]))
    live = [rt.group_live(n) for n in names]
    again = rt.run(rt.destroy_groups(["g.a", "g.b"]))  # already destroyed: reported per group
    rt.run(rt.recreate_group("g.a"))
    t = torch.ones(1)
    rt.run(rt.all_reduce(t, group="g.a", timeout_s=10))
    # the lifecycle's parallel walk on real Gloo groups: DESTROY_DEFERRED, three steps
    specs = [GroupSpec("p.x", tuple(range(world_size))), GroupSpec("p.y", (0, 1))]
    lc = PGLifecycle(rt, specs, config=LifecycleConfig(policy=PGPolicy.DESTROY_DEFERRED, cooldown_s=0.1,
                                                       parallel_destroy=True, control_group="p.control"))
    lc.sync.start()
    steps = []
    for _ in range(3):
        lc.sync.pause()
        down = [rt.group_live(g) for g in lc.groups]
        lc.sync.weight_sync(lambda: None)
        lc.sync.resume()
        sums = {}
        for g in lc.groups:
            if rt.is_member(g):
                x = torch.ones(1)
                rt.run(rt.all_reduce(x, group=g, timeout_s=10))
                sums[g] = x.item()
        steps.append(dict(down=down, sums=sums, gen=rt.group_spec("p.x").generation))
    return dict(errors={k: type(v).__name__ for k, v in errors.items()}, live=live, t=t.item(),
                again={k: type(v).__name__ for k, v in again.items()}, steps=steps, destroys=lc.stats.destroys,
                state=lc.state.name)


def test_torch_runtime_destroy_groups_and_the_parallel_walk_on_gloo():
    """Real Gloo processes: ``destroy_groups`` destroys every named group (its NCCL path shuts them down from a
    thread pool; Gloo takes the same path), names the ones it could not, and the groups can be rebuilt; the
    lifecycle's parallel destroy walk keeps every rank in step with groups right after every wake."""
    results = run_distributed(_torch_destroy_groups, 3, timeout=180)
    for rank, r in enumerate(results):
        assert r["errors"] == {"missing": "GroupError"}, r["errors"]
        assert r["live"] == [False, False, False] and r["t"] == 3.0
        assert r["again"] == {"g.a": "GroupError", "g.b": "GroupError"}
        assert r["state"] == "ACTIVE" and r["destroys"] >= 3
        for s in r["steps"]:
            assert s["down"] == [False, False]
            assert s["sums"] == ({"p.x": 3.0, "p.y": 2.0} if rank in (0, 1) else {"p.x": 3.0})
        assert [s["gen"] for s in r["steps"]] == [2, 4, 6]
