"""Collective rendezvous: matching ranks' collectives and completing them.

Theory of operation
-------------------
Every collective call on a group generation gets the calling rank's next
sequence number on that group. Arrivals are collected under the key
``(group, generation, seq)`` (group creation uses ``seq = -1``). The first
arrival fixes the *signature* (op, dtype, sizes, src or reduce op); a later
arrival with a different signature is a :class:`sim.CollectiveMismatchError`,
which stops the simulation: it is a protocol bug, not a runtime condition.

When the last member arrives the collective completes ``cost`` seconds later
(cost from :class:`sim.machine.protocols.CollectiveCost` or, for group creation, from
:class:`sim.machine.protocols.CommCosts`): on real payloads the data moves then (so a
rank that read its output before awaiting would see stale bytes), and every
member's future is resolved. A member whose future already failed (it timed
out) contributed its input but receives nothing.

A pending collective is also the *blocker* of the ranks waiting in it: it
answers :meth:`Pending.missing`, the members that have not arrived, which is
what the deadlock detector draws as waits-for edges.

[Note: a crashed peer's closed connections]
When a process dies its sockets close, and a peer blocked on them learns it at once: Gloo's TCP
pairs return an error, NCCL's proxy connection reports the remote error that torch's asynchronous
error handling turns into a failed collective. With the world's ``peer_loss_s`` set (a number of
seconds; ``sim run`` sets it), :meth:`Rendezvous.peer_lost` fails every member waiting in a
collective of a group that has the crashed rank, and every member reaching one later, that long
after the crash, with :class:`CollectiveFailedError` naming the rank: the peers fail together
promptly, as a real job does, instead of each waiting out its timeout. Group creation is not
affected (torch's store barrier cannot see a dead peer: a rebuild with one waits for its timeout),
nor are votes (the store does not know who died). With ``peer_loss_s`` None (:class:`sim.SimWorld`'s
default) a crashed rank is one that never arrives, like a hung one.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from refimpl.runtime.base import CollectiveFailedError, CollectiveTimeoutError, GroupSpec, ReduceOp
from sim.kernel.engine import Event, SimFuture
from sim.kernel.errors import CollectiveMismatchError

if TYPE_CHECKING:  # pragma: no cover
    from sim.kernel.engine import Engine
    from sim.machine.protocols import CollectiveCost, CommCosts

log = logging.getLogger(__name__)


class RendezvousHost(Protocol):
    """What the rendezvous reads of its world (:class:`sim.SimWorld` is one): clock and costs."""

    engine: "Engine"
    comm: "CommCosts"
    collective_cost: "CollectiveCost"
    #: seconds after a rank's crash its peers' collectives fail (None: never; see [Note: a crashed peer's closed
    #: connections])
    peer_loss_s: float | None

    def resolve_backend(self, spec: GroupSpec) -> GroupSpec:
        """``spec`` with its backend filled in."""

CREATE_SEQ = -1


class Arrival:
    """One rank's part in a pending collective."""

    __slots__ = ("rank", "detail", "payload", "snapshot", "future", "corrupt", "timer")

    def __init__(self, rank: int, detail: str, payload: Any, future: SimFuture, corrupt: bool):
        self.rank = rank
        self.detail = detail
        self.payload = payload
        # the input as it was at arrival (None when there are no bytes to move): a rank
        # that times out may free or reuse its buffer before the collective completes
        self.snapshot = _snapshot(payload)
        self.future = future
        self.corrupt = corrupt
        self.timer: Event | None = None


def _input_of(payload: Any) -> Any:
    return payload[1] if isinstance(payload, tuple) else payload


def _snapshot(payload: Any) -> torch.Tensor | None:
    inp = _input_of(payload)
    if not isinstance(inp, torch.Tensor) or inp.is_meta:
        return None
    return inp.detach().reshape(-1).clone()


class Pending:
    """A collective on one ``(group, generation, seq)`` that not every member has reached."""

    __slots__ = ("spec", "seq", "op", "signature", "arrivals", "count", "nbytes", "cost")

    def __init__(self, spec: GroupSpec, seq: int, op: str, signature: Any, nbytes: int):
        self.spec = spec
        self.seq = seq
        self.op = op
        self.signature = signature
        self.arrivals: list[Arrival | None] = [None] * spec.size
        self.count = 0
        self.nbytes = nbytes
        self.cost = 0.0

    def missing(self) -> list[int]:
        """Global ranks of members that have not arrived."""
        return [r for r, a in zip(self.spec.ranks, self.arrivals) if a is None]

    def describe(self) -> str:
        """``"all_reduce on group 'tp0' seq 3"`` (generation shown when > 0)."""
        return describe(self.op, self.spec, self.seq)


def describe(op: str, spec: GroupSpec, seq: int) -> str:
    """Human-readable name of a collective for messages and deadlock reports."""
    gen = f" gen {spec.generation}" if spec.generation else ""
    if seq == CREATE_SEQ:
        return f"{op} of group {spec.name!r}{gen}"
    return f"{op} on group {spec.name!r}{gen} seq {seq}"


class HangBlocker:
    """Blocker of a rank hung by an injected fault: it waits for nobody."""

    __slots__ = ("where",)
    hang = True

    def __init__(self, where: str):
        self.where = where

    def missing(self) -> list[int]:
        """Empty: a hung rank waits for no other rank."""
        return []


class Rendezvous:
    """All pending collectives of a world, keyed by ``(group, generation, seq)``."""

    def __init__(self, world: RendezvousHost):
        self._world = world
        self._pending: dict[tuple[str, int, int], Pending] = {}
        self._lost: dict[int, float] = {}  # crashed rank -> when its peers learn it (peer_loss_s after the crash)

    def arrive(
        self,
        spec: GroupSpec,
        group_rank: int,
        seq: int,
        op: str,
        signature: Any,
        detail: str,
        payload: Any,
        nbytes: int,
        corrupt: bool = False,
    ) -> Arrival:
        """Register ``spec.ranks[group_rank]``'s arrival; complete the collective if it is the last.

        Returns the arrival, whose future the rank awaits. On a mismatch the
        engine is stopped with :class:`CollectiveMismatchError` and the future
        never completes.
        """
        key = (spec.name, spec.generation, seq)
        p = self._pending.get(key)
        rank = spec.ranks[group_rank]
        fut = SimFuture(describe(op, spec, seq))
        arrival = Arrival(rank, detail, payload, fut, corrupt)
        if p is None:
            p = self._pending[key] = Pending(spec, seq, op, signature, nbytes)
        elif p.signature != signature or p.op != op:
            ops = {a.rank: a.detail for a in p.arrivals if a is not None}
            ops[rank] = detail
            err = CollectiveMismatchError(spec.name, spec.generation, seq, ops)
            log.debug("%s", err)
            self._world.engine.stop(err)
            fut.blocker = p
            return arrival
        fut.blocker = p
        if p.arrivals[group_rank] is not None:  # a rank can reach a seq only once
            raise AssertionError(f"rank {rank} arrived twice at {p.describe()}")
        p.arrivals[group_rank] = arrival
        p.count += 1
        if p.count == spec.size:
            del self._pending[key]
            self._schedule_complete(p)
        elif self._lost and seq != CREATE_SEQ:
            self._fail_if_lost(p, arrival)
        return arrival

    # ------------------------------------------------------------------ crashed peers

    def peer_lost(self, rank: int) -> None:
        """``rank`` crashed: fail its peers' collectives on its groups ``peer_loss_s`` from now (None: never).

        See [Note: a crashed peer's closed connections].
        """
        delay = self._world.peer_loss_s
        if delay is None or rank in self._lost:
            return
        self._lost[rank] = self._world.engine.now + delay
        for p in list(self._pending.values()):
            if p.seq != CREATE_SEQ and p.spec.has_member(rank):
                for a in p.arrivals:
                    if a is not None:
                        self._fail_if_lost(p, a)

    def _fail_if_lost(self, p: Pending, arrival: Arrival) -> None:
        """Fail ``arrival`` when its peers learn of the first crashed member of ``p``'s group (if it has one)."""
        lost = [(t, r) for r, t in self._lost.items() if p.spec.has_member(r)]
        if not lost:
            return
        when, rank = min(lost)
        engine = self._world.engine
        engine.schedule(max(0.0, when - engine.now), self._peer_gone, p, arrival, rank)

    def _peer_gone(self, p: Pending, arrival: Arrival, lost: int) -> None:
        fut = arrival.future
        if fut.done():
            return
        if arrival.timer is not None:
            arrival.timer.cancel()
        self._world.engine.record(self._world.engine.now, arrival.rank, "peer lost", fut.label, lost)
        fut.fail(CollectiveFailedError(
            f"rank {arrival.rank}: {fut.label} failed: rank {lost}, a member of group {p.spec.name!r}, is gone (its "
            "process exited and its connections closed); restart the job's workers"
        ))
        arrival.payload = arrival.snapshot = None

    def _schedule_complete(self, p: Pending) -> None:
        """Every member arrived: complete ``p`` when its cost has passed (between nodes, through the shared NICs)."""
        w = self._world
        if self._shares_nics(p):  # [Note: NICs shared among collectives] in sim.machine.collectives
            extra = w.comm.first_use(w.resolve_backend(p.spec)) if getattr(w.comm, "init_at_collective", False) else 0.0
            w.collective_cost.run(p.op, p.spec.ranks, p.nbytes, extra, lambda: self._complete(p), p.spec.name)
        else:
            w.engine.schedule(self._cost(p), self._complete, p)

    def _shares_nics(self, p: Pending) -> bool:
        """True for an NCCL collective between nodes on a collective cost that shares the NICs."""
        w = self._world
        spans = getattr(w.collective_cost, "spans_nodes", None)
        return (p.seq != CREATE_SEQ and spans is not None and w.resolve_backend(p.spec).backend == "nccl"
                and spans(p.spec.ranks, p.nbytes))

    def _cost(self, p: Pending) -> float:
        w = self._world
        if p.seq == CREATE_SEQ:
            return w.comm.create_time(w.resolve_backend(p.spec))
        t = w.collective_cost.time(p.op, p.spec.ranks, p.nbytes)
        gloo = getattr(w.comm, "gloo_collective_time", None)  # a host collective (agreement), where simulated
        if gloo is not None:
            host = gloo(w.resolve_backend(p.spec))
            if host is not None:  # a small one costs the agreement; the links still bound a large one
                return max(t, host)
        if getattr(w.comm, "init_at_collective", False):  # lazy NCCL init paid by the collective itself
            t += w.comm.first_use(w.resolve_backend(p.spec))
        return t

    def arm_timeout(self, arrival: Arrival, timeout_s: float, rank: int) -> None:
        """Fail ``arrival``'s future ``timeout_s`` from now unless the collective completes first."""
        from sim.kernel.engine import PRIORITY_LATE

        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        arrival.timer = self._world.engine.schedule(
            timeout_s, self._time_out, arrival, timeout_s, rank, priority=PRIORITY_LATE
        )

    def _time_out(self, arrival: Arrival, timeout_s: float, rank: int) -> None:
        fut = arrival.future
        if fut.done():
            return
        p = fut.blocker
        missing = p.missing() if isinstance(p, Pending) else []
        self._world.engine.record(self._world.engine.now, rank, "timeout", fut.label)
        fut.fail(
            CollectiveTimeoutError(
                f"rank {rank}: {fut.label} timed out after {timeout_s:g} s (simulated) waiting for ranks "
                f"{missing}; those ranks never issued it (crashed, hung, or took another path). Check that "
                "every member issues the same collectives in the same order."
            )
        )

    def _complete(self, p: Pending) -> None:
        w = self._world
        arrivals = [a for a in p.arrivals if a is not None]
        # bytes move whenever they exist: real payloads, and real (e.g. control-group)
        # tensors inside a meta-payload world
        if p.seq != CREATE_SEQ and all(a.snapshot is not None for a in arrivals):
            _MOVE[p.op](p, arrivals)
            for a in arrivals:
                if a.corrupt and not a.future.done():
                    _corrupt(a.payload)
        if w.engine.tracing:
            w.engine.trace.append((w.engine.now, "done", p.describe()))
        for a in arrivals:
            if a.timer is not None:
                a.timer.cancel()
            a.future.resolve(None)
            # done: hold no buffers (the future stays reachable; a real communicator drops them too)
            a.payload = a.snapshot = None

    def pending(self) -> list[Pending]:
        """Collectives some but not all members have reached, oldest first."""
        return list(self._pending.values())


# --------------------------------------------------------------------------- data movement (real payloads)


def _live(arrivals: list[Arrival]) -> list[Arrival]:
    return [a for a in arrivals if not a.future.done()]


def _move_all_gather(p: Pending, arrivals: list[Arrival]) -> None:
    # payload = (output, input); read every input before writing any output:
    # FSDP-style callers pass an input that is a slice of the output.
    gathered = torch.cat([a.snapshot for a in arrivals])
    for a in _live(arrivals):
        a.payload[0].view(-1).copy_(gathered)


_REDUCE: dict[ReduceOp, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    ReduceOp.SUM: lambda acc, t: acc.add_(t),
    ReduceOp.MIN: lambda acc, t: torch.minimum(acc, t, out=acc),
    ReduceOp.MAX: lambda acc, t: torch.maximum(acc, t, out=acc),
}


def _move_all_reduce(p: Pending, arrivals: list[Arrival]) -> None:
    # payload = tensor; reduce in group-rank order so every rank gets the same bits
    reduce = _REDUCE[p.signature[3]]
    acc = arrivals[0].snapshot.clone()
    for a in arrivals[1:]:
        reduce(acc, a.snapshot)
    for a in _live(arrivals):
        a.payload.copy_(acc.view(a.payload.shape))


def _move_broadcast(p: Pending, arrivals: list[Arrival]) -> None:
    src = p.signature[3]
    value = next(a.snapshot for a in arrivals if a.rank == src)
    for a in _live(arrivals):
        if a.rank != src:
            a.payload.copy_(value.view(a.payload.shape))


def _move_barrier(p: Pending, arrivals: list[Arrival]) -> None:  # noqa: ARG001
    return None


_MOVE: dict[str, Callable[[Pending, list[Arrival]], None]] = {
    "all_gather": _move_all_gather,
    "all_reduce": _move_all_reduce,
    "broadcast": _move_broadcast,
    "barrier": _move_barrier,
}


def _corrupt(payload: Any) -> None:
    """Perturb a rank's collective output (injected CORRUPT fault)."""
    out = payload[0] if isinstance(payload, tuple) else payload
    if not isinstance(out, torch.Tensor) or out.numel() == 0:
        return
    if out.dtype == torch.bool:
        out.logical_not_()
    else:
        out.add_(1)


__all__ = ["CREATE_SEQ", "Arrival", "HangBlocker", "Pending", "Rendezvous", "describe"]
