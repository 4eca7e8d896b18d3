"""The folded run: simulate a fold's active ranks and expand the result to every rank of the job.

:func:`run_folded` builds a world of all ``N`` ranks (topology, groups, flow pruning and collective
costs see every rank) in which only the fold's active ranks have a runtime and run; a collective
completes when its active members arrived (:class:`FoldedRendezvous`). Each other rank's result is
its representative's, with its own rank and group names in its last operation and error. The event
count is expanded exactly: every event is a step of a rank, a flow of a rank's copy, a rank's
collective failing or timing out (counted once per rank its owner stands for), or the completion of
a collective on one group (counted once per group of the full job that folds onto it). The planning
half and the notes are in :mod:`sim.scenarios.fold`.
"""
from __future__ import annotations

import gc
import logging
import time
from typing import TYPE_CHECKING, Any

from refimpl.runtime.base import ReduceOp
from sim.kernel.errors import CollectiveMismatchError, DeadlockError
from sim.rendezvous import CREATE_SEQ, Arrival, Pending, Rendezvous, describe
from sim.scenarios.fold import _NODE, Fold, FoldBroken, _rename_node
from sim.scenarios.result import RankOutcome, ScenarioResult, judge, rank_entry
from sim.world import RankReport, WorldReport

if TYPE_CHECKING:  # pragma: no cover
    from sim.machine.faults import FaultPlan
    from sim.machine.topology import Topology
    from sim.scenarios.mesh_groups import MeshGroups
    from sim.scenarios.scenario import Scenario
    from sim.world import SimWorld

log = logging.getLogger(__name__)


class _FoldedPending(Pending):
    """A pending collective of a folded run: who is missing is said for the whole job."""

    __slots__ = ("rdv",)

    def missing(self) -> list[int]:
        """Members of the job whose representative has not arrived (the group must be its own representative)."""
        spec, rep = self.spec, self.rdv.fold.rep
        out = []
        for m in spec.ranks:
            r = rep(m)
            if not spec.has_member(r):
                raise FoldBroken(f"{self.describe()} waits for ranks of another group (folded onto it)")
            if self.arrivals[spec.group_rank(r)] is None:
                out.append(m)
        return out


class FoldedRendezvous(Rendezvous):
    """Completes a collective when its *active* members arrived; reduces values as the whole job would.

    See [Note: a fold with a crashed rank and the lifecycle] in :mod:`sim.scenarios.fold`.
    """

    def __init__(self, world: "SimWorld", fold: Fold):
        super().__init__(world)
        self.fold = fold
        self._expected: dict[tuple[str, int], int] = {}
        self._reps: Any = None  # fold.rep_of_all(), made on first use
        self._alike: dict[int, tuple[tuple[int, ...], dict[int, int] | None]] = {}  # id(ranks) -> (ranks, weights)

    def expected(self, spec) -> int:
        """Active members of ``spec``."""
        key = (spec.name, spec.generation)
        n = self._expected.get(key)
        if n is None:
            n = self._expected[key] = sum(1 for a in self.fold.active_ranks if spec.has_member(a))
        return n

    def _broken(self, why: str) -> FoldBroken:
        """Stop the engine with :class:`FoldBroken` (protocol code catching it cannot hide it) and return it."""
        exc = FoldBroken(why)
        self._world.engine.stop(exc)
        return exc

    def _weights(self, spec) -> dict[int, int] | None:
        """How many members of ``spec`` each active member stands for; None when some member's representative is
        outside the group (its members' values reach this group's collective through another one)."""
        hit = self._alike.get(id(spec.ranks))
        if hit is None or hit[0] is not spec.ranks:
            import numpy as np

            if self._reps is None:
                self._reps = self.fold.rep_of_all()
            members = np.asarray(spec.ranks, dtype=np.int64)
            reps = self._reps[members]
            weights = None
            if np.isin(reps, members).all():
                who, count = np.unique(reps, return_counts=True)
                weights = dict(zip(who.tolist(), count.tolist()))
            hit = self._alike[id(spec.ranks)] = (spec.ranks, weights)
        return hit[1]

    def _check_values(self, spec, op: str, signature: Any, what: str) -> None:
        """A collective with real values: an all-reduce the fold can reduce exactly, or :class:`FoldBroken`."""
        if op != "all_reduce" or signature[3] not in (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.SUM):
            raise self._broken(f"{what} moves real bytes; their values may differ by rank")
        if not self.fold.ends:
            raise self._broken(f"{what} moves real bytes (rank ids), which a fold that does not simulate the last "
                               "rank of every class cannot reduce")
        if self._weights(spec) is None:
            raise self._broken(f"{what} moves real bytes on a group whose members follow ranks of other groups")

    def arrive(self, spec, group_rank, seq, op, signature, detail, payload, nbytes, corrupt=False) -> Arrival:
        """As :meth:`Rendezvous.arrive`, but the last *active* member completes the collective."""
        from sim.kernel.engine import SimFuture

        key = (spec.name, spec.generation, seq)
        p = self._pending.get(key)
        rank = spec.ranks[group_rank]
        what = describe(op, spec, seq)
        fut = SimFuture(what)
        arrival = Arrival(rank, detail, payload, fut, corrupt)
        if arrival.snapshot is not None:
            self._check_values(spec, op, signature, what)
        if corrupt:
            raise self._broken(f"{what} is corrupted on one rank")
        if p is None:
            p = self._pending[key] = _FoldedPending(spec, seq, op, signature, nbytes)
            p.rdv = self
        elif p.signature != signature or p.op != op:
            raise self._broken(f"collective mismatch at {what}")
        fut.blocker = p
        if p.arrivals[group_rank] is not None:
            raise AssertionError(f"rank {rank} arrived twice at {p.describe()}")
        p.arrivals[group_rank] = arrival
        p.count += 1
        if p.count == self.expected(spec):
            del self._pending[key]
            self._schedule_complete(p)
        elif self._lost and seq != CREATE_SEQ:
            self._fail_if_lost(p, arrival)
        return arrival

    def _complete(self, p: Pending) -> None:
        """As :meth:`Rendezvous._complete`; a sum counts each active member once per member it stands for."""
        if p.seq != CREATE_SEQ and p.op == "all_reduce" and p.signature[3] is ReduceOp.SUM:
            arrivals = [a for a in p.arrivals if a is not None]
            if arrivals and all(a.snapshot is not None for a in arrivals):
                weights = self._weights(p.spec)
                for a in arrivals:
                    a.snapshot = a.snapshot * weights[a.rank]
        super()._complete(p)


class _ExpandedMemory:
    """The simulated memory as :func:`sim.scenarios.result.judge` sees it: every rank reads its representative's ledger."""

    def __init__(self, memory: Any, fold: Fold, topo: "Topology"):
        self._m, self._fold = memory, fold
        self._peaks: dict[tuple[int, float, float], int] = {}
        # a rank's NUMA node reads its representative's (plan_fold checked that the renaming is one to one);
        # one no rank is attached to stays untouched by any run, so any untouched one will do: with whole
        # nodes its namesake on the representative node, else itself
        of_rep = {}
        g = topo.gpus_per_node
        attached: dict[str, int] = {}  # each local NUMA node -> the first GPU of a node on it
        for i in range(g):
            attached.setdefault(topo.numa_of(i).split("/", 1)[1], i)
        for r in (k * g + i for k in range(fold.world_size // g) for i in attached.values()):
            if not fold.is_active(r):  # a unit's GPUs on one NUMA node follow GPUs on one (plan_fold checked)
                of_rep[topo.numa_of(r)] = topo.numa_of(fold.rep(r))
        self.numa = {}
        for name in topo.host_memory_nodes():
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


class _EventOwners:
    """Counts the events a folded run executes by owner: a rank (its process steps, its copies' flow events, its
    collective failing when a peer is gone or timing out), a group (a collective's completion) or nobody in
    particular."""

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
        # a collective across nodes that shares the NICs: its start and end events are its group's
        net_begin, net_finish = TopologyCollectiveCost._begin, TopologyCollectiveCost._finish
        by_rank, by_group = self.by_rank, self.by_group

        def counted_pop():
            ev = pop()
            if ev is not None:
                cb = ev.callback
                fn = getattr(cb, "__func__", None)
                self.current = None
                if fn is proc_step:
                    rank = self.current = int(cb.__self__.name[4:])  # processes are named "rank<r>" (SimWorld.run)
                    by_rank[rank] = by_rank.get(rank, 0) + 1
                elif fn is begin:
                    by_rank[ev.args[1]] = by_rank.get(ev.args[1], 0) + 1
                elif fn is complete:
                    rank = ev.args[0].key[0]
                    by_rank[rank] = by_rank.get(rank, 0) + 1
                elif fn is net_begin or fn is net_finish:
                    name = ev.args[0] if fn is net_begin else ev.args[0].key[0]
                    by_group[name] = by_group.get(name, 0) + 1
                elif isinstance(getattr(cb, "__self__", None), Rendezvous):
                    what = fn.__name__
                    if what == "_peer_gone":  # (pending, arrival, lost rank): the arrival's rank's
                        by_rank[ev.args[1].rank] = by_rank.get(ev.args[1].rank, 0) + 1
                    elif what == "_time_out":  # (arrival, timeout_s, rank)
                        by_rank[ev.args[2]] = by_rank.get(ev.args[2], 0) + 1
                    else:  # a collective's completion
                        name = ev.args[0].spec.name
                        by_group[name] = by_group.get(name, 0) + 1
                else:
                    self.other += 1
            return ev

        engine._pop = counted_pop  # instance attribute: Engine.run looks it up on the instance


def _folded_onto(fold: Fold, groups: "MeshGroups", family: str) -> Any:
    """For each group of ``family``, how many groups of the full job fold onto it (an int64 array)."""
    import numpy as np

    index = groups.group_index_of_all(family)
    image = index[fold.rep_of_all()[groups.first_members(family)]]
    return np.bincount(image, minlength=groups.count(family))


def expand_events(fold: Fold, owners: _EventOwners, groups: "MeshGroups") -> int:
    """The event count of the full run (see [Note: when two ranks follow the same timeline]).

    Each active rank's events count once per rank it stands for; each group of the full job counts its
    representative group's completions; a group that is not one of the mesh's (the world's, the lifecycle's
    control group) is one group in the full job too.
    """
    total = owners.other + sum(n * fold.multiplicity(rank) for rank, n in owners.by_rank.items())
    onto: dict[str, Any] = {}
    for name, n in owners.by_group.items():
        try:
            family, index = groups.parse(name)
        except KeyError:
            total += n
            continue
        if family not in onto:
            onto[family] = _folded_onto(fold, groups, family)
        total += n * int(onto[family][index])
    return total


class _Renamer:
    """A representative's last operation and error made another rank's: its own rank before a colon (``rank 12:``,
    how messages name the rank they happen on) and its own group names (``group 'tp1'``)."""

    def __init__(self, groups: "MeshGroups"):
        self.groups = groups
        self._named: dict[tuple[int, str], list[tuple[str, str]]] = {}

    def _families_in(self, rep: int, text: str) -> list[tuple[str, str]]:
        hit = self._named.get((rep, text))
        if hit is None:
            hit = self._named[(rep, text)] = [(fam, name) for fam, name in self.groups.groups_of(rep).items()
                                              if f"group {name!r}" in text]
        return hit

    def __call__(self, text: str | None, rep: int, rank: int) -> str | None:
        if not text:
            return text
        for fam, name in self._families_in(rep, text):
            own = self.groups.name(fam, self.groups.group_index(fam, rank))
            if own != name:
                text = text.replace(f"group {name!r}", f"group {own!r}")
        return text.replace(f"rank {rep}:", f"rank {rank}:")


def _expand_entries(fold: Fold, simulated: dict[int, RankOutcome], rep_report: dict[int, RankReport],
                    memory: "_ExpandedMemory", groups: "MeshGroups") -> list[dict[str, Any]]:
    """Every rank's part of the result (:func:`sim.scenarios.result.rank_entry`): a representative's own, and for
    another rank a copy of its representative's with its own rank and its own rank and group names in its last
    operation and error (the phase times and memory figures are the representative's objects, not copies)."""
    own = {rank: rank_entry(o, rep_report[rank], memory) for rank, o in simulated.items()}
    rename = _Renamer(groups)
    entries: list[dict[str, Any]] = []
    for r, rep in enumerate(fold.rep_of_all().tolist()):
        e = own[rep]
        if r != rep:
            e = dict(e)
            e["rank"] = r
            e["error"] = rename(e["error"], rep, r)
            e["last_op"] = rename(e["last_op"], rep, r)
        entries.append(e)
    return entries


def _first_use_checked(world: "SimWorld", fold: Fold, owners: _EventOwners) -> None:
    """See [Note: first come, first served]: in a group whose members share representatives the first user must be
    a rank standing for itself, or the ranks it stands for would all seem to pay the lazy init."""
    first_use = getattr(world.comm, "first_use", None)
    if first_use is None:
        return
    shared: dict[int, bool] = {}

    def checked_first_use(spec):
        """The comm costs' first use, checked against the fold."""
        delay = first_use(spec)
        if delay > 0:
            key = id(spec.ranks)
            if key not in shared:
                import numpy as np

                reps = fold.rep_of_all()[np.asarray(spec.ranks, dtype=np.int64)]
                shared[key] = len(np.unique(reps)) < spec.size
            user = owners.current
            if shared[key] and (user is None or not fold.stands_alone(user)):
                raise FoldBroken(f"the first user of group {spec.name!r} (rank {user}) stands for other ranks")
        return delay

    world.comm.first_use = checked_first_use


def _outcomes(fold: Fold, world: "SimWorld", ctx: Any, results: list[Any], plan: "FaultPlan | None") -> dict[int, RankOutcome]:
    """The active ranks' outcomes; without a fault plan every one must have finished (else :class:`FoldBroken`)."""
    out: dict[int, RankOutcome] = {}
    for rt, r in zip(world.runtimes, results):
        o = ctx.outcomes.get(rt.rank) or RankOutcome(rank=rt.rank)
        if plan is None and (isinstance(r, BaseException) or not o.finished):
            raise FoldBroken(f"rank {rt.rank} did not finish in the folded run ({r!r})")
        if isinstance(r, BaseException):
            o.error = f"{type(r).__name__}: {r}"
        out[rt.rank] = o
    return out


def run_folded(scn: "Scenario", fold: Fold, *, record_memory: bool = True,
               on_world: Any = None) -> tuple[ScenarioResult, "SimWorld", "FaultPlan | None"]:
    """Run ``scn`` with only the fold's active ranks and expand the result to every rank.

    ``on_world(world)``, if given, is called once the world is built.

    Raises :class:`FoldBroken` if the run met anything the symmetry checks do
    not cover (the caller then runs the full job).
    """
    from sim.presets.models import build_state
    from sim.scenarios.runner import RankContext, build_world, mesh_groups, rank_main

    t0 = time.perf_counter()
    topo = scn.topo
    world, plan = build_world(scn, topo, record_memory=record_memory, ranks=fold.active_ranks)
    if plan is None and scn.pg_policy == "none":
        # no watchdog in a folded run of symmetric ranks without agreements: no collective can wait out a timeout,
        # and a real hang stops as a deadlock (FoldBroken: the caller runs the full job, with the watchdog)
        world.group_timeouts = False
    if on_world is not None:
        on_world(world)
    world.rendezvous = FoldedRendezvous(world, fold)
    world.votes.represent(fold.rep_of_all())
    groups = mesh_groups(scn)
    owners = _EventOwners(world)
    _first_use_checked(world, fold, owners)
    ctx = RankContext(scn, topo, groups, build_state(scn.model))
    if scn.pg_policy != "none":  # as run_scenario
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
    simulated = _outcomes(fold, world, ctx, results, plan)
    wall_run = time.perf_counter() - t0
    rep_report = world.report()
    events = expand_events(fold, owners, groups)
    memory = _ExpandedMemory(world.memory, fold, topo)
    entries = _expand_entries(fold, simulated, {rr.rank: rr for rr in rep_report.ranks}, memory, groups)
    view = _ExpandedWorld(WorldReport(time=rep_report.time, events=events, ranks=()), memory)
    result = judge(scn, topo, view, plan, None, None, time.perf_counter() - t0, entries=entries)
    log.info("folded run: %d of %d ranks simulated in %.2f s, expanded to %d events", fold.active,
             scn.world_size, wall_run, events)
    return result, world, plan


__all__ = ["FoldedRendezvous", "expand_events", "run_folded"]
