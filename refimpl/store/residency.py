"""Checks that registered tensors are still where the store left them.

* :func:`resident_flat`, :func:`steady_unchanged` (see [Note: steady offload
  check] below) and :func:`adopt_resident`: the steady offload's check that every
  ref of a resident layout is still the view the reload made, and its adoption
  of the layout (:meth:`FlatLayout.adopt`).
* :func:`adopt_if_unchanged`: the full offload's per-storage version of that check.
* :func:`changed_tensors`: before a reload, whether each ref is still parked as
  the offload left it; :func:`force_repoint_prepare` makes every ref
  re-pointable for :meth:`OffloadStore.recover`.

The moves themselves (park, unpark, repoint, repark) are the layout's own
transitions, in :mod:`refimpl.store.layout`.
"""
from __future__ import annotations

from typing import Any, Iterator

import torch

from refimpl.store.collect import Item, plain_tensor
from refimpl.store.grouping import StorageGroup, ViewCount, storage_view
from refimpl.store.layout import FlatLayout
from refimpl.store.parking import own_view_mark, storage_use_count, zero_strides


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
    layout.adopt(group.base_view(), every_entry=True)
    for e in layout.entries:
        for r in e.refs:
            c = collected[id(r.live())]
            r.hold(c.tensor, c.dtensor)
    return True


def changed_tensors(layouts: list[FlatLayout]) -> list[str]:
    """Descriptions of registered tensors that are no longer parked the way the offload left them."""
    with torch._C.DisableTorchFunctionSubclass():  # metadata of guarded tensors, without a Python call each
        return _changed(layouts)


def _changed(layouts: list[FlatLayout]) -> list[str]:
    problems = []
    for layout in layouts:
        dtype = layout.dtype
        if not layout.entries:
            continue
        sid, off = layout.placeholder_id, 0
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
                    r.unguard()
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


__all__ = ["ItemSignature", "adopt_if_unchanged", "adopt_resident", "changed_tensors", "force_repoint_prepare",
           "resident_flat", "steady_unchanged"]


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

    def __init__(self, cats: frozenset, items: list[Item], layouts: dict, report: Any) -> None:
        in_layouts = {id(r.tensor) for lay in layouts.values() for e in lay.entries for r in e.refs}
        self.cats = cats
        self.ids = [id(it.tensor) for it in items]
        self.left_in_place = {id(it.tensor): it.tensor for it in items
                              if id(plain_tensor(it.tensor)) not in in_layouts}
        self.layouts = {key: id(lay) for key, lay in layouts.items()}
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
    layout.adopt(flat, every_entry=False)  # one view: the release frees the storage
    for e in layout.entries:
        for r in e.refs:
            r.strengthen()
