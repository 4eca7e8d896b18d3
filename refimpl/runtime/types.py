"""The seam's vocabulary: reductions, copy directions, errors and the data a runtime hands out.

Everything here is re-exported by :mod:`refimpl.runtime.base` (and :mod:`refimpl.runtime`), the
import path protocol code uses; it lives apart so the seam's interface reads on its own.
"""
from __future__ import annotations

import copy
import enum
import functools
from dataclasses import dataclass, field
from typing import Any


class ReduceOp(enum.Enum):
    """Reductions supported by :meth:`Runtime.all_reduce`."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"


class CopyKind(enum.Enum):
    """Direction of a :meth:`Runtime.copy_async`."""

    D2H = "d2h"
    H2D = "h2d"
    D2D = "d2d"


# --------------------------------------------------------------------------- errors


class RuntimeSeamError(RuntimeError):
    """Base class of errors raised through the runtime seam."""


class GroupError(RuntimeSeamError):
    """A group operation was invalid: unknown name, duplicate, not a member, destroyed."""


class GroupSuspendedError(GroupError):
    """A collective was issued on a group whose communicator is suspended."""


class CollectiveTimeoutError(RuntimeSeamError):
    """A collective did not complete within its ``timeout_s``."""


class CollectiveFailedError(RuntimeSeamError):
    """A collective failed (NCCL error, peer gone, injected fault)."""


class PinningError(RuntimeSeamError):
    """Host memory could not be pinned (ulimit -l, out of memory, driver error)."""


class AddressInUseError(RuntimeSeamError):
    """A group rebuild failed because its rendezvous port is still in TIME_WAIT."""


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class GroupSpec:
    """Everything needed to (re)create a process group with the same arguments.

    ``ranks`` are global ranks, sorted. ``backend`` is ``"nccl"``, ``"gloo"`` or
    ``None`` for the runtime's default. ``generation`` counts rebuilds; each
    generation uses a fresh store prefix so stale keys of an earlier one are
    never read.
    """

    name: str
    ranks: tuple[int, ...]
    backend: str | None = None
    timeout_s: float = 600.0
    options: tuple[tuple[str, Any], ...] = ()
    generation: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise GroupError("a group needs a non-empty name")
        if len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise GroupError(f"group {self.name!r}: ranks must be distinct and non-empty, got {self.ranks}")
        if tuple(sorted(self.ranks)) != self.ranks:
            object.__setattr__(self, "ranks", tuple(sorted(self.ranks)))
        if self.timeout_s <= 0:
            raise GroupError(f"group {self.name!r}: timeout_s must be > 0, got {self.timeout_s}")

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return len(self.ranks)

    def group_rank(self, global_rank: int) -> int:
        """Position of ``global_rank`` within this group."""
        pos = self._positions.get(global_rank)
        if pos is None:
            raise GroupError(f"rank {global_rank} is not a member of group {self.name!r} {self.ranks}")
        return pos

    def has_member(self, global_rank: int) -> bool:
        """True if ``global_rank`` is one of the group's ranks (a lookup in the position table, not a scan)."""
        return global_rank in self._positions

    @functools.cached_property
    def _positions(self) -> dict[int, int]:
        # rank -> position, built on first use: ``ranks.index`` made every member's
        # lookup O(size), so installing a 16,384-rank world group was O(n^2)
        return {r: i for i, r in enumerate(self.ranks)}

    def next_generation(self) -> "GroupSpec":
        """This group under the next generation (a rebuild): the same rank tuple and, once built, the same
        position table, shared rather than copied, so it costs no work in the group's size."""
        nxt = copy.copy(self)  # the fields and the cached position table; __post_init__'s checks already held
        object.__setattr__(nxt, "generation", self.generation + 1)
        return nxt

    @property
    def store_prefix(self) -> str:
        """``"<name>/gen<generation>"``: this generation's key prefix in the rendezvous store."""
        return f"{self.name}/gen{self.generation}"


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory as the driver sees it (``cudaMemGetInfo``), in bytes."""

    free: int
    total: int

    @property
    def used(self) -> int:
        """``total - free``: bytes in use on the device as the driver counts them (other processes' included)."""
        return self.total - self.free


@dataclass(frozen=True)
class CommMemory:
    """Memory a group's communicator holds on this rank, in bytes.

    ``suspendable`` is what a suspend frees (``ncclStatGpuMemSuspend``);
    ``persistent`` stays allocated while suspended.
    """

    suspendable: int = 0
    persistent: int = 0


@dataclass
class CopyStats:
    """Counts of copies issued through a runtime, by kind (for tests and benchmarks)."""

    count: dict[CopyKind, int] = field(default_factory=lambda: {k: 0 for k in CopyKind})
    bytes: dict[CopyKind, int] = field(default_factory=lambda: {k: 0 for k in CopyKind})

    def record(self, kind: CopyKind, nbytes: int) -> None:
        """Count one copy of ``kind`` and its ``nbytes``."""
        self.count[kind] += 1
        self.bytes[kind] += nbytes

    @property
    def host_copies(self) -> int:
        """Number of copies that crossed to or from the host (D2H plus H2D)."""
        return self.count[CopyKind.D2H] + self.count[CopyKind.H2D]


__all__ = [
    "AddressInUseError",
    "CollectiveFailedError",
    "CollectiveTimeoutError",
    "CommMemory",
    "CopyKind",
    "CopyStats",
    "GroupError",
    "GroupSpec",
    "GroupSuspendedError",
    "MemoryInfo",
    "PinningError",
    "ReduceOp",
    "RuntimeSeamError",
]
