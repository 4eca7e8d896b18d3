"""The released state: what a registered tensor points at while its bytes are in host memory.

[Note: parked tensors]
Releasing a storage (``Runtime.release``: resize to 0 bytes) returns its
memory, but a tensor that still has its shape on a 0-byte storage reads
through a null or dangling pointer: ``p.sum()``, ``repr(p)``, ``opt.step()``
killed the process with SIGSEGV (a 0-byte storage with the tensor's shape
does the same). So before anything is released, every registered tensor is
*parked*: re-pointed (``set_``, or ``.data`` for a tensor that requires grad:
see [Note: autograd identity] in
:mod:`refimpl.store.state.repoint`) at a one-element placeholder storage of its
dtype and device with all strides 0, and *guarded* (see [Note: offload guard]
in :mod:`refimpl.store.state.guard`): every torch call on it but a metadata read
raises :class:`OffloadedTensorError` naming it and saying ``reload() first``.
Shape, dtype, device, ``requires_grad`` and the tensor object stay.

The placeholder is the floor under the guard, for what does not pass through
``__torch_function__`` (C++ callers, code with torch functions disabled): it
is read-only (``_set_throw_on_mutable_data_ptr``: any write raises, the
autograd engine's gradient accumulation included), not resizable (a DLPack
import: ``resize_`` raises, never grows it), and reads NaN for floating dtypes
(0 otherwise), so a stray read shows. Placeholders are per store
(:class:`Parking`, one per device and dtype): nothing one store parks can be
changed through another store's tensors, even by a write that got past both
floors. A store's placeholders go when the store goes, unless a tensor still
points at one (then it stays for the life of the process, so its storage id
is never reused while :func:`is_parked` could see it).

Parking happens while the offload's copies run (the copies read the store's
own views of the storages, not the registered tensors); a failure before the
release *unparks* (re-points every tensor at its original storage and
unguards it), so nothing moved.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Iterable, NamedTuple

import torch

from refimpl.store.state.guard import guard, unguard
from refimpl.store.state.repoint import repoint_tensor, zero_strides
from refimpl.store.state.storage_views import find_views, storage_use_count

logger = logging.getLogger(__name__)


class _Placeholder(NamedTuple):
    tensor: torch.Tensor
    storage: Any
    storage_id: int
    #: references to the storage with nothing parked on it (the placeholder tensor and ``storage``)
    own_uses: int


_LOCK = threading.Lock()
_PLACEHOLDER_IDS: set[int] = set()
_KEPT: list[_Placeholder] = []  # placeholders of stores gone while tensors still pointed at them


def _make_placeholder(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    fill: Any = float("nan") if dtype.is_floating_point or dtype.is_complex else 0
    if dtype is torch.bool:
        fill = False
    t = torch.full((1,), fill, dtype=dtype, device=device)
    if device.type == "meta":
        return t
    try:  # a DLPack-imported storage is not resizable: resize_ of a parked tensor raises, never grows it
        t = torch.utils.dlpack.from_dlpack(t.__dlpack__())
    except Exception:  # noqa: BLE001 - dtypes DLPack does not carry: a resizable placeholder still never crashes
        pass
    read_only = getattr(torch._C, "_set_throw_on_mutable_data_ptr", None)
    if read_only is not None:  # every write through a data pointer raises, C++ callers included
        read_only(t)
    return t


def _retire(spots: dict[Any, _Placeholder]) -> None:
    """A store's :class:`Parking` is gone: drop its placeholders nothing points at, keep the others."""
    with _LOCK:
        for ph in spots.values():
            if storage_use_count is not None and storage_use_count(ph.storage_id) <= ph.own_uses:
                _PLACEHOLDER_IDS.discard(ph.storage_id)
            else:  # a tensor still parked on it: its id must stay a placeholder's
                _KEPT.append(ph)
        spots.clear()


class Parking:
    """One store's placeholders: a read-only one-element storage per (device, dtype) that its parked
    tensors point at (see [Note: parked tensors]); ``site`` is, in debug mode, where the offload in
    progress was called from (the guard's errors name it)."""

    def __init__(self) -> None:
        self._spots: dict[tuple[torch.device, torch.dtype], _Placeholder] = {}
        #: debug mode: where the offload in progress was called from; None otherwise
        self.site: str | None = None
        weakref.finalize(self, _retire, self._spots)

    def placeholder(self, device: torch.device, dtype: torch.dtype) -> tuple[Any, int]:
        """``(storage, storage id)`` of this store's placeholder for ``(device, dtype)``."""
        hit = self._spots.get((device, dtype))
        if hit is None:
            with _LOCK:
                hit = self._spots.get((device, dtype))
                if hit is None:
                    t = _make_placeholder(device, dtype)
                    st = t.untyped_storage()
                    sid = st._cdata
                    uses = storage_use_count(sid) if storage_use_count is not None else 0
                    hit = self._spots[(device, dtype)] = _Placeholder(t, st, sid, uses)
                    _PLACEHOLDER_IDS.add(sid)
        return hit.storage, hit.storage_id

    def storage_ids(self) -> set[int]:
        """Storage ids of this store's placeholders."""
        return {ph.storage_id for ph in self._spots.values()}


def is_placeholder(storage_id: int) -> bool:
    """True if ``storage_id`` is a placeholder storage (the tensor viewing it is parked by some store)."""
    return storage_id in _PLACEHOLDER_IDS


def is_parked(t: torch.Tensor) -> bool:
    """True while ``t`` is parked by an offload store (its bytes are in host memory); False for a
    tensor with elements on memory of its own."""
    with torch._C.DisableTorchFunctionSubclass():
        return t.untyped_storage()._cdata in _PLACEHOLDER_IDS


class ViewPlace(NamedTuple):
    """Where a view a client keeps itself (not given to the store) points when it is not parked."""

    tensor: torch.Tensor
    storage: Any
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def park_views(parking: Parking, views: Iterable[tuple[str, torch.Tensor]], where: str | None = None) -> None:
    """Park tensors a client keeps itself (a torch DDP bucket's ``p.grad``, Megatron's bucket and shard
    views), each given with its name: re-pointed at ``parking``'s placeholder of its dtype, all strides 0,
    its autograd identity kept (see [Note: parked tensors]), and guarded under its name (``where``: the
    debug site). :func:`repoint_views` points them back."""
    with torch.no_grad():
        for name, t in views:
            st, _ = parking.placeholder(t.device, t.dtype)
            repoint_tensor(t, st, 0, tuple(t.shape), zero_strides(t.dim()))
            guard(t, name, where=where)


def repoint_views(places: Iterable[ViewPlace]) -> None:
    """Unguard each place's tensor and point it at its storage, offset, size and stride again (after
    :func:`park_views`)."""
    with torch.no_grad():
        for p in places:
            unguard(p.tensor)
            repoint_tensor(p.tensor, p.storage, p.offset, p.size, p.stride)


def park_strays(storage_id: int, known: set[int], parking: Parking, owner: str = "") -> list[str]:
    """Park and guard every tensor that views ``storage_id`` but is not in ``known`` (views of the store's own
    flat buffer made after a reload and kept, or kept by a runtime) on ``parking``'s placeholders; ``owner``
    names the registered tensor they viewed, for the guard's error. Returns their descriptions."""
    found = find_views(storage_id, known)
    out = []
    with torch.no_grad():
        for t in found:
            shape = tuple(t.shape)
            out.append(f"{type(t).__name__} of shape {shape}")
            st, _ = parking.placeholder(t.device, t.dtype)
            try:
                repoint_tensor(t, st, 0, shape, zero_strides(t.dim()))
            except RuntimeError as e:  # e.g. a view that autograd guards: left as it is
                logger.warning("could not park a stray view of an offloaded flat buffer (%s)", e)
                continue
            of = f" of {owner}" if owner else ""
            guard(t, f"a view of shape {shape}{of} kept across an offload (it stays offloaded after reload(); "
                     f"take views after reload() instead)", where=parking.site)
    return out


__all__ = ["Parking", "ViewPlace", "is_parked", "is_placeholder", "park_strays", "park_views", "repoint_views"]
