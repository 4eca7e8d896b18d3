"""What the offload store reports: :class:`StoreStats`, and the phase clock behind its timings."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

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
    completed (backends with ``early_release``), overlapping the rest of the DMA.
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

    @classmethod
    def with_counters(cls, counters: Mapping[str, Any], **now: Any) -> "StoreStats":
        """Stats from the store's running ``counters`` (each a field of this name; dicts are copied) and the
        fields computed ``now``; a counter that is no field, or a field given twice, is an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(counters) - names)
        if unknown:
            raise ValueError(f"store counters {unknown} are not StoreStats fields; add them there")
        kept = {k: dict(v) if isinstance(v, dict) else v for k, v in counters.items()}
        return cls(**kept, **now)

    @property
    def host_pinned_gb(self) -> float:
        """:attr:`host_pinned_bytes` in GB (10**9 bytes)."""
        return self.host_pinned_bytes / 1e9

    @property
    def state_bytes(self) -> int:
        """Device bytes of the planned state, all categories."""
        return sum(self.bytes_by_category.values())


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


__all__ = ["PhaseClock", "StoreStats"]
