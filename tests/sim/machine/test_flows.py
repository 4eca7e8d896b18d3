"""Max-min fair bandwidth sharing: shares match the model, recomputed whenever a copy starts or ends."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim
from refimpl.runtime.base import CopyKind
from sim.kernel.engine import Engine
from sim.machine.flows import FlowError, FlowNetwork, FlowTransport, max_min_rates
from sim.machine.topology import Topology
from tests._hypothesis import BUDGET

LAT = 3.6e-6  # per-copy latency of the presets (derived from GPU.md)


class _World:  # what FlowTransport.bind reads from a SimWorld
    def __init__(self, n):
        self.engine = Engine(trace=False)
        self.world_size = n


def _transport(preset, n, **kw):
    topo = Topology.from_preset(preset)
    tr = FlowTransport(topo, **kw)
    world = _World(n)
    tr.bind(world)
    return tr, world.engine


def _run(tr, engine, copies):
    done = {}
    for key, (rank, kind, nbytes) in copies.items():
        tr.start(rank, kind, nbytes, lambda key=key: done.__setitem__(key, engine.now))
    engine.run()
    return done


def test_textbook_max_min_example():
    # two links of 10 and 4; flow a uses both, b only the first, c only the second
    rates = max_min_rates([(0, 1), (0,), (1,)], {0: 10.0, 1: 4.0})
    assert rates == pytest.approx([2.0, 8.0, 2.0])


def test_one_gpu_alone_gets_its_whole_measured_link():
    tr, engine = _transport("h200-1x", 1)
    done = _run(tr, engine, {"a": (0, CopyKind.D2H, 4 * 10**9)})
    assert done["a"] == pytest.approx(LAT + 4e9 / 55.2e9)


def test_eight_gpus_offloading_at_once_share_the_switch_uplinks():
    """Two GPUs behind each PCIe switch: each gets half of the 55.2 GB/s uplink."""
    tr, engine = _transport("hgx-h200-8x", 8)
    done = _run(tr, engine, {r: (r, CopyKind.D2H, 10**9) for r in range(8)})
    for r in range(8):
        assert done[r] == pytest.approx(LAT + 1e9 / 27.6e9, rel=1e-9)
    # half the GPUs (one per switch) get the whole uplink
    tr, engine = _transport("hgx-h200-8x", 8)
    done = _run(tr, engine, {r: (r, CopyKind.D2H, 10**9) for r in (0, 2, 4, 6)})
    assert done[0] == pytest.approx(LAT + 1e9 / 55.2e9, rel=1e-9)


def test_opposite_directions_on_one_uplink_share_its_duplex_limit():
    tr, engine = _transport("hgx-h200-8x", 8)
    done = _run(tr, engine, {"d2h": (0, CopyKind.D2H, 10**9), "h2d": (1, CopyKind.H2D, 10**9)})
    assert done["d2h"] == pytest.approx(LAT + 1e9 / 46.5e9, rel=1e-9)  # 93 GB/s measured duplex / 2
    assert done["h2d"] == pytest.approx(done["d2h"])


def test_rates_are_recomputed_when_a_transfer_ends():
    """A short and a long copy share an uplink; after the short one ends the long one speeds up."""
    tr, engine = _transport("hgx-h200-8x", 8)
    done = _run(tr, engine, {"short": (0, CopyKind.D2H, 10**9), "long": (1, CopyKind.D2H, 3 * 10**9)})
    t_short = LAT + 1e9 / 27.6e9
    assert done["short"] == pytest.approx(t_short, rel=1e-9)
    left = 3e9 - 1e9  # the long copy moved as much as the short one while they shared
    assert done["long"] == pytest.approx(t_short + left / 55.2e9, rel=1e-9)


def test_copies_of_one_rank_run_one_after_another_on_its_stream():
    tr, engine = _transport("h200-1x", 1)
    done = _run(tr, engine, {"a": (0, CopyKind.D2H, 10**9), "b": (0, CopyKind.H2D, 10**9)})
    assert done["b"] == pytest.approx(2 * (LAT + 1e9 / 55.2e9))
    tr, engine = _transport("h200-1x", 1, streams="per_kind")  # one stream per direction: duplex shared
    done = _run(tr, engine, {"a": (0, CopyKind.D2H, 10**9), "b": (0, CopyKind.H2D, 10**9)})
    assert done["b"] == pytest.approx(LAT + 1e9 / 46.5e9)


def test_device_to_device_copies_use_the_gpu_copy_bandwidth_not_pcie():
    tr, engine = _transport("hgx-h200-8x", 8)
    done = _run(tr, engine, {"d2d": (0, CopyKind.D2D, 10**10), "d2h": (1, CopyKind.D2H, 10**9)})
    assert done["d2d"] == pytest.approx(LAT + 1e10 / 2050e9)
    assert done["d2h"] == pytest.approx(LAT + 1e9 / 55.2e9)


def test_a_slowed_link_slows_the_copies_crossing_it_in_flight():
    tr, engine = _transport("hgx-h200-8x", 8)
    done = {}
    tr.start(0, CopyKind.D2H, 2 * 10**9, lambda: done.__setitem__("a", engine.now))
    tr.start(2, CopyKind.D2H, 2 * 10**9, lambda: done.__setitem__("b", engine.now))
    t_half = LAT + 1e9 / 55.2e9
    engine.schedule(t_half, tr.slow, tr.resources_matching("n0/pcisw0"), 0.5)
    engine.run()
    assert done["b"] == pytest.approx(LAT + 2e9 / 55.2e9, rel=1e-9)
    assert done["a"] == pytest.approx(t_half + 1e9 / 27.6e9, rel=1e-9)


def test_unknown_resources_and_bad_capacities_are_refused():
    with pytest.raises(FlowError, match="capacity must be > 0"):
        FlowNetwork({"x": 0.0})
    with pytest.raises(FlowError, match="unknown resource 'y'"):
        FlowNetwork({"x": 1.0}).resources(["y"])
    tr, _ = _transport("hgx-h200-8x", 8)
    with pytest.raises(FlowError, match="no link or element 'n0/gpu9'"):
        tr.resources_matching("n0/gpu9")


paths = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True).map(tuple), min_size=1, max_size=8)
caps = st.lists(st.floats(1.0, 100.0), min_size=5, max_size=5)


@BUDGET.settings(150)
@given(paths, caps)
def test_max_min_rates_are_feasible_and_every_flow_has_a_saturated_bottleneck(ps, cs):
    capacity = dict(enumerate(cs))
    rates = max_min_rates(ps, capacity)
    load = {r: 0.0 for r in capacity}
    for p, x in zip(ps, rates):
        assert x > 0
        for r in p:
            load[r] += x
    for r in capacity:
        assert load[r] <= capacity[r] * (1 + 1e-9)
    for p, x in zip(ps, rates):
        # max-min: some resource on the path is full and no flow through it gets more
        assert any(load[r] >= capacity[r] * (1 - 1e-9)
                   and all(y <= x * (1 + 1e-9) for q, y in zip(ps, rates) if r in q) for r in p)


SCRUB = 428e9  # the H200 presets' h200_scrub (run 7's probe alone)


def test_h2d_after_a_free_waits_for_the_drivers_scrub_and_d2h_does_not():
    """[Note: the driver's scrub of freed memory]: freed bytes queue per GPU; an H2D copy starts once they drained."""
    tr, engine = _transport("hgx-h200-8x", 8)
    assert tr.scrub_bps == pytest.approx(SCRUB)
    tr.device_freed(0, 40 * 10**9)
    tr.device_freed(0, 4 * 10**9)  # queued behind the first free
    assert tr.scrub_pending_s(0) == pytest.approx(44e9 / SCRUB) and tr.scrub_pending_s(2) == 0.0
    done = _run(tr, engine, {"h2d": (0, CopyKind.H2D, 10**9), "d2h": (2, CopyKind.D2H, 10**9),
                             "other_gpu_h2d": (4, CopyKind.H2D, 10**9)})
    assert done["h2d"] == pytest.approx(44e9 / SCRUB + LAT + 1e9 / 55.2e9, rel=1e-9)
    assert done["d2h"] == pytest.approx(LAT + 1e9 / 55.2e9, rel=1e-9)
    assert done["other_gpu_h2d"] == pytest.approx(LAT + 1e9 / 55.2e9, rel=1e-9)  # scrub is per GPU


def test_a_copy_issued_after_the_scrub_finished_runs_at_once_and_a_partial_wait_is_the_rest():
    tr, engine = _transport("h200-1x", 1)
    tr.device_freed(0, 10**9)
    half = 0.5e9 / SCRUB
    done = {}
    engine.schedule(half, lambda: tr.start(0, CopyKind.H2D, 10**9, lambda: done.__setitem__("mid", engine.now)))
    engine.schedule(1.0, lambda: tr.start(0, CopyKind.H2D, 10**9, lambda: done.__setitem__("late", engine.now)))
    engine.run()
    assert done["mid"] == pytest.approx(2 * half + LAT + 1e9 / 55.2e9, rel=1e-9)  # waited the other half
    assert done["late"] == pytest.approx(1.0 + LAT + 1e9 / 55.2e9, rel=1e-9)


def test_presets_without_a_scrub_rate_model_none():
    tr, engine = _transport("a6000-4x-nvlink", 4)
    assert tr.scrub_bps == 0.0
    tr.device_freed(0, 10**12)
    assert tr.scrub_pending_s(0) == 0.0


def test_sim_runtime_reports_returns_to_the_driver_to_the_transport():
    """release and empty_cache start the scrub; a buffer dropped into the allocator cache does not."""
    import torch

    from sim.machine.memory import TopologyMemory
    from sim.world import SimWorld

    topo = Topology.from_preset("h200-1x")
    world = SimWorld(1, payload="meta", transport=FlowTransport(topo), memory=TopologyMemory(topo), trace=False)
    seen = {}

    async def prog(rt):
        a = rt.alloc_device(10**9, torch.uint8)
        b = rt.alloc_device(2 * 10**9, torch.uint8)
        rt.release(a)
        seen["after_release"] = world.transport.scrub_pending_s(0)
        del b  # into the allocator cache: still the process's, not scrubbed
        seen["after_drop"] = world.transport.scrub_pending_s(0)
        rt.empty_cache()
        seen["after_empty_cache"] = world.transport.scrub_pending_s(0)

    world.run(prog)
    assert seen["after_release"] == pytest.approx(1e9 / SCRUB)
    assert seen["after_drop"] == pytest.approx(1e9 / SCRUB)
    assert seen["after_empty_cache"] == pytest.approx(3e9 / SCRUB)


def test_each_node_prunes_the_resources_a_walk_over_every_rank_would():
    # [Note: pruning resources that never bind]: worked out on one node (and on a last node with fewer ranks) and
    # renamed, against the walk over every rank's paths that a slow link makes necessary
    topo = Topology.from_preset("hgx-h200-8x-ib", nodes=3)
    for world_size, streams in ((24, "per_rank"), (21, "per_kind"), (5, "per_rank")):
        world = sim.SimWorld(world_size, transport=FlowTransport(topo, streams=streams), payload="meta")
        transport = world.transport
        walked = transport._binding_resources()
        for rank in range(world_size):
            for kind in CopyKind:
                full = transport._index(topo.copy_path(rank, kind))
                assert transport.path(rank, kind) == (tuple(r for r in full if r in walked) or full[:1])
