"""Who views a storage: the views the store made for itself, counted apart from the tensors the user holds,
and the other tensors alive in the process that view it (aliases a release would leave on freed memory)."""
from __future__ import annotations

import weakref

import torch

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
    import weakref

    proxies = (weakref.ProxyType, weakref.CallableProxyType)
    known = known | own_views_of(storage_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated torch objects warns
        # a weakref.proxy passes isinstance() for the tensor it points to and raises ReferenceError once that is
        # gone (torch.compile leaves such proxies): type() does not look through it, so proxies are skipped first
        objects = [o for o in gc.get_objects()
                   if type(o) not in proxies and isinstance(o, torch.Tensor) and id(o) not in known]
    out = []
    for obj in objects:
        try:
            if obj.untyped_storage()._cdata == storage_id:
                out.append(obj)
        except Exception:  # noqa: BLE001 - wrappers without storage
            continue
    return out


def describe_aliases(storage_id: int, known: set[int], limit: int = 3,
                     views: list[torch.Tensor] | None = None) -> list[str]:
    """Descriptions of :func:`find_views` (for error messages); ``views``: what a caller's own call of it found."""
    found = find_views(storage_id, known) if views is None else views
    return [f"a {type(t).__name__} of shape {tuple(t.shape)} {t.dtype} at storage offset {t.storage_offset()}"
            for t in found[:limit]]


__all__ = ["describe_aliases", "find_views", "own_view", "own_view_mark", "own_views_index", "own_views_of",
           "storage_use_count"]
