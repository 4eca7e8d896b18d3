"""How every ``local_dedup`` offload and reload ends the same way on every rank: the outcome votes.

[Note: the outcome votes]
A replicated layout is kept 1/N per member, so an offload that completed on
some members and rolled back on others would leave the first holding slices
whose other parts nobody keeps: their reload waits for an all-gather the
others never join. A reload that failed on one member while its peers finished
leaves that member unable to ever reload. So the outcome of each operation is
settled by a vote (:meth:`Runtime.vote <refimpl.runtime.base.Runtime.vote>`,
:mod:`refimpl.runtime.votes`) among all ranks, which every rank reads the same,
also a rank that arrives after a peer gave up:

* offload: ``offload.begin`` before the replica checks (the marks carry which
  ranks found new replica groups and which agreed groups a rank sees
  destroyed: every rank then rebuilds the union, in one order), then
  ``offload.commit`` once every copy completed, before any device memory is
  released (the code carries the replica checks' result; the marks say which
  categories each replica group holds, which later reloads use);
* reload, when a chosen category has replicated layouts on any rank:
  ``reload.begin`` (which groups to rebuild first: only those the chosen
  categories use) and ``reload.commit`` once every all-gather completed.

Every rank casts exactly one ballot per step it reaches: a rank that fails
casts its failure at the next vote of the operation (``settle_*`` of
:class:`~refimpl.store.backends.base.StoreBackend`) and leaves; its peers read
the failure and undo their part. A rank that never arrives makes the vote time
out, and every rank's error names it. The votes' keys are
``local_dedup.<n>/<sequence>.<attempt>`` (``n`` numbers the backends of a
rank, :meth:`Runtime.vote_space <refimpl.runtime.base.Runtime.vote_space>`:
ranks create their stores in the same order), and a ballot carries its point,
so ranks at different operations get :class:`OperationMismatchError`.

Reloading layouts that need no peer runs no vote when no chosen category has a
replicated layout on any rank (known from the ``offload.commit`` marks); one
rank alone brings back its rank-local layouts with ``reload(local_only=True)``.
"""
from __future__ import annotations

import enum
import logging
from typing import Iterable

from refimpl.runtime.base import CollectiveFailedError, CollectiveTimeoutError, PinningError, Runtime
from refimpl.runtime.votes import Verdict, VoteError
from refimpl.store.backends.dedup_config import (
    LayoutMismatchError, OperationMismatchError, PeerFailedError, PeerUnavailableError,
    ReplicaMismatchError,
)

log = logging.getLogger(__name__)


class Stage(enum.Enum):
    """Where this rank is in the votes of the operation in progress."""

    IDLE = "idle"  # no vote cast yet in this operation
    BEGUN = "begun"  # the first vote agreed; the commit vote is next
    SETTLED = "settled"  # a vote ended the operation (not agreed); no more ballots in it


class Code(enum.IntEnum):
    """What a rank's ballot says about its part of an operation."""

    OK = 0
    FAILED = 1
    LAYOUT_MISMATCH = 2
    CONTENT_MISMATCH = 3
    PINNING = 4
    PEER = 5

    @property
    def words(self) -> str:
        """How a message names it."""
        return {Code.OK: "done", Code.FAILED: "an error", Code.LAYOUT_MISMATCH: "a replica layout mismatch",
                Code.CONTENT_MISMATCH: "replicas that differ", Code.PINNING: "host memory that could not be pinned",
                Code.PEER: "a peer that failed or vanished"}[self]


def code_of(error: BaseException) -> Code:
    """The ballot code for a rank that failed with ``error``."""
    if isinstance(error, PinningError):
        return Code.PINNING
    if isinstance(error, LayoutMismatchError):
        return Code.LAYOUT_MISMATCH
    if isinstance(error, ReplicaMismatchError):
        return Code.CONTENT_MISMATCH
    if isinstance(error, (CollectiveTimeoutError, CollectiveFailedError, PeerFailedError)):
        return Code.PEER
    return Code.FAILED


def _words(code: int) -> str:
    try:
        return Code(code).words
    except ValueError:
        return f"code {code}"


_AFTER = {
    "offload": "the offload was undone on every rank that took part: the state is on the device",
    "reload": "the state stays offloaded on every rank that took part (host copies kept)",
}
_RETRY = {
    "offload": "offload again on every rank",
    "reload": "reload again on every rank; a rank's own state comes back alone with reload(local_only=True)",
}


class OutcomeVotes:
    """The outcome votes of one ``local_dedup`` backend (see the module note): their keys, timeout and errors."""

    def __init__(self, rt: Runtime, timeout_s: float) -> None:
        self.rt, self.timeout_s = rt, timeout_s
        self.space = rt.vote_space("local_dedup")
        #: the next vote's sequence number, and its attempt (see :meth:`begin`)
        self.seq = 0
        self.attempt = 0

    async def _cast(self, point: str, code: int, marks: Iterable[int], wait: bool) -> Verdict | None:
        rt = self.rt
        return await rt.vote(f"{self.space}/{self.seq}.{self.attempt}", range(rt.world_size), point, code, marks,
                             timeout_s=self.timeout_s, wait=wait)

    async def begin(self, point: str, code: int = 0, marks: Iterable[int] = ()) -> Verdict:
        """The operation's first vote. Complete: the next vote is the next sequence number. Timed out: the
        operation did not start anywhere, so the next operation votes again at this number (its next attempt);
        a rank whose ballot came after a peer gave up joins that next attempt at once (or, with a failure
        ``code``, leaves it to its next operation)."""
        while True:
            verdict = await self._cast(point, code, marks, True)
            assert verdict is not None
            self.attempt += 1
            if self.rt.rank in verdict.absent and not code:
                continue
            if verdict.complete:
                self.seq, self.attempt = self.seq + 1, 0
            return verdict

    async def commit(self, point: str, code: int = 0, marks: Iterable[int] = (), *,
                     wait: bool = True) -> Verdict | None:
        """The operation's last vote (after a complete :meth:`begin`): whatever its verdict, the operation is over."""
        try:
            return await self._cast(point, code, marks, wait)
        finally:
            self.seq, self.attempt = self.seq + 1, 0

    async def cast_failure(self, point: str, error: BaseException, *, begun: bool) -> None:
        """Tell the peers this rank failed, at the operation's commit vote (``begun``) or its begin vote. Never
        raises: the caller raises ``error``."""
        try:
            if begun:
                await self.commit(point, code_of(error), wait=False)
            else:
                await self.begin(point, code_of(error))
        except (VoteError, RuntimeError) as e:
            log.error("rank %d: could not cast the failure of a local_dedup step at %r (%s); peers will time out "
                      "instead", self.rt.rank, point, e)

    def raise_unless_agreed(self, verdict: Verdict, op: str, problems: Iterable[str] = ()) -> None:
        """Raise the error that says why ``verdict`` is not agreed (nothing if it is); ``op``: offload or reload."""
        if verdict.agreed:
            return
        r = self.rt.rank
        if len(verdict.points) > 1:
            raise OperationMismatchError(
                f"rank {r}: local_dedup vote {verdict.key!r}: the ranks were at different operations ("
                + "; ".join(f"ranks {list(rs)} at {p!r}" for p, rs in verdict.points.items())
                + "). Every rank must call offload and reload in the same order; "
                f"{_AFTER[op]}.")
        if r in verdict.absent:
            raise PeerUnavailableError(
                f"rank {r}: came to the local_dedup {op} vote {verdict.key!r} after rank {verdict.decided_by} stopped "
                f"waiting ({verdict.timeout_s:g} s, DedupConfig.timeout_s): the others gave up on this {op}, so "
                f"{_AFTER[op]}. Keep the ranks' calls within the timeout of each other, then {_RETRY[op]}.",
                verdict.absent)
        if not verdict.complete:
            raise PeerUnavailableError(
                f"rank {r}: local_dedup {op}: ranks {list(verdict.absent)} did not take part within "
                f"{verdict.timeout_s:g} s (DedupConfig.timeout_s; rank {verdict.decided_by} stopped waiting): they "
                f"are dead, hung, or not calling {op} with the others. {_AFTER[op].capitalize()}; once they are back, "
                f"{_RETRY[op]}.", verdict.absent)
        codes = set(verdict.failures.values())
        if op == "offload" and codes & {Code.LAYOUT_MISMATCH, Code.CONTENT_MISMATCH}:
            err = LayoutMismatchError if Code.LAYOUT_MISMATCH in codes else ReplicaMismatchError
            detail = "; ".join(problems) or "a replica group of other ranks failed the check"
            raise err(f"rank {r}: local_dedup refused to offload: {detail}. A wrong replica inference would "
                      f"overwrite one rank's state with another's on reload. Nothing was released: the state is on "
                      f"the device on every rank.")
        failed = tuple(verdict.failures)
        raise PeerFailedError(
            f"rank {r}: local_dedup {op} failed on "
            + ", ".join(f"rank {k} ({_words(c)})" for k, c in verdict.failures.items())
            + f"; so that every rank ends alike, {_AFTER[op]}. See the log of rank(s) {list(failed)} for the cause, "
            f"then {_RETRY[op]}.", failed)


def peer_error(rt: Runtime, group: str, point: str, error: BaseException) -> BaseException:
    """The error for a replica-group collective at ``point`` that ``error`` (a timeout or failure) ended: it names the
    members that never reached it (:meth:`Runtime.absent_ranks`). A failure every member reached comes back as it was
    (a peer gave up on the group, or the transport broke)."""
    timed_out = isinstance(error, CollectiveTimeoutError)
    absent = rt.absent_ranks(group, point) or ()
    if not absent and not timed_out:
        return error
    who = (f"ranks {list(absent)} never reached it (dead, hung, or failed before it)" if absent else
           "every member reached it, so one died or hung inside it")
    how = "timed out" if timed_out else "failed"
    return PeerUnavailableError(f"rank {rt.rank}: {point} over replica group {group!r} {how}: {who}. The group is torn "
                                f"down; the next operation on every rank rebuilds it. ({error})", tuple(absent))


__all__ = ["Code", "OutcomeVotes", "Stage", "code_of", "peer_error"]
