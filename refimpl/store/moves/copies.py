"""The copy stage: the copies of one offload or reload, issued, awaited and unwound.

The copy stages of :class:`refimpl.store.moves.offload.Offload` and
:class:`refimpl.store.moves.reload.Reload`.

* :class:`OffloadCopies` holds what one offload has in flight: copies issued
  ahead of collection for layouts resident in one flat buffer
  (:meth:`~OffloadCopies.copy_ahead`, backends with ``copy_ahead``), the
  copies of the planned layouts (:meth:`~OffloadCopies.issue`), the device
  sources and staging ring they read through (:mod:`refimpl.store.moves.source`), and
  the storages released as their copies completed while later copies still ran
  (:meth:`~OffloadCopies.release_as_copied`). :meth:`~OffloadCopies.unwind` waits for every
  copy and gives the storages released as copied their bytes back when the offload fails.
* :class:`ReloadCopies` allocates a reload's flat device buffers and has the
  backend fill them; :meth:`~ReloadCopies.release_flats` frees them when the reload fails.

Every finisher a backend returned is awaited, also on the error path, so ranks
running collectives inside backends agree (see :mod:`refimpl.store.backends`).
"""
from __future__ import annotations

import logging
from typing import Awaitable, Iterable, NamedTuple, Sequence

import torch

from refimpl.runtime.base import Runtime, gather
from refimpl.store.backends.base import Piece, StoreBackend
from refimpl.store.config import Category, StoreConfig
from refimpl.store.moves.early import EarlyCopies
from refimpl.store.moves.release import copy_back_released, release_storages_as_copied
from refimpl.store.moves.source import DeviceLayoutSource, StagingArea, describe_copies
from refimpl.store.state.grouping import ViewCount
from refimpl.store.state.layout import FlatLayout, LayoutKey, ReleasedStorage
from refimpl.store.state.residency import resident_flat
from refimpl.store.state.storage_views import own_view

logger = logging.getLogger(__name__)


def sort_key(layout: FlatLayout) -> tuple[int, str, str]:
    """The order layouts are processed in, identical on every rank."""
    return layout.key.sort_key()


def reload_order(layout: FlatLayout) -> tuple[int, int, str, str]:
    """The order a reload issues (and awaits) layouts in: a training step's first use of their category, then
    :func:`sort_key`; identical on every rank."""
    return layout.key.reload_key()


class CopyAhead(NamedTuple):
    """A copy issued before collection for a layout resident in one flat buffer, and its finisher."""

    layout: FlatLayout
    finisher: Awaitable[None]


class OffloadCopies:
    """The copies of one offload: issued ahead, issued after planning, awaited, or unwound.

    ``drop_grads``: gradient layouts are not copied. Read by the offload (only
    this class's methods write them): ``flats`` (a 1-D view of each resident
    layout's flat buffer found while copying ahead, by key), ``viewers`` (tensor
    objects viewing each of those buffers before the store made its own views),
    ``staging`` (the ring the scattered copies pack through) and ``sources`` /
    ``pending`` (the device sources of the copies issued and the backend
    finishers still to await).
    """

    def __init__(self, rt: Runtime, backend: StoreBackend, config: StoreConfig, *, drop_grads: bool) -> None:
        self.rt, self.backend, self.config = rt, backend, config
        self.drop_grads = drop_grads
        self.staging = StagingArea(rt, config)
        self.sources: list[DeviceLayoutSource] = []
        self.pending: list[Awaitable[None]] = []
        self.ahead: dict[LayoutKey, CopyAhead] = {}
        self.flats: dict[LayoutKey, torch.Tensor] = {}
        self.viewers: dict[int, ViewCount] = {}
        #: storages released as their copies completed, while later copies ran (what a rollback must bring back)
        self.released: list[ReleasedStorage] = []
        #: bytes of early copies taken over, and of early copies found stale and copied again
        self.early_reused = 0
        self.early_redone = 0
        self._early_taken: dict[LayoutKey, int] = {}  # bytes taken over per layout (moved to redone if discarded)

    def will_copy(self, layout: FlatLayout) -> bool:
        """Whether ``layout`` is copied: not a gradient layout of an offload that drops gradients."""
        return not (self.drop_grads and layout.category is Category.GRADS)

    async def copy_ahead(self, resident: list[FlatLayout], early: EarlyCopies | None = None) -> None:
        """Issue the copy of every layout resident in one flat buffer now, before collection.

        Only for a backend with ``copy_ahead``; collecting tens of
        thousands of tensors then overlaps the DMA. A layout the offload lays out anew
        has its copy discarded (:meth:`discard_changed`). ``early``: the copies
        :meth:`OffloadStore.copy_early` issued; a layout's valid ones are taken over and only the rest is
        copied ([Note: early copies] in :mod:`refimpl.store.moves.early`); the store awaits whatever is not taken.
        """
        if not self.backend.copy_ahead:
            return
        if early is not None:  # the bytes of every early copy checked again: writes the counters cannot see
            await early.verify(resident)
        for layout in sorted(resident, key=sort_key):
            if not self.will_copy(layout):
                continue
            taken = await early.take(layout) if early is not None else None
            flat = resident_flat(layout, self.viewers)
            if flat is None:
                if taken is not None:
                    await gather(*taken.completions)
                continue
            self.flats[layout.key] = flat
            src = DeviceLayoutSource(self.rt, layout, self.config, flat=flat)
            self.sources.append(src)
            if taken is None:
                self.ahead[layout.key] = CopyAhead(layout, await self.backend.offload(layout, src))
                continue
            count = self.viewers.get(layout.flat_storage)
            if count is not None and taken.pending_views:  # the early copies' own views of the buffer
                self.viewers[layout.flat_storage] = ViewCount(count.viewers - taken.pending_views, count.mark)
            rest = await self.backend.offload_rest(layout, src, taken.ranges)
            self.ahead[layout.key] = CopyAhead(layout, gather(*taken.completions, rest))
            self.early_reused += taken.reused_bytes
            self.early_redone += taken.redone_bytes
            self._early_taken[layout.key] = taken.reused_bytes

    async def discard_changed(self, layouts: dict[LayoutKey, FlatLayout]) -> None:
        """Await and drop the copies issued ahead for layouts this offload does not keep as they were."""
        for key in list(self.ahead):
            ahead = self.ahead[key]
            if layouts.get(key) is not ahead.layout:  # changed since the reload: discard the copy
                del self.ahead[key]
                await ahead.finisher
                reused = self._early_taken.pop(key, 0)  # its early copies are copied again with the layout
                self.early_reused -= reused
                self.early_redone += reused

    async def issue(self, ordered: list[FlatLayout]) -> None:
        """``prepare`` then one backend ``offload`` per layout to copy (a copy issued ahead is reused)."""
        to_copy = [lay for lay in ordered if self.will_copy(lay)]
        await self.backend.prepare(to_copy)
        for layout in to_copy:
            ahead = self.ahead.pop(layout.key, None)
            if ahead is not None:
                self.pending.append(ahead.finisher)
                continue
            src = DeviceLayoutSource(self.rt, layout, self.config, staging=self.staging)
            self.sources.append(src)
            self.pending.append(await self.backend.offload(layout, src))

    def adopt_stream(self, sources: list[DeviceLayoutSource], pending: list[Awaitable[None]]) -> None:
        """Take over the copies a streamed offload issued while it collected (one finisher per layout)."""
        self.sources.extend(sources)
        self.pending = pending

    def describe(self) -> dict[str, int]:
        """Copies issued so far, by path (``flat``, ``direct``, ``packed``)."""
        return describe_copies(self.sources)

    async def release_as_copied(self) -> int:
        """With a backend that allows it (``release_as_copied``), release each storage as its copies complete;
        returns how many were released."""
        if not self.backend.release_as_copied:
            return 0
        return await release_storages_as_copied(self.rt, self.sources, self.released)

    async def wait(self) -> None:
        """Await every backend finisher, in layout order."""
        pending = self.pending
        while pending:
            await pending.pop(0)

    async def close(self) -> None:
        """Wait for the staging ring's copies and release it."""
        await self.staging.close()

    async def unwind(self) -> None:
        """After a failure: await every finisher (issued or ahead), then give the storages released as copied
        their bytes back from the host copies."""
        await drain([*self.pending, *(a.finisher for a in self.ahead.values())])
        if self.released:
            await copy_back_released(self.rt, self.backend, self.released)

    def forget(self) -> None:
        """Drop every view and source this offload made (after a failure the traceback keeps the frames)."""
        self.flats.clear(), self.sources.clear(), self.ahead.clear(), self.released.clear()


class ReloadCopies:
    """A reload's flat device buffers, one per layout (``flats``, by key), and the backend finishers that fill them.

    ``chunk_bytes`` (a streamed reload): each layout is filled in pieces of at most that many bytes where the
    backend can (``StoreBackend.reload_pieces``); ``pieces`` then holds them by key (a layout the backend fills
    in one step, or a dropped one, has none).
    """

    def __init__(self, rt: Runtime, backend: StoreBackend, chunk_bytes: int | None = None,
                 use_order: Sequence[torch.Tensor] | None = None) -> None:
        self.rt, self.backend, self.chunk_bytes = rt, backend, chunk_bytes
        self.use_order = use_order
        self.flats: dict[LayoutKey, torch.Tensor] = {}
        self.pending: list[Awaitable[None]] = []
        self.pieces: dict[LayoutKey, list[Piece]] = {}
        #: with ``use_order``: how many of its tensors this reload holds (the rest are not in it)
        self.ordered_tensors = 0

    async def issue(self, layouts: list[FlatLayout]) -> None:
        """Allocate each layout's flat buffer and have the backend fill it (zeros for dropped layouts); with
        ``use_order`` and pieces, the pieces of all layouts in that order (:meth:`_issue_in_use_order`)."""
        if self.use_order is not None and self.chunk_bytes:
            cuts = {lay.key: self.backend.piece_ranges(lay, max(1, self.chunk_bytes // lay.dtype.itemsize))
                    for lay in layouts if not lay.dropped}
            if all(c is not None for c in cuts.values()):
                await self._issue_in_use_order(layouts, cuts)
                return
        for layout in layouts:
            flat = self._alloc(layout)
            if layout.dropped:
                continue
            pieces = None
            if self.chunk_bytes:
                chunk = max(1, self.chunk_bytes // layout.dtype.itemsize)
                pieces = await self.backend.reload_pieces(layout, flat, chunk)
            if pieces is None:
                self.pending.append(await self.backend.reload(layout, flat))
            else:
                self.pieces[layout.key] = pieces
                self.pending.append(gather(*(p.completion for p in pieces)))

    def _alloc(self, layout: FlatLayout) -> torch.Tensor:
        """The layout's flat device buffer (zeros for a dropped layout), kept in :attr:`flats`."""
        flat = own_view(self.rt.alloc_device(layout.numel, layout.dtype, tag=f"store.flat.{layout.key.label()}"))
        self.flats[layout.key] = flat
        if layout.dropped:
            flat.zero_()
        return flat

    async def _issue_in_use_order(self, layouts: list[FlatLayout],
                                  cuts: dict[LayoutKey, list[tuple[int, int]]]) -> None:
        """Every layout's pieces (``cuts``, from ``StoreBackend.piece_ranges``) issued in the order of ``use_order``:
        a piece goes at the position of the first-listed tensor it holds bytes of; pieces holding none of them
        follow, in the default order (layouts as given, each by offset). So a step that first uses its tensors in another order
        than the layouts' (an optimizer stepped unit by unit in the backward, last layer first) finds each
        tensor's bytes landed when it reaches it, not after everything queued before them."""
        order = list(self.use_order or ())
        rank: dict[int, int] = {}  # id of a listed tensor (and of a DTensor's local tensor) -> its first position
        for i, t in enumerate(order):
            for obj in (t, getattr(t, "_local_tensor", None)):
                if obj is not None:
                    rank.setdefault(id(obj), i)
        last = len(order)  # the position of a piece that holds no listed tensor
        plan: list[tuple[int, int, int, int]] = []
        seen: set[int] = set()
        for li, layout in enumerate(layouts):
            self._alloc(layout)
            if layout.dropped:
                continue
            entries = sorted((e for e in layout.entries if e.numel), key=lambda e: e.offset)
            ranks = []
            for e in entries:
                r = last
                for ref in e.refs:
                    for obj in (ref.live(), ref.live_dtensor()):
                        if obj is not None and id(obj) in rank:
                            r = min(r, rank[id(obj)])
                            seen.add(rank[id(obj)])
                ranks.append(r)
            j = 0
            for lo, hi in cuts[layout.key]:
                while j < len(entries) and entries[j].offset + entries[j].numel <= lo:
                    j += 1
                k, r = j, last
                while k < len(entries) and entries[k].offset < hi:
                    r = min(r, ranks[k])
                    k += 1
                plan.append((r, li, lo, hi))
        self.ordered_tensors = len(seen)
        plan.sort()
        try:
            for _, li, lo, hi in plan:
                layout = layouts[li]
                piece = await self.backend.reload_piece(layout, self.flats[layout.key], lo, hi)
                self.pieces.setdefault(layout.key, []).append(piece)
        finally:  # what was issued is awaited, also when issuing failed midway
            for layout in layouts:
                pieces = self.pieces.get(layout.key)
                if pieces:
                    pieces.sort(key=lambda p: p.start)
                    self.pending.append(gather(*(p.completion for p in pieces)))

    async def wait(self) -> None:
        """Await every backend finisher, in layout order."""
        pending = self.pending
        while pending:
            await pending.pop(0)

    async def drain(self) -> None:
        """After a failure: await every finisher still pending (errors are logged; the caller raises its own)."""
        await drain(self.pending)

    def release_flats(self) -> None:
        """After a failure: free the flat buffers (no tensor may point into them any more)."""
        for flat in self.flats.values():
            self.rt.release(flat)


async def drain(finishers: Iterable[Awaitable[None]]) -> None:
    """Await every finisher, keeping the first error only for logging (the caller re-raises its own)."""
    for f in finishers:
        try:
            await f
        except BaseException as e:  # noqa: BLE001 - the original error is what the caller raises
            logger.error("while unwinding a failed store operation, a backend finisher also failed: %s", e)


__all__ = ["CopyAhead", "OffloadCopies", "ReloadCopies", "drain", "reload_order", "sort_key"]
