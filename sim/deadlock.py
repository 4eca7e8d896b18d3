"""Deadlock detection: what every still-blocked rank waits for, as a waits-for graph.

Called when the engine has no event left. A rank blocked in a collective (or
in group creation) waits for each member that has not arrived; those are the
edges of a ``networkx.DiGraph``. A cycle there (``nx.find_cycle``) is a
deadlock in the usual sense (rank 0 waits in group A for rank 1, which waits
in group B for rank 0). Without a cycle the waits end at ranks that will
never arrive because they finished, failed, crashed or hung; those are listed
with their last operation, which is usually the bug's address.

Ranks hung by an injected fault are not a deadlock on their own; only ranks
that wait *for* them are.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

from sim.kernel.engine import ProcessState
from sim.kernel.errors import DeadlockError

if TYPE_CHECKING:  # pragma: no cover
    from sim.kernel.engine import Engine
    from sim.runtime import SimRuntime


class WaitingWorld(Protocol):
    """What deadlock detection reads of a world (:class:`sim.SimWorld` is one): its clock and its ranks."""

    engine: "Engine"
    runtimes: Sequence["SimRuntime"]

    def runtime(self, rank: int) -> "SimRuntime":
        """The runtime of ``rank``."""

MAX_LISTED = 32


def _is_hang(fut) -> bool:
    return getattr(fut.blocker, "hang", False)


def _status(world: WaitingWorld, rank: int) -> str:
    rt = world.runtime(rank)
    p = rt.process
    if p is None:
        return f"rank {rank} is not running (last op: {rt.last_op})"
    if p.state is ProcessState.FINISHED:
        return f"rank {rank} finished; its last operation: {rt.last_op}"
    if p.state is ProcessState.CRASHED:
        return f"rank {rank} crashed (injected fault) {p.crash_where}; last op: {rt.last_op}"
    if p.state is ProcessState.FAILED:
        exc = p.exception
        return f"rank {rank} failed with {type(exc).__name__}: {exc}; last op: {rt.last_op}"
    if p.waiting_on is not None and _is_hang(p.waiting_on):
        return f"rank {rank} {p.waiting_on.label}"
    return f"rank {rank} is blocked: {rt.last_op}"


def find_deadlock(world: WaitingWorld) -> DeadlockError | None:
    """The DeadlockError describing the blocked ranks, or None if none is blocked on another."""
    blocked: dict[int, str] = {}
    waits: dict[int, list[int]] = {}
    hung: set[int] = set()
    for rt in world.runtimes:
        p = rt.process
        if p is None or p.state is not ProcessState.WAITING or p.waiting_on is None:
            continue
        fut = p.waiting_on
        blocked[rt.rank] = fut.label
        if _is_hang(fut):
            hung.add(rt.rank)
            continue
        missing = getattr(fut.blocker, "missing", None)
        waits[rt.rank] = missing() if missing is not None else []
    if not waits:
        return None

    import networkx as nx  # here, not at the top: a run that ends without a deadlock never needs it (~0.1 s)

    graph = nx.DiGraph()
    for r, targets in waits.items():
        graph.add_node(r)
        for t in targets:
            graph.add_edge(r, t)
    try:
        cycle = [u for u, _v in nx.find_cycle(graph)]
    except nx.NetworkXNoCycle:
        cycle = []
    absent = {t: _status(world, t) for r in waits for t in waits[r] if t not in blocked or t in hung}
    # a rank that failed with an exception is usually the cause, even when nobody waits for it by name
    # (it raised while completing a collective every member had joined: "waiting for ranks []")
    failed = {rt.rank: _status(world, rt.rank) for rt in world.runtimes
              if rt.process is not None and rt.process.state is ProcessState.FAILED}
    # when the job became stuck: the last blocked rank started waiting, or the last rank they could have
    # needed ended (finished, failed, crashed); timers of others may run on after that
    ends = [world.runtime(r).process.waiting_since for r in waits]
    ends += [world.runtime(r).process.ended_at for r in {*absent, *failed}
             if world.runtime(r).process is not None and r not in hung]
    blocked_at = max((t for t in ends if t is not None), default=world.engine.now)

    lines = [
        f"deadlock at t={blocked_at:.6f} s (simulated): no event is pending and "
        f"{len(waits)} rank(s) are blocked"
    ]
    first = min(failed, key=lambda r: (world.runtime(r).process.ended_at or 0.0, r)) if failed else None
    if first is not None:
        lines.append(f"caused by: {failed[first]}")
    for i, (r, targets) in enumerate(waits.items()):
        if i == MAX_LISTED:
            lines.append(f"  ... and {len(waits) - MAX_LISTED} more blocked ranks (see .blocked)")
            break
        shown = targets[:8]
        more = f" and {len(targets) - 8} more" if len(targets) > 8 else ""
        lines.append(f"  rank {r} blocked in {blocked[r]}, waiting for ranks {shown}{more}")
    if cycle:
        lines.append("waits-for cycle: " + " -> ".join(map(str, cycle + cycle[:1])))
    for r in sorted(set(failed) - set(absent) - {first}):
        absent[r] = failed[r]
    for i, (t, status) in enumerate(sorted(absent.items())):
        if i == MAX_LISTED:
            lines.append(f"  ... and {len(absent) - MAX_LISTED} more (see .absent)")
            break
        lines.append(f"  never arrives: {status}")
    lines.append(
        "Every member of a group must issue the same collectives in the same order; check the ranks "
        "above for a different group order, an early exit, or a skipped collective."
    )
    if first is not None:
        absent.setdefault(first, failed[first])
    return DeadlockError("\n".join(lines), blocked=blocked, cycle=cycle, absent=absent, time=blocked_at,
                         stopped_at=world.engine.now)


__all__ = ["find_deadlock"]
