"""Deadlock detection: blocked ranks, the waits-for cycle, and ranks that never arrive."""
from __future__ import annotations

import pytest
import torch

import sim
from refimpl.runtime import CollectiveTimeoutError, GroupSpec
from sim.machine.protocols import FaultAction, NoFaults


async def _two_groups(rt):
    await rt.new_group(GroupSpec("a", (0, 1)))
    await rt.new_group(GroupSpec("b", (0, 1)))


def test_opposite_group_order_is_a_deadlock_with_its_cycle():
    async def fn(rt):
        await _two_groups(rt)
        x = torch.ones(1)
        order = ("a", "b") if rt.rank == 0 else ("b", "a")
        for g in order:
            await rt.all_reduce(x, group=g)
        return x.item()

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(2, fn)
    err = info.value
    assert err.blocked == {0: "all_reduce on group 'a' seq 0", 1: "all_reduce on group 'b' seq 0"}
    assert sorted(err.cycle) == [0, 1] and len(err.cycle) == 2
    assert err.absent == {}
    msg = str(err)
    assert "rank 0 blocked in all_reduce on group 'a' seq 0, waiting for ranks [1]" in msg
    assert "rank 1 blocked in all_reduce on group 'b' seq 0, waiting for ranks [0]" in msg
    assert "waits-for cycle: 0 -> 1 -> 0" in msg or "waits-for cycle: 1 -> 0 -> 1" in msg


def test_three_rank_cycle_through_pairwise_groups():
    async def fn(rt):
        for pair in ((0, 1), (1, 2), (0, 2)):
            await rt.new_group(GroupSpec(f"g{pair[0]}{pair[1]}", pair))
        # each rank first talks to its right neighbour's group: 0 in g01, 1 in g12, 2 in g02
        first = {0: "g01", 1: "g12", 2: "g02"}[rt.rank]
        await rt.barrier(first)
        return True

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(3, fn)
    assert sorted(info.value.cycle) == [0, 1, 2]
    assert set(info.value.blocked) == {0, 1, 2}


def test_rank_that_exits_early_is_reported_with_its_last_op():
    async def fn(rt):
        x = torch.ones(1)
        await rt.all_reduce(x)
        if rt.rank == 2:
            return "left early"  # bug: skips the second all_reduce
        await rt.all_reduce(x)
        return x.item()

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(3, fn)
    err = info.value
    assert err.blocked == {0: "all_reduce on group 'world' seq 1", 1: "all_reduce on group 'world' seq 1"}
    assert err.cycle == []
    assert list(err.absent) == [2]
    assert "rank 2 finished; its last operation: all_reduce on group 'world' seq 0" in err.absent[2]
    assert "never arrives: rank 2 finished" in str(err)


def test_failed_rank_is_reported_with_its_exception():
    async def fn(rt):
        if rt.rank == 1:
            raise ValueError("shape bug in rank 1")
        await rt.barrier()

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(2, fn)
    assert "ValueError: shape bug in rank 1" in info.value.absent[1]


class HangAt(NoFaults):
    def __init__(self, rank, action):
        self.rank, self.action = rank, action

    def on_point(self, rank, name):
        return self.action if rank == self.rank else None


def test_peers_waiting_on_a_hung_rank_are_a_deadlock_ending_at_the_hang():
    async def fn(rt):
        await rt.point("lifecycle.pause")
        await rt.barrier()

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(3, fn, faults=HangAt(1, FaultAction.hang()))
    err = info.value
    assert err.blocked[0] == err.blocked[2] == "barrier on group 'world' seq 0"
    assert "hung" in err.blocked[1] and "lifecycle.pause" in err.blocked[1]
    assert "injected fault" in err.absent[1]


def test_crashed_rank_is_reported_as_never_arriving():
    async def fn(rt):
        await rt.point("store.offload.copy")
        await rt.barrier()

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(2, fn, faults=HangAt(0, FaultAction.crash()))
    assert "rank 0 crashed (injected fault) at point 'store.offload.copy'" in info.value.absent[0]


def test_timeouts_turn_the_same_hang_into_collective_timeouts():
    async def fn(rt):
        await rt.point("lifecycle.pause")
        await rt.barrier(timeout_s=30.0)

    res = sim.SimWorld(2, faults=HangAt(1, FaultAction.hang())).run(fn, return_exceptions=True)
    assert isinstance(res[0], CollectiveTimeoutError) and isinstance(res[1], sim.RankHungError)


def test_blocked_in_group_creation_is_detected():
    async def fn(rt):
        if rt.rank == 0:
            await rt.new_group(GroupSpec("tp", (0, 1)))
        return rt.rank  # rank 1 never creates the group

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(2, fn)
    assert info.value.blocked == {0: "create_group of group 'tp'"}
    assert "rank 1 finished" in info.value.absent[1]


def test_many_blocked_ranks_keep_the_message_short():
    async def fn(rt):
        if rt.rank == 0:
            return None
        await rt.barrier()

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(100, fn, payload="meta")
    assert len(info.value.blocked) == 99
    assert "and 67 more blocked ranks" in str(info.value)
    assert len(str(info.value).splitlines()) < 45


def test_a_correct_protocol_is_not_a_deadlock():
    async def fn(rt):
        await _two_groups(rt)
        x = torch.ones(1)
        for g in ("a", "b", "a"):
            await rt.all_reduce(x, group=g)
        return x.item()

    assert sim.run_ranks(2, fn) == [8.0, 8.0]


def test_deadlock_time_is_when_the_ranks_blocked_not_when_the_engine_stopped():
    blocked_at = {}

    async def fn(rt):
        if rt.rank == 2:  # not in either group: its timers run on long after 0 and 1 are stuck
            await rt.sleep(100.0)
            return "done"
        await _two_groups(rt)
        await rt.sleep(1.0)
        x = torch.ones(1)
        blocked_at[rt.rank] = rt.now()
        for g in (("a", "b") if rt.rank == 0 else ("b", "a")):
            await rt.all_reduce(x, group=g)
        return x.item()

    with pytest.raises(sim.DeadlockError) as info:
        sim.run_ranks(3, fn)
    err = info.value
    assert err.stopped_at == pytest.approx(100.0)
    assert err.time == pytest.approx(max(blocked_at.values())) and err.time < 10.0
    assert f"deadlock at t={err.time:.6f} s" in str(err)


def test_a_rank_that_failed_completing_a_collective_is_named_as_the_cause():
    """Every member arrived, the last one raised while the collective was costed: the others wait for
    nobody by name ("waiting for ranks []"); the report names the failure (issue 11)."""
    from sim.machine.collectives import TopologyCollectiveCost
    from sim.machine.topology import Topology

    topo = Topology.from_preset("hgx-h200-8x", nodes=2)  # no NICs between the nodes

    async def fn(rt):
        x = torch.ones(1)
        await rt.all_reduce(x)
        return x.item()

    with pytest.raises(sim.DeadlockError) as info:
        sim.SimWorld(16, collective_cost=TopologyCollectiveCost(topo)).run(fn)
    msg = str(info.value)
    assert "caused by: rank" in msg and "nodes have no NICs" in msg
    assert any("nodes have no NICs" in v for v in info.value.absent.values())
