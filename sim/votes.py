"""Votes and arrival marks of a simulated world (what TorchRuntime keeps in the rendezvous store).

:class:`VoteBox` settles every :meth:`SimRuntime.vote <sim.runtime.SimRuntime.vote>` of one world as
:mod:`refimpl.runtime.votes` promises: the last ballot in settles the vote complete at the instant it
arrives; a rank whose ``timeout_s`` passes first settles it timed out (naming the ranks without a
ballot); the first settlement stands, and a ballot cast after it reads that verdict. A settled verdict
reaches the waiting ranks one two-rank Gloo agreement later (the comm costs', where they have one; else
at once), standing for the store's few round trips.

Arrival marks are counters per ``(group, generation, point, rank)``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from refimpl.runtime.base import GroupSpec
from refimpl.runtime.votes import Ballot, Verdict
from sim.kernel.engine import PRIORITY_LATE, SimFuture

if TYPE_CHECKING:  # pragma: no cover
    from sim.rendezvous import RendezvousHost


class _Vote:
    """One vote: the ballots in, the verdict once settled, and the future every waiting rank awaits."""

    __slots__ = ("key", "ranks", "ballots", "verdict", "future")

    def __init__(self, key: str, ranks: tuple[int, ...]):
        self.key, self.ranks = key, ranks
        self.ballots: dict[int, Ballot] = {}
        self.verdict: Verdict | None = None
        self.future = SimFuture(f"vote {key!r}", self)

    def missing(self) -> list[int]:
        """Ranks without a ballot yet (the waits-for edges of a rank waiting here)."""
        return [] if self.verdict is not None else [r for r in self.ranks if r not in self.ballots]


class VoteBox:
    """Every vote and arrival mark of one simulated world."""

    def __init__(self, world: "RendezvousHost"):
        self._world = world
        self._votes: dict[str, _Vote] = {}
        self._marks: dict[tuple[str, int, str, int], int] = {}
        #: in a folded run, each rank's representative (its marks are the representative's); None: every rank runs
        self._reps: Any = None

    def represent(self, reps: Any) -> None:
        """Read each rank's arrival marks from its representative's (``reps[rank]``, a folded run's
        :meth:`Fold.rep_of_all <sim.scenarios.fold.Fold.rep_of_all>`): a rank that is not simulated arrived
        where the rank it is folded onto did."""
        self._reps = reps

    # ------------------------------------------------------------------ votes

    def cast(self, key: str, ranks: Sequence[int], ballot: Ballot, timeout_s: float) -> _Vote:
        """Record ``ballot``; settle the vote complete if it is the last one in."""
        v = self._votes.get(key)
        if v is None:
            v = self._votes[key] = _Vote(key, tuple(ranks))
        if v.verdict is None:
            v.ballots.setdefault(ballot.rank, ballot)
            if len(v.ballots) == len(v.ranks):
                self._settle(v, ballot.rank, timeout_s, complete=True)
        return v

    def arm_timeout(self, v: _Vote, rank: int, timeout_s: float) -> None:
        """Settle ``v`` timed out by ``rank`` if no verdict exists ``timeout_s`` from now."""
        if not timeout_s > 0:
            raise ValueError(f"a vote's timeout_s must be > 0, got {timeout_s}")
        self._world.engine.schedule(timeout_s, self._time_out, v, rank, timeout_s, priority=PRIORITY_LATE)

    def _time_out(self, v: _Vote, rank: int, timeout_s: float) -> None:
        if v.verdict is None:
            self._world.engine.record(self._world.engine.now, rank, "timeout", v.future.label)
            self._settle(v, rank, timeout_s, complete=False)

    def _settle(self, v: _Vote, rank: int, timeout_s: float, *, complete: bool) -> None:
        v.verdict = Verdict.settle(v.key, v.ranks, v.ballots.values(), decided_by=rank, timeout_s=timeout_s,
                                   complete=complete)
        self._world.engine.schedule(self._cost(), v.future.resolve, v.verdict)

    def _cost(self) -> float:
        """One two-rank Gloo agreement: a vote is a few round trips to one store, whatever the number of ranks."""
        gloo = getattr(self._world.comm, "gloo_collective_time", None)
        t = None if gloo is None else gloo(GroupSpec("vote", (0, 1), backend="gloo"))
        return 0.0 if t is None else t

    # ------------------------------------------------------------------ arrival marks

    def mark(self, spec: GroupSpec, point: str, rank: int) -> None:
        """Count one more arrival of ``rank`` at ``point`` on the group's current generation."""
        key = (spec.name, spec.generation, point, rank)
        self._marks[key] = self._marks.get(key, 0) + 1

    def absent(self, spec: GroupSpec, point: str, rank: int) -> tuple[int, ...]:
        """Members that arrived at ``point`` fewer times than ``rank``."""
        mine = self._marks.get((spec.name, spec.generation, point, rank), 0)
        reps = self._reps
        return tuple(r for r in spec.ranks if r != rank
                     and self._marks.get((spec.name, spec.generation, point,
                                          r if reps is None else int(reps[r])), 0) < mine)


__all__ = ["VoteBox"]
