"""One object per group (sim/groups.py, [Note: one object per group]) and a crashed peer's closed connections
(sim/rendezvous.py, [Note: a crashed peer's closed connections])."""
from __future__ import annotations

import gc
import tracemalloc

import pytest
import torch

import sim
from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.comm.agreement import AgreementTimeoutError
from refimpl.runtime import WORLD, CollectiveFailedError, CollectiveTimeoutError, GroupSpec, ReduceOp
from sim.machine.protocols import FaultAction, NoFaults


class CrashAt(NoFaults):
    """Crash ``rank`` at the named point."""

    def __init__(self, rank: int, point: str):
        self.rank, self.point = rank, point

    def on_point(self, rank, name):
        return FaultAction.crash() if (rank, name) == (self.rank, self.point) else None


def _dp(n: int) -> GroupSpec:
    return GroupSpec("dp", tuple(range(n)), backend="nccl")


def test_a_group_and_each_rebuild_are_one_object_shared_by_every_rank():
    n = 64
    world = sim.SimWorld(n)
    spec = _dp(n)  # one object, as the scenario runner hands every rank

    async def job(rt):
        # the lifecycle's control group: each rank builds its own spec of all ranks (refimpl.comm.agreement)
        await rt.new_group(GroupSpec("control", tuple(range(rt.world_size)), backend="gloo"))
        await rt.new_group(spec)
        first = rt.group_spec("dp")
        gens = []
        for _ in range(3):
            await rt.destroy_group("dp")
            gens.append(await rt.recreate_group("dp"))
        return rt.group_spec("control"), first, gens

    results = world.run(job)
    controls = {id(c) for c, _, _ in results}
    assert len(controls) == 1  # 64 ranks, 64 tuples built, one spec kept
    assert all(first is spec for _, first, _ in results)
    for g in range(3):
        rebuilt = {id(gens[g]) for _, _, gens in results}
        assert len(rebuilt) == 1 and results[0][2][g].generation == g + 1
        # made from the previous generation without copying its rank tuple or its position table
        assert results[0][2][g].ranks is spec.ranks
        assert results[0][2][g].__dict__.get("_positions") is spec.__dict__["_positions"]


def test_a_rank_outside_a_group_holds_the_shared_record_and_no_copy():
    world = sim.SimWorld(8)
    tp = GroupSpec("tp0", (0, 1, 2, 3), backend="nccl")

    async def job(rt):
        await rt.new_group(tp)
        member = rt.is_member("tp0")
        await rt.destroy_group("tp0")
        await rt.recreate_group("tp0")
        return member, rt._group("tp0"), rt.group_spec("tp0").generation

    results = world.run(job)
    assert [m for m, _, _ in results] == [True] * 4 + [False] * 4
    outsiders = {id(rec) for _, rec, _ in results[4:]}
    assert len(outsiders) == 1 and {g for _, _, g in results} == {1}
    rec = results[4][1]
    with pytest.raises(AttributeError):  # frozen: a rank cannot change what other ranks share
        rec.state = None


def test_the_memory_of_the_groups_grows_with_the_ranks_not_their_square():
    # every rank installs the control group (a tuple of every rank built on each rank) and rebuilds a world-sized
    # group twice: with one object per group the bytes kept per rank stay flat as the world grows
    def kept_per_rank(n: int) -> float:
        world = sim.SimWorld(n, payload="meta", trace=False)

        async def job(rt):
            await rt.new_group(GroupSpec("control", tuple(range(rt.world_size)), backend="gloo"))
            await rt.new_group(_dp(rt.world_size))
            for _ in range(2):
                await rt.destroy_group("dp")
                await rt.recreate_group("dp")

        gc.collect()
        tracemalloc.start()
        world.run(job)
        gc.collect()
        used, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return used / n

    small, large = kept_per_rank(256), kept_per_rank(1024)
    # measured with this job on the simulator before the book (each rank its own control spec and position
    # tables): 24 kB per rank at 256 ranks, 184 kB at 1,024; with it about 1.1 kB at both
    assert large < 1.5 * small, (small, large)
    assert large < 20_000, large


def test_a_crashed_ranks_peers_fail_their_collectives_on_its_groups_once_its_connections_close():
    world = sim.SimWorld(4, faults=CrashAt(1, "die"), peer_loss_s=0.25)

    async def job(rt):
        await rt.new_group(GroupSpec("pair", (2, 3), backend="gloo"))
        t = torch.ones(1)
        await rt.sleep(1.0)
        await rt.point("die")
        try:
            await rt.all_reduce(t, ReduceOp.SUM, WORLD, timeout_s=600.0)
        except CollectiveFailedError as exc:
            failed = (rt.now(), str(exc))
        else:
            failed = None
        if rt.rank in (2, 3):  # a group without the crashed rank is not affected
            await rt.all_reduce(t, ReduceOp.SUM, "pair")
        return failed

    results = world.run(job, return_exceptions=True)
    assert isinstance(results[1], sim.RankCrashedError)
    for rank in (0, 2, 3):
        when, msg = results[rank]
        assert when == pytest.approx(1.25)  # the crash at 1.0 s, its connections closed 0.25 s later
        assert msg.startswith(f"rank {rank}: all_reduce on group 'world' seq 0 failed: rank 1, a member of group "
                              "'world', is gone")


def test_without_peer_loss_a_crashed_rank_is_waited_for_until_the_timeout():
    world = sim.SimWorld(3, faults=CrashAt(2, "die"))

    async def job(rt):
        await rt.point("die")
        with pytest.raises(CollectiveTimeoutError, match="waiting for ranks \\[2\\]"):
            await rt.all_reduce(torch.ones(1), ReduceOp.SUM, WORLD, timeout_s=30.0)
        return rt.now()

    assert world.run(job, return_exceptions=True)[:2] == [30.0, 30.0]


def test_the_lifecycle_fails_together_at_once_when_a_peer_dies():
    n = 8
    world = sim.SimWorld(n, faults=CrashAt(5, "lifecycle.pause.decide"), peer_loss_s=0.001)
    groups = [_dp(n), GroupSpec("tp0", (0, 1, 2, 3), backend="nccl"), GroupSpec("tp1", (4, 5, 6, 7), backend="nccl")]

    async def job(rt):
        lc = PGLifecycle(rt, groups, config=LifecycleConfig(policy=PGPolicy.DESTROY_DEFERRED, two_phase=False))
        await lc.start()
        t0 = rt.now()
        try:
            await lc.pause()
        except Exception as exc:  # noqa: BLE001 - how each rank ends is the point
            return lc.state, rt.now() - t0, type(exc).__name__, [rt.group_live(g.name) for g in groups]
        return lc.state, rt.now() - t0, None, None

    results = world.run(job, return_exceptions=True)
    assert isinstance(results[5], sim.RankCrashedError)
    alive = [r for i, r in enumerate(results) if i != 5]
    assert {(state, err) for state, _, err, _ in alive} == {(PGState.FAILED, "AgreementError")}
    assert all(dt < 0.01 for _, dt, _, _ in alive)  # not the 300 s agreement timeout
    assert all(not any(live) for _, _, _, live in alive)  # every group aborted
    assert not issubclass(AgreementTimeoutError, CollectiveFailedError)  # the two ways to fail stay apart


def test_peer_loss_s_is_checked():
    with pytest.raises(sim.SimUsageError, match="peer_loss_s"):
        sim.SimWorld(2, peer_loss_s=-1.0)
