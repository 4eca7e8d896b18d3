"""Where registered tensors live: re-pointing them into flat buffers, and noticing when they moved.

After a reload every registered tensor is a view into its layout's flat buffer
(:func:`repoint`). :func:`adopt_if_unchanged` decides at the next offload
whether the tensors are all still exactly there (then the layout leaves in one
copy). :func:`park` points every registered tensor at a placeholder while its
bytes are in host memory (see [Note: parked tensors] in
:mod:`refimpl.store.parking`), :func:`unpark` undoes that when an offload fails;
:func:`changed_tensors` checks before a reload that each tensor is still parked
as the offload left it. :func:`restore_released` parks the tensors again when a
reload fails after re-pointing them.

The reload's last stage (restore, after :mod:`refimpl.store.copies`) is
:func:`repoint` and :func:`mark_resident`; the offload's steady path reads
:func:`resident_flat` and :func:`steady_unchanged` (see [Note: steady offload
check] below) and :func:`adopt_resident`; :func:`unadopt` is its way back.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, NamedTuple

import torch

from refimpl.store.collect import Item, plain_tensor
from refimpl.store.grouping import StorageGroup, ViewCount, storage_view
from refimpl.store.layout import FlatLayout, LayoutState
from refimpl.store.parking import GUARDED_CLASSES as _GUARDED
from refimpl.store.parking import ZERO_STRIDES as _ZEROS
from refimpl.store.parking import (
    debug_mode, guard, own_view, own_view_mark, placeholder, repoint_tensor, storage_use_count, unguard,
    zero_strides,
)


def adopt_if_unchanged(layout: FlatLayout, group: StorageGroup) -> bool:
    """If ``group`` (the layout's flat storage) holds exactly the layout's tensors where the reload
    put them, take the collected tensors back into the layout and return True."""
    if group.dtype != layout.dtype or group.category is not layout.category or group.nbytes != layout.nbytes:
        return False
    collected = {id(r.tensor): r for r in group.refs}
    count = 0
    for e in layout.entries:
        for r in e.refs:
            t = r.live()
            c = collected.get(id(t)) if t is not None else None
            if c is None or c.tensor is not t or (c.offset, c.size, c.stride) != (e.offset + r.offset, r.size, r.stride):
                return False
            count += 1
    if count != len(group.refs):
        return False
    flat = group.base_view()
    for e in layout.entries:
        e.base = own_view(flat[e.offset:e.offset + e.numel])
        e.owns_storage = False
        for r in e.refs:
            c = collected[id(r.live())]
            r.hold(c.tensor, c.dtensor)
    return True


def changed_tensors(layouts: list[FlatLayout]) -> list[str]:
    """Descriptions of registered tensors that are no longer parked the way the offload left them."""
    problems = []
    for layout in layouts:
        dtype = layout.dtype
        if not layout.entries:
            continue
        sid, off = placeholder(layout.entries[0].refs[0].tensor.device, dtype)[1], 0
        for e in layout.entries:
            for r in e.refs:
                t = r.tensor
                assert t is not None
                st = t.untyped_storage()
                if st._cdata == sid and t.storage_offset() == off and t.shape == r.size and t.dtype is dtype \
                        and t.stride() == zero_strides(len(r.size)):
                    continue
                if st._cdata != sid:
                    problems.append(f"{r.name} now has other storage ({st.nbytes()} bytes; was it re-assigned?)")
                elif t.dtype != layout.dtype:
                    problems.append(f"{r.name} changed dtype from {layout.dtype} to {t.dtype}")
                else:
                    problems.append(f"{r.name} was resized/restrided from {r.size} to "
                                    f"{tuple(t.shape)}/{tuple(t.stride())}@{t.storage_offset()}")
    return problems


class EntryOrigin(NamedTuple):
    """Where a parked entry's tensors pointed: its storage (None: no device data) and the entry's start in it."""

    storage: Any
    offset: int


_new = tuple.__new__
_NO_ORIGIN = EntryOrigin(None, 0)


class ParkedLayout(NamedTuple):
    """Where the tensors of one parked layout came from."""

    layout: FlatLayout
    #: a 1-D view of the layout's flat buffer when it was resident in one, else None
    flat: torch.Tensor | None
    #: otherwise, each entry's origin, in entry order
    origins: list[EntryOrigin] | None


class ParkRecord:
    """Where each parked tensor came from, to put it back if the offload fails before its release.

    ``origins``: one :class:`ParkedLayout` per layout, in the order :func:`park` visited them.
    """

    __slots__ = ("origins",)

    def __init__(self) -> None:
        self.origins: list[ParkedLayout] = []


def park(layouts: list[FlatLayout], flats: dict[Any, torch.Tensor], record: ParkRecord) -> None:
    """Point every registered tensor of ``layouts`` at its placeholder (see [Note: parked tensors]).

    Runs once every copy is issued, while they run: the copies read the store's own
    views. Records where each tensor was in ``record`` (filled before the
    layout's tensors move, so :func:`unpark` undoes a park that failed midway).
    ``flats``: the flat buffer of each layout resident in one (fast path), by key.
    """
    guarding = debug_mode()
    with torch.no_grad():
        for layout in layouts:
            flat = flats.get(layout.key)
            origins: list[EntryOrigin] | None = None
            if flat is None:
                origins = []
                for e in layout.entries:
                    base = e.base
                    # _new(EntryOrigin, ...): no generated __new__ frame per entry (25k on a MoE's first offload)
                    origins.append(_new(EntryOrigin, (base.untyped_storage(), base.storage_offset()))
                                   if base is not None else _NO_ORIGIN)
            record.origins.append(ParkedLayout(layout, flat, origins))
            if not layout.entries:
                continue
            st, _ = placeholder(layout.entries[0].refs[0].tensor.device, layout.dtype)
            zs = _ZEROS
            for e in layout.entries:  # the hot loop of a steady offload: keep it to one set_ per tensor
                for r in e.refs:
                    t, size = r.tensor, r.size
                    z = zs.get(len(size)) or zero_strides(len(size))
                    if t.requires_grad:  # keep its gradient accumulator (see [Note: autograd identity])
                        repoint_tensor(t, st, 0, size, z)
                    else:
                        t.set_(st, 0, size, z)
                    if guarding:
                        guard(t, r.name)


def unpark(record: ParkRecord) -> None:
    """Undo :func:`park`: every tensor back on its original storage (which must hold its bytes again)."""
    with torch.no_grad():
        for layout, flat, origins in record.origins:
            if flat is not None:
                st, at0 = flat.untyped_storage(), flat.storage_offset()
                for e in layout.entries:
                    for r in e.refs:
                        unguard(r.tensor)
                        repoint_tensor(r.tensor, st, at0 + e.offset + r.offset, r.size, r.stride)
                continue
            for e, (st, at0) in zip(layout.entries, origins or ()):
                for r in e.refs:
                    unguard(r.tensor)
                    if st is not None:
                        repoint_tensor(r.tensor, st, at0 + r.offset, r.size, r.stride)


def repoint(layouts: list[FlatLayout], flats: list[torch.Tensor]) -> None:
    """Point every registered tensor into its layout's flat buffer (views and sharing survive).

    Afterwards the store holds the tensors only weakly; ``layout.resident_views``
    counts the tensor objects viewing the flat buffer (for the steady-state check).
    """
    with torch.no_grad():
        for layout, flat in zip(layouts, flats):
            st = flat.untyped_storage()
            base = flat.storage_offset()
            views = 0
            for e in layout.entries:
                at = base + e.offset
                for r in e.refs:
                    t = r.tensor
                    if type(t) in _GUARDED:
                        unguard(t)
                    if t.requires_grad:  # keep its gradient accumulator (see [Note: autograd identity])
                        repoint_tensor(t, st, at + r.offset, r.size, r.stride)
                    else:
                        t.set_(st, at + r.offset, r.size, r.stride)
                    r.weaken()
                    views += 1
            layout.resident_views = views


def restore_released(layouts: list[FlatLayout]) -> None:
    """Undo :func:`repoint`: every tensor parked again, held strongly again."""
    guarding = debug_mode()
    with torch.no_grad():
        for layout in layouts:
            if not layout.entries:
                continue
            for e in layout.entries:
                for r in e.refs:
                    t = r.live()
                    if t is None:
                        continue
                    st, _ = placeholder(t.device, layout.dtype)
                    repoint_tensor(t, st, 0, r.size, zero_strides(len(r.size)))
                    r.strengthen()
                    if guarding:
                        guard(t, r.name)
            layout.resident_views = -1


def force_repoint_prepare(layouts: list[FlatLayout]) -> list[str]:
    """Before a forced reload (:meth:`OffloadStore.recover`): make every registered tensor re-pointable.

    A tensor whose dtype was changed meanwhile gets an empty tensor of the layout's
    dtype as its data. Returns the names of tensors whose change is overwritten.
    """
    changed = changed_tensors(layouts)
    with torch.no_grad():
        for layout in layouts:
            for e in layout.entries:
                for r in e.refs:
                    t = r.tensor
                    unguard(t)
                    if t.dtype != layout.dtype:
                        t.data = torch.empty(0, dtype=layout.dtype, device=t.device)
    return changed


def resident_flat(layout: FlatLayout, viewers: dict[int, ViewCount]) -> torch.Tensor | None:
    """A 1-D view of ``layout``'s flat device buffer, found through a live registered tensor.

    Records in ``viewers`` how many tensor objects view the buffer before the store adds its own.
    """
    for e in layout.entries:
        for r in e.refs:
            t = r.live()
            if t is None:
                continue
            st = t.untyped_storage()
            if st._cdata == layout.flat_storage and st.nbytes() == layout.nbytes:
                if storage_use_count is not None:
                    viewers[st._cdata] = ViewCount(storage_use_count(st._cdata) - 1, own_view_mark())  # minus st
                return storage_view(st, layout.dtype, t.device, layout.numel)
    return None


def unadopt(layouts: Iterable[FlatLayout]) -> None:
    """After a failed offload (nothing released): resident layouts go back to weak references."""
    for layout in layouts:
        for e in layout.entries:
            e.base = None
            for r in e.refs:
                r.weaken()


def mark_resident(layouts: list[FlatLayout], flat_storages: list[int]) -> int:
    """After a reload: each layout is on the device in its flat buffer (storage ids in layout order).
    Returns the bytes brought back (dropped layouts count nothing)."""
    moved = 0
    for layout, sid in zip(layouts, flat_storages):
        layout.state = LayoutState.ON_DEVICE
        layout.flat_storage = sid
        moved += 0 if layout.dropped else layout.data_nbytes
        layout.dropped = False
    return moved


__all__ = ["EntryOrigin", "ItemSignature", "ParkRecord", "ParkedLayout", "adopt_if_unchanged", "adopt_resident",
           "changed_tensors", "force_repoint_prepare", "mark_resident", "park", "repoint", "resident_flat",
           "restore_released", "steady_unchanged", "unadopt", "unpark"]


# --------------------------------------------------------------------------- steady-state fast path
#
# [Note: steady offload check] After a reload every registered tensor is a view into its
# layout's flat buffer and the copies of those buffers are issued first ("speculatively").
# Deciding that nothing changed used to walk every tensor through the full collection and
# planning (group_by_storage + adopt_if_unchanged + record_released): ~5 Python calls and a few
# objects per tensor, 150-340 ms for 25k MoE tensors, which could outlast the copy. The fast
# check compares what the collectors yield now with a signature taken at the last full
# collection (the same objects, in the same order; the ones left in place still left in place)
# and each registered tensor's address and geometry with where the reload put it. Any
# difference falls back to the full path, which decides exactly as before.


class ItemSignature:
    """What the last full collection saw: item object ids in order and the ones left in place."""

    __slots__ = ("cats", "ids", "left_in_place", "layouts", "report")

    def __init__(self, cats: frozenset, items: list[Item], plan: dict, report: Any) -> None:
        in_layouts = {id(r.tensor) for lay in plan.values() for e in lay.entries for r in e.refs}
        self.cats = cats
        self.ids = [id(it.tensor) for it in items]
        self.left_in_place = {id(it.tensor): it.tensor for it in items
                              if id(plain_tensor(it.tensor)) not in in_layouts}
        self.layouts = {key: id(lay) for key, lay in plan.items()}
        self.report = report


def steady_unchanged(tensors: Iterator[Any], sig: ItemSignature, resident: list[FlatLayout],
                     flats: dict[Any, torch.Tensor], device: torch.device) -> bool:
    """True if the collectors yield the same objects as at ``sig`` and every registered tensor of the
    resident layouts is still the view the reload made (see [Note: steady offload check]).

    ``tensors``: the tensor objects the collectors yield now (:meth:`Collector.tensor_objects`)."""
    if {lay.key: id(lay) for lay in resident} != sig.layouts or any(lay.key not in flats for lay in resident):
        return False
    ids, left, n, i = sig.ids, sig.left_in_place, len(sig.ids), 0
    for t in tensors:
        if i >= n or id(t) != ids[i]:
            return False
        i += 1
        if id(t) in left:  # zero-size or host-resident before: must still be
            plain = plain_tensor(t)
            if plain.numel() and not (plain.device.type == "cpu" and device.type != "cpu"):
                return False
    if i != n:
        return False
    for layout in resident:
        base, size, dtype = flats[layout.key].data_ptr(), layout.dtype.itemsize, layout.dtype
        for e in layout.entries:
            for r in e.refs:
                t = r.live()
                if (t is None or t.dtype is not dtype or t.data_ptr() != base + (e.offset + r.offset) * size
                        or t.shape != r.size or t.stride() != r.stride):
                    return False
    return True


def adopt_resident(layout: FlatLayout, flat: torch.Tensor) -> None:
    """The fast path's :func:`adopt_if_unchanged`: hold the tensors strongly and give the release one
    view of the flat buffer."""
    first = True
    for e in layout.entries:
        e.owns_storage = False
        e.base = own_view(flat[e.offset:e.offset + e.numel]) if first else None  # one view: the release frees the storage
        first = False
        for r in e.refs:
            r.strengthen()
