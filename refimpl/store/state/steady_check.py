"""The steady offload's check: is every registered tensor still where the last reload put it?

[Note: steady offload check]
After a reload every registered tensor is a view into its layout's flat buffer, and the copies of those
buffers are issued first, ahead of collection. Deciding that nothing changed through the full collection and
planning (group_by_storage, adopt_if_unchanged) costs about five Python calls and a few objects per tensor,
which for tens of thousands of tensors can outlast the copy. The fast check compares what the collectors yield
now with a signature taken at the last full collection (the same objects, in the same order; the ones left in
place still left in place) and each registered tensor's address and geometry with where the reload put it. Any
difference falls back to the full path, which decides as always.
"""
from __future__ import annotations

from typing import Any, Iterator

import torch

from refimpl.store.state.collect import Item, plain_tensor
from refimpl.store.state.layout import FlatLayout


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


__all__ = ["ItemSignature", "steady_unchanged"]
