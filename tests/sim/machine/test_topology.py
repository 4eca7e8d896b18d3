"""Topology presets: every number has a source, the machines have the shape their data sheets say."""
import copy
import json

import pytest

from refimpl.runtime.base import CopyKind
from sim.presets import PRESET_DIR, list_presets, load_preset_data
from sim.machine.topology import ElementKind, LinkKind, Topology, TopologyError

EXPECTED = {"h200-1x", "h200-2x", "hgx-h200-8x", "hgx-h200-8x-ib", "hgx-h20-8x", "a6000-4x-nvlink"}


def test_every_preset_loads_and_every_constant_says_where_it_came_from():
    assert EXPECTED <= set(list_presets())
    for name in list_presets():
        topo = Topology.from_preset(name)
        raw = json.loads((PRESET_DIR / f"{name}.json").read_text())
        assert set(topo.constants) == set(raw["constants"])
        for c in topo.constants.values():
            assert len(c.source) > 20, f"{name}.{c.name} has no real source"
        assert topo.summary()["constants"][next(iter(topo.constants))]["source"]


def test_the_test_machine_preset_uses_the_measured_figures():
    topo = Topology.from_preset("h200-1x")
    assert topo.num_gpus == 1
    assert topo.constant("pcie_gen5_x16").value == pytest.approx(55.2e9)
    assert "measured" in topo.constant("pcie_gen5_x16").source
    assert topo.constant("h200_copy").value == pytest.approx(4100e9 / 2)
    caps = topo.capacities()
    d2h = topo.copy_path(0, CopyKind.D2H)
    assert min(caps[r] for r in d2h) == pytest.approx(55.2e9)
    assert topo.comm.suspend_s == pytest.approx(0.30) and topo.comm.resume_s == pytest.approx(0.097)
    assert topo.comm.memory_bytes == 384 << 20


def test_hgx_gpu_pairs_share_a_pcie_switch_and_sockets_own_their_numa_node():
    topo = Topology.from_preset("hgx-h200-8x")
    assert topo.num_gpus == 8 and len(topo.host_memory_nodes()) == 2
    paths = [set(topo.copy_path(r, CopyKind.D2H)) for r in range(8)]
    uplink = "link:n0/pcisw0>n0/cpu0"
    assert uplink in paths[0] and uplink in paths[1]
    assert uplink not in paths[2]
    assert not paths[0] & paths[4]  # other socket: nothing shared on the way to host memory
    assert [topo.numa_of(r) for r in (0, 3, 4, 7)] == ["n0/numa0", "n0/numa0", "n0/numa1", "n0/numa1"]
    bw, kind = topo.p2p(0, 7)
    assert kind is LinkKind.NVLINK and bw == pytest.approx(450e9)


def test_multi_node_ranks_map_to_nodes_and_cross_through_the_nics():
    topo = Topology.from_preset("hgx-h200-8x-ib", nodes=3)
    assert topo.num_gpus == 24
    assert topo.gpu(17) == "n2/gpu1" and topo.node_of(17) == 2
    bw, kind = topo.p2p(1, 9)
    assert kind is LinkKind.NETWORK and bw == pytest.approx(8 * 50e9)  # 8 x 400 Gb/s NICs (PXN)
    assert sum(1 for n, e in topo.graph.nodes(data=True) if e["kind"] is ElementKind.NIC) == 24
    with pytest.raises(TopologyError, match="rank 24 is outside"):
        topo.gpu(24)


def test_relax_a6000_machine_has_nvlink_bridges_on_0_1_and_2_3_only():
    topo = Topology.from_preset("a6000-4x-nvlink")
    assert topo.p2p(0, 1) == (pytest.approx(56.25e9), LinkKind.NVLINK)
    assert topo.p2p(2, 3) == (pytest.approx(56.25e9), LinkKind.NVLINK)
    assert topo.p2p(1, 2)[1] is LinkKind.PCIE and topo.p2p(0, 3)[1] is LinkKind.PCIE
    assert topo.hbm_bytes(0) == 48 * 10**9


def _broken(mutate):
    data = copy.deepcopy(load_preset_data("h200-1x"))
    mutate(data)
    return data


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["node"]["links"][0].__setitem__("bandwidth", 55.2), r"node\.links\[0\]\.bandwidth: bare number"),
    (lambda d: d["constants"]["pin_rate"].__setitem__("source", ""), r"constants\.pin_rate\.source"),
    (lambda d: d["constants"]["pin_rate"].__setitem__("unit", "furlongs"), r"constants\.pin_rate\.unit"),
    (lambda d: d["node"]["links"][0].__setitem__("bandwidth", "hbm_h200"), r"node\.links\[0\]\.bandwidth: constant 'hbm_h200' is in GB"),
    (lambda d: d["node"]["elements"][0].pop("hbm"), r"node\.elements\[0\]\.hbm"),
    (lambda d: d["node"]["links"][0].__setitem__("ends", ["gpu0", "nowhere"]), r"node\.links\[0\]\.ends: unknown element 'nowhere'"),
    (lambda d: d["comm"].pop("resume"), r"comm\.resume: required"),
    (lambda d: d["collective"]["efficiency"].pop("pcie"), r"collective\.efficiency: no entry for link kinds \['pcie'\]"),
])
def test_a_bad_topology_gets_an_error_naming_the_field(mutate, field):
    with pytest.raises(TopologyError, match=field):
        Topology.from_dict(_broken(mutate))


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(TopologyError, match="hgx-h200-8x"):
        Topology.from_preset("dgx-9000")


# [Note: no networkx on the way of a run] in sim/machine/topology.py: the topology keeps its graph as dicts and
# finds copy paths with its own breadth-first search, which must pick the path networkx picks.


def test_copy_paths_are_the_ones_networkx_finds_on_every_preset():
    import networkx as nx

    for name in list_presets():
        topo = Topology.from_preset(name, nodes=2) if "ib" in name else Topology.from_preset(name)
        g = topo.graph
        assert g.number_of_edges() == len(topo._edges) and set(g) == set(topo._elements)
        view = g.subgraph([n for n in g if n.startswith("n0/")])
        for gpu in topo.local_gpus:
            numa = topo.element(f"n0/{gpu}")["numa"]
            want = nx.shortest_path(view, f"n0/{gpu}", numa)
            res = [r for u, v in zip(want, want[1:]) for r in g.edges[u, v]["resources"]]
            res += [f"elem:{n}" for n in want if f"elem:{n}" in topo.capacities()]
            rank = topo.local_gpus.index(gpu)
            assert topo.copy_path(rank, CopyKind.D2H) == tuple(res), (name, gpu)


def test_breadth_first_search_breaks_ties_as_networkx_does():
    """4,000 small random digraphs (seeded), a node left out of the search as node 0's view leaves the
    others out: the same path as networkx's, including wherever several paths are equally short."""
    import random

    import networkx as nx

    from sim.machine.topology import _bidirectional_bfs, _NoPath

    rng = random.Random(18)
    ties = 0
    for _ in range(4000):
        n = rng.randint(2, 12)
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from((rng.randrange(n), rng.randrange(n)) for _ in range(rng.randint(0, 4 * n)))
        src, dst = rng.randrange(n), rng.randrange(n)
        inside = frozenset(range(n - 1)) | {src, dst}
        succ = {u: dict(g.succ[u]) for u in g}
        pred = {u: dict(g.pred[u]) for u in g}
        view = g.subgraph(inside)
        try:
            want = nx.bidirectional_shortest_path(view, src, dst)
        except nx.NetworkXNoPath:
            with pytest.raises(_NoPath):
                _bidirectional_bfs(succ, pred, inside, src, dst)
            continue
        assert _bidirectional_bfs(succ, pred, inside, src, dst) == want, (sorted(g.edges), src, dst)
        ties += sum(1 for _ in zip(range(2), nx.all_shortest_paths(view, src, dst))) > 1
    assert ties > 100  # the draw does exercise the tie-breaking


def test_a_topology_of_many_nodes_answers_as_if_every_node_were_built():
    # [Note: a node built once]: node 0 and the fabric are built; other nodes are made from the node section when
    # asked for. Every answer must be a full build's.
    lazy = Topology.from_preset("hgx-h200-8x-ib", nodes=6)
    full = Topology.from_preset("hgx-h200-8x-ib", nodes=6)
    caps = full.capacities()  # builds every node
    assert len(lazy._elements) < len(full._elements) / 5  # the lazy one really built one node
    for rank in (0, 9, 23, 47):
        for kind in CopyKind:
            path = lazy.copy_path(rank, kind)
            assert path == full.copy_path(rank, kind)
            assert [lazy.capacity(r) for r in path] == [caps[r] for r in path]
        assert (lazy.numa_of(rank), lazy.hbm_bytes(rank)) == (full.numa_of(rank), full.hbm_bytes(rank))
        assert lazy.element(lazy.gpu(rank)) == full.element(full.gpu(rank))
    for name in ("link:n5/nic0>fabric/spine", "elem:n4/gpu3/copy", "duplex:n3/cpu0|n3/pcisw1", "elem:fabric/spine"):
        assert lazy.capacity(name) == caps[name]
    assert lazy.capacity("link:n6/nic0>fabric/spine") is None and lazy.capacity("link:n2/nope>n2/gpu0") is None
    assert lazy.host_memory_nodes() == full.host_memory_nodes()
    for numa in full.host_memory_nodes():
        assert (lazy.host_capacity(numa), lazy.pinnable_bytes(numa)) == (full.host_capacity(numa), full.pinnable_bytes(numa))
    assert lazy.p2p(3, 40) == full.p2p(3, 40) and lazy.p2p(8, 9) == full.p2p(8, 9)
    changed = lazy.element("n5/numa0")  # handed out, changed, and still the one the topology reads after a full build
    changed["pinnable"] = 7
    assert lazy.pinnable_bytes("n5/numa0") == 7
    assert lazy.capacities() == caps and lazy.pinnable_bytes("n5/numa0") == 7
    assert list(lazy.graph) == list(full.graph) and list(lazy.graph.edges) == list(full.graph.edges)


def test_the_two_h200_machine_has_each_gpu_on_its_own_pcie_link():
    """h200-2x, the machine as nvidia-smi shows it (its records of 2026-11-30): two H200 on NVLink (NV18), each on its
    own PCIe link to the root complex, no switch shared: both GPUs reload at the line rate at once, where the HGX
    preset's first two GPUs share one switch's uplink."""
    two = Topology.from_preset("h200-2x")
    assert two.num_gpus == 2 and two.p2p(0, 1) == (pytest.approx(450e9), LinkKind.NVLINK)
    shared = set(two.copy_path(0, CopyKind.H2D)) & set(two.copy_path(1, CopyKind.H2D))
    assert shared == {"link:n0/numa0>n0/cpu0", "duplex:n0/cpu0|n0/numa0"}  # host memory only, no PCIe link
    assert "nvidia-smi" in two.constant("pcie_gen5_x16").source
    hgx = Topology.from_preset("hgx-h200-8x")
    shared_hgx = set(hgx.copy_path(0, CopyKind.H2D)) & set(hgx.copy_path(1, CopyKind.H2D))
    assert "link:n0/cpu0>n0/pcisw0" in shared_hgx  # the switch's uplink
