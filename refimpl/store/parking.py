"""The released state: what a registered tensor points at while its bytes are in host memory.

[Note: parked tensors]
Releasing a storage (``Runtime.release``: resize to 0 bytes) returns its
memory, but a tensor that still has its shape on a 0-byte storage reads
through a null or dangling pointer: ``p.sum()``, ``repr(p)``, ``opt.step()``
killed the process with SIGSEGV (a 0-byte storage with the tensor's shape
does the same). So before anything is released, every registered tensor is
*parked*: re-pointed (``set_``, or ``.data`` for a tensor that requires grad:
see [Note: autograd identity]) at a one-element placeholder storage of its
dtype and device with all strides 0, and *guarded* (see [Note: offload guard]
in :mod:`refimpl.store.guard`): every torch call on it but a metadata read
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

import inspect
import logging
import os
import threading
import weakref
from typing import Any, Iterable, Mapping, NamedTuple

import torch

from refimpl.store.guard import GUARDED_CLASSES, OffloadedTensorError, guard, is_guarded, unguard

logger = logging.getLogger(__name__)

DEBUG_ENV = "TIMESHARE_DEBUG"
"""Environment variable that turns on debug mode (where each offload was called from in the guard's
errors, replica checks at every offload)."""


def debug_mode() -> bool:
    """True when :data:`DEBUG_ENV` is set to a true value (1, true, yes, on)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def caller_site() -> str:
    """``file:line in function`` of the innermost caller outside this package (debug mode's detail for
    the guard's errors: where the offload was called from)."""
    here = inspect.currentframe()
    f = here.f_back if here is not None else None
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE):
        f = f.f_back
    if f is None:
        return "an offload inside the store"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} in {f.f_code.co_name}()"


class _Placeholder(NamedTuple):
    tensor: torch.Tensor
    storage: Any
    storage_id: int
    #: references to the storage with nothing parked on it (the placeholder tensor and ``storage``)
    own_uses: int


_LOCK = threading.Lock()
_PLACEHOLDER_IDS: set[int] = set()
_KEPT: list[_Placeholder] = []  # placeholders of stores gone while tensors still pointed at them
_ZERO_STRIDES: dict[int, tuple[int, ...]] = {}
ZERO_STRIDES: Mapping[int, tuple[int, ...]] = _ZERO_STRIDES
"""All-zero strides by dimension count, filled by :func:`zero_strides` (read it, never write it: a hot
loop's ``ZERO_STRIDES.get(ndim)`` saves a call)."""


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


# [Note: autograd identity]
# ``Tensor.set_`` resets a leaf's gradient accumulator (torch treats it like ``resize_``): after
# it, ``p.expand_as(p).grad_fn.next_functions[0][0]`` is a new AccumulateGrad node and every hook
# registered on the old one (torch DDP's reducer, Megatron DDP) never fires again. ``p.data = t``
# swaps the storage and geometry under the same autograd metadata, keeping the node (same dtype
# and device). So a tensor that requires grad is re-pointed through a carrier tensor and ``.data``;
# its version counter is bumped as ``set_`` bumps it, so a backward through a graph recorded
# before the re-point still raises instead of reading the placeholder.


def repoint_tensor(t: torch.Tensor, storage: Any, offset: int, size: Any, stride: Any) -> None:
    """``t.set_(storage, offset, size, stride)`` that keeps ``t``'s autograd identity (see
    [Note: autograd identity]): its gradient accumulator, hooks, ``is_leaf`` and ``requires_grad``.
    Call it under ``torch.no_grad()``."""
    if t.requires_grad:
        carrier = torch.empty(0, dtype=t.dtype, device=t.device)
        carrier.set_(storage, offset, size, stride)
        t.data = carrier
        _increment_version(t)
    else:
        t.set_(storage, offset, size, stride)


_increment_version = torch.autograd.graph.increment_version


def zero_strides(ndim: int) -> tuple[int, ...]:
    """``(0,) * ndim``, cached."""
    z = _ZERO_STRIDES.get(ndim)
    if z is None:
        z = _ZERO_STRIDES[ndim] = (0,) * ndim
    return z


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


# --------------------------------------------------------------------------- aliases

_OWN_VIEWS: "weakref.WeakSet[torch.Tensor]" = weakref.WeakSet()


_OWN_SEQ = [0]


def own_view(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as a view the store made for itself (not counted as an unattached alias); returns ``t``.

    A failed offload's traceback, a debugger or a tracer may keep such views alive after the store dropped them.
    """
    _OWN_SEQ[0] += 1
    t._timeshare_own = _OWN_SEQ[0]  # type: ignore[attr-defined]
    _OWN_VIEWS.add(t)
    return t


def own_view_mark() -> int:
    """A mark: :func:`own_views_of` with ``before=`` this counts only views made before now."""
    return _OWN_SEQ[0] + 1


def own_views_index() -> dict[int, list[tuple[int, int]]]:
    """Every live view the store made, by storage id: ``[(mark, id(view)), ...]`` (one pass)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for t in list(_OWN_VIEWS):
        try:
            out.setdefault(t.untyped_storage()._cdata, []).append((t._timeshare_own, id(t)))
        except Exception:  # noqa: BLE001 - a tensor being torn down
            continue
    return out


def own_views_of(storage_id: int, before: int | None = None) -> set[int]:
    """Ids of the live views the store made of ``storage_id`` (see :func:`own_view`), made before ``before``."""
    out = set()
    for t in list(_OWN_VIEWS):
        try:
            if t.untyped_storage()._cdata == storage_id and (before is None or t._timeshare_own < before):
                out.add(id(t))
        except Exception:  # noqa: BLE001 - a tensor being torn down
            continue
    return out


storage_use_count = getattr(torch._C, "_storage_Use_Count", None)
"""``storage_use_count(storage_id)``: how many references the StorageImpl has (TensorImpls viewing it, plus
one while a Python storage object for it exists); None on builds without it (the alias check is skipped)."""


def find_views(storage_id: int, known: set[int]) -> list[torch.Tensor]:
    """Tensors alive in this process that view ``storage_id`` and whose ids are not in ``known``.

    Walks every object the garbage collector tracks: for the rare cases where a count does not add up.
    """
    import gc
    import warnings

    known = known | own_views_of(storage_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated torch objects warns
        objects = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and id(o) not in known]
    out = []
    for obj in objects:
        try:
            if obj.untyped_storage()._cdata == storage_id:
                out.append(obj)
        except Exception:  # noqa: BLE001 - wrappers without storage
            continue
    return out


def describe_aliases(storage_id: int, known: set[int], limit: int = 3) -> list[str]:
    """Descriptions of :func:`find_views` (for error messages)."""
    return [f"a {type(t).__name__} of shape {tuple(t.shape)} {t.dtype} at storage offset {t.storage_offset()}"
            for t in find_views(storage_id, known)[:limit]]


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


__all__ = [
    "DEBUG_ENV",
    "GUARDED_CLASSES",
    "OffloadedTensorError",
    "ZERO_STRIDES",
    "debug_mode",
    "describe_aliases",
    "find_views",
    "Parking",
    "caller_site",
    "park_strays",
    "guard",
    "own_view",
    "own_view_mark",
    "own_views_index",
    "own_views_of",
    "is_guarded",
    "is_parked",
    "is_placeholder",
    "repoint_tensor",
    "storage_use_count",
    "unguard",
    "zero_strides",
]
