"""Votes: ranks settle one outcome that every one of them reads the same, also when some never arrive.

Theory of operation
-------------------
A collective with a timeout cannot make ranks agree on how an operation ended.
A rank that gives up does not know whether its peers completed, and a peer that
comes late finds the collective abandoned (Gloo closes the pair; NCCL's watchdog
aborts) or, in the simulator, completes it on stale inputs. Two ranks can then
take different branches: one commits an offload, the other rolls it back.

:meth:`Runtime.vote <refimpl.runtime.base.Runtime.vote>` settles an outcome by
one atomic decision instead:

* every rank of ``ranks`` casts a :class:`Ballot` under one key: its rank, the
  point it is at (``"offload.commit"``), a code (0: done here; anything else: a
  failure) and a set of small non-negative integers (``marks``) that the vote
  ORs together (which categories a rank laid out, which groups it saw destroyed);
* the rank whose ballot is the last one in decides ``complete``;
* a rank that waited ``timeout_s`` without a decision decides "timed out",
  naming the ranks whose ballots were missing;
* the first decision stands (a compare-and-set in the job's rendezvous store
  for :class:`~refimpl.torch_runtime.TorchRuntime`; the event order in the
  simulator), and every rank reads that one :class:`Verdict`, including a rank
  whose ballot arrives after a peer gave up.

So a vote never splits: every rank sees every ballot, or every rank sees the same
timeout naming the same absent ranks. The key carries what the vote is about
(protocol code uses ``<space>/<sequence number>``, its space named by what its votes are about:
:func:`space_name`), and the ballots carry their
point, so ranks that met at different operations see the mismatch
(:attr:`Verdict.points` has more than one entry) instead of pairing stale votes.

A rank that has failed casts its ballot and leaves without waiting
(``wait=False``): its own outcome is already known, and its ballot is what its
peers need.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence


class VoteError(RuntimeError):
    """A vote could not be cast or read (the rendezvous store is unreachable, a ballot is malformed)."""


@dataclass(frozen=True)
class Ballot:
    """One rank's ballot: where it is, how it went there (0: fine), and marks to OR into the outcome."""

    rank: int
    point: str
    code: int = 0
    marks: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.point or any(c in self.point for c in "|;,"):
            raise VoteError(f"a ballot's point must be a non-empty name without '|', ';' or ',', got {self.point!r}")
        marks = frozenset(int(m) for m in self.marks)
        if any(m < 0 for m in marks):
            raise VoteError(f"ballot marks must be non-negative integers, got {sorted(marks)}")
        object.__setattr__(self, "marks", marks)
        object.__setattr__(self, "code", int(self.code))

    def record(self) -> str:
        """The ballot as one ``;``-terminated record (``rank|point|code|m1,m2``), for an append-only store key."""
        return f"{self.rank}|{self.point}|{self.code}|{','.join(map(str, sorted(self.marks)))};"

    @staticmethod
    def parse(records: str) -> list["Ballot"]:
        """The ballots of a string of records (:meth:`record`), in arrival order."""
        out = []
        for rec in records.split(";"):
            if not rec:
                continue
            try:
                rank, point, code, marks = rec.split("|")
                out.append(Ballot(int(rank), point, int(code), frozenset(int(m) for m in marks.split(",") if m)))
            except ValueError as e:
                raise VoteError(f"malformed ballot record {rec!r}: {e}") from None
        return out


@dataclass(frozen=True)
class Verdict:
    """How a vote was settled; every rank that takes part reads the same one.

    ``complete``: every rank's ballot was in before anyone gave up. ``failures``:
    rank -> non-zero code of the ballots counted. ``marks``: the union of the
    counted ballots' marks. ``points``: point -> ranks that cast a ballot there
    (one entry when the ranks met at the same operation). ``absent``: ranks
    without a ballot when the vote was settled (empty when complete).
    ``decided_by``: the rank whose arrival (complete) or timeout settled it.
    """

    key: str
    complete: bool
    failures: dict[int, int]
    marks: frozenset[int]
    points: dict[str, tuple[int, ...]]
    absent: tuple[int, ...]
    decided_by: int
    timeout_s: float

    @classmethod
    def settle(cls, key: str, ranks: Sequence[int], ballots: Iterable[Ballot], *, decided_by: int,
               timeout_s: float, complete: bool) -> "Verdict":
        """The verdict of ``ballots`` (the first ballot of each rank counts; ballots of other ranks are ignored)."""
        members = set(ranks)
        seen: dict[int, Ballot] = {}
        for b in ballots:
            if b.rank in members and b.rank not in seen:
                seen[b.rank] = b
        points: dict[str, list[int]] = {}
        for r in sorted(seen):
            points.setdefault(seen[r].point, []).append(r)
        marks: frozenset[int] = frozenset().union(*(b.marks for b in seen.values()))
        return cls(key=key, complete=complete and len(seen) == len(members),
                   failures={r: b.code for r, b in sorted(seen.items()) if b.code},
                   marks=marks, points={p: tuple(rs) for p, rs in points.items()},
                   absent=tuple(sorted(members - set(seen))),
                   decided_by=decided_by, timeout_s=timeout_s)

    @property
    def agreed(self) -> bool:
        """Every rank arrived, at the same point, and none failed."""
        return self.complete and not self.failures and len(self.points) <= 1

    def encode(self) -> str:
        """JSON of the verdict (what TorchRuntime stores as the decision)."""
        return json.dumps({"key": self.key, "complete": self.complete,
                           "failures": [[r, c] for r, c in self.failures.items()], "marks": sorted(self.marks),
                           "points": self.points, "absent": list(self.absent), "decided_by": self.decided_by,
                           "timeout_s": self.timeout_s}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> "Verdict":
        """The verdict :meth:`encode` wrote."""
        try:
            d = json.loads(text)
            return cls(key=d["key"], complete=bool(d["complete"]), failures={int(r): int(c) for r, c in d["failures"]},
                       marks=frozenset(int(m) for m in d["marks"]),
                       points={p: tuple(int(r) for r in rs) for p, rs in d["points"].items()},
                       absent=tuple(int(r) for r in d["absent"]), decided_by=int(d["decided_by"]),
                       timeout_s=float(d["timeout_s"]))
        except (ValueError, KeyError, TypeError) as e:
            raise VoteError(f"malformed verdict {text!r}: {e}") from None

    def describe(self) -> str:
        """One line for error messages: who was absent, who failed, where the ranks were."""
        parts = []
        if not self.complete:
            parts.append(f"ranks {list(self.absent)} did not arrive within {self.timeout_s:g} s "
                         f"(rank {self.decided_by} gave up)")
        if self.failures:
            parts.append("failed on " + ", ".join(f"rank {r} (code {c})" for r, c in self.failures.items()))
        if len(self.points) > 1:
            parts.append("ranks at different operations: " + "; ".join(
                f"{list(rs)} at {p!r}" for p, rs in self.points.items()))
        return ", ".join(parts) or "agreed"


def space_name(kind: str, about: str, n: int) -> str:
    """The name of the ``n``-th key space of ``kind`` about ``about`` (:meth:`Runtime.vote_space
    <refimpl.runtime.base.Runtime.vote_space>`): ``"<kind>.<n>"``, or ``"<kind>.<crc32 of about, hex>.<n>"``.

    Spaces of one kind about different things (two stores, two roles of one process) are numbered apart, so ranks
    that create them in different orders still give each the same name: their votes cannot pair."""
    if not about:
        return f"{kind}.{n}"
    return f"{kind}.{zlib.crc32(about.encode()):08x}.{n}"


def single_rank_verdict(key: str, ballot: Ballot, timeout_s: float) -> Verdict:
    """The verdict of a vote among one rank (no store, no waiting)."""
    return Verdict.settle(key, (ballot.rank,), (ballot,), decided_by=ballot.rank, timeout_s=timeout_s, complete=True)


__all__ = ["Ballot", "Verdict", "VoteError", "single_rank_verdict", "space_name"]
