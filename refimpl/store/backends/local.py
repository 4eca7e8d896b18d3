"""The ``local`` backend: each rank keeps a full copy of its layouts in its own pinned host buffers."""
from __future__ import annotations

from typing import Awaitable

import torch

from refimpl.runtime.base import Completion, CopyKind, Runtime, gather
from refimpl.store.backends.base import LayoutSource, Piece, StoreBackend, complement
from refimpl.store.backends.pool import HostBuffer, PinnedHostPool
from refimpl.store.config import StoreConfig
from refimpl.store.errors import StoreStateError
from refimpl.store.state.layout import FlatLayout, LayoutKey
from refimpl.store.state.storage_views import own_view


class LocalBackend(StoreBackend):
    """``local``: each rank keeps a full copy of its layouts in its own pinned host buffers.

    One :class:`HostBuffer` per layout key, pinned at exactly the layout's
    size in segments cut at storage boundaries, reused every cycle. Implements
    :class:`~refimpl.store.backends.base.StreamingBackend`.
    """

    name = "local"
    copy_ahead = True
    release_as_copied = True
    early_copies = True

    def __init__(self, runtime: Runtime, pool: PinnedHostPool, config: StoreConfig) -> None:
        super().__init__(runtime, pool, config)
        self._held: dict[LayoutKey, HostBuffer] = {}

    def reserve(self, layout: FlatLayout) -> None:
        """Pin the layout's buffer now (in the pool's background threads when it has them)."""
        self._held[layout.key] = self.pool.acquire(layout.key, layout.dtype, layout.segment_numels())

    def stream_begin(self, layout: FlatLayout) -> None:
        """Start an empty, growing pinned buffer for the layout's key."""
        self._held[layout.key] = self.pool.acquire_growing(layout.key, layout.dtype)

    def stream_reserve(self, layout: FlatLayout, numel: int) -> int:
        """Append a segment and start pinning it (on the pool's threads when it has them)."""
        return self.pool.grow(self._held[layout.key], numel)

    async def stream_copy(self, layout: FlatLayout, source: LayoutSource, index: int, start: int,
                          stop: int) -> list[Completion]:
        """Wait for segment ``index`` to be pinned, then copy the layout range into it."""
        return await source.copy_range(self._held[layout.key].segment(index), start, stop)

    def stream_end(self, layout: FlatLayout) -> None:
        """Free whatever the key's previous buffer had that the grown one did not take over."""
        self.pool.finish_growing(self._held[layout.key])

    async def offload(self, layout: FlatLayout, source: LayoutSource) -> Awaitable[None]:
        """Copy the whole layout into the key's pinned buffer (pinned on first use)."""
        host = self.pool.acquire(layout.key, layout.dtype, layout.segment_numels())
        self._held[layout.key] = host
        try:
            completions = await source.copy_to_host(host, 0, layout.numel)
        except BaseException:
            # copy_to_host waited for what it issued; a buffer that failed to pin is dropped
            if host.failed:
                self._held.pop(layout.key, None)
                self.pool.free(layout.key)
            raise
        return gather(*completions)

    async def copy_early(self, layout: FlatLayout, flat: torch.Tensor, start: int,
                         stop: int) -> list[Completion] | None:
        """One device-to-host copy of the range into the key's buffer, if it holds one of the layout's size."""
        host = self._held.get(layout.key)
        if host is None or host.numel != layout.numel or host.failed:
            return None
        return [self.rt.copy_async(host.view(start, stop), own_view(flat[start:stop]), CopyKind.D2H)]

    async def offload_rest(self, layout: FlatLayout, source: LayoutSource,
                           done: list[tuple[int, int]]) -> Awaitable[None]:
        """As :meth:`offload`, but only the ranges not in ``done``, one copy per range and host segment."""
        host = self.pool.acquire(layout.key, layout.dtype, layout.segment_numels())
        self._held[layout.key] = host
        completions: list[Completion] = []
        try:
            for a, b in complement(done, layout.numel, host.ranges()):
                completions += await source.copy_range(host.view(a, b), a, b)
        except BaseException:
            for c in completions:  # nothing issued may still write into a buffer the caller frees
                await c
            if host.failed:
                self._held.pop(layout.key, None)
                self.pool.free(layout.key)
            raise
        return gather(*completions)

    def _host_copy(self, layout: FlatLayout) -> HostBuffer:
        host = self._held.get(layout.key)
        if host is None or host.numel != layout.numel:
            raise StoreStateError(
                f"local backend holds no host copy of layout {layout.key.label()}; it was never offloaded "
                f"through this backend or was discarded"
            )
        return host

    async def reload(self, layout: FlatLayout, device_flat: torch.Tensor) -> Awaitable[None]:
        """One host-to-device copy per host segment into ``device_flat``."""
        host = self._host_copy(layout)
        completions = [
            self.rt.copy_async(own_view(device_flat[a:b]), host.segment(i), CopyKind.H2D)
            for i, (a, b) in enumerate(host.ranges())
            if b > a
        ]
        return gather(*completions)

    async def reload_pieces(self, layout: FlatLayout, device_flat: torch.Tensor, chunk_numel: int) -> list[Piece]:
        """:meth:`reload` cut into host-to-device copies of at most ``chunk_numel`` elements, each a piece."""
        return [await self.reload_piece(layout, device_flat, lo, hi)
                for lo, hi in self.piece_ranges(layout, chunk_numel)]

    def piece_ranges(self, layout: FlatLayout, chunk_numel: int) -> list[tuple[int, int]]:
        """Each host segment's range cut every ``chunk_numel`` elements."""
        step = max(1, int(chunk_numel))
        return [(lo, min(b, lo + step)) for a, b in self._host_copy(layout).ranges() for lo in range(a, b, step)]

    async def reload_piece(self, layout: FlatLayout, device_flat: torch.Tensor, start: int, stop: int) -> Piece:
        """One host-to-device copy of elements ``[start, stop)`` (inside one host segment)."""
        src = self._host_copy(layout).view(start, stop)  # raises for a range across host segments
        return Piece(start, stop, self.rt.copy_async(own_view(device_flat[start:stop]), src, CopyKind.H2D))

    def host_view(self, layout: FlatLayout, start: int, stop: int) -> torch.Tensor | None:
        """A view of the pinned buffer (no copy)."""
        host = self._held.get(layout.key)
        return None if host is None else host.view(start, stop)

    def host_bytes(self) -> int:
        """Bytes of the buffers this backend holds."""
        return sum(h.nbytes for h in self._held.values())

    def discard(self, layout: FlatLayout) -> None:
        """Unpin and drop the layout's buffer."""
        if self._held.pop(layout.key, None) is not None:
            self.pool.free(layout.key)

    def close(self) -> None:
        """Drop every buffer."""
        for key in list(self._held):
            self._held.pop(key)
            self.pool.free(key)


__all__ = ["LocalBackend"]
