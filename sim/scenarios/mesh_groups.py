"""The process groups of a scenario's mesh, computed from the mesh rather than stored.

A family of groups varies along some dims of the mesh (``tp``: the ranks that differ only in their
``tp`` coordinate); it has one group per coordinate of the other dims. Rank ``r``'s coordinates are
read row-major (last dim fastest), its group of a family is numbered by its coordinates on the other
dims (row-major too), and the group is named after the family, with that number when the family has
more than one group (``tp``, ``tp0``, ``tp1``, ...).

[Note: mesh groups without a list of them]
At 131,072 ranks fourteen Megatron families make about 850,000 groups (six families of one-rank
groups alone are 786,432), and a dict of every rank's group per family 131,072 more objects: seconds
to build and hundreds of MB before anything runs, while a folded run simulates a few dozen ranks.
:class:`MeshGroups` answers every question from the mesh's sizes and strides: a rank's group of a
family, a group's members and spec (made on first use and kept), and, for the fold's checks, the
group number of every rank of a family at once (:meth:`MeshGroups.group_index_of_all`, a numpy
array). :attr:`MeshGroups.specs` and :attr:`MeshGroups.member`, every group and every rank's groups,
are still there for callers that want the lists; they are built on first use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from refimpl.runtime.base import GroupSpec

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from sim.scenarios.scenario import Scenario


@dataclass(frozen=True)
class _Family:
    """One family: its name, the dims it varies along (inner) and the others (outer), in mesh order."""

    name: str
    inner: tuple[int, ...]
    outer: tuple[int, ...]
    count: int  # groups in the family
    size: int  # ranks per group
    offsets: tuple[int, ...]  # members of a group minus its first member, ascending


class MeshGroups:
    """The groups of every family of a mesh (see [Note: mesh groups without a list of them])."""

    def __init__(self, mesh: tuple[tuple[str, int], ...], families: tuple, world_size: int):
        self.world_size = world_size
        self._sizes = [n for _, n in mesh]
        self._strides = [math.prod(self._sizes[i + 1:]) for i in range(len(self._sizes))]
        dims = [d for d, _ in mesh]
        fams = []
        for fam in families:
            inner = tuple(dims.index(d) for d in fam.dims)
            outer = tuple(i for i in range(len(dims)) if i not in inner)
            fams.append(_Family(fam.name, inner, outer, math.prod(self._sizes[i] for i in outer),
                                math.prod(self._sizes[i] for i in inner), self._offsets(inner)))
        self._families = tuple(fams)
        self._by_family = {f.name: f for f in fams}
        self._specs: dict[str, GroupSpec] = {}
        self._all_specs: list[GroupSpec] | None = None
        self._member: list[dict[str, str]] | None = None

    def _offsets(self, inner: tuple[int, ...]) -> tuple[int, ...]:
        """The members of a group varying along ``inner`` minus its first member, ascending."""
        offsets = [0]
        for i in inner:  # every combination of the inner coordinates, one dim at a time
            step, size = self._strides[i], self._sizes[i]
            offsets = [o + c * step for o in offsets for c in range(size)]
        return tuple(sorted(offsets))

    # ------------------------------------------------------------------ families and names

    @property
    def families(self) -> tuple[str, ...]:
        """The family names, in the scenario's order."""
        return tuple(f.name for f in self._families)

    def count(self, family: str) -> int:
        """Number of groups in ``family``."""
        return self._by_family[family].count

    def size(self, family: str) -> int:
        """Ranks per group of ``family``."""
        return self._by_family[family].size

    def name(self, family: str, index: int) -> str:
        """The name of group ``index`` of ``family``."""
        f = self._by_family[family]
        return f.name if f.count == 1 else f"{f.name}{index}"

    def parse(self, name: str) -> tuple[str, int]:
        """``(family, index)`` of the group called ``name``; KeyError if no group has that name."""
        for f in self._families:
            if f.count == 1:
                if name == f.name:
                    return f.name, 0
            elif name.startswith(f.name) and name[len(f.name):].isdigit():
                index = int(name[len(f.name):])
                if index < f.count and self.name(f.name, index) == name:
                    return f.name, index
        raise KeyError(name)

    # ------------------------------------------------------------------ a rank's groups

    def group_index(self, family: str, rank: int) -> int:
        """The number of ``rank``'s group in ``family``."""
        f = self._by_family[family]
        index = 0
        for i in f.outer:
            index = index * self._sizes[i] + (rank // self._strides[i]) % self._sizes[i]
        return index

    def groups_of(self, rank: int) -> dict[str, str]:
        """``rank``'s group of every family: family -> group name, in family order."""
        return {f.name: self.name(f.name, self.group_index(f.name, rank)) for f in self._families}

    # ------------------------------------------------------------------ a group

    def first_member(self, family: str, index: int) -> int:
        """The lowest rank of group ``index`` of ``family``."""
        f = self._by_family[family]
        base, rest = 0, index
        for i in reversed(f.outer):
            rest, c = divmod(rest, self._sizes[i])
            base += c * self._strides[i]
        return base

    def members(self, family: str, index: int) -> tuple[int, ...]:
        """The ranks of group ``index`` of ``family``, ascending."""
        base = self.first_member(family, index)
        return tuple(base + o for o in self._by_family[family].offsets)

    def spec(self, name: str) -> GroupSpec:
        """The spec of group ``name`` (made on first use, then the same object)."""
        spec = self._specs.get(name)
        if spec is None:
            family, index = self.parse(name)
            spec = self._specs[name] = GroupSpec(name, self.members(family, index), backend="nccl")
        return spec

    def specs_of(self, family: str) -> Iterator[GroupSpec]:
        """Every group of ``family``, in order."""
        for index in range(self._by_family[family].count):
            yield self.spec(self.name(family, index))

    # ------------------------------------------------------------------ everything (lists, arrays)

    @property
    def specs(self) -> list[GroupSpec]:
        """Every group of every family, family by family (built on first use)."""
        if self._all_specs is None:
            self._all_specs = [s for f in self._families for s in self.specs_of(f.name)]
        return self._all_specs

    @property
    def member(self) -> list[dict[str, str]]:
        """Every rank's :meth:`groups_of` (built on first use)."""
        if self._member is None:
            self._member = [self.groups_of(r) for r in range(self.world_size)]
        return self._member

    def first_members(self, family: str) -> "np.ndarray":
        """:meth:`first_member` of every group of ``family`` (an int64 array indexed by group number)."""
        import numpy as np

        f = self._by_family[family]
        rest = np.arange(f.count, dtype=np.int64)
        base = np.zeros(f.count, dtype=np.int64)
        for i in reversed(f.outer):
            base += (rest % self._sizes[i]) * self._strides[i]
            rest //= self._sizes[i]
        return base

    def group_index_of_all(self, family: str) -> "np.ndarray":
        """The number of every rank's group in ``family`` (an int64 array indexed by rank)."""
        import numpy as np

        f = self._by_family[family]
        ranks = np.arange(self.world_size, dtype=np.int64)
        index = np.zeros(self.world_size, dtype=np.int64)
        for i in f.outer:
            index = index * self._sizes[i] + (ranks // self._strides[i]) % self._sizes[i]
        return index


def mesh_groups(scn: "Scenario") -> MeshGroups:
    """The groups of ``scn``'s families over its mesh (row-major, last dimension fastest)."""
    return MeshGroups(scn.mesh, scn.groups, scn.world_size)


__all__ = ["MeshGroups", "mesh_groups"]
