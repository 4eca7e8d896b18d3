"""Reading a layout's bytes off the device: one large copy, or pack-then-copy.

Theory of operation
-------------------
A layout is either *resident* in one flat device buffer (after a reload; then
each host segment leaves in one D2H copy at line rate) or *scattered* over the
storages the framework allocated (the first offload, or after the framework
reallocated tensors). For a scattered layout, a D2H copy per storage would
pay a fixed cost per copy: a MoE state has tens of thousands of small
tensors. So storages smaller than ``pack_below_bytes`` are first packed, in
layout order and with their alignment gaps, into a device staging buffer
(``torch.cat`` into the buffer: a few device-to-device kernels at HBM speed)
and leave in one D2H copy per staging buffer; larger storages are copied
directly. The staging buffers (``staging_buffers`` x ``staging_bytes``, shared by all
layouts of one offload) bound the extra device memory. Packing runs on the
compute stream; ``copy_async`` orders each D2H after it, and a staging buffer
is reused only after its previous D2H has completed.
"""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch

from refimpl.runtime.base import Completion, CopyKind, Runtime
from refimpl.store.backends.base import LayoutSource
from refimpl.store.backends.pool import HostBuffer
from refimpl.store.config import StoreConfig
from refimpl.store.state.layout import FlatLayout, StorageEntry
from refimpl.store.state.storage_views import own_view

logger = logging.getLogger(__name__)


async def _finish_issued(copies: list[Completion]) -> None:
    """Wait for copies already issued: none may still write into host memory the caller is about to free."""
    for c in copies:
        if not c.done():
            await c


class _Zeros(NamedTuple):
    """The zeros :meth:`StagingArea.zeros` handed out last."""

    numel: int
    dtype: torch.dtype
    zeros: torch.Tensor


class StagingArea:
    """A ring of device staging buffers for packing small storages, shared by one offload.

    Buffers are allocated through the runtime on first use and released by
    :meth:`close`. Each buffer remembers the completion of the last D2H copy
    that read it; :meth:`take` awaits it before handing the buffer out again.
    """

    def __init__(self, runtime: Runtime, config: StoreConfig) -> None:
        self.rt = runtime
        self.nbytes = config.staging_bytes
        self.count = config.staging_buffers
        self._buffers: list[torch.Tensor] = []
        self._pending: list[Completion | None] = []
        self._next = 0
        self._zeros: dict[torch.dtype, torch.Tensor] = {}
        self._last_zeros: _Zeros | None = None

    def zeros(self, n: int, dtype: torch.dtype, alignment_bytes: int) -> torch.Tensor:
        """``n`` device zeros of ``dtype`` (fills alignment gaps inside a packed run)."""
        hit = self._last_zeros
        if hit is not None and hit.numel == n and hit.dtype is dtype:
            return hit.zeros
        z = self._zeros.get(dtype)
        if z is None or z.numel() < n:
            z = self.rt.alloc_device(max(n, alignment_bytes // dtype.itemsize), dtype, tag="store.staging.gap")
            z.zero_()
            if dtype in self._zeros:
                self.rt.release(self._zeros[dtype])
            self._zeros[dtype] = z
        self._last_zeros = _Zeros(n, dtype, z[:n])
        return self._last_zeros.zeros

    async def take(self, dtype: torch.dtype) -> tuple[int, torch.Tensor]:
        """``(slot, buffer viewed as dtype)``; the slot's previous copy has completed."""
        slot = self._next
        self._next = (self._next + 1) % self.count
        if slot >= len(self._buffers):
            self._buffers.append(self.rt.alloc_device(self.nbytes, torch.uint8, tag="store.staging"))
            self._pending.append(None)
        prev = self._pending[slot]
        if prev is not None and not prev.done():
            await prev
        self._pending[slot] = None
        raw = self._buffers[slot]
        usable = (self.nbytes // dtype.itemsize) * dtype.itemsize
        return slot, raw[:usable].view(dtype)

    def used_by(self, slot: int, completion: Completion) -> None:
        """Record the copy that reads ``slot`` now."""
        self._pending[slot] = completion

    async def close(self) -> None:
        """Wait for outstanding copies and release the buffers."""
        for c in self._pending:
            if c is not None and not c.done():
                await c
        for b in [*self._buffers, *self._zeros.values()]:
            self.rt.release(b)
        self._buffers.clear()
        self._zeros.clear()
        self._last_zeros = None
        self._pending.clear()


class DeviceLayoutSource(LayoutSource):
    """A layout's bytes on the device: resident in ``flat`` or scattered over its entries' storages."""

    def __init__(
        self,
        runtime: Runtime,
        layout: FlatLayout,
        config: StoreConfig,
        *,
        flat: torch.Tensor | None = None,
        staging: StagingArea | None = None,
    ) -> None:
        self.rt = runtime
        self.layout = layout
        self.config = config
        self._flat = flat
        self._staging = staging
        #: copies issued, by path (for logs and benchmarks)
        self.copies = {"flat": 0, "direct": 0, "packed": 0}
        #: every copy issued with the entries whose bytes it carries (empty for flat-buffer copies)
        self.track: list[tuple[Completion, list[StorageEntry]]] = []

    @property
    def flat(self) -> torch.Tensor | None:
        """The resident flat buffer, or None when the layout is scattered."""
        return self._flat

    async def copy_to_host(self, host: HostBuffer, start: int = 0, stop: int | None = None) -> list[Completion]:
        """Issue the copies of layout elements ``[start, stop)`` into ``host``; see :class:`LayoutSource`."""
        stop = self.layout.numel if stop is None else stop
        if host.numel != stop - start or host.dtype != self.layout.dtype:
            raise ValueError(
                f"host buffer of {host.numel} {host.dtype} elements cannot hold layout "
                f"{self.layout.key.label()} range [{start}, {stop})"
            )
        out: list[Completion] = []
        try:
            for i, (a, b) in enumerate(host.ranges()):
                lo, hi = start + a, start + b
                if lo >= hi:
                    continue
                await self.rt.point("store.offload.copy")
                await self._copy_into(host.segment(i), lo, hi, out)
        except BaseException:
            await _finish_issued(out)
            raise
        return out

    async def copy_range(self, dst: torch.Tensor, start: int, stop: int) -> list[Completion]:
        """Issue copies of layout elements ``[start, stop)`` into the host tensor ``dst``; see :class:`LayoutSource`."""
        if dst.numel() != stop - start or dst.dtype != self.layout.dtype:
            raise ValueError(f"host tensor of {dst.numel()} {dst.dtype} elements cannot hold layout "
                             f"{self.layout.key.label()} range [{start}, {stop})")
        out: list[Completion] = []
        try:
            await self.rt.point("store.offload.copy")
            await self._copy_into(dst, start, stop, out)
        except BaseException:
            await _finish_issued(out)
            raise
        return out

    async def _copy_into(self, seg: torch.Tensor, lo: int, hi: int, out: list[Completion]) -> None:
        """One flat copy when resident, else the scattered path."""
        if self._flat is not None:
            out.append(self.rt.copy_async(seg, own_view(self._flat[lo:hi]), CopyKind.D2H))
            self.track.append((out[-1], []))
            self.copies["flat"] += 1
        else:
            await self._copy_scattered(seg, lo, hi, out)

    async def _copy_scattered(self, seg: torch.Tensor, lo: int, hi: int, out: list[Completion]) -> None:
        """Issue copies of the entries' data in layout range ``[lo, hi)`` into ``seg`` (seg[0] is element
        ``lo``), appending their completions to ``out`` as they are issued."""
        itemsize = self.layout.dtype.itemsize
        pack_below = self.config.pack_below_bytes // itemsize
        staging_numel = self.config.staging_bytes // itemsize
        batch: list[tuple[int, torch.Tensor]] = []
        entries: list[StorageEntry] = []
        batch_start = batch_end = 0

        async def flush() -> None:
            nonlocal batch, entries
            if batch:
                out.append(await self._pack_and_copy(seg, lo, batch, batch_start, batch_end))
                self.track.append((out[-1], entries))
                batch, entries = [], []

        for off, view, entry in self.entry_pieces(lo, hi):
            n = view.numel()
            if n >= pack_below or self._staging is None:
                await flush()
                out.append(self.rt.copy_async(seg[off - lo:off - lo + n], view, CopyKind.D2H))
                self.track.append((out[-1], [entry]))
                self.copies["direct"] += 1
                continue
            if batch and off + n - batch_start > staging_numel:
                await flush()
            if not batch:
                batch_start = off
            batch.append((off, view))
            entries.append(entry)
            batch_end = off + n
        await flush()

    async def _pack_and_copy(
        self, seg: torch.Tensor, lo: int, batch: list[tuple[int, torch.Tensor]], start: int, end: int
    ) -> Completion:
        """Pack ``batch`` (layout offsets ``[start, end)``, gaps kept) into staging, then one D2H."""
        assert self._staging is not None
        slot, buf = await self._staging.take(self.layout.dtype)
        parts: list[torch.Tensor] = []
        pos = start
        for off, view in batch:
            if off > pos:
                parts.append(self._staging.zeros(off - pos, self.layout.dtype, self.config.alignment_bytes))
            parts.append(view)
            pos = off + view.numel()
        packed = buf[:end - start]
        with torch.no_grad():
            if packed.is_meta:
                pass  # meta payloads carry no bytes (and torch.cat(out=) on meta imports torch._dynamo: ~1 s)
            elif len(parts) == 1:
                packed.copy_(parts[0])
            else:
                torch.cat(parts, out=packed)
        completion = self.rt.copy_async(seg[start - lo:end - lo], packed, CopyKind.D2H)
        self._staging.used_by(slot, completion)
        self.copies["packed"] += 1
        return completion


def describe_copies(sources: list[Any]) -> dict[str, int]:
    """Sum of :attr:`DeviceLayoutSource.copies` over sources."""
    total = {"flat": 0, "direct": 0, "packed": 0}
    for s in sources:
        for k, v in getattr(s, "copies", {}).items():
            total[k] += v
    return total


__all__ = ["DeviceLayoutSource", "StagingArea", "describe_copies"]
