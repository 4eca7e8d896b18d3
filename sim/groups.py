"""The world's group objects: one :class:`GroupSpec` per group and generation, shared by every rank that knows it.

[Note: one object per group]
Every simulated rank used to hold its own copy of each group it created: its own spec of the
lifecycle's control group (a tuple of every rank of the job), its own next-generation spec after each
rebuild with its own position table (rank -> place in the group, a dict as large as the group), and a
record of its own for every group it is not a member of. Over ``N`` ranks that is O(N^2) memory for
the groups as large as the job (a 4,096-rank TP8 x DP512 run with a destroying lifecycle peaked at
3.4 GB, of which the store's state is a tenth; docs/sim.md, "Cluster scale").

:class:`GroupBook` (one per :class:`sim.SimWorld`) keeps one spec per ``(name, generation)``:

* a rank creating a group installs the book's object. The first rank to create a generation stores
  its spec; a later rank's spec is compared with it, at once when it is the same object (the
  scenario runner hands every rank the same spec), else field by field (a rank that built its own,
  as the lifecycle's control group does, pays the comparison of the rank tuple it built). A spec
  that differs stays the rank's own, so that the rendezvous reports the ranks' different arguments
  as the :class:`sim.CollectiveMismatchError` it always was;
* a rebuild on a member takes :meth:`GroupBook.next_generation`: the next generation made once, from
  the previous one, sharing its rank tuple and position table (:meth:`GroupSpec.next_generation
  <refimpl.runtime.types.GroupSpec.next_generation>`), so each member's part is a dictionary lookup;
* a rank's record of a group it is not a member of holds no per-rank data (spec and state only), so
  it is one shared, frozen :class:`OutsiderGroup` per spec and state (:meth:`GroupBook.outsider`).

What stays per rank is what differs per rank: a member's record (its sequence number, the
communicator memory it holds, its state) and one dictionary slot per group it knows.
"""
from __future__ import annotations

import dataclasses
import enum

from refimpl.runtime.base import CommMemory, GroupSpec


class GroupState(enum.Enum):
    """A group as one rank sees it."""

    LIVE = "live"
    SUSPENDED = "suspended"
    DESTROYED = "destroyed"


@dataclasses.dataclass
class RankGroup:
    """One member's record of a group: its spec, state, next seq and held comm memory."""

    spec: GroupSpec
    state: GroupState
    member: bool
    group_rank: int = -1
    seq: int = 0
    held: CommMemory = CommMemory()


@dataclasses.dataclass(frozen=True)
class OutsiderGroup:
    """A rank's record of a group it is not a member of: the same on every such rank, so shared (and frozen).

    It reads like a :class:`RankGroup` (``member`` False, no position, no sequence, no memory held); a
    change of state replaces the rank's record with another shared one (:meth:`GroupBook.outsider`).
    """

    spec: GroupSpec
    state: GroupState
    member: bool = False
    group_rank: int = -1
    seq: int = 0
    held: CommMemory = CommMemory()


class GroupBook:
    """One spec per ``(name, generation)`` and one outsider record per spec and state (see the module note)."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, int], GroupSpec] = {}
        self._outsiders: dict[tuple[str, int, GroupState], OutsiderGroup] = {}
        self._resolved: dict[int, tuple[GroupSpec, GroupSpec]] = {}

    def intern(self, spec: GroupSpec) -> GroupSpec:
        """The book's spec of ``spec``'s group and generation: ``spec`` itself if it is the first, the stored one if
        equal, else ``spec`` (another rank created that generation with other arguments: the rendezvous says so)."""
        key = (spec.name, spec.generation)
        have = self._specs.get(key)
        if have is None:
            self._specs[key] = spec
            return spec
        return have if have is spec or have == spec else spec

    def next_generation(self, spec: GroupSpec) -> GroupSpec:
        """The book's spec of ``spec``'s group under the next generation: made once, sharing ``spec``'s rank tuple and
        position table (a rank whose spec differs from the one the book holds gets its own, as :meth:`intern`)."""
        key = (spec.name, spec.generation + 1)
        have = self._specs.get(key)
        if have is None:
            have = self._specs[key] = spec.next_generation()
            return have
        same_args = (have.backend, have.timeout_s, have.options) == (spec.backend, spec.timeout_s, spec.options)
        if same_args and (have.ranks is spec.ranks or have.ranks == spec.ranks):
            return have
        return spec.next_generation()

    def outsider(self, spec: GroupSpec, state: GroupState) -> OutsiderGroup:
        """The shared record of group ``spec`` in ``state`` on the ranks that are not its members."""
        key = (spec.name, spec.generation, state)
        rec = self._outsiders.get(key)
        if rec is None or rec.spec is not spec:
            rec = self._outsiders[key] = OutsiderGroup(spec, state)
        return rec

    def resolved(self, spec: GroupSpec, default_backend: str) -> GroupSpec:
        """``spec`` with ``backend=None`` replaced by ``default_backend``, made once per spec object."""
        if spec.backend is not None:
            return spec
        hit = self._resolved.get(id(spec))
        if hit is None or hit[0] is not spec:
            hit = self._resolved[id(spec)] = (spec, dataclasses.replace(spec, backend=default_backend))
        return hit[1]


__all__ = ["GroupBook", "GroupState", "OutsiderGroup", "RankGroup"]
