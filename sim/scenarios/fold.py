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
holds. :func:`sim.scenarios.fold_run.run_folded` then runs a world of all ``N`` ranks (topology,
groups, flow pruning and collective costs see every rank) in which only the
active ranks run; a collective completes when its active members have
arrived. Each inactive rank's result is its representative's, with group
names in ``last_op`` renamed to its own. The event count is expanded exactly:
every event is a step of a rank or a flow of a rank (unit-local), counted
once per rank its owner stands for, or the completion of a collective on one
group, counted once per group of the full job through its representative
group.

[Note: a fold with a crashed rank and the lifecycle]
One rank's crash (the only fault a fold takes) makes the ranks differ by their relation to it: the
crashed rank itself, the ranks that share one of its groups (their collectives on it fail when its
connections close), the rest. The crashed rank's unit is simulated as itself (a *single* unit,
standing for nobody else), and for every family every rank must share the crashed rank's group
exactly when its representative does; then the others follow their representatives as before.

The lifecycle's agreements move real values (an ``all_reduce(MIN)`` on its control group of
codes, votes and rank ids). A folded :class:`sim.scenarios.fold_run.FoldedRendezvous` reduces only the active ranks'
values; that is the whole job's reduction when (1) every rank's value is its representative's,
except for rank ids, and (2) for a lane carrying a rank id (its rank, or minus it: the
lifecycle's check that ranks 0 to N-1 all arrived) the lowest and the highest rank of every
class of ranks that follow one timeline are simulated: the MIN of a rank id over a class is at
one of its ends. So a fold of a lifecycle scenario also simulates, as single units, the last unit
of every class of the period (``Fold.ends``). A lane per group (a walk's vote for each group, the
plan's action for it) is the MIN over the group's members, which the active members give only
if the members' representatives are members of the same group: every group the lifecycle
manages must be its own representative group (groups spanning the nodes, or the units, do; a
tensor-parallel group of one node of the tail does not). A sum (the canary) counts each active
member once per member of the group it stands for. Other collectives with real bytes, and folds
that do not keep these conditions, stop the folded run (:class:`FoldBroken`): the caller
simulates every rank.

Anything the checks did not foresee (a collective moving real bytes, a rank
that did not finish, a deadlock) makes :func:`sim.scenarios.scale.run_auto` fall back to the full
simulation. ``tests/sim/scenarios/test_fold.py`` compares folded and full runs bit for
bit at 256 to 2,048 ranks and against the golden results of the simulator as
it was before folding existed; ``tests/sim/scenarios/test_fold_crash.py`` compares
them, rank by rank, with the lifecycle and a crashed rank.

[Note: checks over arrays]
The checks below ask, for every rank of the job, where it sits and which groups it is in. At
131,072 ranks a Python loop over ranks and families costs seconds, so they are numpy operations
over arrays indexed by rank (the representative of every rank, the number of its group in a family,
:meth:`sim.scenarios.mesh_groups.MeshGroups.group_index_of_all`), and the machine's part uses that
every node of a topology is built from the same ``node`` section: two units in the same places of
their nodes, with representatives in the same places of theirs, are checked once.
"""
from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.kernel.errors import SimError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from sim.machine.topology import Topology
    from sim.scenarios.mesh_groups import MeshGroups
    from sim.scenarios.scenario import Scenario

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
    for every later unit. ``singles`` are later units that run and stand only for
    themselves (a crashed rank's unit; with ``ends``, the last unit of every class,
    see [Note: a fold with a crashed rank and the lifecycle]). So ``rep(r) = r``
    for the ``active`` ranks, and for another rank the rank at the same place of
    the tail period.
    """

    world_size: int
    gpus_per_node: int
    nodes: int  # tail period in units (k)
    head: int = 0  # leading units simulated as themselves
    ranks_per_unit: int | None = None  # None: a unit is a node
    singles: tuple[int, ...] = ()  # later units simulated as themselves, ascending
    ends: bool = False  # the singles include the last unit of every class of the period

    @functools.cached_property
    def unit(self) -> int:
        """Ranks per unit (``gpus_per_node`` unless the fold cuts nodes into parts)."""
        return self.ranks_per_unit or self.gpus_per_node

    @functools.cached_property
    def units(self) -> int:
        """Units in the job."""
        return self.world_size // self.unit

    @functools.cached_property
    def _single_set(self) -> frozenset[int]:
        return frozenset(self.singles)

    @functools.cached_property
    def active(self) -> int:
        """Ranks that really run."""
        return (self.head + self.nodes + len(self.singles)) * self.unit

    @functools.cached_property
    def active_ranks(self) -> tuple[int, ...]:
        """The ranks that really run, ascending."""
        units = list(range(self.head + self.nodes)) + list(self.singles)
        return tuple(u * self.unit + i for u in units for i in range(self.unit))

    def is_active(self, rank: int) -> bool:
        """True if ``rank`` really runs."""
        u = rank // self.unit
        return u < self.head + self.nodes or u in self._single_set

    def stands_alone(self, rank: int) -> bool:
        """True if ``rank`` runs and stands for no other rank (a head or single unit)."""
        u = rank // self.unit
        return u < self.head or u in self._single_set

    def rep(self, rank: int) -> int:
        """The active rank whose timeline ``rank`` follows."""
        if self.is_active(rank):
            return rank
        h = self.head * self.unit
        return h + (rank - h) % (self.nodes * self.unit)

    def rep_node(self, node: int) -> int:
        """The simulated node whose timeline ``node`` follows (units of whole nodes only)."""
        if self.unit != self.gpus_per_node:
            raise ValueError(f"a fold in units of {self.unit} ranks maps ranks, not nodes; use rep()")
        if node < self.head + self.nodes or node in self._single_set:
            return node
        return self.head + (node - self.head) % self.nodes

    def multiplicity(self, rank: int) -> int:
        """How many ranks of the job active ``rank`` stands for (itself included)."""
        u = rank // self.unit
        if u < self.head or u in self._single_set:
            return 1
        place = (u - self.head) % self.nodes
        taken = sum(1 for s in self.singles if (s - self.head) % self.nodes == place)
        return (self.units - self.head) // self.nodes - taken

    def rep_of_all(self) -> "np.ndarray":
        """:meth:`rep` of every rank of the job (an int64 array indexed by rank; made once, read-only)."""
        return self._reps

    @functools.cached_property
    def _reps(self) -> "np.ndarray":
        import numpy as np

        ranks = np.arange(self.world_size, dtype=np.int64)
        units = ranks // self.unit
        h = self.head * self.unit
        later = (units >= self.head + self.nodes) & ~np.isin(units, np.asarray(self.singles, dtype=np.int64))
        reps = np.where(later, h + (ranks - h) % (self.nodes * self.unit), ranks)
        reps.setflags(write=False)
        return reps

    def alone_of_all(self) -> "np.ndarray":
        """:meth:`stands_alone` of every rank (a bool array indexed by rank)."""
        import numpy as np

        units = np.arange(self.world_size, dtype=np.int64) // self.unit
        return (units < self.head) | np.isin(units, np.asarray(self.singles, dtype=np.int64))


def with_singles(fold: Fold, crashed: int | None, ends: bool) -> Fold | None:
    """``fold`` with the crashed rank's unit and (``ends``) the last unit of every class simulated as themselves;
    None when the crashed rank is in the period (it would stand for others)."""
    singles: set[int] = set()
    first_tail = fold.head + fold.nodes
    if crashed is not None:
        u = crashed // fold.unit
        if fold.head <= u < first_tail:
            return None
        if u >= first_tail:
            singles.add(u)
    if ends:
        for place in range(fold.nodes):
            last = fold.units - 1 - ((fold.units - 1 - fold.head - place) % fold.nodes)
            while last >= first_tail and last in singles:
                last -= fold.nodes
            if last >= first_tail:
                singles.add(last)
    return Fold(fold.world_size, fold.gpus_per_node, fold.nodes, fold.head, fold.ranks_per_unit,
                tuple(sorted(singles)), ends)


# --------------------------------------------------------------------------- can this scenario fold?


def _rename_node(name: str, node: int) -> str | None:
    """``name`` with every node reference (``n<j>/``) made ``node``; None if it names no node."""
    if _NODE_ANY.search(name) is None:
        return None
    return _NODE_ANY.sub(f"n{node}/", name)


def _units_apart(scn: "Scenario", topo: "Topology", unit: int) -> str | None:
    """None when no two units of ``unit`` consecutive ranks share a resource of a copy path or a NUMA
    node (so their flows never compete and their host memory is their own); else why not.

    Copy paths stay inside a node and every node is built alike (see [Note: checks over arrays]), so
    the ranks of the first node (or of the job, if smaller) are the ones to check."""
    from refimpl.runtime.base import CopyKind

    kinds = list(CopyKind)
    owner: dict[str, int] = {}
    for r in range(min(scn.world_size, topo.gpus_per_node)):
        u = r // unit
        for res in (*(x for k in kinds for x in topo.copy_path(r, k)), "numa " + topo.numa_of(r)):
            v = owner.setdefault(res, u)
            if v != u:
                return f"ranks {v * unit}-{v * unit + unit - 1} and rank {r} share {res!r}"
    return None


def _examples(fold: Fold, gpus_per_node: int) -> list[int]:
    """One unit of the tail for each way a unit can sit against its representative unit: its place in its node,
    the representative's place in its node, same node or not (see [Note: checks over arrays])."""
    per_node = max(1, gpus_per_node // fold.unit)
    seen: dict[tuple[int, int, bool], int] = {}
    first_tail = fold.head + fold.nodes
    k = fold.nodes
    # a unit's kind repeats every k * per_node units of the tail, and a unit shares a node with its representative
    # only within per_node units of the period: two periods of kinds and a node more see every kind (singles apart)
    for u in range(first_tail, min(fold.units, first_tail + 2 * k * per_node + per_node)):
        if u in fold._single_set:
            continue
        rep_u = fold.head + (u - fold.head) % k
        seen.setdefault((u % per_node, rep_u % per_node, u // per_node == rep_u // per_node), u)
    return sorted(seen.values())


def _topology_symmetric(scn: "Scenario", topo: "Topology", fold: Fold) -> str | None:
    """None when every rank sits where its representative does; else why not.

    Units share nothing (:func:`_units_apart`, checked by the caller), and one
    renaming of resources and NUMA nodes, one to one within each unit, takes
    every rank's copy paths (position by position) and NUMA node to its
    representative's, with the same capacities, HBM size and host memory. For
    units of whole nodes that renaming is the node's name (``n7/`` to ``n1/``).
    Checked on one unit of each kind (:func:`_examples`).
    """
    from refimpl.runtime.base import CopyKind

    kinds = list(CopyKind)
    onto: dict[str, str] = {}  # a later unit's resource -> its representative unit's
    taken: dict[tuple[int, str], str] = {}  # (later unit, representative's resource) -> the unit's resource
    for u in _examples(fold, topo.gpus_per_node):
        for r in range(u * fold.unit, (u + 1) * fold.unit):
            rep = fold.rep(r)
            if topo.hbm_bytes(r) != topo.hbm_bytes(rep):
                return f"rank {r} has another HBM size than rank {rep}"
            numa, rnuma = topo.numa_of(r), topo.numa_of(rep)
            if (topo.host_capacity(numa) != topo.host_capacity(rnuma)
                    or topo.pinnable_bytes(numa) != topo.pinnable_bytes(rnuma)):
                return f"NUMA node {numa!r} has other capacities than {rnuma!r}"
            pairs = [("numa " + numa, "numa " + rnuma)]
            for kind in kinds:
                path, rpath = topo.copy_path(r, kind), topo.copy_path(rep, kind)
                if len(path) != len(rpath):
                    return f"rank {r}'s {kind.name} path {path} is not like rank {rep}'s {rpath}"
                pairs += zip(path, rpath)
            for a, b in pairs:
                if onto.setdefault(a, b) != b or taken.setdefault((u, b), a) != a:
                    return f"rank {r}'s {a!r} is not in the place of rank {rep}'s {b!r} (its unit is laid out otherwise)"
                if not a.startswith("numa ") and topo.capacity(a) != topo.capacity(b):
                    return f"resource {a!r} has another capacity than {b!r}"
    return None


@dataclass
class _FoldArrays:
    """What the group checks of one fold read, per rank: the representative, whether it runs, whether it stands alone,
    and its place among the active ranks (-1 for the others)."""

    rep: Any
    active: Any
    alone: Any
    place: Any
    nactive: int


def _sort_order_varies(groups: "MeshGroups") -> bool:
    """True if some rank's families could sort in another order by group name than another rank's: only when a
    family's name followed by a digit begins another's (``tp`` and ``tp2x``), the group numbers then decide."""
    fams = groups.families
    return any(b != a and b.startswith(a) and b[len(a)].isdigit() and groups.count(a) > 1 for a in fams for b in fams)


def _family_symmetric(groups: "MeshGroups", fam: str, index: Any, arrays: _FoldArrays, bus: Any,
                      gpus_per_node: int) -> tuple[str | None, Any]:
    """Check one family (see the module docstring); returns (why not or None, each group's representative group)."""
    import numpy as np

    n, count, size = groups.world_size, groups.count(fam), groups.size(fam)
    onto = index[arrays.rep]  # the group of each rank's representative
    image = np.empty(count, dtype=np.int64)
    image[index] = onto
    bad = np.flatnonzero(image[index] != onto)
    if bad.size:
        r = int(bad[0])
        return f"group {groups.name(fam, int(index[r]))!r} of rank {r} does not fold onto one group", image
    if size == 1:
        nreps = np.ones(count, dtype=np.int64)
    elif count * arrays.nactive <= 4 * n:  # distinct (group, representative) pairs, counted in a table
        seen = np.bincount(index * arrays.nactive + arrays.place[arrays.rep], minlength=count * arrays.nactive)
        nreps = (seen.reshape(count, arrays.nactive) > 0).sum(axis=1)
    else:
        nreps = np.bincount(np.unique(index * n + arrays.rep) // n, minlength=count)
    nact = np.bincount(index[arrays.active], minlength=count)
    bad = np.flatnonzero(nreps != nact[image])
    if bad.size:
        g = int(bad[0])
        other = groups.name(fam, int(image[g]))
        return f"group {groups.name(fam, g)!r} does not fold onto group {other!r}", image
    first = groups.first_members(fam)
    shared = np.flatnonzero((nreps < size) & ~arrays.alone[first])
    if shared.size:
        # [Note: first come, first served] The first member to use a lazily created communicator pays its
        # initialisation; members that share a representative must therefore follow a rank that stands alone
        return f"group {groups.name(fam, int(shared[0]))!r} has members that share a representative and no head rank", image
    moved = np.flatnonzero(image != np.arange(count))
    if moved.size:  # a group folded onto another: the same collective cost (translates by whole nodes cost alike)
        keys = {}
        for g in np.unique(np.stack([first[moved] % gpus_per_node, first[image[moved]] % gpus_per_node]), axis=1).T:
            for key in g:
                if int(key) not in keys:
                    example = int(np.flatnonzero(first % gpus_per_node == key)[0])
                    keys[int(key)] = bus(groups.members(fam, example))
            if keys[int(g[0])] != keys[int(g[1])]:
                return f"groups of {fam!r} fold onto groups with another collective cost", image
    return None, image


def _groups_symmetric(scn: "Scenario", topo: "Topology", groups: "MeshGroups", fold: Fold,
                      indices: dict[str, Any], crashed: int | None, managed: frozenset[str]) -> str | None:
    """None when every rank's groups look like its representative's (see the module docstring and [Note: a fold with
    a crashed rank and the lifecycle]); ``indices``: each family's :meth:`MeshGroups.group_index_of_all` (a cache),
    ``managed``: the families the lifecycle manages."""
    import numpy as np

    from sim.machine.collectives import TopologyCollectiveCost

    rep = fold.rep_of_all()
    active = rep == np.arange(scn.world_size)
    place = np.full(scn.world_size, -1, dtype=np.int64)
    place[active] = np.arange(int(active.sum()), dtype=np.int64)
    arrays = _FoldArrays(rep, active, fold.alone_of_all(), place, int(active.sum()))
    cost = TopologyCollectiveCost(topo)
    for fam in groups.families:
        index = indices.get(fam)
        if index is None:
            index = indices[fam] = groups.group_index_of_all(fam)
        if crashed is not None:  # a rank shares the crashed rank's group exactly when its representative does
            near = index == index[crashed]
            bad = np.flatnonzero(near[rep] != near)
            if bad.size:
                r = int(bad[0])
                return f"rank {r} and its representative {int(rep[r])} are not alike to the crashed rank {crashed} in {fam!r}"
        why, image = _family_symmetric(groups, fam, index, arrays, cost.bus, topo.gpus_per_node)
        if why is not None:
            return why
        if fam in managed and (image != np.arange(groups.count(fam))).any():
            g = int(np.flatnonzero(image != np.arange(groups.count(fam)))[0])
            return (f"the lifecycle's group {groups.name(fam, g)!r} folds onto {groups.name(fam, int(image[g]))!r}: "
                    "its agreements' votes would be lost")
    if _sort_order_varies(groups):
        fams = groups.families
        for r in range(scn.world_size):
            mine, theirs = groups.groups_of(r), groups.groups_of(int(rep[r]))
            if sorted(fams, key=mine.get) != sorted(fams, key=theirs.get):
                return f"rank {r}'s groups sort in another order than rank {int(rep[r])}'s"
    return None


def crashed_rank(scn: "Scenario") -> tuple[int | None, str | None]:
    """``(rank, None)`` for a fault plan of one crash of one rank, ``(None, None)`` for no fault plan, else
    ``(None, why the plan cannot fold)``."""
    from sim.machine.faults import FaultType

    faults = scn.faults.faults
    if not faults:
        return None, None
    if len(faults) == 1 and faults[0].kind is FaultType.CRASH and faults[0].ranks is not None \
            and len(faults[0].ranks) == 1:
        return faults[0].ranks[0], None
    return None, "a fault plan other than one crash of one rank breaks the symmetry between ranks"


def _candidates(scn: "Scenario", crashed: int | None, ends: bool) -> list[Fold]:
    """Every fold :func:`plan_fold` may try, fewest active ranks first (whole nodes first among as many)."""
    g = scn.topo.gpus_per_node
    candidates = []
    for unit in (u for u in range(1, g + 1) if g % u == 0):  # see [Note: units smaller than a node]
        units = scn.world_size // unit
        k = 1
        while k < units and k * unit <= MAX_ACTIVE:
            for head in (0, k):  # no head, or one period of units simulated as themselves before the tail
                if head + k < units and (units - head) % k == 0:
                    fold = with_singles(Fold(scn.world_size, g, k, head, None if unit == g else unit), crashed, ends)
                    if fold is not None and fold.active < scn.world_size:
                        candidates.append(fold)
            k *= 2
    candidates.sort(key=lambda f: (f.active, f.unit != g))
    return candidates


def plan_fold(scn: "Scenario", groups: "MeshGroups | None" = None) -> tuple[Fold | None, str]:
    """The fold for ``scn`` (None if it cannot fold) and a one-line reason."""
    from sim.scenarios.runner import mesh_groups

    topo = scn.topo
    if topo is None:
        return None, "the scenario has no built topology"
    g = topo.gpus_per_node
    if scn.payload != "meta":
        return None, "real payloads: every rank holds different bytes"
    crashed, why = crashed_rank(scn)
    if why is not None:
        return None, why
    if scn.offload.backend not in ("local", "tms"):
        return None, f"offload backend {scn.offload.backend!r} gives each rank of a group its own slice"
    if scn.world_size % g or scn.world_size // g < 2:
        return None, f"{scn.world_size} ranks are not two or more whole nodes of {g} GPUs"
    groups = groups or mesh_groups(scn)
    # the families the lifecycle manages (runner.lifecycle_specs): their groups must be their own representatives
    managed = frozenset(f for f in groups.families
                        if scn.pg_policy != "none" and groups.size(f) >= scn.lifecycle.min_ranks)
    why = "no candidate"
    apart: dict[int, str | None] = {}
    indices: dict[str, Any] = {}
    for fold in _candidates(scn, crashed, ends=scn.pg_policy != "none"):
        why = _groups_symmetric(scn, topo, groups, fold, indices, crashed, managed)  # most candidates fail here
        if why is None:
            if fold.unit not in apart:
                apart[fold.unit] = _units_apart(scn, topo, fold.unit)
            why = apart[fold.unit] or _topology_symmetric(scn, topo, fold)
        if why is None:
            what = "node(s)" if fold.unit == g else f"unit(s) of {fold.unit} ranks"
            more = f", {len(fold.singles)} simulated as themselves" if fold.singles else ""
            return fold, (f"{scn.world_size} ranks follow the timelines of {fold.active} simulated ranks "
                          f"({fold.head} head {what}, then a period of {fold.nodes} {what}{more})")
        log.debug("fold %s rejected: %s", fold, why)
    return None, f"no symmetric fold: {why}"


__all__ = ["Fold", "FoldBroken", "MAX_ACTIVE", "crashed_rank", "plan_fold", "with_singles"]
