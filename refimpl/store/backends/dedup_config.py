"""Options, errors and slice arithmetic of the ``local_dedup`` backend (:mod:`refimpl.store.backends.dedup`).

* :class:`DedupConfig`: the backend's options (replica policy, alignment, content check, timeouts).
* :class:`MemberSlice`: which elements of a replicated layout one member of its replica group keeps.
* :class:`ReplicaShare`: what one rank holds of a replicated layout (for stats).
* The backend's errors: :class:`DedupError` and its kinds.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from refimpl.runtime.base import CollectiveTimeoutError
from refimpl.runtime.errors import DedupError, PeerFailedError  # one class with the lifecycle's
from refimpl.store.backends.replica import ReplicaGroup, ReplicaPolicy
from refimpl.store.debug import debug_mode


class ReplicaMismatchError(DedupError):
    """Tensors resolved as replicated differ across their replica group."""


class LayoutMismatchError(DedupError):
    """Members of a replica group laid out different tensors for the same layout."""


class PeerUnavailableError(DedupError, CollectiveTimeoutError):
    """Other ranks did not take part in a ``local_dedup`` step within ``DedupConfig.timeout_s``.

    ``ranks``: the ranks that never arrived (dead, hung, or not making the same call); empty when every
    member arrived and one died or hung inside the collective.
    """

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


class OperationMismatchError(DedupError):
    """Ranks met at different ``local_dedup`` operations: they called offload and reload in different orders."""


@dataclass(frozen=True)
class DedupConfig:
    """Options of the ``local_dedup`` backend.

    ``policy``: how entries map to replica groups (data-parallel ranks,
    overrides). ``align_bytes``: each rank's slice is a multiple of this many
    bytes. ``verify_replicas``: hash-check replicated tensors at offload:
    ``None`` (default) when a layout is new or changed, and at every offload in
    debug mode (env ``TIMESHARE_DEBUG=1``); ``True`` at every offload;
    ``False`` never. ``timeout_s``: timeout of the replica groups' collectives
    (a reload some member does not join fails after it).
    ``local_world_size``: ranks per host, for the multi-host warning; ``None``
    reads env ``LOCAL_WORLD_SIZE`` (no check when neither is set).
    ``group_backend``: backend of the replica groups (``None``: runtime default).
    ``groups``: every replica group of the job, declared up front (e.g.
    :meth:`MeshTopology.groups_over`); spares the group exchange, and is
    required on runtimes whose collectives move no data (meta payloads).
    """

    policy: ReplicaPolicy = field(default_factory=ReplicaPolicy)
    align_bytes: int = 64
    verify_replicas: bool | None = None
    local_world_size: int | None = None
    group_backend: str | None = None
    groups: tuple[ReplicaGroup, ...] | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"DedupConfig.timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.groups is not None:
            groups = tuple(self.groups)
            if not all(isinstance(g, ReplicaGroup) for g in groups):
                raise ValueError("DedupConfig.groups must be ReplicaGroup objects")
            object.__setattr__(self, "groups", tuple(sorted({g for g in groups if not g.trivial})))
        if self.align_bytes < 1:
            raise ValueError(f"DedupConfig.align_bytes must be >= 1, got {self.align_bytes}")
        if self.local_world_size is not None and self.local_world_size < 1:
            raise ValueError(f"DedupConfig.local_world_size must be >= 1, got {self.local_world_size}")
        if not isinstance(self.policy, ReplicaPolicy):
            raise ValueError(f"DedupConfig.policy must be a ReplicaPolicy, got {type(self.policy).__name__}")

    @property
    def verify(self) -> bool:
        """Whether every offload hash-checks replicated tensors (``True``, or ``None`` in debug mode)."""
        return debug_mode() if self.verify_replicas is None else bool(self.verify_replicas)

    @property
    def verify_changed(self) -> bool:
        """Whether an offload hash-checks the replicated tensors of new or changed layouts (not ``False``)."""
        return self.verify_replicas is not False

    def ranks_per_host(self) -> int | None:
        """Ranks per host from the config or env ``LOCAL_WORLD_SIZE``; None if unknown."""
        if self.local_world_size is not None:
            return self.local_world_size
        env = os.environ.get("LOCAL_WORLD_SIZE")
        if env is None:
            return None
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"env LOCAL_WORLD_SIZE={env!r} is not an integer; fix it or set "
                             "DedupConfig.local_world_size") from None
        return value if value > 0 else None


# --------------------------------------------------------------------------- slices


@dataclass(frozen=True)
class MemberSlice:
    """Which elements of a layout of ``numel`` elements member ``index`` of ``group_size`` keeps."""

    numel: int
    group_size: int
    index: int
    chunk: int

    @classmethod
    def balanced(cls, numel: int, group_size: int, index: int, *, itemsize: int, align_bytes: int = 64) -> "MemberSlice":
        """Equal chunks of ``ceil(numel/group_size)`` elements, rounded up to ``align_bytes``."""
        if numel < 0 or group_size < 1 or not 0 <= index < group_size or itemsize < 1:
            raise ValueError(f"bad slice request: numel={numel} group_size={group_size} index={index} "
                             f"itemsize={itemsize}")
        align = math.lcm(align_bytes, itemsize) // itemsize
        chunk = -(-numel // group_size)
        chunk = -(-chunk // align) * align if chunk else 0
        return cls(numel, group_size, index, chunk)

    @property
    def start(self) -> int:
        """First layout element of this member's slice (may be >= numel: all padding)."""
        return min(self.index * self.chunk, self.numel)

    @property
    def stop(self) -> int:
        """One past the last real element of the slice."""
        return min((self.index + 1) * self.chunk, self.numel)

    @property
    def valid(self) -> int:
        """Real (non-padding) elements in the slice."""
        return self.stop - self.start

    @property
    def padded_numel(self) -> int:
        """Elements of the device buffer the all-gather fills: ``group_size * chunk``."""
        return self.group_size * self.chunk

    def overlap(self, offset: int, numel: int) -> tuple[int, int, int] | None:
        """Part of layout range ``[offset, offset+numel)`` inside the slice.

        Returns ``(offset into the range, offset into the slice, count)`` or
        ``None`` when they do not overlap.
        """
        lo, hi = max(offset, self.start), min(offset + numel, self.stop)
        if lo >= hi:
            return None
        return lo - offset, lo - self.start, hi - lo


@dataclass(frozen=True)
class ReplicaShare:
    """One replicated layout as this rank holds it: the whole layout's bytes and the slice kept here."""

    group: ReplicaGroup
    layout: str
    layout_bytes: int
    host_bytes: int

    @property
    def fraction(self) -> float:
        """Host bytes kept here over the layout's bytes (about 1/N)."""
        return self.host_bytes / self.layout_bytes if self.layout_bytes else 0.0


__all__ = ["DedupConfig", "DedupError", "LayoutMismatchError", "MemberSlice", "OperationMismatchError",
           "PeerFailedError", "PeerUnavailableError", "ReplicaMismatchError", "ReplicaShare"]
