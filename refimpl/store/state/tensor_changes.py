"""Registered tensors changed while offloaded: before a reload, each parked tensor must still be parked the way
the offload left it (:func:`changed_tensors`; a change raises ``TensorChangedError``), unless
:meth:`OffloadStore.recover` overwrites the change (:func:`force_repoint_prepare`).

The moves themselves (park, unpark, repoint, repark) are the layout's own transitions, in
:mod:`refimpl.store.state.layout`.
"""
from __future__ import annotations

import torch

from refimpl.store.state.layout import FlatLayout
from refimpl.store.state.repoint import zero_strides


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


__all__ = ["changed_tensors", "force_repoint_prepare"]
