"""Bandwidth sharing between concurrent copies: max-min fair rates over shared resources.

Theory of operation
-------------------
A copy in flight is a *flow* of bytes through a path of *resources* (see
:meth:`sim.machine.topology.Topology.copy_path`): the directed links it crosses, the
duplex limit of each link, and element throughputs such as host memory. Each
resource has a capacity in bytes/s. Rates are max-min fair ("water filling"):
raise every flow's rate together until some resource is full, freeze the flows
through it, and go on with the rest. So eight GPUs offloading at once through
four PCIe switch uplinks get half an uplink each, and a lone copy gets its
whole path.

Rates change only when a flow starts or ends (or a fault rescales a
capacity), and only for flows that share resources with it, transitively: its
*component*. :class:`FlowNetwork` recomputes just that component, advances
its flows' remaining bytes to the current time, and reports whose rate
changed; :class:`FlowTransport` then re-schedules those flows' completion
events (the old event is cancelled). With one copy stream per rank (see
below) a component holds at most the GPUs behind one socket, so an event
costs a few dozen operations whatever the number of ranks.

Copy streams: copies issued by one rank run one after another on its copy
stream, as on a real CUDA stream (the TorchRuntime uses one copy stream per
device); ``streams="per_kind"`` gives each direction its own stream. Each copy
first pays the preset's per-copy latency (launch and DMA setup), during which
it draws no bandwidth, then flows.

Determinism: flows are kept in insertion-ordered dicts keyed by a sequence
number, never in sets of objects.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from refimpl.runtime.base import CopyKind

if TYPE_CHECKING:  # pragma: no cover
    from sim.machine.topology import Topology
    from sim.machine.protocols import WorldBinding

log = logging.getLogger(__name__)

_EPS = 1e-12


class FlowError(ValueError):
    """A flow or resource was used wrongly (unknown resource, non-positive capacity)."""


class Flow:
    """One transfer in flight: its resources (as indices), bytes left and current rate."""

    __slots__ = ("fid", "res", "remaining", "rate", "since", "event", "on_done", "label", "key")

    def __init__(self, fid: int, res: tuple[int, ...], nbytes: float, now: float, on_done: Callable[[], None], label: str,
                 key: tuple = ()):
        self.fid = fid
        self.key = key
        self.res = res
        self.remaining = float(nbytes)
        self.rate = 0.0
        self.since = now
        self.event = None
        self.on_done = on_done
        self.label = label

    def __repr__(self) -> str:
        return f"Flow({self.fid}, {self.label}, {self.remaining:.0f} B left at {self.rate:.3e} B/s)"


class FlowNetwork:
    """Max-min fair rates of flows over resources with capacities (bytes/s).

    Pure bookkeeping, no engine: :meth:`add` and :meth:`remove` return the flows
    whose rate changed; the caller re-times them. Times are passed in.
    """

    def __init__(self, capacities: Mapping[str, float]):
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.base: list[float] = []
        self.factor: list[float] = []
        for name, cap in capacities.items():
            if not cap > 0:
                raise FlowError(f"resource {name!r}: capacity must be > 0 bytes/s, got {cap}")
            self.index[name] = len(self.names)
            self.names.append(name)
            self.base.append(float(cap))
            self.factor.append(1.0)
        self.users: list[dict[int, Flow]] = [{} for _ in self.names]
        self.flows: dict[int, Flow] = {}

    def add_resource(self, name: str, capacity: float) -> int:
        """Add a resource (or return the existing one's index): e.g. one collective's own bottleneck."""
        if name in self.index:
            return self.index[name]
        if not capacity > 0:
            raise FlowError(f"resource {name!r}: capacity must be > 0 bytes/s, got {capacity}")
        self.index[name] = len(self.names)
        self.names.append(name)
        self.base.append(float(capacity))
        self.factor.append(1.0)
        self.users.append({})
        return self.index[name]

    def resources(self, names: Iterable[str]) -> tuple[int, ...]:
        """Indices of resource names (raises FlowError naming an unknown one)."""
        out = []
        for n in names:
            try:
                out.append(self.index[n])
            except KeyError:
                raise FlowError(f"unknown resource {n!r}; the topology has no such link or element") from None
        return tuple(out)

    def capacity(self, r: int) -> float:
        """Current capacity of resource ``r`` (base times any fault factor)."""
        return self.base[r] * self.factor[r]

    def add(self, flow: Flow, now: float) -> list[Flow]:
        """Start ``flow`` at ``now``; returns the flows (including it) whose rate changed."""
        if not flow.res:
            raise FlowError(f"flow {flow.label}: a flow needs at least one resource")
        self.flows[flow.fid] = flow
        for r in flow.res:
            self.users[r][flow.fid] = flow
        return self._recompute(flow.res, now, new=flow)

    def remove(self, flow: Flow, now: float) -> list[Flow]:
        """End ``flow`` at ``now``; returns the other flows whose rate changed."""
        del self.flows[flow.fid]
        for r in flow.res:
            del self.users[r][flow.fid]
        return self._recompute(flow.res, now)

    def set_factor(self, names: Iterable[str], factor: float, now: float) -> list[Flow]:
        """Scale the capacity of resources (a slow link); returns flows whose rate changed."""
        if not factor > 0:
            raise FlowError(f"capacity factor must be > 0, got {factor}")
        idx = self.resources(names)
        for r in idx:
            self.factor[r] = factor
        return self._recompute(idx, now)

    # ------------------------------------------------------------------ core

    def _component(self, seeds: Iterable[int]) -> tuple[list[int], list[Flow]]:
        seen_r: dict[int, None] = {}
        seen_f: dict[int, Flow] = {}
        stack = list(seeds)
        while stack:
            r = stack.pop()
            if r in seen_r:
                continue
            seen_r[r] = None
            for fid, f in self.users[r].items():
                if fid not in seen_f:
                    seen_f[fid] = f
                    stack.extend(x for x in f.res if x not in seen_r)
        flows = sorted(seen_f.values(), key=lambda f: f.fid)
        return list(seen_r), flows

    def _recompute(self, seeds: Iterable[int], now: float, new: Flow | None = None) -> list[Flow]:
        res, flows = self._component(seeds)
        if not flows:
            return []
        for f in flows:  # bring bytes up to date at the old rates
            if f.rate > 0:
                f.remaining = max(0.0, f.remaining - f.rate * (now - f.since))
            f.since = now
        if len(flows) == 1:  # alone on its path: the narrowest resource is its rate
            rates = [min(self.capacity(r) for r in flows[0].res)]
        else:
            rates = max_min_rates([f.res for f in flows], {r: self.capacity(r) for r in res})
        changed = []
        for f, rate in zip(flows, rates):
            if f is new or abs(rate - f.rate) > _EPS * max(rate, f.rate, 1.0):
                f.rate = rate
                changed.append(f)
        return changed


def max_min_rates(paths: list[tuple[int, ...]], capacity: Mapping[int, float]) -> list[float]:
    """Max-min fair rates of flows with the given resource paths (progressive filling).

    Every unfrozen flow gets the same increment until a resource is full; the
    flows through a full resource are frozen at that rate; repeat with the rest.
    """
    n = len(paths)
    rates = [0.0] * n
    users: dict[int, list[int]] = {}
    for i, p in enumerate(paths):
        for r in p:
            users.setdefault(r, []).append(i)
    left = {r: capacity[r] for r in users}
    active_on = {r: len(u) for r, u in users.items()}
    frozen = [False] * n
    remaining = n
    level = 0.0
    while remaining:
        inc = min(left[r] / k for r, k in active_on.items() if k)
        level += inc
        full = []
        for r, k in active_on.items():
            if k:
                left[r] -= inc * k
                if left[r] <= _EPS * capacity[r]:
                    full.append(r)
        for r in full:
            for i in users[r]:
                if not frozen[i]:
                    frozen[i] = True
                    rates[i] = level
                    remaining -= 1
                    for q in paths[i]:
                        active_on[q] -= 1
    return rates


class FlowTransport:
    """The :class:`sim.machine.protocols.Transport` of a topology: copies share bandwidth max-min fairly.

    Args:
        topology: where paths and capacities come from.
        streams: ``"per_rank"`` (one copy stream per rank, as TorchRuntime) or
            ``"per_kind"`` (one per rank and direction).
    """

    def __init__(self, topology: "Topology", *, streams: str = "per_rank"):
        if streams not in ("per_rank", "per_kind"):
            raise FlowError(f"streams must be 'per_rank' or 'per_kind', got {streams!r}")
        self.topology = topology
        self.streams = streams
        self.latency_s = topology.copy.latency_s
        # resources enter the network when a path first crosses them (see [Note: a node built once] in
        # sim.machine.topology: a 16,384-node topology has about 650,000; a folded run's copies cross a few hundred)
        self.network = FlowNetwork({})
        self._engine = None
        self._paths: dict[tuple[int, CopyKind], tuple[int, ...]] = {}
        self._binding: set[int] | None = None
        self._binding_names: dict[int, frozenset[str]] = {}  # node -> its binding resources' names (see _is_binding)
        self._slowed = False  # a slow-link fault changed a capacity: every node's loads are its own
        self._world_size = topology.num_gpus
        self._queues: dict[tuple, list[tuple[CopyKind, int, Callable[[], None]]]] = {}
        self._busy: dict[tuple, bool] = {}
        self._seq = 0
        #: (rank, kind, nbytes, start, end) of every finished copy, for traces and tests
        self.log: list[tuple[int, CopyKind, int, float, float]] = []
        self.keep_log = True
        self.scrub_bps = topology.copy.scrub_bps
        self._scrub_until: dict[int, float] = {}  # rank -> when the driver finishes zero-filling what it freed

    def bind(self, world: "WorldBinding") -> None:
        """Attach to the world's engine (SimWorld calls this)."""
        if world.world_size > self.topology.num_gpus:
            raise FlowError(
                f"world of {world.world_size} ranks does not fit topology {self.topology.name!r} with "
                f"{self.topology.num_gpus} GPUs; use more nodes"
            )
        self._engine = world.engine
        self._world_size = world.world_size
        self._binding = None
        self._binding_names.clear()
        self._paths.clear()

    def _index(self, names: Iterable[str]) -> tuple[int, ...]:
        """Indices of resource names, adding those the network does not have yet with the topology's capacity."""
        net, out = self.network, []
        for n in names:
            i = net.index.get(n)
            if i is None:
                cap = self.topology.capacity(n)
                if cap is None:
                    raise FlowError(f"unknown resource {n!r}; the topology has no such link or element")
                i = net.add_resource(n, cap)
            out.append(i)
        return tuple(out)

    def path(self, rank: int, kind: CopyKind) -> tuple[int, ...]:
        """Resource indices a copy of ``kind`` on ``rank`` flows through, without those that can never bind."""
        key = (rank, kind)
        p = self._paths.get(key)
        if p is None:
            names = self.topology.copy_path(rank, kind)
            full = self._index(names)
            if self._slowed:
                binding = self._binding_resources()
                p = tuple(r for r in full if r in binding) or full[:1]
            else:
                binding_names = self._node_binding(rank // self.topology.gpus_per_node)
                p = tuple(r for r, n in zip(full, names) if n in binding_names) or full[:1]
            self._paths[key] = p
        return p

    def _node_binding(self, node: int) -> frozenset[str]:
        """The names of ``node``'s resources that can bind (see [Note: pruning resources that never bind]).

        Copy paths stay inside a node and every node is built alike, so a node's loads are those of any other
        node with as many ranks: worked out on the first node with that many (the last node of a world that does
        not fill it has fewer) and renamed."""
        g = self.topology.gpus_per_node
        ranks = min(g, self._world_size - node * g)
        first = 0 if ranks == g else node
        hit = self._binding_names.get(first)
        if hit is None:
            hit = self._binding_names[first] = frozenset(self._loaded(range(first * g, first * g + ranks)))
        if first == node:
            return hit
        return frozenset(n.replace(f"n{first}/", f"n{node}/") for n in hit)

    def _binding_resources(self) -> set[int]:
        """Indices of the resources whose capacity the flows of this world can exhaust, every rank's paths walked
        (after a slow-link fault, when nodes differ; else :meth:`_node_binding`).

        [Note: pruning resources that never bind]
        Copies on one stream run one at a time, so a resource carries at most one
        flow per stream. If its capacity is at least the sum, over the streams
        whose paths cross it, of the most those paths can carry elsewhere (the
        smallest other capacity on the path), it can never be the bottleneck and
        leaving it out of the paths changes no rate. Components then shrink to
        the GPUs that really share something (a PCIe switch uplink), which is
        what keeps an event cheap at 1,024 ranks. A slow-link fault changes
        capacities, so :meth:`slow` recomputes this and re-paths flows in flight.
        """
        if self._binding is None:
            self._binding = set(self._index(self._loaded(range(self._world_size))))
        return self._binding

    def _loaded(self, ranks: Iterable[int]) -> list[str]:
        """Names of the resources the copy streams of ``ranks`` can exhaust (see [Note: pruning resources that never
        bind]), at the network's current capacities."""
        net = self.network
        load: dict[str, float] = {}
        kinds = list(CopyKind)
        groups = [kinds] if self.streams == "per_rank" else [[k] for k in kinds]
        others: dict[tuple[float, ...], tuple[float, ...]] = {}  # capacities on a path -> min of the others
        for rank in ranks:
            full = {k: self.topology.copy_path(rank, k) for k in kinds}
            for group in groups:
                best: dict[str, float] = {}
                for k in group:
                    path = full[k]
                    caps = tuple(net.capacity(r) for r in self._index(path))
                    mins = others.get(caps)
                    if mins is None:  # most ranks' paths have the same capacities: computed once each
                        mins = others[caps] = tuple(min((c for j, c in enumerate(caps) if j != i), default=float("inf"))
                                                    for i in range(len(caps)))
                    for r, other in zip(path, mins):
                        best[r] = max(best.get(r, 0.0), other)
                for r, v in best.items():
                    load[r] = load.get(r, 0.0) + v
        return [r for r, v in load.items() if net.capacity(net.index[r]) < v * (1 + 1e-9)]

    def start(self, rank: int, kind: CopyKind, nbytes: int, on_done: Callable[[], None]) -> None:
        """Queue a copy on the rank's copy stream; ``on_done`` runs when its last byte lands."""
        if self._engine is None:
            raise FlowError("FlowTransport is not bound to a SimWorld; pass it as SimWorld(transport=...)")
        stream = (rank,) if self.streams == "per_rank" else (rank, kind)
        q = self._queues.setdefault(stream, [])
        q.append((kind, int(nbytes), on_done))
        if not self._busy.get(stream):
            self._busy[stream] = True
            self._launch(stream)

    def device_freed(self, rank: int, nbytes: int) -> None:
        """``nbytes`` of ``rank``'s device memory went back to the driver now.

        [Note: the driver's scrub of freed memory]
        The driver zero-fills device memory given back to it before anyone may
        see it again, in the background, at ``copy.scrub_bandwidth``; a
        host-to-device copy issued while that runs starts when it is done
        (measured on the H200: a copy right after a free finishes later by the
        freed bytes / 443 GB/s, one issued 20 ms or more later at the line
        rate; ``bench/results/2026-11-29-h200-run7``, ``-run9``). Frees queue:
        the backlog drains in order. Device-to-host copies are not held back.
        """
        if self.scrub_bps <= 0 or nbytes <= 0 or self._engine is None:
            return
        now = self._engine.now
        self._scrub_until[rank] = max(now, self._scrub_until.get(rank, 0.0)) + nbytes / self.scrub_bps

    def scrub_pending_s(self, rank: int) -> float:
        """Seconds until the driver has scrubbed everything ``rank`` freed so far (0 when idle)."""
        if self._engine is None:
            return 0.0
        return max(0.0, self._scrub_until.get(rank, 0.0) - self._engine.now)

    def slow(self, resources: Iterable[str], factor: float) -> None:
        """Scale the capacity of ``resources`` by ``factor`` from now on (1.0 restores)."""
        now = self._engine.now
        resources = list(resources)
        self._index(resources)
        changed = {f.fid: f for f in self.network.set_factor(resources, factor, now)}
        self._slowed = True  # nodes may differ from now on (a factor of 1.0 back is still walked rank by rank)
        self._binding = None
        self._binding_names.clear()
        self._paths.clear()
        for flow in list(self.network.flows.values()):  # re-path flows in flight under the new capacities
            new = self.path(*flow.key)
            if new != flow.res:
                self.network.remove(flow, now)
                flow.res = new
                for f in self.network.add(flow, now):
                    changed[f.fid] = f
        self._retime(sorted(changed.values(), key=lambda f: f.fid))

    def resources_matching(self, element: str) -> list[str]:
        """Resource names of links touching ``element`` (e.g. ``"n0/pcisw1"``) and its own throughputs.

        A full resource name (``"link:n0/gpu0>n0/pcisw0"``) matches itself. Every resource of the topology
        enters the network (and every node is built: a slow-link fault names one).
        """
        self._index(self.topology.resource_names())
        out = [n for n in self.network.names if n == element or element in _endpoints(n)]
        if not out:
            raise FlowError(f"no link or element {element!r} in topology {self.topology.name!r}")
        return out

    # ------------------------------------------------------------------ internals

    def _launch(self, stream: tuple) -> None:
        q = self._queues[stream]
        if not q:
            self._busy[stream] = False
            return
        kind, nbytes, on_done = q.pop(0)
        rank = stream[0]
        start = self._engine.now
        wait = self.latency_s
        if kind is CopyKind.H2D and self._scrub_until:
            wait += self.scrub_pending_s(rank)  # [Note: the driver's scrub of freed memory]
        if wait > 0:
            self._engine.schedule(wait, self._begin, stream, rank, kind, nbytes, on_done, start)
        else:
            self._begin(stream, rank, kind, nbytes, on_done, start)

    def _begin(self, stream, rank: int, kind: CopyKind, nbytes: int, on_done, start: float) -> None:
        engine = self._engine
        if nbytes == 0:
            self._finish(stream, rank, kind, nbytes, on_done, start)
            return
        self._seq += 1
        flow = Flow(self._seq, self.path(rank, kind), nbytes, engine.now,
                    lambda: self._finish(stream, rank, kind, nbytes, on_done, start), f"rank {rank} {kind.value}",
                    (rank, kind))
        self._retime(self.network.add(flow, engine.now))

    def _retime(self, flows: list[Flow]) -> None:
        engine = self._engine
        for f in flows:
            if f.event is not None:
                f.event.cancel()
            f.event = engine.schedule(f.remaining / f.rate, self._complete, f)

    def _complete(self, flow: Flow) -> None:
        flow.event = None
        flow.remaining = 0.0
        self._retime(self.network.remove(flow, self._engine.now))
        flow.on_done()

    def _finish(self, stream, rank: int, kind: CopyKind, nbytes: int, on_done, start: float) -> None:
        if self.keep_log:
            self.log.append((rank, kind, nbytes, start, self._engine.now))
        on_done()
        self._launch(stream)


def _endpoints(resource: str) -> tuple[str, ...]:
    kind, _, rest = resource.partition(":")
    if kind == "elem":
        return (rest.removesuffix("/copy"),)
    return tuple(rest.replace(">", "|").split("|"))


__all__ = ["Flow", "FlowError", "FlowNetwork", "FlowTransport", "max_min_rates"]
