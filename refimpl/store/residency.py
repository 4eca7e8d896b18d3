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
