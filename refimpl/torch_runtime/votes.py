"""Votes and arrival marks in the job's rendezvous store (the ``torch.distributed`` default store).

:class:`StoreBallotBox` implements :meth:`Runtime.vote <refimpl.runtime.base.Runtime.vote>` for
:class:`~refimpl.torch_runtime.TorchRuntime` (see :mod:`refimpl.runtime.votes` for what a vote promises). Under
``timeshare/vote/<key>/``:

* ``ballots``: every rank appends its ballot's record (``TCPStore.append``: atomic), *then* increments
  ``count`` (``add``); the rank whose increment reaches the number of voters reads ``ballots`` and
  writes the verdict;
* ``verdict``: written with ``compare_set(key, "", value)``, which sets it only if it is not set yet and
  returns what is there, so the first decision stands: the last arrival's (complete) or the first
  timeout's (naming the ranks whose records were missing);
* every waiting rank ``wait``-s for ``verdict`` up to ``timeout_s`` and reads it.

Four store operations per rank and vote (about 45 us each on one host), two more for the deciding rank,
which deletes the records of the previous complete vote it settled in the same key space (everything
before the last ``/``); verdicts stay (they are short).

Arrival marks (:meth:`Runtime.mark_arrival <refimpl.runtime.base.Runtime.mark_arrival>`) are counters under
``timeshare/arrive/<group>/gen<g>/<point>/<rank>``: one ``add`` per mark; :meth:`StoreBallotBox.absent`
reads the members' counters only when a collective has timed out.

The store is the one ``init_process_group`` set up (torchrun's rendezvous store, or the TCP store of
rank 0 with ``tcp://``); if it becomes unreachable (its host died) a vote raises
:class:`~refimpl.runtime.votes.VoteError` and marks are skipped with a warning.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Callable, Sequence

from refimpl.runtime.base import GroupSpec
from refimpl.runtime.votes import Ballot, Verdict, VoteError, space_name

log = logging.getLogger(__name__)

VOTE_PREFIX = "timeshare/vote/"
ARRIVE_PREFIX = "timeshare/arrive/"


_SPACES: dict[tuple[str, str], int] = {}  # (kind, about) -> spaces handed out in this process (one store for all)


def next_space(kind: str, about: str = "") -> str:
    """The next key space of ``kind`` about ``about`` in this process (:func:`refimpl.runtime.votes.space_name`)."""
    n = _SPACES[(kind, about)] = _SPACES.get((kind, about), -1) + 1
    return space_name(kind, about, n)


def _timed_out(e: BaseException) -> bool:
    return "timeout" in str(e).lower() or "timed out" in str(e).lower()


class StoreBallotBox:
    """Votes and arrival marks of one process, through the store ``store()`` returns (None: not distributed)."""

    def __init__(self, store: Callable[[], Any], rank: int) -> None:
        self._store = store
        self.rank = rank
        self._marks: dict[tuple[str, str], int] = {}  # (group store prefix, point) -> this rank's count
        self._settled: dict[str, str] = {}  # key space -> the last vote this rank settled as complete there

    def _get(self) -> Any:
        store = self._store()
        if store is None:
            raise VoteError("no rendezvous store: torch.distributed is not initialised")
        return store

    # ------------------------------------------------------------------ votes

    def vote(self, key: str, ranks: Sequence[int], ballot: Ballot, timeout_s: float, wait: bool) -> Verdict | None:
        """Cast ``ballot``; settle the vote if it is the last one in; with ``wait``, read the verdict (see module)."""
        store, base = self._get(), VOTE_PREFIX + key
        try:
            store.append(f"{base}/ballots", ballot.record())
            if store.add(f"{base}/count", 1) >= len(ranks):
                return self._decide(store, key, ranks, timeout_s, complete=True)
            if not wait:
                return None
            try:
                store.wait([f"{base}/verdict"], timedelta(seconds=timeout_s))
            except Exception as e:  # noqa: BLE001 - a timeout settles the vote; anything else is the store's
                if not _timed_out(e):
                    raise
                return self._decide(store, key, ranks, timeout_s, complete=False)
            return Verdict.decode(store.get(f"{base}/verdict"))
        except VoteError:
            raise
        except Exception as e:  # noqa: BLE001 - the store is the only thing talked to here
            raise VoteError(f"rank {self.rank}: vote {key!r} at {ballot.point!r}: the rendezvous store failed: {e} "
                            "(its host may be gone)") from e

    def _decide(self, store: Any, key: str, ranks: Sequence[int], timeout_s: float, *, complete: bool) -> Verdict:
        base = VOTE_PREFIX + key
        ballots = Ballot.parse(store.get(f"{base}/ballots").decode())
        mine = Verdict.settle(key, ranks, ballots, decided_by=self.rank, timeout_s=timeout_s, complete=complete)
        verdict = Verdict.decode(store.compare_set(f"{base}/verdict", "", mine.encode()))
        if verdict.complete and verdict.decided_by == self.rank:
            self._forget(store, key)
        return verdict

    def _forget(self, store: Any, key: str) -> None:
        """Delete the records of the last vote of ``key``'s space this rank settled as complete: every rank has cast
        a ballot in ``key`` since, so none still reads them (verdicts stay; they are short)."""
        space = key.rsplit("/", 1)[0]
        old, self._settled[space] = self._settled.get(space), key
        if old is not None:
            for k in ("ballots", "count"):
                store.delete_key(f"{VOTE_PREFIX}{old}/{k}")

    # ------------------------------------------------------------------ arrival marks

    def mark(self, spec: GroupSpec, point: str) -> None:
        """Count one more arrival of this rank at ``point`` on the group's current generation."""
        store = self._store()
        if store is None:
            return
        try:
            self._marks[(spec.store_prefix, point)] = store.add(self._mark_key(spec, point, self.rank), 1)
        except Exception as e:  # noqa: BLE001 - a mark only serves an error message
            log.warning("rank %d: could not mark arrival at %r on group %r in the rendezvous store: %s",
                        self.rank, point, spec.name, e)

    def absent(self, spec: GroupSpec, point: str) -> tuple[int, ...] | None:
        """Members that arrived at ``point`` fewer times than this rank (None: unknown)."""
        store, mine = self._store(), self._marks.get((spec.store_prefix, point))
        if store is None or mine is None:
            return None
        try:
            return tuple(r for r in spec.ranks if r != self.rank and store.add(self._mark_key(spec, point, r), 0) < mine)
        except Exception as e:  # noqa: BLE001
            log.warning("rank %d: could not read arrivals at %r on group %r: %s", self.rank, point, spec.name, e)
            return None

    @staticmethod
    def _mark_key(spec: GroupSpec, point: str, rank: int) -> str:
        return f"{ARRIVE_PREFIX}{spec.store_prefix}/{point}/{rank}"


__all__ = ["ARRIVE_PREFIX", "StoreBallotBox", "VOTE_PREFIX", "next_space"]
