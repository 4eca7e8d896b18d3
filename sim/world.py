"""``SimWorld``: the engine, the machine and the simulated ranks of one job.

    world = SimWorld(8, payload="real")
    results = world.run(lambda rt: my_protocol(rt))   # one process per rank
    world.report()                                    # per-rank last op, spans, memory peaks

``world.run(fn)`` starts ``fn(rt)`` (a coroutine) on every rank, runs the
engine until no event is left, and then:

* raises :class:`sim.CollectiveMismatchError` if members issued different
  collectives at the same sequence number (the engine stops at once);
* raises :class:`sim.DeadlockError` if a rank is still blocked waiting for
  another (see :mod:`sim.deadlock`);
* raises :class:`sim.RankFailedError` for the first rank, in simulated time,
  that raised, crashed or hung (unless ``return_exceptions=True``, which
  puts the exception, :class:`sim.RankCrashedError` or
  :class:`sim.RankHungError` in that rank's result slot);
* otherwise returns the ranks' return values in rank order.

The world keeps its state between runs (groups, memory, clock), so a test can
set up in one ``run`` and act in the next. A crashed rank stays crashed.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Sequence

from refimpl.runtime.base import WORLD, GroupSpec
from sim.deadlock import find_deadlock
from sim.groups import GroupBook
from sim.kernel.engine import Chooser, Engine, ProcessState, RandomChooser
from sim.kernel.errors import RankCrashedError, RankFailedError, RankHungError, SimUsageError
from sim.machine.protocols import (
    CollectiveCost, CommCosts, FaultHooks, FixedBandwidthTransport, LedgerMemory, Memory, NcclCommCosts,
    NoFaults, RingCollectiveCost, Transport,
)
from sim.rendezvous import Rendezvous
from sim.runtime import SimRuntime
from sim.votes import VoteBox

log = logging.getLogger(__name__)

PAYLOADS = ("real", "meta")


@dataclass(frozen=True)
class RankReport:
    """What one rank did in the last run: status, last operation, phases and memory peaks."""

    rank: int
    status: str  # finished | failed | crashed | hung | blocked | not run
    last_op: str
    ended_at: float | None
    spans: tuple[tuple[str, float, float], ...]
    device_peak: int | None
    host_pinned_peak: int | None


@dataclass(frozen=True)
class WorldReport:
    """Per-rank reports plus the simulated end time and the number of events run."""

    time: float
    events: int
    ranks: tuple[RankReport, ...]

    def format(self) -> str:
        """A plain-text table, one line per rank."""
        lines = [f"simulated time {self.time:.6f} s, {self.events} events"]
        for r in self.ranks:
            peak = f"{r.device_peak / 2**30:.2f} GiB" if r.device_peak is not None else "-"
            phases = ", ".join(f"{n} {e - s:.4f}s" for n, s, e in r.spans[-4:])
            lines.append(f"rank {r.rank:>4}  {r.status:<8} peak {peak:>10}  last: {r.last_op}  {phases}")
        return "\n".join(lines)


class SimWorld:
    """A simulated job of ``world_size`` ranks sharing one engine and one simulated machine.

    Args:
        world_size: number of ranks (>= 1).
        payload: ``"real"`` (small CPU tensors, real bytes) or ``"meta"`` (no data).
        seed: seeds :attr:`rng` (for the machine's parts) and ``chooser="random"``.
        chooser: how events ready at the same instant are ordered: None (FIFO),
            ``"random"`` (seeded by ``seed``) or a :class:`sim.kernel.engine.Chooser`.
        transport, collective_cost, memory, faults, comm: the machine's parts (see
            :mod:`sim.machine.protocols`); None means the default.
        default_backend: backend of groups whose spec says ``backend=None``.
        group_timeouts: when True, collectives and group creation without an
            explicit ``timeout_s`` time out after the group's ``timeout_s``
            (as torch's watchdog does). Off by default so that a hang shows up
            as a :class:`sim.DeadlockError` with its waits-for cycle.
        trace: keep the event trace (:meth:`sim.kernel.engine.Engine.trace_bytes`).
        peer_loss_s: seconds after a rank crashes at which its peers' collectives on its groups fail, as when a
            process dies and its connections close (see :mod:`sim.rendezvous`, [Note: a crashed peer's closed
            connections]); None (the default) models a crashed rank as one that never arrives: its peers wait
            for their timeouts (``group_timeouts``, an explicit ``timeout_s``) or stop as a deadlock.
        ranks: the ranks that have a runtime and run (a folded run's active ranks, :mod:`sim.scenarios.fold`);
            None: all. :attr:`runtimes` lists them in rank order, :meth:`runtime` finds one by rank.
    """

    def __init__(
        self,
        world_size: int,
        *,
        payload: str = "real",
        seed: int = 0,
        chooser: Chooser | str | None = None,
        transport: Transport | None = None,
        collective_cost: CollectiveCost | None = None,
        memory: Memory | None = None,
        faults: FaultHooks | None = None,
        comm: CommCosts | None = None,
        default_backend: str = "nccl",
        group_timeouts: bool = False,
        trace: bool = True,
        peer_loss_s: float | None = None,
        ranks: Sequence[int] | None = None,
    ):
        if not isinstance(world_size, int) or world_size < 1:
            raise SimUsageError(f"world_size must be an int >= 1, got {world_size!r}")
        if payload not in PAYLOADS:
            raise SimUsageError(f"payload must be one of {PAYLOADS}, got {payload!r}")
        if default_backend not in ("nccl", "gloo"):
            raise SimUsageError(f"default_backend must be 'nccl' or 'gloo', got {default_backend!r}")
        if peer_loss_s is not None and not (isinstance(peer_loss_s, (int, float)) and 0 <= peer_loss_s < float("inf")):
            raise SimUsageError(f"peer_loss_s must be None or a number of seconds >= 0, got {peer_loss_s!r}")
        if chooser == "random":
            chooser = RandomChooser(seed)
        elif isinstance(chooser, str):
            raise SimUsageError(f"chooser must be None, 'random' or a Chooser, got {chooser!r}")
        self.world_size = world_size
        self.payload = payload
        self.payload_real = payload == "real"
        self.seed = seed
        self.rng = random.Random(seed)
        self.default_backend = default_backend
        self.group_timeouts = group_timeouts
        self.peer_loss_s = peer_loss_s
        self.engine = Engine(chooser, trace=trace)
        self.transport: Transport = transport if transport is not None else FixedBandwidthTransport()
        self.collective_cost: CollectiveCost = collective_cost if collective_cost is not None else RingCollectiveCost()
        self.memory: Memory = memory if memory is not None else LedgerMemory()
        self.faults: FaultHooks | None = None if faults is None or type(faults) is NoFaults else faults
        self.comm: CommCosts = comm if comm is not None else NcclCommCosts()
        for part in (self.transport, self.collective_cost, self.memory, self.faults, self.comm):
            bind = getattr(part, "bind", None)
            if bind is not None:
                bind(self)
        self.rendezvous = Rendezvous(self)
        self.votes = VoteBox(self)
        self.groups = GroupBook()  # one spec per group and generation, shared by its ranks (sim.groups)
        if ranks is None:
            simulated: Sequence[int] = range(world_size)
        else:
            simulated = sorted(set(ranks))
            if not simulated or simulated[0] < 0 or simulated[-1] >= world_size:
                raise SimUsageError(f"ranks must be a non-empty set of ranks below world_size {world_size}")
        self.runtimes = [SimRuntime(self, r) for r in simulated]
        self._by_rank = None if ranks is None else {rt.rank: rt for rt in self.runtimes}
        world_spec = GroupSpec(WORLD, tuple(range(world_size)), backend=default_backend)
        for rt in self.runtimes:
            rt.join_world_group(world_spec)
        self._broken: BaseException | None = None

    def runtime(self, rank: int) -> SimRuntime:
        """The runtime of ``rank`` (KeyError for a rank this world does not simulate)."""
        return self.runtimes[rank] if self._by_rank is None else self._by_rank[rank]

    def resolve_backend(self, spec: GroupSpec) -> GroupSpec:
        """``spec`` with ``backend=None`` replaced by the world's default backend."""
        return self.groups.resolved(spec, self.default_backend)

    def run(self, fn: Callable[[SimRuntime], Coroutine[Any, Any, Any]], *, return_exceptions: bool = False) -> list[Any]:
        """Run ``fn(rt)`` on every rank until the job ends; see the module docstring."""
        if self._broken is not None:
            raise SimUsageError(f"this world stopped on an error earlier ({self._broken}); build a new SimWorld")
        for rt in self.runtimes:
            if rt.crashed or (rt.process is not None and rt.process.alive):
                continue  # crashed, or hung in an earlier run: it runs nothing new
            rt.process = self.engine.process(fn(rt), f"rank{rt.rank}")
        try:
            self.engine.run()
        except BaseException as exc:
            self._abandon(exc)
            raise
        deadlock = find_deadlock(self)
        if deadlock is not None:
            self._abandon(deadlock)
            raise deadlock
        results: list[Any] = []
        failures: list[tuple[float, int, BaseException]] = []
        for rt in self.runtimes:
            p = rt.process
            if rt.crashed:
                exc: BaseException = RankCrashedError(rt.rank, p.crash_where if p is not None else "earlier")
                results.append(exc)
                failures.append((p.ended_at if p is not None and p.ended_at is not None else 0.0, rt.rank, exc))
            elif p.state is ProcessState.FINISHED:
                results.append(p.result)
            elif p.state is ProcessState.FAILED:
                results.append(p.exception)
                failures.append((p.ended_at, rt.rank, p.exception))
            else:  # waiting on an injected hang (anything else was a deadlock)
                exc = RankHungError(rt.rank, rt.last_op)
                results.append(exc)
                failures.append((self.engine.now, rt.rank, exc))
        if failures and not return_exceptions:
            _t, rank, exc = min(failures, key=lambda f: (f[0], f[1]))
            raise RankFailedError(rank, exc) from exc
        return results

    def _abandon(self, exc: BaseException) -> None:
        """Mark the world broken and close the coroutines of ranks still running.

        Closing runs their ``finally`` blocks now, deterministically, rather than
        whenever the garbage collector gets to them; the engine no longer runs.
        """
        self._broken = exc
        for rt in self.runtimes:
            p = rt.process
            if p is not None and p.alive:
                p.abandon()

    def report(self) -> WorldReport:
        """Per-rank status, last operation, spans and memory peaks after a run."""
        ledger = getattr(self.memory, "ledger", None)
        ranks = []
        for rt in self.runtimes:
            p = rt.process
            if p is None:
                status = "not run"
            elif p.state is ProcessState.WAITING:
                status = "hung" if getattr(p.waiting_on.blocker, "hang", False) else "blocked"
            else:
                status = p.state.value
            led = ledger(rt.rank) if ledger is not None else None
            ranks.append(RankReport(
                rank=rt.rank, status=status, last_op=rt.last_op, ended_at=p.ended_at if p else None,
                spans=tuple(rt.spans), device_peak=led.device_peak if led else None,
                host_pinned_peak=led.host_pinned_peak if led else None,
            ))
        return WorldReport(time=self.engine.now, events=self.engine.events_run, ranks=tuple(ranks))


def run_ranks(n: int, fn: Callable[[SimRuntime], Coroutine[Any, Any, Any]], **world_kwargs: Any) -> list[Any]:
    """Build ``SimWorld(n, **world_kwargs)`` and return ``world.run(fn)``."""
    return SimWorld(n, **world_kwargs).run(fn)


__all__ = ["RankReport", "SimWorld", "WorldReport", "run_ranks"]
