"""Giving an offload's device memory back, the stage after the copies.

* :func:`release_storages_as_copied` releases storages one by one as the copies
  carrying their bytes complete, overlapping the rest of the DMA (backends with
  ``release_as_copied``), and records each release so a later failure can restore it;
* :func:`park_kept_views` parks views of the store's flat buffers that the user kept;
* :func:`release_layouts` releases what is left, then :func:`mark_offloaded` marks the layouts offloaded;
* :func:`copy_back_released` is the way back when the offload fails after
  :func:`release_storages_as_copied` or :func:`release_layouts` released storages.

:func:`park_kept_views` and :func:`release_layouts` are the last stage of an offload
(:meth:`refimpl.store.moves.offload.Offload.release`); the other two run inside the
copy stage (:class:`refimpl.store.moves.copies.OffloadCopies`).

Every registered tensor is parked before any of this runs (see
:mod:`refimpl.store.state.parking`): a release never leaves a tensor on freed memory.
"""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef  # torch imports torch.multiprocessing itself

from refimpl.runtime.base import CopyKind, Runtime
from refimpl.store.backends.base import StoreBackend
from refimpl.store.config import Category
from refimpl.store.moves.source import DeviceLayoutSource
from refimpl.store.state.layout import FlatLayout, ReleasedStorage
from refimpl.store.state.parking import Parking, ViewPlace, park_strays

logger = logging.getLogger(__name__)


class ExportedStorage(NamedTuple):
    """A flat buffer exported since its reload (``t.numpy()``, DLPack) that the release left to its holders."""

    #: the registered tensor the buffer held first (for messages)
    name: str
    nbytes: int
    #: ``weakref``-like: ``expired()`` once nothing holds the storage any more (its memory is back)
    ref: Any


def release_layouts(rt: Runtime, layouts: list[FlatLayout], released: list[ReleasedStorage],
                    exported: list[ExportedStorage]) -> None:
    """Release what is left of the offloaded layouts' device memory (:meth:`FlatLayout.release_device`; a
    layout resident as one flat buffer releases it once), recording in ``released`` every entry whose storage
    was shrunk (what :func:`copy_back_released` restores if the release stage fails later). The layouts stay
    PARKED; :func:`mark_offloaded` follows.

    A storage that is not resizable is the store's own flat buffer that ``t.numpy()`` or a DLPack export marked
    so after the reload (validation refuses any other: :mod:`refimpl.store.state.grouping`); torch will not
    shrink it, and the array made from it may still read its memory. Every registered tensor viewing it is
    parked already, so the release leaves it to its holders: the store drops its own views and the memory is
    freed when the last holder goes (at once when the array is gone; it is listed in ``exported``).
    """
    done: set[int] = set()

    def release(view: torch.Tensor) -> bool:
        st = view.untyped_storage()
        if not st.resizable():
            exported.append(ExportedStorage(_first_name(layouts, st._cdata), st.nbytes(), StorageWeakRef(st)))
            return False
        rt.release(view)
        return True

    for layout in layouts:
        layout.release_device(release, done, released)


def _first_name(layouts: list[FlatLayout], storage_id: int) -> str:
    return next((lay.entries[0].name for lay in layouts if lay.flat_storage == storage_id and lay.entries), "?")


def mark_offloaded(layouts: list[FlatLayout], drop_grads: bool) -> None:
    """Every layout's device memory is released: mark each offloaded (nothing fails here)."""
    for layout in layouts:
        layout.mark_offloaded(drop_grads and layout.category is Category.GRADS)


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


async def copy_back_released(rt: Runtime, backend: StoreBackend, released: list[ReleasedStorage], *,
                             drop_grads: bool = False) -> None:
    """After a failed offload: give the released storages their bytes back from the host copies (each storage
    grown to its size again, each entry copied to where it sat); gradients the offload dropped without a copy
    come back as zeros, as a reload would give them."""
    for r in released:
        layout = r.layout
        if r.storage.nbytes() != r.nbytes:
            r.storage.resize_(r.nbytes)
        for entry, at in r.places:
            device = torch.empty(0, dtype=layout.dtype, device=rt.device).set_(r.storage, at, (entry.numel,), (1,))
            if drop_grads and layout.category is Category.GRADS:
                device.zero_()
                continue
            host = backend.host_view(layout, entry.offset, entry.offset + entry.numel)
            if host is None:
                logger.error("cannot restore %s after a failed offload: the backend holds no host copy of it",
                             entry.name)
                continue
            await rt.copy_async(device, host, CopyKind.H2D)
    # "released early" is the wording log readers (and a test) know for storages released as copied
    logger.warning("offload failed after %d storage(s) were released early; their bytes were copied back",
                   len(released))


def park_kept_views(strays: dict[int, set[int]], layouts: list[FlatLayout], flats: dict[Any, torch.Tensor],
                    parking: Parking, places: list[ViewPlace]) -> None:
    """Park and guard the views of the store's flat buffers that tensor objects it does not know kept
    (``strays``: storage id -> ids of the tensors it knows there) on ``parking``'s placeholders, with a
    warning; the store's own views are not strays. ``places`` receives where each pointed (a failed release
    stage points them back with :func:`~refimpl.store.state.parking.repoint_views`)."""
    if not strays:
        return
    ours = {id(t) for t in flats.values()} | {id(lay.release_view) for lay in layouts if lay.release_view is not None}
    ours |= {id(e.base) for lay in layouts for e in lay.entries if e.base is not None}
    for sid, known in strays.items():
        owner = next((lay.key.label() for lay in layouts if lay.flat_storage == sid), "")
        found = park_strays(sid, known | ours, parking, owner, places)
        logger.warning("views of an attached tensor kept across the offload (%s) are parked: using them raises "
                       "OffloadedTensorError and they do not come back on reload; take views after reload() instead",
                       "; ".join(found[:3]) or "none reachable from Python")


__all__ = ["ExportedStorage", "copy_back_released", "mark_offloaded", "park_kept_views", "release_layouts",
           "release_storages_as_copied"]
