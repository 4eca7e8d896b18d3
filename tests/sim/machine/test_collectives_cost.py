"""Collective costs in nccl-tests' bus-bandwidth terms, checked against published nccl-tests figures."""
import pytest

from refimpl.runtime.base import GroupSpec
from sim.machine.collectives import CollectiveCostError, NcclComm, TopologyCollectiveCost
from sim.machine.topology import Topology

GB = 1e9


def _cost(preset, nodes=None):
    return TopologyCollectiveCost(Topology.from_preset(preset, nodes=nodes) if nodes else Topology.from_preset(preset))


NVLINK4_PER_GPU_ONE_WAY = 450 * GB  # NVIDIA H100/H200 SXM data sheets: 900 GB/s NVLink, both directions


def test_8xh200_all_reduce_busbw_is_below_the_nvlink_line_and_near_published_figures():
    """The preset's efficiency was fitted to 368.76 GB/s (all_reduce_perf, 8 x H100/H200, NVLS off:
    NVIDIA/nccl-tests#309), so matching that figure would prove nothing. Checked instead: the busbw is
    below the data-sheet NVLink rate (a ring cannot beat the link) and within 10% of the *other*
    published figure, ~370 GB/s, quoted by NVIDIA for the same node (nccl-tests#212, nccl#2140)."""
    c = _cost("hgx-h200-8x")
    ranks = tuple(range(8))
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert 0.5 * NVLINK4_PER_GPU_ONE_WAY < c.busbw(op, ranks, 4 << 30) < NVLINK4_PER_GPU_ONE_WAY, op
    assert c.busbw("all_reduce", ranks, 4 << 30) == pytest.approx(370 * GB, rel=0.10)


def test_ring_identities_hold_in_the_bandwidth_bound_regime():
    """From first principles, not from the model's tables: a ring all-reduce is a reduce-scatter plus an
    all-gather, so for large messages it takes twice as long as either; nccl-tests' busbw convention
    (PERFORMANCE.md: algbw = S/t, busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for all-gather) makes
    busbw independent of the rank count on one switch; time is linear in size for large messages and
    flat for tiny ones."""
    c = _cost("hgx-h200-8x")
    big = 8 << 30
    for n in (2, 4, 8):
        ranks = tuple(range(n))
        ar, ag = c.time("all_reduce", ranks, big), c.time("all_gather", ranks, big)
        assert ar / ag == pytest.approx(2.0, rel=0.01), n
        assert c.time("reduce_scatter", ranks, big) == pytest.approx(ag, rel=0.01)
        algbw = big / ar
        assert algbw * 2 * (n - 1) / n == pytest.approx(c.busbw("all_reduce", ranks, big), rel=1e-9)
    busbws = [big / c.time("all_reduce", tuple(range(n)), big) * 2 * (n - 1) / n for n in (2, 4, 8)]
    assert max(busbws) / min(busbws) < 1.02, busbws
    ranks = tuple(range(8))
    assert c.time("all_reduce", ranks, 2 * big) / c.time("all_reduce", ranks, big) == pytest.approx(2.0, rel=0.01)
    tiny = c.time("all_reduce", ranks, 8)
    assert c.time("all_reduce", ranks, 64) == pytest.approx(tiny, rel=0.01)  # latency bound
    # a time never falls as the message grows, and busbw rises toward its plateau
    sizes = [8 << k for k in range(0, 31, 3)]
    times = [c.time("all_reduce", ranks, s) for s in sizes]
    assert times == sorted(times)
    bws = [c.busbw("all_reduce", ranks, s) for s in sizes]
    assert bws == sorted(bws)


def test_two_hgx_nodes_ring_busbw_matches_published_ring_figures():
    """~48 GB/s per 400 Gb/s CX7 NIC, up to ~396 GB/s ring busbw on 2 nodes (NVIDIA/nccl-tests#319)."""
    c = _cost("hgx-h200-8x-ib", nodes=2)
    busbw = c.busbw("all_reduce", tuple(range(16)), 8 << 30)
    assert busbw == pytest.approx(396 * GB, rel=0.10)


def test_a6000_bridged_pairs_run_at_nccls_nvlink_rate_and_the_4_gpu_ring_at_pcie_rate():
    """No published nccl-tests figure for bridged A6000s was found; NCCL's own topology model
    (src/graph/topo.h) says 4 x 12 GB/s for an SM86 NVLink bridge and 24 GB/s for PCIe Gen4 x16."""
    c = _cost("a6000-4x-nvlink")
    assert c.busbw("all_reduce", (0, 1), 1 << 30) == pytest.approx(48 * GB, rel=0.02)
    assert c.busbw("all_reduce", (0, 2), 1 << 30) == pytest.approx(24 * GB, rel=0.02)
    assert c.busbw("all_reduce", (0, 1, 2, 3), 1 << 30) == pytest.approx(24 * GB, rel=0.02)


def test_alpha_beta_edges_and_ordering():
    c = _cost("hgx-h200-8x")
    ranks = tuple(range(8))
    # NCCL's LL protocol: a few microseconds for a tiny all-reduce on one NVLink node, not milliseconds
    assert 1e-6 < c.time("all_reduce", ranks, 8) < 50e-6
    assert c.time("all_reduce", (3,), 1 << 30) == 0.0
    assert c.time("barrier", ranks, 0) == c.time("all_reduce", ranks, 4)
    assert c.time("broadcast", ranks, 1 << 30) < c.time("all_reduce", ranks, 1 << 30)
    with pytest.raises(CollectiveCostError, match="unknown collective 'alltoall'"):
        c.time("alltoall", ranks, 8)


def test_groups_across_nodes_use_the_tree_when_its_latency_is_lower():
    """Scaling laws instead of the model's own formula: a ring's latency grows with the rank count (2(n-1)
    steps), a tree's with its depth (log2 n). Across nodes the small-message all-reduce must therefore grow
    far slower than linearly, as NCCL's tree does (nccl-tests across 2 to 8+ nodes), while inside one node
    (ring only) it grows about linearly."""
    c = _cost("hgx-h200-8x-ib", nodes=8)
    lat = {n: c.latency("all_reduce", tuple(range(n))) for n in (16, 32, 64)}
    assert lat[16] < lat[32] < lat[64]
    assert lat[64] / lat[16] < 2.0, lat  # a ring would take about 4x the steps
    one_node = _cost("hgx-h200-8x")
    small = {n: one_node.latency("all_reduce", tuple(range(n))) - one_node.latency("all_reduce", (0, 1))
             for n in (4, 8)}
    assert small[8] / small[4] == pytest.approx((2 * 7 - 2) / (2 * 3 - 2), rel=0.05)  # ring: 2(n-1) steps


def test_nccl_communicators_are_initialised_lazily_and_destroyed_at_the_matching_cost():
    topo = Topology.from_preset("a6000-4x-nvlink")
    comm = NcclComm(topo)
    spec = GroupSpec("tp0", (0, 1), backend="nccl")
    assert comm.create_time(spec) == pytest.approx(topo.comm.create_group_s)
    assert comm.destroy_time(spec) == pytest.approx(topo.comm.destroy_uninitialized_s)
    assert comm.first_use(spec) == pytest.approx(topo.comm.init_s)
    assert comm.first_use(spec) == 0.0
    assert comm.destroy_time(spec) == pytest.approx(topo.comm.destroy_s)
    rebuilt = GroupSpec("tp0", (0, 1), backend="nccl", generation=1)
    assert comm.destroy_time(rebuilt) == pytest.approx(topo.comm.destroy_uninitialized_s)
    assert comm.memory(spec, 0).suspendable == 384 << 20
    assert comm.memory(GroupSpec("ctl", (0, 1), backend="gloo"), 0).suspendable == 0
    eager = NcclComm(topo, lazy_init=False)
    assert eager.create_time(spec) == pytest.approx(topo.comm.create_group_s + topo.comm.init_s)
    assert eager.first_use(spec) == 0.0
