"""SUSPEND_PLANNED's lazy wake in the simulator: groups left down at the wake, brought up at first use.

2 ranks x 14 groups (the 2-GPU benchmark's mesh, ``mesh_groups(2, 1)``): the five
two-rank groups are suspended (cost row off), the nine one-rank groups of each
rank destroyed. Training declares ``wake_groups={"dp"}``: the wake brings back
only ``dp``; the others stay down until ``use()`` names them.
"""
from __future__ import annotations

import pytest
import torch

import sim
from bench.switch_window import mesh_groups
from refimpl.comm import LifecycleConfig, PeerFailedError, PGLifecycle, PGPolicy, PGState
from refimpl.comm.group_plan import GroupAction, GroupPlanRules
from refimpl.comm.lazy_wake import LazyGroupError, request_votes
from refimpl.runtime.base import GroupError, GroupSuspendedError

MULTI = ["dp", "dp_cp", "edp", "tp_dp", "tp_dp_cp"]


def config(**kw) -> LifecycleConfig:
    kw.setdefault("agree_timeout_s", 60.0)
    kw.setdefault("canary_timeout_s", 10.0)
    return LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, cooldown_s=2.0, two_phase=False, **kw)


def rules(rank: int, **kw) -> GroupPlanRules:
    kw.setdefault("sync_groups", {f"tp{rank}"})
    kw.setdefault("wake_groups", {"dp"})
    return GroupPlanRules(costs=None, **kw)


async def rank_sums(rt, names) -> dict[str, float]:
    out = {}
    for g in names:
        if rt.is_member(g):
            t = torch.full((2,), float(rt.rank + 1))
            await rt.all_reduce(t, group=g, timeout_s=5)
            out[g] = t[0].item()
    return out


def expected(rank: int, names) -> dict[str, float]:
    by_name = {s.name: s for s in mesh_groups(2, 1)}
    return {g: float(sum(r + 1 for r in by_name[g].ranks)) for g in names if rank in by_name[g].ranks}


def test_lazy_wake_leaves_unused_groups_down_and_never_pays_for_them_again():
    specs = mesh_groups(2, 1)
    world = sim.SimWorld(2)

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(), plan=rules(rt.rank))
        await lc.start()
        steps = []
        for step in range(3):
            s0 = dict(vars(lc.stats))
            await lc.pause()
            await lc.weight_sync(lambda: rank_sums(rt, [f"tp{rt.rank}"]))
            held = lc.comm_memory()
            await rt.sleep(3.0)
            t0 = rt.now()
            state = await lc.resume()
            wake_s = rt.now() - t0
            left = dict(lc.planned.left_down)
            # training: dp always; tp_dp on step 1 only, brought up lazily at its first use
            trained = await rank_sums(rt, ["dp"])
            refused = None
            if step == 1:
                try:
                    await rt.all_reduce(torch.ones(1), group="tp_dp", timeout_s=5)
                except GroupSuspendedError as exc:
                    refused = str(exc)
                t1 = rt.now()
                await lc.use(["tp_dp"])
                trained.update(await rank_sums(rt, ["tp_dp"]))
                use_s = rt.now() - t1
            else:
                use_s = 0.0
            steps.append(dict(state=state, held=held, left=left, trained=trained, refused=refused, wake_s=wake_s,
                              use_s=use_s, after_use=lc.state,
                              delta={k: v - s0[k] for k, v in vars(lc.stats).items()}))
        end = await lc.resume()  # everything back: ACTIVE, every group's collective right
        return dict(steps=steps, end=end, sums=await rank_sums(rt, lc.groups), history=lc.history)

    results = world.run(job)
    for rank, r in enumerate(results):
        first, second, third = r["steps"]
        mine = [s.name for s in specs if rank in s.ranks]
        assert first["state"] is PGState.ACTIVE_LAZY
        assert set(first["left"]) == set(specs_names(specs)) - {"dp"}, "all but the wake group left down"
        assert first["left"]["tp_dp"] is GroupAction.SUSPEND and first["left"][f"tp{rank}"] is GroupAction.DESTROY
        assert first["trained"] == expected(rank, ["dp"])
        assert first["delta"]["comm_resumes"] == 1, "the wake resumes dp only"
        # step 2: the pause takes down dp and the sync group only; the others are still down from step 1
        assert second["delta"]["comm_suspends"] == 1 and second["delta"]["destroys"] == 2, (
            "dp suspended again; tp0 and tp1 (the sync groups) destroyed by every rank; nothing else touched")
        assert second["refused"] and "suspended" in second["refused"], "a collective on a left-down group is refused"
        assert second["trained"] == expected(rank, ["dp", "tp_dp"]), "tp_dp right after its lazy resume"
        assert second["delta"]["comm_resumes"] == 2 and second["delta"]["lazy_bring_ups"] == 3, (
            "the pause rebuilt tp0 and tp1 for the weight sync; use() resumed tp_dp")
        assert second["after_use"] is PGState.ACTIVE_LAZY
        assert second["use_s"] > 0, "the resume of tp_dp is paid at its first use"
        assert third["delta"]["comm_suspends"] == 2, "dp and tp_dp (used in step 2) suspended; the rest stayed down"
        for s in r["steps"]:
            assert s["held"].suspendable == 0, "no suspendable NCCL memory held in the rollout"
        assert r["end"] is PGState.ACTIVE
        assert r["sums"] == expected(rank, mine), "every group works after the lazy groups came back"
        assert any(e is sim_event("USE") for _, _, e, _ in r["history"])
        assert any(e is sim_event("RELOADED_LAZY") for _, _, e, _ in r["history"])
    assert [h[1:] for h in results[0]["history"]] == [h[1:] for h in results[1]["history"]]


def specs_names(specs):
    return [s.name for s in specs]


def sim_event(name):
    from refimpl.comm import PGEvent

    return PGEvent[name]


def test_use_brings_up_the_union_of_what_every_rank_names():
    world = sim.SimWorld(2)
    specs = mesh_groups(2, 1)

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(), plan=rules(rt.rank, wake_groups=()))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        await lc.resume()
        before = set(lc.planned.left_down)
        # rank 0 names edp, rank 1 its own one-rank group: both come up on both ranks (edp on both members)
        await lc.use(["edp"] if rt.rank == 0 else [f"mp{rt.rank}"])
        after = set(lc.planned.left_down)
        return before, after, await rank_sums(rt, ["edp", "mp1"]), lc.state

    for rank, (before, after, sums, state) in enumerate(world.run(job)):
        assert "dp" in before and before - after == {"edp", "mp1"}
        assert sums == expected(rank, ["edp", "mp1"]), "rank 0's mp0 was not named: still down"
        assert state is PGState.ACTIVE_LAZY


def test_run_on_a_left_down_group_fails_every_rank_with_the_fix_in_the_message():
    world = sim.SimWorld(2)
    specs = mesh_groups(2, 1)

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(), plan=rules(rt.rank))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        await lc.resume()
        t0 = rt.now()
        try:
            # names dp but uses edp too (rank 0 only): refused at once, every rank fails together
            await lc.run_on(["dp"], lambda: rank_sums(rt, ["dp", "edp"] if rt.rank == 0 else ["dp"]))
        except (LazyGroupError, PeerFailedError) as exc:
            return type(exc).__name__, str(exc), lc.state, rt.now() - t0
        return None

    (e0, m0, s0, t0), (e1, m1, s1, t1) = world.run(job)
    assert e0 == "LazyGroupError" and "'edp'" in m0 and "use()" in m0 and "wake_groups" in m0
    assert e1 == "PeerFailedError"
    assert s0 is s1 is PGState.FAILED
    assert max(t0, t1) < 10, "refused at once, not after a timeout"


def test_pause_with_another_policy_from_active_lazy_brings_everything_up_first():
    world = sim.SimWorld(2)
    specs = mesh_groups(2, 1)

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(), plan=rules(rt.rank))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        await lc.resume()
        lazy = lc.state
        await lc.pause(policy=PGPolicy.DESTROY_DEFERRED)
        destroyed = all(not rt.group_live(g) for g in lc.groups)
        await lc.resume()
        return lazy, destroyed, lc.state, await rank_sums(rt, lc.groups)

    for rank, (lazy, destroyed, state, sums) in enumerate(world.run(job)):
        assert lazy is PGState.ACTIVE_LAZY and destroyed and state is PGState.ACTIVE
        assert sums == expected(rank, [s.name for s in specs])


def test_use_refuses_names_that_are_not_role_groups():
    assert request_votes(("a", "b"), ["b"]) == [1, 0]
    assert request_votes(("a", "b"), None) == [0, 0]
    with pytest.raises(ValueError, match=r"\['c'\].*not role groups"):
        request_votes(("a", "b"), ["c"])
    with pytest.raises(TypeError, match="not the string"):
        request_votes(("a", "b"), "a")
    assert GroupPlanRules(wake_groups={"nope", "a"}).unknown(["a"]) == ["nope"], "a typo in wake_groups is caught"
    with pytest.raises(TypeError, match="not the string"):
        GroupPlanRules(wake_groups="dp")


def test_a_collective_on_a_destroyed_left_down_group_is_refused():
    world = sim.SimWorld(2)
    specs = mesh_groups(2, 1)

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config(), plan=rules(rt.rank))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        await lc.resume()
        try:
            await rt.all_reduce(torch.ones(1), group=f"mp{rt.rank}", timeout_s=5)
        except GroupError as exc:
            return str(exc)
        return None

    for msg in world.run(job):
        assert msg is not None and "destroyed" in msg


def test_where_the_lazy_wake_pays_groups_the_training_step_does_not_use():
    """Training uses dp only; the plan suspends the four other two-rank groups (cost row off). Without a lazy
    wake they are resumed at every wake and suspended at every pause; with one they stay suspended."""
    specs = mesh_groups(2, 1)

    def per_step(wake_groups):
        world = sim.SimWorld(2)

        async def job(rt):
            lc = PGLifecycle(rt, specs, config=config(), plan=rules(rt.rank, wake_groups=wake_groups))
            await lc.start()
            times = []
            for _ in range(3):
                t0 = rt.now()
                await lc.pause()
                await lc.weight_sync(lambda: rank_sums(rt, [f"tp{rt.rank}"]))
                t1 = rt.now()
                await rt.sleep(3.0)
                t2 = rt.now()
                await lc.resume()
                await lc.use(["dp"])  # the training step's first use (a no-op where dp is already up)
                assert await rank_sums(rt, ["dp"]) == expected(rt.rank, ["dp"])
                times.append((t1 - t0) + (rt.now() - t2))
            return times

        return max(r[-1] for r in world.run(job))  # the last step, slowest rank

    eager, lazy = per_step(None), per_step({"dp"})
    assert lazy < eager, (lazy, eager)
    # default preset: 4.69 s per step eager against 0.70 s lazy (the four unused two-rank groups' suspend and
    # resume, 0.30 + 0.097 s each, and the one-rank groups' destroy and rebuild, all saved)
    assert eager - lazy > 4 * (0.30 + 0.097), (eager, lazy)
