"""Where registered tensors live: re-pointing them into flat buffers, and noticing when they moved.

After a reload every registered tensor is a view into its layout's flat buffer
(:func:`repoint`). :func:`adopt_if_unchanged` decides at the next offload
whether the tensors are all still exactly there (then the layout leaves in one
copy). :func:`record_released` and :func:`changed_tensors` guard the offloaded
state: before a reload, each tensor must still sit on the 0-byte storage the
offload left it on, with the same geometry. :func:`restore_released` undoes a
re-pointing when a reload fails after it.
"""
from __future__ import annotations

from typing import Any, Iterator

import torch

from refimpl.store.collect import StorageGroup
from refimpl.store.layout import FlatLayout


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
        e.base = flat[e.offset:e.offset + e.numel]
        e.owns_storage = False
        for r in e.refs:
            c = collected[id(r.live())]
            r.tensor, r.dtensor = c.tensor, c.dtensor
            r._weak_tensor = r._weak_dtensor = None
    return True


def changed_tensors(layouts: list[FlatLayout]) -> list[str]:
    """Descriptions of registered tensors that no longer look the way the offload left them."""
    problems = []
    for layout in layouts:
        dtype = layout.dtype
        for e in layout.entries:
            for r in e.refs:
                t = r.tensor
                assert t is not None and r.released is not None
                sid, off = r.released
                st = t.untyped_storage()
                if st._cdata == sid and t.storage_offset() == off and t.shape == r.size and t.dtype is dtype \
                        and st.nbytes() == 0 and t.stride() == r.stride:
                    continue
                if st._cdata != sid or st.nbytes() != 0:
                    problems.append(f"{r.name} now has other storage ({st.nbytes()} bytes; was it re-assigned?)")
                elif (t.storage_offset(), tuple(t.shape), tuple(t.stride())) != (off, r.size, r.stride):
                    problems.append(f"{r.name} was resized/restrided from {r.size}/{r.stride}@{off} to "
                                    f"{tuple(t.shape)}/{tuple(t.stride())}@{t.storage_offset()}")
                elif t.dtype != layout.dtype:
                    problems.append(f"{r.name} changed dtype from {layout.dtype} to {t.dtype}")
    return problems


def record_released(layouts: list[FlatLayout]) -> None:
    """Remember each tensor's storage and offset as the offload leaves them (checked before reload).

    Releasing shrinks a storage in place, so its identity is known before the release happens.
    """
    for layout in layouts:
        for e in layout.entries:
            for r in e.refs:
                t = r.tensor
                st = t.untyped_storage()
                r.released = (st._cdata, t.storage_offset())
                r.released_storage = st


def repoint(layouts: list[FlatLayout], flats: list[torch.Tensor]) -> None:
    """Point every registered tensor into its layout's flat buffer (views and sharing survive).

    Afterwards the store holds the tensors only weakly.
    """
    with torch.no_grad():
        for layout, flat in zip(layouts, flats):
            st = flat.untyped_storage()
            base = flat.storage_offset()
            for e in layout.entries:
                at = base + e.offset
                for r in e.refs:
                    r.tensor.set_(st, at + r.offset, r.size, r.stride)
                    r.weaken()


def restore_released(layouts: list[FlatLayout]) -> None:
    """Undo :func:`repoint`: every tensor back on its released (0-byte) storage, held strongly again."""
    with torch.no_grad():
        for layout in layouts:
            for e in layout.entries:
                for r in e.refs:
                    t = r.live()
                    if t is not None and r.released is not None and r.released_storage is not None:
                        t.set_(r.released_storage, r.released[1], r.size, r.stride)
                        r.strengthen()


__all__ = ["adopt_if_unchanged", "changed_tensors", "record_released", "repoint", "restore_released"]


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

    def __init__(self, cats: frozenset, items: list, plan: dict, report: Any) -> None:
        from refimpl.store.collect import split_dtensor

        in_layouts = {id(r.tensor) for lay in plan.values() for e in lay.entries for r in e.refs}
        self.cats = cats
        self.ids = [id(it[3]) for it in items]
        self.left_in_place = {id(it[3]): it[3] for it in items if id(split_dtensor(it[3])[0]) not in in_layouts}
        self.layouts = {key: id(lay) for key, lay in plan.items()}
        self.report = report


def steady_unchanged(items: Iterator, sig: ItemSignature, resident: list[FlatLayout],
                     flats: dict[Any, torch.Tensor], device: torch.device) -> bool:
    """True if the collectors yield the same objects as at ``sig`` and every registered tensor of the
    resident layouts is still the view the reload made (see [Note: steady offload check])."""
    from refimpl.store.collect import split_dtensor

    if {lay.key: id(lay) for lay in resident} != sig.layouts or any(lay.key not in flats for lay in resident):
        return False
    ids, left, n, i = sig.ids, sig.left_in_place, len(sig.ids), 0
    for it in items:
        t = it[3]
        if i >= n or id(t) != ids[i]:
            return False
        i += 1
        if id(t) in left:  # zero-size or host-resident before: must still be
            plain = split_dtensor(t)[0]
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
    """The fast path's :func:`adopt_if_unchanged` + :func:`record_released`: hold the tensors strongly,
    give the release one view of the flat buffer, and record where each tensor will sit after it."""
    storage, sid = flat.untyped_storage(), layout.flat_storage
    first = True
    for e in layout.entries:
        e.owns_storage = False
        e.base = flat[e.offset:e.offset + e.numel] if first else None  # one view: the release frees the storage
        first = False
        for r in e.refs:
            r.tensor, r.dtensor = r.live(), r.live_dtensor()
            r._weak_tensor = r._weak_dtensor = None
            r.released = (sid, e.offset + r.offset)
            r.released_storage = storage
