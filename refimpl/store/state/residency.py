"""A resident layout taken into the next offload: after a reload every registered tensor of a layout is a view
into its flat device buffer, and an offload that finds them where the reload put them moves the layout as it is.

* :func:`resident_flat`: the flat buffer, found through a live registered tensor (and its viewers counted);
* :func:`adopt_resident`: the steady offload's adoption of the layout (:meth:`FlatLayout.adopt`; the check that
  it may is :func:`refimpl.store.state.steady_check.steady_unchanged`);
* :func:`adopt_if_unchanged`: the full offload's per-storage version of that check and adoption.
"""
from __future__ import annotations

import torch

from refimpl.store.state.grouping import StorageGroup, ViewCount, storage_view
from refimpl.store.state.layout import FlatLayout
from refimpl.store.state.storage_views import own_view_mark, storage_use_count


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


def adopt_resident(layout: FlatLayout, flat: torch.Tensor) -> None:
    """The steady path's :func:`adopt_if_unchanged`: hold the tensors strongly and give the release one
    view of the flat buffer."""
    layout.adopt(flat, every_entry=False)  # one view: the release frees the storage
    for e in layout.entries:
        for r in e.refs:
            r.strengthen()


__all__ = ["adopt_if_unchanged", "adopt_resident", "resident_flat"]
