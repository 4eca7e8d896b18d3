"""Symmetry folding: simulate a socket, a node or a few of a large symmetric job and expand the result to every rank.

[Note: why fold]
Profiling the default multi-node scenario (``{"world_size": N, "topology":
"hgx-h200-8x-ib"}``, a dense 7B FSDP shard of 1,455 tensors per rank) at 64 to
1,024 ranks showed that about three quarters of the time and nearly all of the
memory are the protocol code itself: the offload store collecting, packing and
copying 1,455 meta tensors per rank, and the allocator ledger entries for
them (``docs/sim.md``, "Cluster scale"). The simulator's own event machinery
is a few per cent. No change to the kernel can make 16,384 copies of that
work fit in a minute; but in such a job most ranks do exactly the same thing
at exactly the same simulated times.

[Note: when two ranks follow the same timeline]
A fold simulates the first ``head`` units (nodes, or parts of nodes: see
[Note: units smaller than a node]) as themselves and the next ``k`` units as
a period that every later unit repeats: rank ``r`` follows its
representative ``rep(r)`` (itself if it runs, else the rank at the same place
of the period). Rank ``r`` and ``rep(r)`` have the same timeline when, by
induction over events:

* they run the same program on the same inputs: every rank runs
  :func:`sim.scenarios.runner.rank_main`, meta payloads (no bytes whose values differ by
  rank), no fault plan, no process-group lifecycle (its agreements reduce over
  rank ids), the plain offload store or the TMS pause (the dedup backend gives
  each member of a group its own slice);
* they sit at the same place in the topology: no two units share a resource
  of a copy path or a NUMA node (so units never share a flow or host
  memory), and one renaming of resources, one to one within each unit,
  takes the copy paths (position by position) and the NUMA node of ``r`` to
  those of ``rep(r)``, with the same capacities, HBM size and host memory
  (for whole nodes, the node's name: ``n7/`` to ``n1/``);
* their groups look the same: for every group family, the representatives of
  the members of ``r``'s group are exactly the active members of ``rep(r)``'s
  group (so a collective completes at the same instant: the last arrival is a
  representative's), the two groups have the same size and the same
  collective cost (size, ring bus bandwidth, spans nodes), and the families
  sort in the same order by group name;
* nobody is first for them (see [Note: first come, first served]): a group
  whose members share representatives (a DP group across all nodes) starts in
  the head, so the member that initialises its lazily created communicator,
  and sleeps for it while the others wait, is a rank that stands only for
  itself. Hence the default scenario runs socket 0 of node 0 as itself and
  socket 1 of node 0 for every later socket (8 ranks); a fold without a head
  gave the right phase times but, in a drawn scenario, a phase's memory peak
  of the other nodes that differed by one export bucket
  (``property_tests/test_fold_property.py``).

[Note: units smaller than a node]
With a whole node as the unit the default scenario would simulate 16 ranks
(node 0 as the head, node 1 for the rest). But the two sockets of an HGX
node share nothing a copy uses: GPUs 0-3 stage through
their PCIe switches and socket 0 to NUMA node 0, GPUs 4-7 through socket 1 to
NUMA node 1, and collectives are costed per group, not per link. A socket can
then stand for a socket, node borders or not, and the head and the period are
half a node each: 8 simulated ranks, half the protocol work of a run (a
1,024-rank run's simulated ranks took 1.0 s of CPU with whole nodes and 0.47 s
with sockets, same result JSON). :func:`plan_fold` tries every divisor of the
GPUs per node as the unit, fewest active ranks first; :func:`_units_apart`
rejects a unit size at once if two units share any copy-path resource or
NUMA node (GPU pairs share a PCIe switch, so units of 1 or 2 GPUs never
pass), and the renaming check above does the rest. Everything else is as
for nodes: a unit's NUMA ledgers are its representative unit's.

:func:`plan_fold` checks all of this and picks the smallest fold for which it
holds. :func:`run_folded` then runs a world of all ``N`` ranks (topology,
groups, flow pruning and collective costs see every rank) in which only the
active ranks run; a collective completes when its active members have
arrived. Each inactive rank's result is its representative's, with group
names in ``last_op`` renamed to its own. The event count is expanded exactly:
every event is a step of a rank or a flow of a rank (unit-local), counted
once per rank its owner stands for, or the completion of a collective on one
group, counted once per group of the full job through its representative
group.

Anything the checks did not foresee (a collective moving real bytes, a rank
that did not finish, a deadlock) makes :func:`run_auto` fall back to the full
simulation. ``tests/sim/scenarios/test_fold.py`` compares folded and full runs bit for
bit at 256 to 2,048 ranks and against the golden results of the simulator as
it was before folding existed.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from refimpl.runtime.base import WORLD
from sim.kernel.errors import CollectiveMismatchError, DeadlockError, SimError
from sim.rendezvous import Arrival, Pending, Rendezvous, describe
from sim.scenarios.result import RankOutcome, ScenarioResult, judge
from sim.world import RankReport, WorldReport

if TYPE_CHECKING:  # pragma: no cover
    from sim.machine.faults import FaultPlan
    from sim.scenarios.runner import MeshGroups
    from sim.scenarios.scenario import Scenario
    from sim.machine.topology import Topology
    from sim.world import SimWorld

log = logging.getLogger(__name__)

#: largest active set :func:`plan_fold` tries (ranks of the first units)
MAX_ACTIVE = 1024

_NODE = re.compile(r"^n(\d+)/")
_NODE_ANY = re.compile(r"(?<![A-Za-z0-9_])n(\d+)/")


class FoldBroken(SimError):
    """The folded run met something its symmetry checks did not cover; the caller runs the full job."""


@dataclass(frozen=True)
class Fold:
    """Which ranks run, and which active rank each rank of the job follows.

    The job is cut into units of ``unit`` consecutive ranks: whole nodes, or
    (``ranks_per_unit``) equal parts of a node that share no copy-path resource
    and no host memory with each other, such as the GPUs of one socket (see
    [Note: units smaller than a node]). The first ``head`` units run and stand
    only for themselves; the next ``nodes`` units run and stand, periodically,
    for every later unit. So ``rep(r) = r`` for the ``active`` ranks, and for a
    later rank the rank at the same place of the tail period.
    """

    world_size: int
    gpus_per_node: int
    nodes: int  # tail period in units (k)
    head: int = 0  # leading units simulated as themselves
    ranks_per_unit: int | None = None  # None: a unit is a node

    @functools.cached_property
    def unit(self) -> int:
        """Ranks per unit (``gpus_per_node`` unless the fold cuts nodes into parts)."""
        return self.ranks_per_unit or self.gpus_per_node

    @functools.cached_property
    def active(self) -> int:
        """Ranks that really run."""
        return (self.head + self.nodes) * self.unit

    def rep(self, rank: int) -> int:
        """The active rank whose timeline ``rank`` follows."""
        active = self.active
        if rank < active:
            return rank
        h = self.head * self.unit
        return h + (rank - h) % (active - h)

    def rep_node(self, node: int) -> int:
        """The simulated node whose timeline ``node`` follows (units of whole nodes only)."""
        if self.unit != self.gpus_per_node:
            raise ValueError(f"a fold in units of {self.unit} ranks maps ranks, not nodes; use rep()")
        if node < self.head + self.nodes:
            return node
        return self.head + (node - self.head) % self.nodes

    def multiplicity(self, rank: int) -> int:
        """How many ranks of the job active ``rank`` stands for (itself included)."""
        if rank < self.head * self.unit:
            return 1
        return (self.world_size // self.unit - self.head) // self.nodes


# --------------------------------------------------------------------------- can this scenario fold?


def _rename_node(name: str, node: int) -> str | None:
    """``name`` with every node reference (``n<j>/``) made ``node``; None if it names no node."""
    if _NODE_ANY.search(name) is None:
        return None
    return _NODE_ANY.sub(f"n{node}/", name)


def _units_apart(scn: "Scenario", topo: "Topology", unit: int) -> str | None:
    """None when no two units of ``unit`` consecutive ranks share a resource of a copy path or a NUMA
    node (so their flows never compete and their host memory is their own); else why not."""
    from refimpl.runtime.base import CopyKind

    kinds = list(CopyKind)
    owner: dict[str, int] = {}
    for r in range(scn.world_size):
        u = r // unit
        for res in (*(x for k in kinds for x in topo.copy_path(r, k)), "numa " + topo.numa_of(r)):
            v = owner.setdefault(res, u)
            if v != u:
                return f"ranks {v * unit}-{v * unit + unit - 1} and rank {r} share {res!r}"
    return None


def _topology_symmetric(scn: "Scenario", topo: "Topology", fold: Fold) -> str | None:
    """None when every rank sits where its representative does; else why not.

    Units share nothing (:func:`_units_apart`, checked by the caller), and one
    renaming of resources and NUMA nodes, one to one within each unit, takes
    every rank's copy paths (position by position) and NUMA node to its
    representative's, with the same capacities, HBM size and host memory. For
    units of whole nodes that renaming is the node's name (``n7/`` to ``n1/``).
    """
    from refimpl.runtime.base import CopyKind

    caps = topo.capacities()
    kinds = list(CopyKind)
    rep_paths: dict[int, list[tuple[str, ...]]] = {}
    for rep in range(fold.active):
        rep_paths[rep] = [topo.copy_path(rep, kind) for kind in kinds]
    onto: dict[str, str] = {}  # a later unit's resource -> its representative unit's
    taken: dict[tuple[int, str], str] = {}  # (later unit, representative's resource) -> the unit's resource
    for r in range(fold.active, scn.world_size):
        rep, u = fold.rep(r), r // fold.unit
        if topo.hbm_bytes(r) != topo.hbm_bytes(rep):
            return f"rank {r} has another HBM size than rank {rep}"
        numa, rnuma = topo.numa_of(r), topo.numa_of(rep)
        if topo.host_capacity(numa) != topo.host_capacity(rnuma) or topo.pinnable_bytes(numa) != topo.pinnable_bytes(rnuma):
            return f"NUMA node {numa!r} has other capacities than {rnuma!r}"
        pairs = [("numa " + numa, "numa " + rnuma)]
        for kind, rpath in zip(kinds, rep_paths[rep]):
            path = topo.copy_path(r, kind)
            if len(path) != len(rpath):
                return f"rank {r}'s {kind.name} path {path} is not like rank {rep}'s {rpath}"
            pairs += zip(path, rpath)
        for a, b in pairs:
            if onto.setdefault(a, b) != b or taken.setdefault((u, b), a) != a:
                return f"rank {r}'s {a!r} is not in the place of rank {rep}'s {b!r} (its unit is laid out otherwise)"
            if caps.get(a) != caps.get(b):
                return f"resource {a!r} has another capacity than {b!r}"
    return None


def _groups_symmetric(scn: "Scenario", topo: "Topology", groups: "MeshGroups", fold: Fold) -> str | None:
    """None when every rank's groups look like its representative's (see the module docstring)."""
    from sim.machine.collectives import TopologyCollectiveCost

    active, rep_of = fold.active, fold.rep
    head = fold.head * fold.unit
    by_name = {s.name: s for s in groups.specs}
    repset: dict[str, frozenset[int]] = {}
    for spec in groups.specs:
        # [Note: first come, first served] The first member to use a lazily created communicator pays
        # its initialisation; the others do not. Members that share a representative must therefore
        # not include that first one, unless a head rank (standing only for itself) comes first.
        # (More members than active ranks always share one: said before computing them all.)
        if spec.size > active and not (spec.ranks[0] < head):
            return f"group {spec.name!r} has members that share a representative and no head rank"
        reps = [rep_of(m) for m in spec.ranks]
        repset[spec.name] = frozenset(reps)
        if len(repset[spec.name]) < len(reps) and not (spec.ranks[0] < head):
            return f"group {spec.name!r} has members that share a representative and no head rank"
    actset = {s.name: frozenset(m for m in s.ranks if m < active) for s in groups.specs}
    cost = TopologyCollectiveCost(topo)
    fams = [f.name for f in scn.groups]
    for r in range(scn.world_size):
        rep = rep_of(r)
        mine, theirs = groups.member[r], groups.member[rep]
        if set(mine) != set(theirs):
            return f"rank {r} is in other group families than rank {rep}"
        order = sorted(fams, key=lambda f: mine.get(f, ""))
        if [f for f in order if f in mine] != [f for f in sorted(fams, key=lambda f: theirs.get(f, "")) if f in theirs]:
            return f"rank {r}'s groups sort in another order than rank {rep}'s"
        for fam, name in mine.items():
            other = theirs[fam]
            if name == other:
                if repset[name] != actset[name]:
                    return f"group {name!r}: representatives of its members are not all members"
                continue
            a, b = by_name[name], by_name[other]
            if repset[name] != actset[other] or repset[other] != actset[other] or a.size != b.size:
                return f"group {name!r} of rank {r} does not fold onto group {other!r} of rank {rep}"
            if (a.backend, a.timeout_s) != (b.backend, b.timeout_s) or cost.bus(a.ranks) != cost.bus(b.ranks):
                return f"group {name!r} has another collective cost than {other!r}"
    return None


def plan_fold(scn: "Scenario", groups: "MeshGroups | None" = None) -> tuple[Fold | None, str]:
    """The fold for ``scn`` (None if it cannot fold) and a one-line reason."""
    from sim.scenarios.runner import mesh_groups

    topo = scn.topo
    if topo is None:
        return None, "the scenario has no built topology"
    g = topo.gpus_per_node
    if scn.payload != "meta":
        return None, "real payloads: every rank holds different bytes"
    if scn.faults.faults:
        return None, "a fault plan breaks the symmetry between ranks"
    if scn.pg_policy != "none":
        return None, "the process-group lifecycle's agreements reduce over rank ids"
    if scn.offload.backend not in ("local", "tms"):
        return None, f"offload backend {scn.offload.backend!r} gives each rank of a group its own slice"
    if scn.world_size % g or scn.world_size // g < 2:
        return None, f"{scn.world_size} ranks are not two or more whole nodes of {g} GPUs"
    groups = groups or mesh_groups(scn)
    why = "no candidate"
    candidates = []
    for unit in (u for u in range(1, g + 1) if g % u == 0):  # see [Note: units smaller than a node]
        units = scn.world_size // unit
        k = 1
        while k < units and k * unit <= MAX_ACTIVE:
            for head in (0, k):  # no head, or one period of units simulated as themselves before the tail
                if head + k < units and (units - head) % k == 0:
                    candidates.append(Fold(scn.world_size, g, k, head, None if unit == g else unit))
            k *= 2
    # the fewest active ranks first; among as many, whole nodes (the fold as it was before units)
    candidates.sort(key=lambda f: (f.active, f.unit != g))
    apart: dict[int, str | None] = {}
    for fold in candidates:
        why = _groups_symmetric(scn, topo, groups, fold)  # most candidates fail here, at the first group
        if why is None:
            if fold.unit not in apart:
                apart[fold.unit] = _units_apart(scn, topo, fold.unit)
            why = apart[fold.unit] or _topology_symmetric(scn, topo, fold)
        if why is None:
            what = "node(s)" if fold.unit == g else f"unit(s) of {fold.unit} ranks"
            return fold, (f"{scn.world_size} ranks follow the timelines of {fold.active} simulated ranks "
                          f"({fold.head} head {what}, then a period of {fold.nodes} {what})")
        log.debug("fold %s rejected: %s", fold, why)
    return None, f"no symmetric fold: {why}"


# --------------------------------------------------------------------------- the folded run


class FoldedRendezvous(Rendezvous):
    """Completes a collective when its *active* members arrived."""

    def __init__(self, world: "SimWorld", fold: Fold):
        super().__init__(world)
        self.fold = fold
        self._expected: dict[tuple[str, int], int] = {}

    def expected(self, spec) -> int:
        """Active members of ``spec``."""
        key = (spec.name, spec.generation)
        n = self._expected.get(key)
        if n is None:
            n = self._expected[key] = sum(1 for m in spec.ranks if m < self.fold.active)
        return n

    def arrive(self, spec, group_rank, seq, op, signature, detail, payload, nbytes, corrupt=False) -> Arrival:
        """As :meth:`Rendezvous.arrive`, but the last *active* member completes the collective."""
        key = (spec.name, spec.generation, seq)
        p = self._pending.get(key)
        rank = spec.ranks[group_rank]
        from sim.kernel.engine import SimFuture

        fut = SimFuture(describe(op, spec, seq))
        arrival = Arrival(rank, detail, payload, fut, corrupt)
        if arrival.snapshot is not None:
            raise FoldBroken(f"{describe(op, spec, seq)} moves real bytes; their values may differ by rank")
        if p is None:
            p = self._pending[key] = Pending(spec, seq, op, signature, nbytes)
        elif p.signature != signature or p.op != op:
            raise FoldBroken(f"collective mismatch at {describe(op, spec, seq)}")
        fut.blocker = p
        if p.arrivals[group_rank] is not None:
            raise AssertionError(f"rank {rank} arrived twice at {p.describe()}")
        p.arrivals[group_rank] = arrival
        p.count += 1
        if p.count == self.expected(spec):
            del self._pending[key]
            self._schedule_complete(p)
        return arrival

    def arm_timeout(self, arrival: Arrival, timeout_s: float, rank: int) -> None:
        """Timeouts would fire on behalf of ranks that do not run: not foldable."""
        raise FoldBroken("a collective with a timeout (the fold does not simulate timeouts)")



class _ExpandedMemory:
    """The simulated memory as :func:`sim.scenarios.result.judge` sees it: every rank reads its representative's ledger."""

    def __init__(self, memory: Any, fold: Fold, topo: "Topology"):
        self._m, self._fold = memory, fold
        self._peaks: dict[tuple[int, float, float], int] = {}
        # a rank's NUMA node reads its representative's (plan_fold checked that the renaming is one to one);
        # one no rank is attached to stays untouched by any run, so any untouched one will do: with whole
        # nodes its namesake on the representative node, else itself
        of_rep = {topo.numa_of(r): topo.numa_of(fold.rep(r)) for r in range(fold.active, fold.world_size)}
        self.numa = {}
        for name in memory.numa:
            src = of_rep.get(name)
            if src is None:
                m = _NODE.match(name) if fold.unit == fold.gpus_per_node else None
                src = name if m is None else _rename_node(name, fold.rep_node(int(m.group(1))))
            self.numa[name] = memory.numa[src]

    def ledger(self, rank: int):
        """The representative's counters."""
        return self._m.ledger(self._fold.rep(rank))

    def peak_between(self, rank: int, start: float, end: float) -> int:
        """The representative's peak (cached: most ranks share it)."""
        key = (self._fold.rep(rank), start, end)
        v = self._peaks.get(key)
        if v is None:
            v = self._peaks[key] = self._m.peak_between(*key)
        return v


class _ExpandedWorld:
    """What :func:`sim.scenarios.result.judge` reads from a world, for all ranks of a folded run."""

    def __init__(self, report: WorldReport, memory: _ExpandedMemory):
        self._report, self.memory = report, memory

    def report(self) -> WorldReport:
        """The expanded report."""
        return self._report


def _rename_groups(text: str, mine: dict[str, str], theirs: dict[str, str]) -> str:
    for fam, name in theirs.items():
        own = mine.get(fam)
        if own is not None and own != name:
            text = text.replace(f"group {name!r}", f"group {own!r}")
    return text


class _EventOwners:
    """Counts the events a folded run executes by owner: a rank (its process steps, its copies' flow
    events), a group (a collective's completion) or nobody in particular."""

    def __init__(self, world: "SimWorld"):
        from sim.kernel.engine import Process
        from sim.machine.collectives import TopologyCollectiveCost
        from sim.machine.flows import FlowTransport

        self.by_rank: dict[int, int] = {}
        self.by_group: dict[str, int] = {}
        self.other = 0
        self.current: int | None = None  # the rank whose process step runs now
        engine = world.engine
        pop = engine._pop
        proc_step, begin, complete = Process._step, FlowTransport._begin, FlowTransport._complete
        rdv_complete = Rendezvous._complete
        # a collective across nodes that shares the NICs: its start and end events are its group's
        net_begin, net_finish = TopologyCollectiveCost._begin, TopologyCollectiveCost._finish

        def counted_pop():
            ev = pop()
            if ev is not None:
                cb = ev.callback
                fn = getattr(cb, "__func__", None)
                self.current = None
                if fn is proc_step:
                    rank = self.current = int(cb.__self__.name[4:])  # processes are named "rank<r>" (SimWorld.run)
                    self.by_rank[rank] = self.by_rank.get(rank, 0) + 1
                elif fn is begin:
                    self.by_rank[ev.args[1]] = self.by_rank.get(ev.args[1], 0) + 1
                elif fn is complete:
                    rank = ev.args[0].key[0]
                    self.by_rank[rank] = self.by_rank.get(rank, 0) + 1
                elif fn is net_begin or fn is net_finish:
                    name = ev.args[0] if fn is net_begin else ev.args[0].key[0]
                    self.by_group[name] = self.by_group.get(name, 0) + 1
                elif fn is rdv_complete or isinstance(getattr(cb, "__self__", None), Rendezvous):
                    name = ev.args[0].spec.name
                    self.by_group[name] = self.by_group.get(name, 0) + 1
                else:
                    self.other += 1
            return ev

        engine._pop = counted_pop  # instance attribute: Engine.run looks it up on the instance


def expand_events(fold: Fold, owners: _EventOwners, groups: "MeshGroups") -> int:
    """The event count of the full run (see [Note: when two ranks follow the same timeline]).

    Each active rank's events count once per rank it stands for; each group of
    the full job counts its representative group's completions.
    """
    fam_of: dict[str, str] = {}
    for r in range(fold.world_size):
        for fam, name in groups.member[r].items():
            fam_of.setdefault(name, fam)
    total = owners.other + owners.by_group.get(WORLD, 0)
    total += sum(n * fold.multiplicity(rank) for rank, n in owners.by_rank.items())
    for spec in groups.specs:
        rep_group = groups.member[fold.rep(spec.ranks[0])][fam_of[spec.name]]
        total += owners.by_group.get(rep_group, 0)
    return total


def _expand_ranks(world_size: int, fold: Fold, simulated: dict[int, RankOutcome], rep_report: WorldReport,
                  groups: "MeshGroups") -> tuple[list[RankOutcome], list[RankReport]]:
    """Every rank's outcome and report from its representative's (``simulated``, ``rep_report``), with its own rank
    and its own group names in its last operation."""
    outcomes: list[RankOutcome] = []
    reports: list[RankReport] = []
    for r in range(world_size):
        rep = fold.rep(r)
        o = simulated[rep]
        rr = rep_report.ranks[rep]
        if r == rep:
            outcomes.append(o)
            reports.append(rr)
            continue
        outcomes.append(dataclasses.replace(o, rank=r, phases=[dict(p) for p in o.phases],
                                            mismatched=list(o.mismatched), lifecycle_stats=dict(o.lifecycle_stats)))
        reports.append(dataclasses.replace(
            rr, rank=r, last_op=_rename_groups(rr.last_op, groups.member[r], groups.member[rep])))
    return outcomes, reports


def run_folded(scn: "Scenario", fold: Fold, *, record_memory: bool = True,
               on_world: Any = None) -> tuple[ScenarioResult, "SimWorld", "FaultPlan | None"]:
    """Run ``scn`` with only the fold's active ranks and expand the result to every rank.

    ``on_world(world)``, if given, is called once the world is built.

    Raises :class:`FoldBroken` if the run met anything the symmetry checks do
    not cover (the caller then runs the full job).
    """
    from sim.scenarios.runner import RankContext, build_world, mesh_groups, rank_main
    from sim.presets.models import build_state

    t0 = time.perf_counter()
    topo = scn.topo
    world, plan = build_world(scn, topo, record_memory=record_memory)
    # no watchdog in a folded run: plan_fold refused fault plans and the lifecycle, so in a run of symmetric
    # ranks no collective can wait out a timeout; a real hang stops as a deadlock (FoldBroken: the caller runs
    # the full job, with the watchdog)
    world.group_timeouts = False
    world.runtimes = world.runtimes[:fold.active]  # a prefix: world.runtimes[rank] still works for active ranks
    if on_world is not None:
        on_world(world)
    world.rendezvous = FoldedRendezvous(world, fold)
    groups = mesh_groups(scn)
    owners = _EventOwners(world)
    first_use = getattr(world.comm, "first_use", None)
    if first_use is not None:
        shared = {s.name for s in groups.specs if len({fold.rep(m) for m in s.ranks}) < s.size}
        head = fold.head * fold.unit

        def checked_first_use(spec):
            """See [Note: first come, first served]: in a group whose members share representatives the
            first user must be a head rank, or the ranks it stands for would all seem to pay the init."""
            delay = first_use(spec)
            if delay > 0 and spec.name in shared:
                user = owners.current
                if user is None or user >= head:
                    raise FoldBroken(f"the first user of group {spec.name!r} (rank {user}) stands for other ranks")
            return delay

        world.comm.first_use = checked_first_use
    ctx = RankContext(scn, topo, groups, build_state(scn.model))
    if scn.pg_policy != "none":  # as run_scenario; plan_fold refuses it, a caller passing a fold may not
        from refimpl.comm import lifecycle as lc_mod

        ctx.lifecycle_cls = lc_mod
    gc_was_enabled = gc.isenabled()
    gc.disable()  # see [Note: no cyclic GC during a run] in sim/scenarios/runner.py
    try:
        results = world.run(lambda rt: rank_main(rt, world, ctx), return_exceptions=True)
    except (DeadlockError, CollectiveMismatchError) as exc:
        raise FoldBroken(f"the folded run stopped: {type(exc).__name__}") from exc
    finally:
        if gc_was_enabled:
            gc.enable()
    for rank, r in enumerate(results):
        o = ctx.outcomes.get(rank)
        if isinstance(r, BaseException) or o is None or not o.finished:
            raise FoldBroken(f"rank {rank} did not finish in the folded run ({r!r})")
    wall_run = time.perf_counter() - t0
    rep_report = world.report()
    events = expand_events(fold, owners, groups)
    outcomes, reports = _expand_ranks(scn.world_size, fold, ctx.outcomes, rep_report, groups)
    report = WorldReport(time=rep_report.time, events=events, ranks=tuple(reports))
    view = _ExpandedWorld(report, _ExpandedMemory(world.memory, fold, topo))
    result = judge(scn, topo, view, plan, outcomes, None, time.perf_counter() - t0)
    log.info("folded run: %d of %d ranks simulated in %.2f s, expanded to %d events", fold.active,
             scn.world_size, wall_run, events)
    return result, world, plan


__all__ = ["Fold", "FoldBroken", "FoldedRendezvous", "MAX_ACTIVE", "expand_events", "plan_fold", "run_folded"]
