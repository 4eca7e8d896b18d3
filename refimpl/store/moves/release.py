"""Giving an offload's device memory back, the stage after the copies.

* :func:`release_storages_as_copied` releases storages one by one as the copies
  carrying their bytes complete, overlapping the rest of the DMA (backends with
  ``release_as_copied``), and records each release so a later failure can restore it;
* :func:`park_kept_views` parks views of the store's flat buffers that the user kept;
* :func:`release_layouts` releases what is left and marks the layouts offloaded;
* :func:`copy_back_released` is the way back when the offload fails after
  :func:`release_storages_as_copied` released storages.

:func:`park_kept_views` and :func:`release_layouts` are the last stage of an offload
(:meth:`refimpl.store.moves.offload.Offload.release`); the other two run inside the
copy stage (:class:`refimpl.store.moves.copies.OffloadCopies`).

Every registered tensor is parked before any of this runs (see
:mod:`refimpl.store.state.parking`): a release never leaves a tensor on freed memory.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from refimpl.runtime.base import CopyKind, Runtime
from refimpl.store.backends.base import StoreBackend
from refimpl.store.config import Category
from refimpl.store.moves.source import DeviceLayoutSource
from refimpl.store.state.grouping import storage_view
from refimpl.store.state.layout import FlatLayout, ReleasedStorage
from refimpl.store.state.parking import Parking, park_strays

logger = logging.getLogger(__name__)


def release_layouts(rt: Runtime, layouts: list[FlatLayout], drop_grads: bool) -> None:
    """Release what is left of the offloaded layouts' device memory and mark them offloaded
    (:meth:`FlatLayout.release_device`; a layout resident as one flat buffer releases it once)."""
    done: set[int] = set()
    release = rt.release
    for layout in layouts:
        layout.release_device(release, done, drop_grads and layout.category is Category.GRADS)


async def release_storages_as_copied(rt: Runtime, sources: list[DeviceLayoutSource],
                                     released: list[ReleasedStorage]) -> int:
    """Release each storage as soon as every copy carrying its bytes has completed.

    Runs while later copies are still in flight, so the per-storage work of a
    scattered offload overlaps the DMA. Only entries that own their storage;
    all host memory is already pinned (``copy_to_host`` waited for every
    segment), so a pinning failure can no longer happen after this starts.
    Appends a :class:`ReleasedStorage` for each released storage to
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


async def copy_back_released(rt: Runtime, backend: StoreBackend, released: list[ReleasedStorage]) -> None:
    """After a failed offload: give the storages released as copied their bytes back from the host copies."""
    for r in released:
        layout, entry = r.layout, r.entry
        host = backend.host_view(layout, entry.offset, entry.offset + entry.numel)
        if host is None:
            logger.error("cannot restore %s after a failed offload: the backend holds no host copy of it",
                         entry.name)
            continue
        r.storage.resize_(r.nbytes)
        device = storage_view(r.storage, layout.dtype, rt.device, entry.numel)
        await rt.copy_async(device, host, CopyKind.H2D)
    # "released early" is the wording log readers (and a test) know for storages released as copied
    logger.warning("offload failed after %d storage(s) were released early; their bytes were copied back",
                   len(released))


def park_kept_views(strays: dict[int, set[int]], layouts: list[FlatLayout], flats: dict[Any, torch.Tensor],
                    parking: Parking) -> None:
    """Park and guard the views of the store's flat buffers that tensor objects it does not know kept
    (``strays``: storage id -> ids of the tensors it knows there) on ``parking``'s placeholders, with a
    warning; the store's own views are not strays. Nothing can fail any more when this runs."""
    if not strays:
        return
    ours = {id(t) for t in flats.values()} | {id(lay.release_view) for lay in layouts if lay.release_view is not None}
    ours |= {id(e.base) for lay in layouts for e in lay.entries if e.base is not None}
    for sid, known in strays.items():
        owner = next((lay.key.label() for lay in layouts if lay.flat_storage == sid), "")
        found = park_strays(sid, known | ours, parking, owner)
        logger.warning("views of an attached tensor kept across the offload (%s) are parked: using them raises "
                       "OffloadedTensorError and they do not come back on reload; take views after reload() instead",
                       "; ".join(found[:3]) or "none reachable from Python")


__all__ = ["copy_back_released", "park_kept_views", "release_layouts", "release_storages_as_copied"]
