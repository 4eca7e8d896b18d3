"""The released state: what a registered tensor points at while its bytes are in host memory.

[Note: parked tensors]
Releasing a storage (``Runtime.release``: resize to 0 bytes) returns its
memory, but a tensor that still has its shape on a 0-byte storage reads
through a null or dangling pointer: ``p.sum()``, ``repr(p)``, ``opt.step()``
killed the process with SIGSEGV. So before anything is released, every
registered tensor is *parked*: re-pointed (``set_``, or ``.data`` for a tensor that
requires grad: see [Note: autograd identity]) at a one-element
placeholder storage of its dtype and device with all strides 0. Shape, dtype,
device, ``requires_grad`` and the tensor object stay; every element reads the
placeholder's one value (NaN for floating dtypes, so a stray read shows);
in-place writes raise torch's "more than one element of the written-to tensor
refers to a single memory location"; the placeholder storage is not resizable,
so ``resize_`` raises too. Nothing can crash the process.

In debug mode (env ``TIMESHARE_DEBUG=1``) a parked tensor also changes class
to a subclass whose ``__torch_function__`` raises :class:`OffloadedTensorError`
naming the tensor and saying ``reload() first`` for any torch call but reading
metadata (shape, dtype, device, ...). The class goes back on reload.

Parking happens while the offload's copies run (the copies read the store's
own views of the storages, not the registered tensors); a failure before the
release *unparks* (re-points every tensor at its original storage), so nothing
moved. Placeholders are shared by every store of the process, one per (device,
dtype), kept for the life of the process.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Iterable, Mapping, NamedTuple

import torch

logger = logging.getLogger(__name__)

DEBUG_ENV = "TIMESHARE_DEBUG"
"""Environment variable that turns on debug mode (guarded parked tensors, replica checks at every offload)."""


def debug_mode() -> bool:
    """True when :data:`DEBUG_ENV` is set to a true value (1, true, yes, on)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class OffloadedTensorError(RuntimeError):
    """A parked (offloaded) tensor was used in debug mode; its bytes are in host memory."""


_LOCK = threading.Lock()
class _Placeholder(NamedTuple):
    tensor: torch.Tensor
    storage: Any
    storage_id: int


_PLACEHOLDERS: dict[tuple[str, torch.dtype], _Placeholder] = {}
_PLACEHOLDER_IDS: set[int] = set()
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
        return torch.utils.dlpack.from_dlpack(t.__dlpack__())
    except Exception:  # noqa: BLE001 - dtypes DLPack does not carry: a resizable placeholder still never crashes
        return t


def placeholder(device: torch.device, dtype: torch.dtype) -> tuple[Any, int]:
    """``(storage, storage id)`` of the shared one-element placeholder for ``(device, dtype)``."""
    key = (str(device), dtype)
    hit = _PLACEHOLDERS.get(key)
    if hit is None:
        with _LOCK:
            hit = _PLACEHOLDERS.get(key)
            if hit is None:
                t = _make_placeholder(device, dtype)
                st = t.untyped_storage()
                hit = _PLACEHOLDERS[key] = _Placeholder(t, st, st._cdata)
                _PLACEHOLDER_IDS.add(st._cdata)
    return hit.storage, hit.storage_id


def is_placeholder(storage_id: int) -> bool:
    """True if ``storage_id`` is a placeholder storage (the tensor viewing it is parked by some store)."""
    return storage_id in _PLACEHOLDER_IDS


def is_parked(t: torch.Tensor) -> bool:
    """True while ``t`` is parked by an offload store (its bytes are in host memory); False for a
    tensor with elements on memory of its own."""
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


def park_views(tensors: Iterable[torch.Tensor]) -> None:
    """Park tensors a client keeps itself (a torch DDP bucket's ``p.grad``, Megatron's bucket and shard
    views): each re-pointed at its dtype's placeholder, all strides 0, its autograd identity kept
    (see [Note: parked tensors]). :func:`repoint_views` points them back."""
    with torch.no_grad():
        for t in tensors:
            st, _ = placeholder(t.device, t.dtype)
            repoint_tensor(t, st, 0, tuple(t.shape), zero_strides(t.dim()))


def repoint_views(places: Iterable[ViewPlace]) -> None:
    """Point each place's tensor at its storage, offset, size and stride again (after :func:`park_views`)."""
    with torch.no_grad():
        for p in places:
            repoint_tensor(p.tensor, p.storage, p.offset, p.size, p.stride)


# --------------------------------------------------------------------------- debug guard

_ALLOWED_NAMES = frozenset({
    "shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "ndim", "dim", "size", "numel",
    "nelement", "is_cuda", "is_meta", "is_sparse", "layout", "names", "name", "grad", "_is_view",
    "is_floating_point", "is_complex", "element_size", "itemsize", "nbytes", "__hash__", "_base", "data_ptr",
    "untyped_storage", "storage_offset", "stride", "is_contiguous", "requires_grad_", "_backward_hooks",
    "is_nested", "is_quantized", "_post_accumulate_grad_hooks", "__set__",
})
_GUARD_CLASSES: dict[type, type] = {}
_ORIGINAL_CLASS: dict[type, type] = {}
GUARDED_CLASSES: Mapping[type, type] = _ORIGINAL_CLASS
"""Guarded tensor class -> the class it replaced (read it, never write it: ``type(t) in GUARDED_CLASSES``
is :func:`is_guarded` without the call)."""


def _func_name(func: Any) -> str:
    name = getattr(func, "__name__", "") or str(func)
    if name == "__get__":  # a property read: the descriptor's name (``shape``, ``data`` ...)
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


def _guarded_torch_function(cls, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch protocol
    kwargs = kwargs or {}
    name = _func_name(func)
    if name not in _ALLOWED_NAMES:
        offenders = [a for a in _flatten((args, kwargs)) if type(a) in _ORIGINAL_CLASS]
        if offenders:
            names = ", ".join(getattr(a, "_timeshare_parked", "<unnamed>") for a in offenders[:3])
            raise OffloadedTensorError(
                f"{names} is offloaded (its bytes are in host memory) and was used by {name}(); "
                f"reload() first. Shape, dtype and device are safe to read while offloaded")
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _flatten(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _flatten(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _flatten(x)


def _guard_class(cls: type) -> type | None:
    """The debug-mode subclass of ``cls`` parked tensors take (None if ``cls`` cannot be swapped)."""
    g = _GUARD_CLASSES.get(cls)
    if g is None:
        own = getattr(cls.__torch_function__, "__func__", cls.__torch_function__)
        if cls is not torch.nn.Parameter and own is not torch.Tensor.__torch_function__.__func__:
            return None  # a subclass with its own torch-function protocol: leave it alone
        g = type(f"Offloaded{cls.__name__}", (cls,), {"__torch_function__": classmethod(_guarded_torch_function)})
        _GUARD_CLASSES[cls] = g
        _ORIGINAL_CLASS[g] = cls
    return g


def guard(t: torch.Tensor, name: str) -> None:
    """Debug mode: make torch calls on the parked ``t`` raise :class:`OffloadedTensorError` naming ``name``."""
    g = _guard_class(type(t))
    if g is None:
        return
    try:
        t.__class__ = g
        t._timeshare_parked = name  # type: ignore[attr-defined]
    except (TypeError, AttributeError) as e:
        logger.debug("cannot guard %s (%s): it stays parked without the debug guard", name, e)


def unguard(t: torch.Tensor) -> None:
    """Undo :func:`guard` (no-op for a tensor that is not guarded)."""
    orig = _ORIGINAL_CLASS.get(type(t))
    if orig is not None:
        t.__class__ = orig
        try:
            del t._timeshare_parked  # type: ignore[attr-defined]
        except AttributeError:
            pass


def is_guarded(t: torch.Tensor) -> bool:
    """True if ``t`` carries the debug guard."""
    return type(t) in _ORIGINAL_CLASS


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


def park_strays(storage_id: int, known: set[int]) -> list[str]:
    """Park every tensor that views ``storage_id`` but is not in ``known`` (views of the store's own flat
    buffer made after a reload and kept, or kept by a runtime); returns their descriptions."""
    found = find_views(storage_id, known)
    out = []
    with torch.no_grad():
        for t in found:
            out.append(f"{type(t).__name__} of shape {tuple(t.shape)}")
            st, _ = placeholder(t.device, t.dtype)
            try:
                repoint_tensor(t, st, 0, tuple(t.shape), zero_strides(t.dim()))
            except RuntimeError as e:  # e.g. a view that autograd guards: left as it is
                logger.warning("could not park a stray view of an offloaded flat buffer (%s)", e)
    return out


__all__ = [
    "DEBUG_ENV",
    "GUARDED_CLASSES",
    "OffloadedTensorError",
    "ZERO_STRIDES",
    "debug_mode",
    "describe_aliases",
    "find_views",
    "park_strays",
    "guard",
    "own_view",
    "own_view_mark",
    "own_views_index",
    "own_views_of",
    "is_guarded",
    "is_parked",
    "is_placeholder",
    "placeholder",
    "repoint_tensor",
    "storage_use_count",
    "unguard",
    "zero_strides",
]
