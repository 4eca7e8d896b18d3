"""Giving an offload's device memory back, the stage after the copies.

* :func:`release_as_copied` releases storages one by one as the copies carrying
  their bytes complete, overlapping the rest of the DMA (backends with
  ``early_release``), and records each release so a later failure can restore it;
* :func:`prepare_release` does the per-entry part of the release while the copies
  run;
* :func:`park_kept_views` parks views of the store's flat buffers that the user kept;
* :func:`release_layouts` releases what is left and marks the layouts offloaded;
* :func:`copy_back_early_releases` is the way back when the offload fails after
  :func:`release_as_copied` released storages.

The last stage of an offload (:class:`refimpl.store.offload.Offload`).

Every registered tensor is parked before any of this runs (see
:mod:`refimpl.store.parking`): a release never leaves a tensor on freed memory.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from refimpl.runtime.base import CopyKind, Runtime
from refimpl.store.backends.base import StoreBackend
from refimpl.store.grouping import storage_view
from refimpl.store.config import Category
from refimpl.store.layout import EarlyRelease, FlatLayout
from refimpl.store.parking import park_strays
from refimpl.store.source import DeviceLayoutSource

logger = logging.getLogger(__name__)


@dataclass
class PreparedRelease:
    """What :func:`prepare_release` settled while the copies ran: one view per flat-resident layout
    (by ``id(layout)``) and the bytes the offload moves."""

    flat_bases: dict[int, torch.Tensor] = field(default_factory=dict)
    moved_bytes: int = 0


def prepare_release(layouts: list[FlatLayout], drop_grads: bool) -> PreparedRelease:
    """Per-entry work of the release, done once every copy is issued, while they run.

    For a layout resident as one flat buffer, keep one view of it and drop the
    entries' views (dropping tens of thousands of view tensors costs
    milliseconds, which must not land after the last copy completes); sum the
    bytes moved. :func:`release_layouts` then does no per-entry work for them.
    """
    prepared = PreparedRelease()
    for layout in layouts:
        if not (drop_grads and layout.category is Category.GRADS):
            prepared.moved_bytes += layout.data_nbytes
        if layout.flat_storage is None:
            continue
        base = next((e.base for e in layout.entries if e.base is not None), None)
        if base is None or base.untyped_storage()._cdata != layout.flat_storage:
            continue
        prepared.flat_bases[id(layout)] = base
        layout.drop_bases()
    return prepared


def release_layouts(rt: Runtime, layouts: list[FlatLayout], drop_grads: bool, prepared: PreparedRelease | None = None) -> int:
    """Release what is left of the offloaded layouts' device memory and mark them offloaded.

    With a :class:`PreparedRelease` from :func:`prepare_release`, a layout resident
    as one flat buffer releases that storage once, with no per-entry work.
    Returns the bytes copied out (dropped gradients count nothing).
    """
    done: set[int] = set()
    release = rt.release
    if prepared is None:
        prepared = PreparedRelease(moved_bytes=sum(lay.data_nbytes for lay in layouts
                                           if not (drop_grads and lay.category is Category.GRADS)))
    for layout in layouts:
        flat = prepared.flat_bases.get(id(layout))
        if flat is not None:
            sid = flat.untyped_storage()._cdata
            if sid not in done:
                release(flat)
                done.add(sid)
        else:
            layout.release_bases(release, done)
        layout.mark_offloaded(drop_grads and layout.category is Category.GRADS)
    return prepared.moved_bytes


async def release_as_copied(rt: Runtime, sources: list[DeviceLayoutSource], released: list[EarlyRelease]) -> int:
    """Release each storage as soon as every copy carrying its bytes has completed.

    Runs while later copies are still in flight, so the per-storage work of a
    scattered offload overlaps the DMA. Only entries that own their storage;
    all host memory is already pinned (``copy_to_host`` waited for every
    segment), so a pinning failure can no longer happen after this starts.
    Appends an :class:`EarlyRelease` for each released storage to
    ``released`` as it goes (what a rollback must bring back if a later copy
    fails). Returns how many storages it released.
    """
    remaining: dict[int, int] = {}
    for src in sources:
        for _, entries in src.track:
            for e in entries:
                remaining[id(e)] = remaining.get(id(e), 0) + 1
    release = rt.release
    count = 0
    for src in sources:
        for completion, entries in src.track:
            if not entries:
                continue
            if not completion.done():
                await completion
            count += src.layout.release_copied(entries, remaining, release, released)
    return count


async def copy_back_early_releases(rt: Runtime, backend: StoreBackend, early: list[EarlyRelease]) -> None:
    """After a failed offload: give storages released early their bytes back from the host copies."""
    for r in early:
        layout, entry = r.layout, r.entry
        host = backend.host_view(layout, entry.offset, entry.offset + entry.numel)
        if host is None:
            logger.error("cannot restore %s after a failed offload: the backend holds no host copy of it",
                         entry.name)
            continue
        r.storage.resize_(r.nbytes)
        device = storage_view(r.storage, layout.dtype, rt.device, entry.numel)
        await rt.copy_async(device, host, CopyKind.H2D)
    logger.warning("offload failed after %d storage(s) were released early; their bytes were copied back",
                   len(early))


def park_kept_views(strays: dict[int, set[int]], layouts: list[FlatLayout], flats: dict[Any, torch.Tensor],
                    prepared: PreparedRelease) -> None:
    """Park the views of the store's flat buffers that tensor objects it does not know kept (``strays``:
    storage id -> ids of the tensors it knows there), with a warning; the store's own views are not
    strays. Nothing can fail any more when this runs."""
    if not strays:
        return
    ours = {id(t) for t in flats.values()} | {id(t) for t in prepared.flat_bases.values()}
    ours |= {id(e.base) for lay in layouts for e in lay.entries if e.base is not None}
    for sid, known in strays.items():
        found = park_strays(sid, known | ours)
        logger.warning("views of an attached tensor kept across the offload (%s) are parked: they read "
                       "NaN/0 and do not come back on reload; take views after reload() instead",
                       "; ".join(found[:3]) or "none reachable from Python")


__all__ = ["EarlyRelease", "PreparedRelease", "park_kept_views", "prepare_release", "release_as_copied",
           "release_layouts", "copy_back_early_releases"]
