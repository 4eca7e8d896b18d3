"""Machine topology: GPUs, switches, host memory and NICs as a directed graph.

Theory of operation
-------------------
A topology is built from a *preset* (JSON under ``sim/presets/``) or an
equivalent dict inside a scenario. The data has three parts:

* ``constants``: every physical number, each with a ``value``, a ``unit`` and a
  ``source`` (measured here, a datasheet, a paper, or an assumption said as
  such). Nothing else in the file may hold a bare number for a physical
  quantity: elements and links name a constant, so each figure has exactly one
  place that says where it came from.
* ``node``: one machine (elements and links), repeated ``nodes`` times. Element
  names inside a node are local (``gpu0``); in the graph they become
  ``n3/gpu0``.
* ``fabric``: elements shared by all nodes (a network switch) and the links
  from each node's NICs to them.

The graph is a directed graph (plain dicts of successors and predecessors,
offered as a ``networkx.DiGraph`` by :attr:`Topology.graph`, built on first
use; see [Note: no networkx on the way of a run]); a physical link becomes two directed
edges, each with its own capacity (``bandwidth`` is per direction), and, where
the link has a ``duplex`` limit, a shared resource that both directions draw
from (PCIe Gen5 x16 on the test machine moves 55.2 GB/s each way but only
about 93 GB/s both ways at once). Elements may carry a throughput of their own
(host memory bandwidth, a GPU's copy engine for device-to-device copies).

Ranks map to GPUs in order: rank ``r`` is GPU ``r % gpus_per_node`` of node
``r // gpus_per_node``. A host buffer of a rank lives on the NUMA node its GPU
is attached to (the store pins host memory near its GPU).

What the flows need from here is :meth:`Topology.copy_path`: the
resources a device<->host or device<->device copy of a rank draws from, and
:meth:`Topology.capacities`: the capacity of each resource.

[Note: no networkx on the way of a run]
Importing networkx costs about 0.1 s and building a ``DiGraph`` of 2,048
nodes (16,384 ranks) about 0.6 s, a fifth of a whole 1,024-rank ``timeshare
sim run``. What the simulator asks of the graph is small: a
shortest path from each GPU of node 0 to its host memory, a widest GPU-to-GPU
path, a node's NIC links. So the graph is kept as two dicts (``_succ``,
``_pred``: node -> neighbour -> edge attributes, in insertion order, as
networkx keeps them), :func:`_bidirectional_bfs` is networkx's
``bidirectional_shortest_path`` step for step (so a tie between equally short
paths is broken the same way; ``tests/sim/machine/test_topology.py`` compares them),
and :attr:`Topology.graph` builds the ``networkx.DiGraph`` only for callers
that want one.

[Note: a node built once]
Every node is the ``node`` section again, so what a run asks of a node is what it would ask of the
first one, renamed: a rank's copy path is node 0's with ``n0/`` made ``n<k>/`` (as it always was),
its NUMA node and HBM come from the section, a resource's capacity is its node-0 namesake's. So a
topology builds the elements, links and resources of node 0 and the fabric only; an element of
another node is made from the section when asked for (:meth:`Topology.element`) and kept, so a
caller may change it. Only :attr:`Topology.graph` and :meth:`Topology.capacities` build every node
(in the order a full build has them, handed-out elements kept). A 16,384-node preset took 8.5 s
and about 1 GB to build in full (cProfile of ``timeshare sim run`` at 131,072 ranks, shared machine);
a run of the folded simulator asks for a few nodes.
"""
from __future__ import annotations

import enum
import heapq
import logging
import math
import re
from functools import lru_cache
from typing import Any, Mapping

from refimpl.runtime.base import CopyKind
from sim.presets import (
    CollectiveParams,
    CommParams,
    Constant,
    ConstantTable,
    CopyParams,
    LinkKind,
    PresetError,
    list_presets,
    load_preset_data,
    parse_collective,
    parse_comm,
    parse_copy,
    section as check_fields_of_preset,
)

log = logging.getLogger(__name__)

TopologyError = PresetError
"""A topology description is invalid; the message names the field."""


class ElementKind(enum.Enum):
    """What a vertex of the topology graph is."""

    GPU = "gpu"
    NVSWITCH = "nvswitch"
    PCIE_SWITCH = "pcie_switch"
    ROOT_COMPLEX = "root_complex"
    HOST_MEMORY = "host_memory"
    NIC = "nic"
    NETWORK_SWITCH = "network_switch"


Resource = str
"""A shared capacity: ``link:A>B`` (one direction), ``duplex:A|B`` (both directions), ``elem:A``."""


def _link_resource(a: str, b: str) -> Resource:
    return f"link:{a}>{b}"


def _duplex_resource(a: str, b: str) -> Resource:
    lo, hi = sorted((a, b))
    return f"duplex:{lo}|{hi}"


def _elem_resource(a: str) -> Resource:
    return f"elem:{a}"


_ELEMENT_NUMBERS = {"hbm", "bandwidth", "capacity", "pinnable", "copy_bandwidth"}
_NODE_PREFIX = re.compile(r"^n(\d+)/(.+)$")
_NODE_ANY = re.compile(r"(?<![A-Za-z0-9_])n(\d+)/")
_LINK_NUMBERS = {"bandwidth", "duplex"}


class Topology:
    """A machine (or cluster) as a directed graph with per-direction capacities.

    Build with :meth:`from_preset` or :meth:`from_dict`.
    """

    def __init__(self, data: Mapping[str, Any], *, where: str = "topology") -> None:
        self.where = where
        if not isinstance(data, Mapping):
            raise TopologyError(f"{where}: expected an object, got {type(data).__name__}")
        self.name: str = str(data.get("name", "custom"))
        self.description: str = str(data.get("description", ""))
        self.table = ConstantTable(data.get("constants"), f"{where}.constants")
        self.constants: dict[str, Constant] = self.table.by_name
        nodes = data.get("nodes", 1)
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise TopologyError(f"{where}.nodes: expected a positive integer, got {nodes!r}")
        self.nodes: int = nodes
        node = data.get("node")
        if not isinstance(node, Mapping):
            raise TopologyError(f"{where}.node: missing or not an object (the elements and links of one machine)")
        fabric = data.get("fabric")
        if fabric is not None and not isinstance(fabric, Mapping):
            raise TopologyError(f"{where}.fabric: expected an object")
        self._graph: Any = None
        self._derived: dict[str, dict[str, Any]] = {}  # elements of nodes past the first, made when asked for
        self._sections = (node, fabric)
        self._built = 1  # nodes whose elements, links and resources are in the dicts (see [Note: a node built once])
        local = self._build()
        self._section = local  # node elements by local name, as the section has them
        self.local_gpus: list[str] = [n for n, e in local.items() if e["kind"] is ElementKind.GPU]
        if not self.local_gpus:
            raise TopologyError(f"{where}.node.elements: a node needs at least one element of kind 'gpu'")
        self.gpus_per_node = len(self.local_gpus)
        kinds = {e["kind"] for _, _, e in self._edges}
        self.copy: CopyParams = parse_copy(data.get("copy"), f"{where}.copy", self.table)
        self.collective: CollectiveParams = parse_collective(data.get("collective"), f"{where}.collective", self.table, kinds)
        self.comm: CommParams = parse_comm(data.get("comm"), f"{where}.comm", self.table)
        self._check_paths()

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "topology") -> "Topology":
        """Build from an already parsed preset-shaped dict."""
        return cls(data, where=where)

    @classmethod
    def from_preset(cls, name: str, *, nodes: int | None = None) -> "Topology":
        """A built-in preset by name (see :func:`list_presets`); ``nodes`` overrides its node count."""
        data = load_preset_data(name)
        if nodes is not None:
            data = dict(data, nodes=nodes)
        return cls(data, where=f"preset {name!r}")

    # ------------------------------------------------------------------ queries

    @property
    def graph(self) -> Any:
        """The topology as a ``networkx.DiGraph`` (node and edge attributes as built), made on first use."""
        if self._graph is None:
            import networkx as nx

            self._materialize()
            g = nx.DiGraph()
            for name, attrs in self._elements.items():
                g.add_node(name, **attrs)
            for u, v, attrs in self._edges:
                g.add_edge(u, v, **attrs)
            self._graph = g
        return self._graph

    @property
    def num_gpus(self) -> int:
        """GPUs in the whole topology (nodes x GPUs per node)."""
        return self.nodes * self.gpus_per_node

    def gpu(self, rank: int) -> str:
        """Graph name of the GPU that ``rank`` runs on."""
        self._check_rank(rank)
        return f"n{rank // self.gpus_per_node}/{self.local_gpus[rank % self.gpus_per_node]}"

    def node_of(self, rank: int) -> int:
        """Index of the node ``rank`` runs on."""
        self._check_rank(rank)
        return rank // self.gpus_per_node

    def numa_of(self, rank: int) -> str:
        """Graph name of the host-memory (NUMA) element nearest to ``rank``'s GPU."""
        self._check_rank(rank)
        node, i = divmod(rank, self.gpus_per_node)
        return f"n{node}/{self._section[self.local_gpus[i]]['numa_local']}"

    def hbm_bytes(self, rank: int) -> int:
        """Device memory of ``rank``'s GPU in bytes."""
        self._check_rank(rank)
        return int(self._section[self.local_gpus[rank % self.gpus_per_node]]["hbm"])

    def host_memory_nodes(self) -> list[str]:
        """Graph names of every host-memory (NUMA) element."""
        local = [n for n, e in self._section.items() if e["kind"] is ElementKind.HOST_MEMORY]
        shared = [n for n, e in self._elements.items() if n.startswith("fabric/") and e["kind"] is ElementKind.HOST_MEMORY]
        return [f"n{k}/{n}" for k in range(self.nodes) for n in local] + shared

    def host_capacity(self, numa: str) -> int:
        """Bytes of host memory on NUMA node ``numa``."""
        return int(self._element(numa)["capacity"])

    def pinnable_bytes(self, numa: str) -> int:
        """Host memory of ``numa`` that may be page-locked (``ulimit -l`` and the like)."""
        e = self._element(numa)
        return int(e.get("pinnable", e["capacity"]))

    def element(self, name: str) -> Mapping[str, Any]:
        """The attributes of element ``name`` (kind, capacities in SI units)."""
        return self._element(name)

    def capacity(self, resource: Resource) -> float | None:
        """Capacity in bytes/s of one shared resource (None if the topology has no such resource): a node not built
        has its first node's capacities."""
        cap = self._resources.get(resource)
        if cap is None and self._built < self.nodes:
            nodes = {int(k) for k in _NODE_ANY.findall(resource)}
            if nodes and max(nodes) < self.nodes:
                cap = self._resources.get(_NODE_ANY.sub("n0/", resource))
        return cap

    def resource_names(self) -> list[Resource]:
        """Every shared resource's name (builds every node)."""
        self._materialize()
        return list(self._resources)

    def capacities(self) -> dict[Resource, float]:
        """Capacity in bytes/s of every shared resource (builds every node)."""
        self._materialize()
        return dict(self._resources)

    def copy_path(self, rank: int, kind: CopyKind) -> tuple[Resource, ...]:
        """Resources a copy of ``kind`` on ``rank`` draws from, in path order."""
        self._check_rank(rank)
        node, i = divmod(rank, self.gpus_per_node)  # what gpu() and node_of() say, without their strings
        prefix = f"n{node}/"
        return tuple(r.replace("@", prefix) for r in self._copy_path_local(self.local_gpus[i], kind))

    def p2p(self, rank_a: int, rank_b: int) -> tuple[float, LinkKind]:
        """Bottleneck bandwidth (bytes/s, one direction) between two ranks' GPUs and its link kind.

        Inside a node: the widest GPU-to-GPU path that does not pass through host
        memory or a NIC. Across nodes: NCCL spreads a ring over every NIC of the
        node (PXN), so the bottleneck is the smaller of the two nodes' aggregate
        NIC bandwidth and the GPUs' own widest link.
        """
        if rank_a == rank_b:
            return math.inf, LinkKind.NVLINK
        na, nb = self.node_of(rank_a), self.node_of(rank_b)
        la = self._local(self.gpu(rank_a))
        lb = self._local(self.gpu(rank_b))
        if na == nb:
            return self._widest_local(la, lb)
        nic_bw = min(self._nic_bandwidth(), math.inf)
        if nic_bw == 0:
            raise TopologyError(f"{self.where}: ranks {rank_a} and {rank_b} are on different nodes but nodes have no NICs")
        own = min(self._gpu_max_link(la), self._gpu_max_link(lb))
        return min(nic_bw, own), LinkKind.NETWORK if nic_bw <= own else LinkKind.NVLINK

    def device_copy_bandwidth(self, rank: int = 0) -> float:
        """Bytes per second a device-to-device copy on ``rank``'s GPU moves (copied bytes, not read + write)."""
        self._check_rank(rank)
        return self._resources[_elem_resource("n0/" + self._local(self.gpu(rank))) + "/copy"]

    def nic_bandwidth(self) -> float:
        """One node's NICs' aggregate bandwidth to the fabric (bytes/s, one direction; 0 without NICs)."""
        return self._nic_bandwidth()

    def gpu_link_bandwidth(self, rank_a: int, rank_b: int) -> float:
        """The smaller of two ranks' GPUs' widest own links (bytes/s): what carries a hop between them to the NICs."""
        return min(self._gpu_max_link(self._local(self.gpu(rank_a))), self._gpu_max_link(self._local(self.gpu(rank_b))))

    def constant(self, name: str) -> Constant:
        """A named constant of the preset, with its unit and source."""
        return self.constants[name]

    def summary(self) -> dict[str, Any]:
        """A JSON-ready description (name, sizes, and every constant with its source)."""
        return {
            "name": self.name,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "constants": {
                c.name: {"value": c.as_written, "unit": c.unit, "source": c.source} for c in self.constants.values()
            },
        }

    # ------------------------------------------------------------------ building

    def _build(self) -> dict[str, dict[str, Any]]:
        """Elements, links and resources of the first :attr:`_built` nodes and the fabric, in the order a full build
        has them (every node's elements, the fabric's, every node's links, every node's links to the fabric)."""
        node, fabric = self._sections
        where = self.where
        self._succ: dict[str, dict[str, dict[str, Any]]] = {}  # see [Note: no networkx on the way of a run]
        self._pred: dict[str, dict[str, dict[str, Any]]] = {}
        self._edges: list[tuple[str, str, dict[str, Any]]] = []  # insertion order, for :attr:`graph`
        self._elements: dict[str, dict[str, Any]] = {}
        self._resources: dict[Resource, float] = {}
        local = self._add_elements(node.get("elements"), f"{where}.node.elements", per_node=True)
        self._add_links(node.get("links"), f"{where}.node.links", local, per_node=True)
        if fabric is not None:
            shared = self._add_elements(fabric.get("elements", []), f"{where}.fabric.elements", per_node=False)
            self._add_links(fabric.get("links", []), f"{where}.fabric.links", local | shared, per_node=True, shared=shared)
        return local

    def _materialize(self) -> None:
        """Build every node (for :attr:`graph` and :meth:`capacities`); elements already handed out stay the same
        objects (a caller may have changed one)."""
        if self._built == self.nodes:
            return
        kept = {**self._elements, **self._derived}
        self._built = self.nodes
        self._build()
        for name, attrs in kept.items():
            self._elements[name] = attrs
        self._derived.clear()

    def _element(self, name: str) -> dict[str, Any]:
        """The attributes of element ``name`` (made from the node's section for a node not built; KeyError if none)."""
        attrs = self._elements.get(name)
        if attrs is not None:
            return attrs
        attrs = self._derived.get(name)
        if attrs is None:
            m = _NODE_PREFIX.match(name)
            if m is None or not int(m.group(1)) < self.nodes or m.group(2) not in self._section:
                raise KeyError(name)
            attrs = dict(self._elements[f"n0/{m.group(2)}"])
            if "numa_local" in attrs:
                attrs["numa"] = f"n{m.group(1)}/{attrs['numa_local']}"
            self._derived[name] = attrs
        return attrs

    def _add_elements(self, elements: Any, where: str, *, per_node: bool) -> dict[str, dict[str, Any]]:
        if not isinstance(elements, list):
            raise TopologyError(f"{where}: expected a list of elements")
        local: dict[str, dict[str, Any]] = {}
        for i, raw in enumerate(elements):
            w = f"{where}[{i}]"
            if not isinstance(raw, Mapping):
                raise TopologyError(f"{w}: expected an object")
            name = raw.get("name")
            if not isinstance(name, str) or not name or "/" in name:
                raise TopologyError(f"{w}.name: expected a non-empty name without '/', got {name!r}")
            if name in local:
                raise TopologyError(f"{w}.name: duplicate element {name!r}")
            try:
                kind = ElementKind(raw.get("kind"))
            except ValueError:
                raise TopologyError(
                    f"{w}.kind: {raw.get('kind')!r} is not one of {[k.value for k in ElementKind]}"
                ) from None
            attrs: dict[str, Any] = {"kind": kind, "local": name}
            for key, val in raw.items():
                if key in ("name", "kind"):
                    continue
                if key in _ELEMENT_NUMBERS:
                    attrs[key] = self.table.ref(val, f"{w}.{key}", _DIM_OF[key])
                elif key == "numa":
                    attrs["numa_local"] = val
                else:
                    raise TopologyError(f"{w}.{key}: unknown field for an element")
            if kind is ElementKind.GPU:
                for req in ("hbm", "numa", "copy_bandwidth"):
                    if req not in raw:
                        raise TopologyError(f"{w}.{req}: a gpu needs '{req}'")
            if kind is ElementKind.HOST_MEMORY and "capacity" not in raw:
                raise TopologyError(f"{w}.capacity: host memory needs a 'capacity' constant")
            local[name] = attrs
        copies = range(self._built) if per_node else [None]
        for node in copies:
            for name, attrs in local.items():
                full = f"n{node}/{name}" if node is not None else f"fabric/{name}"
                a = dict(attrs)
                if "numa_local" in a:
                    if a["numa_local"] not in local or local[a["numa_local"]]["kind"] is not ElementKind.HOST_MEMORY:
                        raise TopologyError(f"{where}: element {name!r} names numa {a['numa_local']!r}, which is not a host_memory element")
                    a["numa"] = f"n{node}/{a['numa_local']}"
                self._elements[full] = a
                self._succ.setdefault(full, {})
                self._pred.setdefault(full, {})
                if "bandwidth" in a:
                    self._resources[_elem_resource(full)] = a["bandwidth"]
                if "copy_bandwidth" in a:
                    self._resources[_elem_resource(full) + "/copy"] = a["copy_bandwidth"]
        return local

    def _add_links(
        self,
        links: Any,
        where: str,
        known: Mapping[str, Any],
        *,
        per_node: bool,
        shared: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(links, list):
            raise TopologyError(f"{where}: expected a list of links")
        shared = shared or {}
        for i, raw in enumerate(links):
            w = f"{where}[{i}]"
            if not isinstance(raw, Mapping):
                raise TopologyError(f"{w}: expected an object")
            ends = raw.get("ends")
            if not (isinstance(ends, list) and len(ends) == 2 and all(isinstance(e, str) for e in ends)):
                raise TopologyError(f"{w}.ends: expected two element names, got {ends!r}")
            for e in ends:
                if e not in known:
                    raise TopologyError(f"{w}.ends: unknown element {e!r}")
            try:
                kind = LinkKind(raw.get("kind"))
            except ValueError:
                raise TopologyError(f"{w}.kind: {raw.get('kind')!r} is not one of {[k.value for k in LinkKind]}") from None
            check_fields_of_preset(raw, w, (), ("ends", "kind", *_LINK_NUMBERS))
            if "bandwidth" not in raw:
                raise TopologyError(f"{w}.bandwidth: every link needs a bandwidth constant")
            bw = self.table.ref(raw["bandwidth"], f"{w}.bandwidth", "bandwidth")
            duplex = self.table.ref(raw["duplex"], f"{w}.duplex", "bandwidth") if "duplex" in raw else None
            for node in range(self._built):
                a, b = (f"fabric/{e}" if e in shared else f"n{node}/{e}" for e in ends)
                for u, v in ((a, b), (b, a)):
                    res = [_link_resource(u, v)]
                    self._resources[res[0]] = bw
                    if duplex is not None:
                        res.append(_duplex_resource(u, v))
                        self._resources[res[1]] = duplex
                    self._add_edge(u, v, {"kind": kind, "bandwidth": bw, "resources": tuple(res)})
                if not per_node:
                    break

    def _add_edge(self, u: str, v: str, attrs: dict[str, Any]) -> None:
        """Edge ``u -> v`` (both known elements); a repeated edge updates its attributes, as networkx does."""
        old = self._succ[u].get(v)
        if old is not None:
            old.update(attrs)
            return
        self._succ[u][v] = self._pred[v][u] = attrs
        self._edges.append((u, v, attrs))

    def _check_paths(self) -> None:
        for g in self.local_gpus:
            try:
                self._copy_path_local(g, CopyKind.D2H)
            except _NoPath:
                raise TopologyError(f"{self.where}: gpu {g!r} has no path to its host memory") from None

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.num_gpus:
            raise TopologyError(f"rank {rank} is outside this topology's {self.num_gpus} GPUs ({self.name})")

    @staticmethod
    def _local(full: str) -> str:
        return full.split("/", 1)[1]

    # The copy path and widest paths depend only on the local GPU, so they are
    # computed once on node 0 and re-prefixed ("@" stands for "n<node>/").
    @lru_cache(maxsize=None)
    def _copy_path_local(self, gpu_local: str, kind: CopyKind) -> tuple[Resource, ...]:
        gpu = f"n0/{gpu_local}"
        if kind is CopyKind.D2D:
            return (_elem_resource("@" + gpu_local) + "/copy",)
        numa = self._elements[gpu]["numa"]
        path = _bidirectional_bfs(self._succ, self._pred, self._node0(), gpu, numa)
        if kind is CopyKind.H2D:
            path = list(reversed(path))
        res: list[Resource] = []
        for u, v in zip(path, path[1:]):
            res.extend(self._succ[u][v]["resources"])
        for n in path:
            if _elem_resource(n) in self._resources:
                res.append(_elem_resource(n))
        return tuple(r.replace("n0/", "@") for r in res)

    @lru_cache(maxsize=None)
    def _node0(self) -> frozenset[str]:
        """Elements of node 0 (what networkx's induced subgraph view of them showed)."""
        return frozenset(f"n0/{n}" for n in self._section)

    @lru_cache(maxsize=None)
    def _widest_local(self, a: str, b: str) -> tuple[float, LinkKind]:
        """Widest path between two GPUs of node 0 that avoids host memory and NICs."""
        node0 = self._node0()
        blocked = {ElementKind.HOST_MEMORY, ElementKind.NIC}
        src, dst = f"n0/{a}", f"n0/{b}"
        best: dict[str, float] = {src: math.inf}
        kind_at: dict[str, LinkKind] = {src: LinkKind.NVLINK}
        heap = [(-math.inf, src)]
        while heap:
            negw, u = heapq.heappop(heap)
            if u == dst:
                return -negw, kind_at[u]
            if -negw < best.get(u, -1):
                continue
            for v, e in self._succ[u].items():
                if v not in node0:
                    continue
                if v != dst and self._elements[v]["kind"] in blocked | {ElementKind.GPU}:
                    continue
                w = min(-negw, e["bandwidth"])
                if w > best.get(v, -1):
                    best[v] = w
                    kind_at[v] = e["kind"] if e["bandwidth"] < -negw else kind_at[u]
                    heapq.heappush(heap, (-w, v))
        raise TopologyError(f"{self.where}: no GPU-to-GPU path between {a} and {b}")

    @lru_cache(maxsize=None)
    def _nic_bandwidth(self) -> float:
        total = 0.0
        node0 = self._node0()
        for n in self._elements:
            if n in node0 and self._elements[n]["kind"] is ElementKind.NIC:
                out = [e for v, e in self._succ[n].items() if v.startswith("fabric/")]
                total += sum(e["bandwidth"] for e in out)
        return total

    @lru_cache(maxsize=None)
    def _gpu_max_link(self, gpu_local: str) -> float:
        return max(e["bandwidth"] for e in self._succ[f"n0/{gpu_local}"].values())

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, nodes={self.nodes}, gpus_per_node={self.gpus_per_node})"


class _NoPath(Exception):
    """No path between two elements (networkx's NetworkXNoPath)."""


def _bidirectional_bfs(succ: Mapping[str, Mapping[str, Any]], pred: Mapping[str, Mapping[str, Any]],
                       inside: frozenset[str], source: str, target: str) -> list[str]:
    """A shortest path from ``source`` to ``target`` through elements in ``inside``.

    networkx's ``bidirectional_shortest_path`` (3.x) on the subgraph induced by
    ``inside``, step for step, so that ties between equally short paths are
    broken the same way: breadth first from both ends, always growing the
    smaller fringe, neighbours in insertion order, stopping at the first meeting.
    """
    if source == target:
        return [source]
    preds: dict[str, str | None] = {source: None}
    succs: dict[str, str | None] = {target: None}
    forward, reverse = [source], [target]
    meet = None
    while forward and reverse and meet is None:
        if len(forward) <= len(reverse):
            level, forward = forward, []
            for v in level:
                for w in succ[v]:
                    if w not in inside:
                        continue
                    if w not in preds:
                        forward.append(w)
                        preds[w] = v
                    if w in succs:
                        meet = w
                        break
                if meet is not None:
                    break
        else:
            level, reverse = reverse, []
            for v in level:
                for w in pred[v]:
                    if w not in inside:
                        continue
                    if w not in succs:
                        succs[w] = v
                        reverse.append(w)
                    if w in preds:
                        meet = w
                        break
                if meet is not None:
                    break
    if meet is None:
        raise _NoPath(f"no path between {source} and {target}")
    path: list[str] = []
    w: str | None = meet
    while w is not None:
        path.append(w)
        w = preds[w]
    path.reverse()
    w = succs[path[-1]]
    while w is not None:
        path.append(w)
        w = succs[w]
    return path


_DIM_OF = {
    "hbm": "bytes",
    "capacity": "bytes",
    "pinnable": "bytes",
    "bandwidth": "bandwidth",
    "copy_bandwidth": "bandwidth",
}


__all__ = [
    "ElementKind",
    "LinkKind",
    "Resource",
    "Topology",
    "TopologyError",
    "list_presets",
    "load_preset_data",
]
