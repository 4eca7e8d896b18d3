"""Collective and communicator costs from a topology, in nccl-tests' bus-bandwidth terms.

Collectives (:class:`TopologyCollectiveCost`, a :class:`sim.machine.protocols.CollectiveCost`)
-------------------------------------------------------------------------------
nccl-tests reports, for a collective of *size* ``S`` bytes taking ``t`` seconds,
``algbw = S / t`` and ``busbw = algbw * f(n)`` with ``f = 2(n-1)/n`` for
all_reduce, ``(n-1)/n`` for all_gather (``S`` is the output), ``1`` for
broadcast. busbw is what a ring moves over its slowest link, so it is
comparable across ``n``. The collective cost inverts that, alpha-beta style::

    t = latency + f(n) * S / B

* ``B``, the bus bandwidth of the group, is the slowest hop of the ring over
  the group's ranks in rank order, each hop's bottleneck bandwidth
  (:meth:`sim.machine.topology.Topology.p2p`) times NCCL's efficiency on that link
  kind (the preset's ``collective.efficiency``, from nccl-tests figures and
  NCCL's topology constants).
* ``latency`` is the smaller of a ring (``ring_base + steps * ring_step``,
  with ``2(n-1)`` steps for all_reduce and ``n-1`` for all_gather/broadcast)
  and, for groups that span nodes, a tree (``tree_base + 2 ceil(log2 n) *
  tree_step`` for all_reduce, half that for broadcast); the step latency is
  the one of the slowest link kind the ring crosses (NCCL's tuning tables).

A barrier is timed as a one-element all_reduce (what torch does on NCCL).

Communicators (:class:`NcclComm`, a :class:`sim.machine.protocols.CommCosts`)
------------------------------------------------------------------
Memory and lifecycle times come from the preset's ``comm`` section. torch
creates NCCL communicators lazily, at the first collective of a (re)built
group: creating the group costs ``create_group``; the first collective costs
``init`` more (:meth:`NcclComm.first_use`), and destroying a group costs
``destroy`` if its communicator was initialised, ``destroy_uninitialized``
if not. Gloo groups hold no device memory; where the preset has ``agreement``,
a collective on a Gloo group (the lifecycle's agreements) takes that long
(:meth:`NcclComm.gloo_collective_time`, charged by the rendezvous).

[Note: a destroy, with and without the proxy waker] Destroying an initialised
communicator joins its NCCL UDS proxy thread, which notices the stop only when
its ``poll`` returns: at its next poll timeout, ``proxy_poll`` (500 ms) periods
after its last request, which is the end of its initialisation ([Note: the
proxy's 500 ms poll] in :mod:`sim.presets`). So the condition decides the cost:

* the runtime wakes the thread (``wake_proxies``, TorchRuntime's default,
  :mod:`refimpl.torch_runtime.proxy_wake`): ``destroy`` alone;
* it does not (the records before the waker, or a framework's own destroys):
  the wait for the next timeout, ``(init_end - now) mod proxy_poll``, then
  ``destroy``. Communicators initialised one after the other have their
  timeouts that far apart, so a walk destroying them in that order pays one
  wait, then each next destroy the spacing of the inits (not a period each).

:func:`destroy_seconds`, :func:`rebuild_seconds` and :func:`first_use_seconds`
state these per communicator from a preset's :class:`sim.presets.CommParams`;
:class:`NcclComm` charges them in a simulated run, and code predicting a step
outside the simulated runtime (the RL step on N GPUs) calls them directly.
"""
from __future__ import annotations

import bisect
import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from refimpl.runtime.base import CommMemory, GroupSpec
from sim.presets import CommParams, LinkKind

if TYPE_CHECKING:  # pragma: no cover
    from sim.machine.topology import Topology

log = logging.getLogger(__name__)

#: nccl-tests busbw factor per collective (``busbw = algbw * factor``)
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
_RING_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
}
_TREE_STEPS = {"all_reduce": lambda n: 2 * math.ceil(math.log2(n)), "broadcast": lambda n: math.ceil(math.log2(n))}


#: collectives across nodes of fewer bus bytes than this are latency-bound: timed alone, they share no NIC
#: (NCCL's LL protocols carry such sizes; the lifecycle's probes, canaries and agreements are a few bytes)
SHARE_MIN_BYTES = 1 << 20


def _delay_to(now: float, t: float) -> float:
    """The delay that, added to ``now``, gives exactly ``t`` in floating point (``t - now``, nudged an ulp)."""
    d = max(0.0, t - now)
    while now + d < t:
        d = math.nextafter(d, math.inf)
    while d > 0 and now + d > t:
        d = math.nextafter(d, -math.inf)
    return d


class CollectiveCostError(ValueError):
    """A collective cost was asked for something the topology has no figure for."""


class TopologyCollectiveCost:
    """Ring/tree alpha-beta costs of collectives over a topology (see the module docstring)."""

    def __init__(self, topology: "Topology"):
        self.topology = topology
        self.params = topology.collective
        self._bus: dict[tuple[int, ...], tuple[float, LinkKind, bool]] = {}

    def bus(self, ranks: tuple[int, ...]) -> tuple[float, LinkKind, bool]:
        """``(bus bandwidth B in bytes/s, bottleneck link kind, spans nodes)`` of a ring over ``ranks``.

        Every hop is held to each link it crosses at NCCL's efficiency on that link: a hop between nodes to the
        NICs' aggregate at the network efficiency and to the GPUs' own links (NVLink to the NICs, PXN) at theirs,
        so no ring gets more than any link it uses carries."""
        hit = self._bus.get(ranks)
        if hit is not None:
            return hit
        own, own_kind = self._own(ranks)
        nic = self.nic_share_capacity()
        g = self.topology.gpus_per_node
        multi = min(ranks) // g != max(ranks) // g
        if multi and not nic > 0:
            order = sorted(ranks)
            self.topology.p2p(order[0], order[-1])  # raises: nodes without NICs
        out = (nic, LinkKind.NETWORK, True) if multi and nic < own else (own, own_kind, multi)
        self._bus[ranks] = out
        return out

    def _own(self, ranks: tuple[int, ...]) -> tuple[float, LinkKind]:
        """The ring's bottleneck over every link but the NICs (each at its efficiency), and its kind (the first hop's
        of the ring's narrowest).

        A hop's bandwidth depends only on its two GPUs' places in their nodes and whether the nodes differ (every
        node is built alike), so each kind of hop is looked up once (:meth:`_hop`)."""
        best, kind = math.inf, LinkKind.NVLINK
        order = sorted(ranks)
        g = self.topology.gpus_per_node
        hop = self._hop
        for a, b in zip(order, order[1:] + order[:1]):
            if a == b:
                continue
            bw, k = hop(a % g, b % g, a // g == b // g)
            if bw < best:
                best, kind = bw, k
        return best, kind

    @functools.lru_cache(maxsize=None)
    def _hop(self, local_a: int, local_b: int, same_node: bool) -> tuple[float, LinkKind]:
        """A ring hop between GPUs ``local_a`` and ``local_b`` of one node (``same_node``) or of two: its bandwidth at
        NCCL's efficiency and its link kind."""
        topo, eff = self.topology, self.params.efficiency
        g = topo.gpus_per_node
        if same_node:
            bw, k = topo.p2p(local_a, local_b)
        else:  # the GPUs' own widest links carry the hop to the NICs
            bw, k = topo.gpu_link_bandwidth(local_a, g + local_b if topo.nodes > 1 else local_b), LinkKind.NVLINK
        return bw * eff[k], k

    def nic_share_capacity(self) -> float:
        """What one node's NICs carry out of it for collectives (bytes/s): their aggregate at the network efficiency
        (math.inf for a one-node topology)."""
        if self.topology.nodes <= 1:
            return math.inf
        return self.topology.nic_bandwidth() * self.params.efficiency.get(LinkKind.NETWORK, 1.0)

    # ------------------------------------------------------------------ NICs shared by concurrent collectives

    def bind(self, world) -> None:
        """Attach to the world's engine: collectives that span nodes then share the NICs (:meth:`run`)."""
        from sim.machine.flows import FlowNetwork

        self._engine = world.engine
        nic = self.nic_share_capacity()
        self._net = (FlowNetwork({f"nic:n{k}": nic for k in range(self.topology.nodes)}) if 0 < nic < math.inf
                     else None)
        self._seq = 0

    def spans_nodes(self, ranks: tuple[int, ...], nbytes: int = SHARE_MIN_BYTES) -> bool:
        """True if a collective of ``nbytes`` over ``ranks`` crosses nodes with enough bytes to share the NICs with
        other such collectives (:data:`SHARE_MIN_BYTES`; a smaller one is latency-bound and timed alone)."""
        return (getattr(self, "_net", None) is not None and nbytes >= SHARE_MIN_BYTES
                and self.bus(tuple(ranks))[2])

    def run(self, op: str, ranks: tuple[int, ...], nbytes: int, extra_s: float, on_done, group: str = "") -> None:
        """Complete a collective through the engine: ``extra_s`` (lazy init) and the latency, then its bytes.

        [Note: NICs shared among collectives] A collective between nodes moves ``f(n) * nbytes`` over every
        spanned node's NICs as a flow, max-min fair with the other collectives crossing those NICs at the time (and
        held to its own ring's bottleneck over the other links), so eight groups all-reducing across two nodes at
        once get an eighth of the NICs each. A lone one takes :meth:`time`, to the last bit. Only collectives of
        :data:`SHARE_MIN_BYTES` or more come here (:meth:`spans_nodes`)."""
        ranks = tuple(ranks)
        if op == "barrier":
            op, nbytes = "all_reduce", 4
        if op not in BUS_FACTOR:
            raise CollectiveCostError(f"unknown collective {op!r}; known: {sorted(BUS_FACTOR)} and 'barrier'")
        wait = extra_s + self.latency(op, ranks)
        nodes = sorted({self.topology.node_of(r) for r in ranks})
        own, _ = self._own(ranks)
        bus_bytes = BUS_FACTOR[op](len(ranks)) * nbytes
        # alone, it ends exactly when the closed form says (the same sum, not a sum split in two)
        alone = self._engine.now + (self.time(op, ranks, nbytes) + extra_s)
        self._engine.schedule(wait, self._begin, group, ranks, nodes, own, bus_bytes, alone, on_done)

    def _begin(self, group: str, ranks: tuple[int, ...], nodes: list[int], own: float, nbytes: float, alone: float,
               on_done) -> None:
        """The collective's bytes start to flow (its events are its group's: ``group`` first, for a folded run)."""
        from sim.machine.flows import Flow

        self._seq += 1
        cap = f"own:{','.join(map(str, ranks))}"  # one per group: its collectives run in order on its stream
        self._net.add_resource(cap, own)
        res = self._net.resources([*(f"nic:n{k}" for k in nodes), cap])
        flow = Flow(self._seq, res, nbytes, self._engine.now, on_done, f"collective over nodes {nodes}", (group,))
        changed = self._net.add(flow, self._engine.now)
        if flow.rate == self.bus(ranks)[0]:  # nothing shares its NICs now: the closed form's end
            flow.event = self._engine.schedule(_delay_to(self._engine.now, alone), self._finish, flow)
            changed = [f for f in changed if f is not flow]
        self._retime(changed)

    def _retime(self, flows) -> None:
        for f in flows:
            if f.event is not None:
                f.event.cancel()
            f.event = self._engine.schedule(f.remaining / f.rate, self._finish, f)

    def _finish(self, flow) -> None:
        flow.event = None
        flow.remaining = 0.0
        self._retime(self._net.remove(flow, self._engine.now))
        flow.on_done()

    def latency(self, op: str, ranks: tuple[int, ...]) -> float:
        """Latency part of the cost: the better of ring and (across nodes) tree."""
        n = len(ranks)
        _, kind, multi = self.bus(ranks)
        p = self.params
        step_kind = LinkKind.NETWORK if multi else kind
        ring = p.ring_base_s + _RING_STEPS[op](n) * p.ring_step_s[step_kind]
        if multi and op in _TREE_STEPS:
            return min(ring, p.tree_base_s + _TREE_STEPS[op](n) * p.tree_step_s[step_kind])
        return ring

    def time(self, op: str, ranks: tuple[int, ...], nbytes: int) -> float:
        """Seconds the collective takes once every member arrived (``nbytes``: nccl-tests size)."""
        n = len(ranks)
        if n <= 1:
            return 0.0
        if op == "barrier":
            op, nbytes = "all_reduce", 4
        if op not in BUS_FACTOR:
            raise CollectiveCostError(f"unknown collective {op!r}; known: {sorted(BUS_FACTOR)} and 'barrier'")
        bus, _, _ = self.bus(tuple(ranks))
        return self.latency(op, tuple(ranks)) + BUS_FACTOR[op](n) * nbytes / bus

    def busbw(self, op: str, ranks: tuple[int, ...], nbytes: int) -> float:
        """The busbw nccl-tests would print for this collective at these costs (bytes/s)."""
        n = len(ranks)
        return nbytes / self.time(op, ranks, nbytes) * BUS_FACTOR[op](n)


def destroy_seconds(params: CommParams, *, initialised: bool = True, wake_proxies: bool = True,
                    since_init_s: float | None = None) -> float:
    """Seconds one rank spends destroying one group's communicator ([Note: a destroy, with and without the proxy
    waker]).

    ``params``: the communicator's costs (``topology.comm.for_size(ranks)``); ``initialised``: its lazy NCCL init ran
    (a collective since the (re)build), else ``destroy_uninitialized``; ``wake_proxies``: the runtime wakes the UDS
    proxy thread (TorchRuntime's default); without it, ``since_init_s`` (seconds from the end of its init to the
    destroy's start) places the wait for the next poll timeout, and None takes the mean over a uniform phase, half a
    period (a destroy long after an init whose time is not known).
    """
    if not initialised:
        return params.destroy_uninitialized_s
    if wake_proxies:
        return params.destroy_s
    return poll_wait_seconds(params, since_init_s) + params.destroy_s


def poll_wait_seconds(params: CommParams, since_init_s: float | None) -> float:
    """Seconds a destroy without the proxy waker waits for the UDS proxy thread's next poll timeout, ``since_init_s``
    after the end of the communicator's init, its first collective (None: the mean over a uniform phase, half a
    period; 0 where the preset does not simulate the poll)."""
    poll = params.proxy_poll_s
    if poll <= 0:
        return 0.0
    if since_init_s is None:
        return poll / 2
    return (-since_init_s) % poll


def rebuild_seconds(params: CommParams) -> float:
    """Seconds one rank spends in ``recreate_group`` of a destroyed group: the process-group object alone (torch creates
    the NCCL communicator lazily, at the first collective: :func:`first_use_seconds`)."""
    return params.create_group_s


def first_use_seconds(params: CommParams, *, after_resume: bool = False) -> float:
    """Seconds a (re)built group's first collective adds beyond the collective itself: the lazy NCCL init
    (``init``); after an ``ncclCommResume`` instead, ``resume_first_collective``."""
    return params.resume_first_collective_s if after_resume else params.init_s


def destroy_walk_seconds(params: Sequence[CommParams], *, wake_proxies: bool = True,
                         init_ends: Sequence[float] | None = None, start: float = 0.0) -> float:
    """Seconds one rank spends destroying initialised communicators one after the other, in the given order.

    ``params``: each communicator's costs; with ``wake_proxies`` each costs ``destroy``. Without, ``init_ends`` (the
    end of each one's init, on the clock of ``start``, the walk's start) places each wait: a communicator's timeouts
    fall ``proxy_poll`` apart from its init's end, so groups initialised together pay one wait per walk and then the
    spacing of their inits ([Note: a destroy, with and without the proxy waker])."""
    if wake_proxies:
        return sum(destroy_seconds(p) for p in params)
    if init_ends is None or len(init_ends) != len(params):
        raise ValueError("without the proxy waker a walk needs init_ends: each communicator's init end, one per group")
    t = start
    for p, end in zip(params, init_ends):
        t += destroy_seconds(p, wake_proxies=False, since_init_s=t - end)
    return t - start


@dataclass(frozen=True)
class GroupSwitch:
    """What one rank pays for one group's communicator across a switch that destroys and rebuilds it (seconds)."""

    #: ranks of the group
    ranks: int
    #: destroying its initialised communicator (:func:`destroy_seconds`)
    destroy_s: float
    #: ``recreate_group``: the process-group object (:func:`rebuild_seconds`)
    rebuild_s: float
    #: its first collective after the rebuild beyond the collective itself: the lazy init (:func:`first_use_seconds`)
    first_use_s: float

    @property
    def total_s(self) -> float:
        """Destroy, rebuild and first use together."""
        return self.destroy_s + self.rebuild_s + self.first_use_s


def predict_group_switch(topology: "str | Topology", ranks: int, *, wake_proxies: bool = True,
                         since_init_s: float | None = None) -> GroupSwitch:
    """[Note: a destroy, with and without the proxy waker] One group of ``ranks`` ranks destroyed, rebuilt and used
    again, on ``topology`` (a preset name or file, or a :class:`~sim.machine.topology.Topology`): the hook a
    prediction outside the simulated runtime (the RL step on N GPUs) calls for each group its switch takes down.
    ``wake_proxies`` and ``since_init_s`` as :func:`destroy_seconds`."""
    from sim.machine.topology import Topology

    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ValueError(f"ranks must be a positive integer (the group's size), got {ranks!r}")
    topo = topology if isinstance(topology, Topology) else Topology.from_preset(topology)
    p = topo.comm.for_size(ranks)
    return GroupSwitch(ranks, destroy_seconds(p, wake_proxies=wake_proxies, since_init_s=since_init_s),
                       rebuild_seconds(p), first_use_seconds(p))


class NcclComm:
    """Communicator memory and lifecycle times from a preset's ``comm`` section (see module docstring).

    Every cost is per communicator and per rank, and depends on the group's
    size: a one-rank communicator and one of several ranks have their own
    figures where the preset has both ([Note: one-rank and multi-rank
    communicators] in :mod:`sim.presets`).

    Args:
        topology: where the ``comm`` parameters come from.
        lazy_init: True (torch's default) charges ``init`` at a group's first
            collective via :meth:`first_use`; False charges it at creation.
        init_at_collective: the simulator charges :meth:`first_use` itself, as
            part of a group's first collective (and of its first collective
            after a resume), so code that does not call ``first_use`` (the
            lifecycle, the switch-window benchmark) pays the lazy init where
            torch pays it. False (the default) leaves it to the caller, as the
            scenario runner does.
        proxy_wake: the runtime wakes the proxy thread a destroy joins
            (:class:`refimpl.torch_runtime.proxy_wake.ProxyWaker`; True, the
            default, as TorchRuntime's ``wake_proxies``): a destroy costs
            ``destroy`` without the wait for the poll timeout. False simulates a
            runtime without it (the records taken before the waker, a
            framework's own ``destroy_process_group``), whose destroys wait
            ([Note: a destroy, with and without the proxy waker]).
    """

    def __init__(self, topology: "Topology", *, lazy_init: bool = True, init_at_collective: bool = False,
                 proxy_wake: bool = True):
        self.params = topology.comm
        self.lazy_init = lazy_init
        self.init_at_collective = init_at_collective
        self.proxy_wake = proxy_wake
        self._initialized: dict[tuple[str, int], None] = {}
        self._resumed: set[tuple[str, int]] = set()
        #: when each initialised communicator's proxy thread last started a poll period (end of its init)
        self._poll_origin: dict[tuple[str, int], float] = {}
        self._clock = None
        #: when each destroy started whose wait for its poll timeout is shorter than the preset's
        #: ``poll_phase_spread``: on hardware it may find the timeout passed and wait a period more
        self.poll_late: list[float] = []

    def bind(self, world) -> None:
        """Read simulated time from ``world``'s engine (the proxy poll needs it; :class:`sim.SimWorld` calls this)."""
        engine = world.engine
        self._clock = lambda: engine.now

    def _initialise(self, key: tuple[str, int], after_s: float) -> None:
        """Record that ``key``'s communicator exists once ``after_s`` from now have passed."""
        self._initialized[key] = None
        if self._clock is not None:
            self._poll_origin[key] = self._clock() + after_s

    def _p(self, spec: GroupSpec) -> CommParams:
        return self.params.for_size(spec.size)

    def memory(self, spec: GroupSpec, rank: int) -> CommMemory:
        """Device bytes a live communicator of ``spec`` holds on ``rank``."""
        if spec.backend != "nccl":
            return CommMemory()
        p = self._p(spec)
        return CommMemory(suspendable=p.memory_bytes, persistent=p.persistent_bytes)

    def create_time(self, spec: GroupSpec) -> float:
        """Seconds from the last member's arrival to a usable group."""
        p = self._p(spec)
        if spec.backend != "nccl" or self.lazy_init:
            return rebuild_seconds(p)
        self._initialise((spec.name, spec.generation), p.create_group_s + p.init_s)
        return p.create_group_s + p.init_s

    def first_use(self, spec: GroupSpec) -> float:
        """Seconds the first collective of this group generation adds (lazy NCCL init), or the first
        collective after a resume; 0 otherwise."""
        key = (spec.name, spec.generation)
        if spec.backend == "gloo":
            return 0.0
        if key in self._resumed:
            self._resumed.discard(key)
            return first_use_seconds(self._p(spec), after_resume=True)
        if key in self._initialized:
            return 0.0
        init_s = first_use_seconds(self._p(spec))
        self._initialise(key, init_s)
        return init_s

    def initialized(self, spec: GroupSpec) -> bool:
        """True once this group generation's communicator exists (a collective ran, or eager init)."""
        return (spec.name, spec.generation) in self._initialized

    def destroy_time(self, spec: GroupSpec) -> float:
        """Seconds one rank spends destroying its communicator: for an initialised one, the wait for its proxy
        thread's next poll timeout (where the preset has ``proxy_poll`` and the proxy is not woken) and ``destroy``."""
        p = self._p(spec)
        if spec.backend == "nccl" and self.initialized(spec):
            origin = self._poll_origin.get((spec.name, spec.generation))
            since = None if self.proxy_wake or origin is None or self._clock is None else self._clock() - origin
            if since is None:  # woken, or no clock: the destroy's own cost
                return destroy_seconds(p)
            wait = poll_wait_seconds(p, since)
            if 0.0 < wait < p.poll_phase_spread_s:
                self.poll_late.append(self._clock())
            return wait + p.destroy_s
        return destroy_seconds(p, initialised=False)

    def poll_late_between(self, start: float, end: float) -> bool:
        """True if a destroy that may wait one proxy poll period more than simulated (:attr:`poll_late`) started in
        ``[start, end)`` (simulated seconds): a phase spanning it ends when simulated or a period later."""
        i = bisect.bisect_left(self.poll_late, start)  # appended as simulated time runs: sorted
        return i < len(self.poll_late) and self.poll_late[i] < end

    def proxy_wait(self, spec: GroupSpec) -> float:
        """Seconds from now to the next poll timeout of the communicator's UDS proxy thread (0 where not simulated)."""
        origin = self._poll_origin.get((spec.name, spec.generation))
        if origin is None or self._clock is None:
            return 0.0
        return poll_wait_seconds(self._p(spec), self._clock() - origin)

    def gloo_collective_time(self, spec: GroupSpec) -> float | None:
        """Seconds one collective on a Gloo group takes, or None where not simulated.

        The preset's ``agreement`` is what one took over two ranks; over ``n`` ranks Gloo's ring makes
        ``n - 1`` such exchanges (an assumption: only two-rank agreements are recorded), and one rank none.
        """
        t = self.params.agreement_s
        return t * (spec.size - 1) if spec.backend == "gloo" and t > 0 else None

    def suspend_time(self, spec: GroupSpec) -> float:
        """Seconds ``ncclCommSuspend`` takes on one rank."""
        return self._p(spec).suspend_s

    def resume_time(self, spec: GroupSpec) -> float:
        """Seconds ``ncclCommResume`` takes on one rank; the next collective then pays
        ``resume_first_collective`` (charged once per group, by :meth:`first_use`)."""
        self._resumed.add((spec.name, spec.generation))
        return self._p(spec).resume_s


__all__ = ["SHARE_MIN_BYTES", "BUS_FACTOR", "CollectiveCostError", "NcclComm", "TopologyCollectiveCost",
           "GroupSwitch", "destroy_seconds", "destroy_walk_seconds", "first_use_seconds", "poll_wait_seconds",
           "predict_group_switch", "rebuild_seconds"]
