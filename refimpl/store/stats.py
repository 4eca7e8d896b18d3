"""What the offload store reports: :class:`StoreStats`, built from the typed figures its operations return
(:class:`OffloadFigures`, :class:`ReloadFigures`, counted in :class:`StoreFigures`), and the phase clock behind
their timings."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from refimpl.runtime.base import Runtime


@dataclass(frozen=True)
class StoreStats:
    """What the store holds and what its last offload/reload did.

    ``host_pinned_bytes``: pinned host memory the store's pool holds now (the
    resident high-water mark); ``registrations``/``reuses``: host segments
    pinned / handed out again without pinning. ``bytes_by_category``: device
    bytes of the state planned at the last offload, by category value.
    ``last_device_bytes_freed``: rise of the driver's free device memory over
    the last offload (``Runtime.memory_info``, not allocator counters).
    ``last_early_releases``: storages released as soon as their own copies
    completed (backends with ``release_as_copied``), overlapping the rest of the
    DMA (the name predates "release as copied": records and dashboards read it).
    ``copies``: copies the last offload issued, by path (``flat``: resident
    layouts; ``direct``: one per storage; ``packed``: one per staging buffer).
    """

    backend: str
    host_pinned_bytes: int
    host_pageable_bytes: int
    backend_host_bytes: int
    registrations: int
    reuses: int
    pageable_fallbacks: int
    bytes_by_category: dict[str, int]
    offloaded: tuple[str, ...]
    layouts: int
    storages: int
    tensors: int
    skipped_zero_size: int
    skipped_host_resident: int
    offloads: int
    reloads: int
    last_offload_s: float
    last_reload_s: float
    last_offload_bytes: int
    last_reload_bytes: int
    last_device_bytes_freed: int
    #: storages the last offload released while later copies were still in flight
    last_early_releases: int
    #: offloads that found the state as the last reload left it with the fast check (no full collection)
    steady_fast_offloads: int = 0
    copies: dict[str, int] = field(default_factory=dict)
    #: seconds per phase of the last offload (``offload.collect`` ...) and reload (``reload.wait`` ...)
    phases: dict[str, float] = field(default_factory=dict)
    #: the path the last offload took (its path's name, :mod:`refimpl.store.moves.offload_paths`): ``streamed`` (first
    #: offload, streaming backend), ``steady`` (unchanged since the reload), ``full``; "" before any
    last_offload_path: str = ""
    #: the last offload's early copies ([Note: early copies] in refimpl.store.moves.early): bytes
    #: ``OffloadStore.copy_early`` queued before it, bytes it took over, bytes it found changed since and copied
    #: again, and tensors ``copy_early`` skipped (not in a resident flat buffer; the offload copied them)
    last_early_copy_bytes: int = 0
    last_early_reused_bytes: int = 0
    last_early_redone_bytes: int = 0
    last_early_skipped: int = 0
    #: of :attr:`last_early_copy_bytes`, the bytes copied while a streamed reload was still filling their layout
    #: ([Note: early copies while a reload streams] in refimpl.store.moves.early)
    last_early_streaming_bytes: int = 0
    #: tensors of the last reload's ``use_order`` it held, its pieces issued in their order (0 without one)
    last_reload_ordered: int = 0

    @classmethod
    def of(cls, figures: "StoreFigures", **now: Any) -> "StoreStats":
        """Stats from the store's ``figures`` (its counts and the last offload's and reload's figures) and the
        fields computed ``now`` (host memory, layouts)."""
        off, back = figures.last_offload, figures.last_reload
        return cls(offloads=figures.offloads, reloads=figures.reloads, steady_fast_offloads=figures.steady_fast_offloads,
                   last_offload_s=off.seconds, last_reload_s=back.seconds, last_offload_bytes=off.moved_bytes,
                   last_reload_bytes=back.moved_bytes, last_device_bytes_freed=off.device_bytes_freed,
                   last_early_releases=off.released_as_copied, skipped_zero_size=off.skipped_zero_size,
                   skipped_host_resident=off.skipped_host_resident, copies=dict(off.copies),
                   phases={**off.phases, **back.phases}, last_offload_path=off.path,
                   last_early_copy_bytes=off.early_copy_bytes, last_early_reused_bytes=off.early_reused_bytes,
                   last_early_redone_bytes=off.early_redone_bytes, last_early_skipped=off.early_skipped,
                   last_early_streaming_bytes=off.early_streaming_bytes, last_reload_ordered=back.ordered_tensors,
                   **now)

    @property
    def host_pinned_gb(self) -> float:
        """:attr:`host_pinned_bytes` in GB (10**9 bytes)."""
        return self.host_pinned_bytes / 1e9

    @property
    def state_bytes(self) -> int:
        """Device bytes of the planned state, all categories."""
        return sum(self.bytes_by_category.values())


@dataclass
class OffloadFigures:
    """What one offload did. Its :class:`~refimpl.store.moves.offload.Offload` fills the fields its stages know as
    they pass and returns it; the store adds what spans the whole call (``seconds``, ``device_bytes_freed``, and
    the early copies queued before it)."""

    #: the path it took (``streamed``, ``steady``, ``full``; see :mod:`refimpl.store.moves.offload_paths`)
    path: str = ""
    #: bytes copied to host memory (gradients dropped without a copy are not counted)
    moved_bytes: int = 0
    #: seconds of the whole call, on the runtime's clock
    seconds: float = 0.0
    #: rise of the driver's free device memory over the call (``Runtime.memory_info``)
    device_bytes_freed: int = 0
    #: copies issued, by path (``flat``, ``direct``, ``packed``)
    copies: dict[str, int] = field(default_factory=dict)
    #: storages released as their own copies completed, while later copies ran
    released_as_copied: int = 0
    #: registered tensors left out: zero-size ones, and host-resident ones left in place
    skipped_zero_size: int = 0
    skipped_host_resident: int = 0
    #: early copies: bytes ``OffloadStore.copy_early`` queued before the offload, bytes it took over, bytes it
    #: found changed and copied again, and tensors ``copy_early`` skipped
    early_copy_bytes: int = 0
    early_reused_bytes: int = 0
    early_redone_bytes: int = 0
    early_skipped: int = 0
    #: of ``early_copy_bytes``, those copied while a streamed reload was still filling their layout
    early_streaming_bytes: int = 0
    #: seconds of each phase (``offload.<phase>``), on the runtime's clock
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class ReloadFigures:
    """What one reload did, returned by :meth:`Reload.run <refimpl.store.moves.reload.Reload.run>` (the store adds
    ``seconds``)."""

    #: bytes brought back (a streamed reload: bytes on their way while ``streaming``)
    moved_bytes: int = 0
    #: seconds of the whole call, on the runtime's clock
    seconds: float = 0.0
    #: seconds of each phase (``reload.<phase>``)
    phases: dict[str, float] = field(default_factory=dict)
    #: the reload's copies are still in flight behind the arrival guards (a streamed reload)
    streaming: bool = False
    #: tensors of the caller's ``use_order`` this reload held (its pieces issued in that order)
    ordered_tensors: int = 0


@dataclass
class StoreFigures:
    """What one store's operations did over its life: how many offloads and reloads, and the last one of each."""

    offloads: int = 0
    reloads: int = 0
    #: offloads that took the steady path (the fast check found every tensor where the reload put it)
    steady_fast_offloads: int = 0
    last_offload: OffloadFigures = field(default_factory=OffloadFigures)
    last_reload: ReloadFigures = field(default_factory=ReloadFigures)

    def count_offload(self, figures: OffloadFigures) -> None:
        """A completed offload's figures."""
        self.offloads += 1
        self.steady_fast_offloads += figures.path == "steady"
        self.last_offload = figures

    def count_reload(self, figures: ReloadFigures) -> None:
        """A completed reload's figures."""
        self.reloads += 1
        self.last_reload = figures


class PhaseClock:
    """Seconds between successive :meth:`lap` calls, on the runtime's clock."""

    def __init__(self, rt: Runtime, prefix: str) -> None:
        self.rt, self.prefix = rt, prefix
        self.last = rt.now()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        """Record the seconds since the previous lap (or the clock's start) as ``"<prefix>.<name>"``."""
        now = self.rt.now()
        self.laps[f"{self.prefix}.{name}"] = now - self.last
        self.last = now


__all__ = ["OffloadFigures", "PhaseClock", "ReloadFigures", "StoreFigures", "StoreStats"]
