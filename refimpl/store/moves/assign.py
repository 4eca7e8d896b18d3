"""Assigning storages to layouts: which flat layout every collected storage goes to.

* :func:`assign_layouts` turns the collected storage groups into flat layouts,
  reusing a resident layout unchanged when its flat buffer still holds exactly
  its tensors (the steady-state fast path).
* :func:`reserve_ahead` lays out the attached state the same way before any offload and has the backend reserve
  (pin) the host memory the layouts will need (``OffloadStore.pin_ahead``).
* :func:`gc_paused` keeps Python's cyclic collector out of the per-tensor loops.

Giving device memory back is the next stage, :mod:`refimpl.store.moves.release`.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import replace
from typing import Iterable, Iterator

import torch

from refimpl.store.backends.base import StoreBackend
from refimpl.store.config import StoreConfig
from refimpl.store.state.collect import Item
from refimpl.store.state.grouping import StorageGroup, group_by_storage
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutKeys, StorageEntry
from refimpl.store.state.residency import adopt_if_unchanged


def assign_layouts(groups: list[StorageGroup], resident_layouts: list[FlatLayout], backend: StoreBackend,
                 config: StoreConfig) -> dict[LayoutKey, FlatLayout]:
    """Flat layouts for the collected storage groups, by key.

    A resident layout (after a reload) whose flat buffer still holds exactly
    its tensors is reused as it is; one that gained entries is rebuilt with its
    old entries first (as copies, so its own offsets stay valid); every other
    storage becomes a whole-storage entry.
    """
    resident = {lay.flat_storage: lay for lay in resident_layouts}
    reused: dict[LayoutKey, FlatLayout] = {}
    loose: dict[LayoutKey, list[StorageEntry]] = {}
    keys = LayoutKeys()
    placement_key = backend.placement_key
    for g in groups:
        layout = resident.get(g.storage_id)
        if layout is not None and adopt_if_unchanged(layout, g):
            reused[layout.key] = layout
            continue
        entry = StorageEntry(g.category, g.kind, g.dtype, g.numel, g.refs, g.base_view(), g.source)
        key = keys[(g.category.value, g.dtype, placement_key(entry))]
        loose.setdefault(key, []).append(entry)
    layouts: dict[LayoutKey, FlatLayout] = {}
    for key in sorted(set(reused) | set(loose), key=LayoutKey.sort_key):
        old, extra = reused.get(key), loose.get(key, [])
        if old is not None and not extra:
            layouts[key] = old
            continue
        # copies of a reused layout's entries: building a new layout must not move the old one's offsets
        carried = [replace(e, refs=list(e.refs)) for e in old.entries] if old is not None else []
        entries = carried + extra
        layout = FlatLayout.build(key, entries, alignment_bytes=config.alignment_bytes,
                                  segment_bytes=config.segment_bytes)
        padded = backend.padded_numel(key, layout.numel)
        if padded != layout.numel:
            layout.pad_to(padded)
        layouts[key] = layout
    return layouts


def reserve_ahead(items: Iterable[Item], resident: list[FlatLayout], backend: StoreBackend, config: StoreConfig,
                  device: torch.device) -> int:
    """Lay ``items`` out as the next offload would (resident layouts reused, then let go again) and have
    ``backend`` reserve each layout's host memory (``StoreBackend.reserve``); returns the host bytes reserved.
    Nothing is copied or released."""
    groups, _ = group_by_storage(items, device)
    try:
        layouts = assign_layouts(groups, resident, backend, config)
    finally:
        for lay in resident:
            lay.unadopt()
    for layout in sorted(layouts.values(), key=lambda lay: lay.key.sort_key()):
        backend.reserve(layout)
        layout.drop_bases()
    return sum(layout.nbytes for layout in layouts.values())


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a synchronous, allocation-heavy stretch."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


__all__ = ["assign_layouts", "gc_paused", "reserve_ahead"]
