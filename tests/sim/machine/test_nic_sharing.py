"""Links between nodes: no ring gets more than a link it crosses carries, and concurrent collectives share the NICs."""
from __future__ import annotations

import pytest
import torch

from refimpl.runtime.base import GroupSpec
from sim.machine.collectives import TopologyCollectiveCost
from sim.machine.topology import Topology
from sim.world import SimWorld

GIB = 2**30


def test_a_pair_across_nodes_gets_no_more_than_an_nvlink_pair_inside_a_node():
    """Its hop leaves the GPU over NVLink (PXN to the NICs): at most NVLink's effective rate, never the NICs' 384 GB/s
    aggregate above it (before: 382 GB/s across nodes, 370 GB/s inside one)."""
    cost = TopologyCollectiveCost(Topology.from_preset("hgx-h200-8x-ib"))
    across = cost.busbw("all_reduce", (0, 8), 4 * GIB)
    inside = cost.busbw("all_reduce", (0, 1), 4 * GIB)
    assert across <= inside * (1 + 1e-6)
    assert across < 0.824 * 450e9  # NVLink 4 at NCCL's efficiency on it


def _concurrent(groups: int, nbytes: int) -> float:
    """Seconds the slowest of ``groups`` two-rank groups {i, i + 8} takes to all-reduce ``nbytes`` at once."""
    topo = Topology.from_preset("hgx-h200-8x-ib")
    world = SimWorld(16, trace=False, payload="meta", collective_cost=TopologyCollectiveCost(topo))
    specs = [GroupSpec(f"pair{i}", (i, i + 8)) for i in range(8)]

    async def fn(rt):
        for spec in specs:
            await rt.new_group(spec)
        mine = next(s.name for s in specs if rt.rank in s.ranks)
        t = rt.alloc_device(nbytes // 2, torch.bfloat16, tag="x")
        t0 = rt.now()
        if int(mine.removeprefix("pair")) < groups:
            await rt.all_reduce(t, group=mine)
        return rt.now() - t0

    return max(world.run(fn))


def test_concurrent_groups_across_nodes_share_the_nics():
    """Eight pairs all-reducing 1 GiB across two nodes at once share each node's NICs (8 x 400 Gb/s): the NICs'
    aggregate, not each pair's NVLink, bounds them, so each takes about 8 x 48/370 of a lone pair's bandwidth time.
    Before, every pair got its lone figure whatever the others did."""
    cost = TopologyCollectiveCost(Topology.from_preset("hgx-h200-8x-ib"))
    lone = _concurrent(1, GIB)
    assert lone == pytest.approx(cost.time("all_reduce", (0, 8), GIB), rel=1e-6)
    eight = _concurrent(8, GIB)
    assert eight > 5 * lone
    nic = cost.nic_share_capacity()
    assert eight == pytest.approx(cost.latency("all_reduce", (0, 8)) + GIB / (nic / 8), rel=1e-3)
    # four at once: the NICs still bind (96 GB/s each < 370): half the time of eight
    assert _concurrent(4, GIB) == pytest.approx(cost.latency("all_reduce", (0, 8)) + GIB / (nic / 4), rel=1e-3)
