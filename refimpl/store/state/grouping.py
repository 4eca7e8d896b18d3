"""Grouping collected tensors by storage, and validating them: the second half of collection.

:class:`StorageGrouper` (and :func:`group_by_storage`, all at once) turns the
:class:`~refimpl.store.state.collect.Item` s the collectors yield into
:class:`StorageGroup` s, one per storage, and refuses anything that cannot be
moved bit-exact with a :class:`StoreError` subclass naming the tensor. Nothing
moves here, so a validation error loses nothing.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple

import torch

from refimpl.store.config import Category
from refimpl.store.state.collect import EXPLICIT_KIND, HOST_RESIDENT_OK, Item, split_dtensor
from refimpl.store.errors import (
    MixedDtypeError,
    SharedStorageError,
    StoreStateError,
    UnattachedAliasError,
    UnsupportedTensorError,
    WrongDeviceError,
)
from refimpl.store.state.entry import TensorRef
from refimpl.store.state.parking import is_placeholder
from refimpl.store.state.storage_views import (
    describe_aliases, find_views, own_view, own_view_mark, own_views_index, own_views_of, storage_use_count,
)

logger = logging.getLogger(__name__)


class ViewCount(NamedTuple):
    """How many tensor objects viewed a storage before the store made views of its own."""

    #: tensor objects viewing the storage (registered or not); -1: unknown
    viewers: int
    #: :func:`own_view_mark` when they were counted (the store's views made before it are among them)
    mark: int


class StorageGroup:
    """All registered tensors viewing one storage; ``refs`` offsets are from the storage start.

    A plain slotted class: one is built per storage at every scattered offload.
    """

    __slots__ = ("storage_id", "storage", "device", "dtype", "category", "kind", "source", "nbytes", "refs",
                 "viewers", "mark")

    def __init__(self, storage_id: int, storage: Any, device: torch.device, dtype: torch.dtype,
                 category: Category, kind: str, source: str, nbytes: int) -> None:
        self.storage_id = storage_id
        self.storage = storage
        self.device = device
        self.dtype = dtype
        self.category = category
        self.kind = kind
        self.source = source
        self.nbytes = nbytes
        self.refs: list[TensorRef] = []
        #: tensor objects viewing the storage when it was found (registered or not); -1: unknown
        self.viewers = -1
        #: :func:`own_view_mark` when ``viewers`` was counted (the store's views made before it are in it)
        self.mark = 0

    @property
    def numel(self) -> int:
        """Elements of the storage in the group's dtype."""
        return self.nbytes // self.dtype.itemsize

    def base_view(self) -> torch.Tensor:
        """A 1-D tensor over the whole storage: the store's own view, never a registered tensor object
        (registered tensors are parked while the copies still read this view; see refimpl.store.state.parking)."""
        n = self.numel
        for r in self.refs[:2]:
            t = r.tensor
            if r.offset == 0 and t.dim() == 1 and r.size[0] == n and r.stride[0] == 1:
                return own_view(t.detach())  # a new tensor object on the same storage, no autograd
        return storage_view(self.storage, self.dtype, self.device, n)


def storage_view(storage: Any, dtype: torch.dtype, device: torch.device, numel: int) -> torch.Tensor:
    """A 1-D ``dtype`` tensor over the first ``numel`` elements of ``storage`` (a view the store owns)."""
    return own_view(torch.empty(0, dtype=dtype, device=device).set_(storage, 0, (numel,), (1,)))


@dataclass
class CollectReport:
    """What :func:`group_by_storage` left out, and why."""

    skipped_zero_size: list[str] = field(default_factory=list)
    skipped_host_resident: list[str] = field(default_factory=list)
    #: the host-resident tensors left in place, with their category and name (guarded while offloaded)
    host_resident: list[tuple[Category, str, torch.Tensor]] = field(default_factory=list)
    #: the store's own flat buffers that tensor objects it does not know also view: storage id -> the
    #: ids of the tensors it knows there (those views are parked at the release, see park_strays)
    stray_views: dict[int, set[int]] = field(default_factory=dict)


def same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality where an unspecified index matches any index of the same type."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _refuse_shared(g: StorageGroup, t: torch.Tensor, name: str, category: Category) -> None:
    """Raise for a tensor viewing a known storage with another dtype or category."""
    other = g.refs[0].name if g.refs else "another tensor"
    if g.dtype != t.dtype:
        raise MixedDtypeError(
            f"{name} ({t.dtype}) views the same storage as {other} ({g.dtype}); the store never casts. "
            f"Register tensors of one dtype per storage"
        )
    raise SharedStorageError(
        f"{name} ({category.value}) shares its storage with {other} ({g.category.value}); attach tensors that "
        f"share storage under one category"
    )


class StorageGrouper:
    """Validates items and groups them by storage, incrementally (see :func:`group_by_storage`).

    :meth:`feed` yields each storage group the moment it gets its first
    registered tensor with elements, so a caller can start moving that
    storage while later items are still being collected; later tensors
    viewing the same storage are appended to the group's ``refs``.
    :meth:`finish` returns the groups in that order and what was left out.

    This loop runs once per registered tensor at every offload (tens of
    thousands for a MoE), so it sticks to cheap attribute reads.
    """

    def __init__(self, device: torch.device, viewers: dict[int, ViewCount] | None = None,
                 own: frozenset[int] = frozenset()) -> None:
        self.device = device
        #: storage ids of the store's own flat buffers (a view of one kept by the user is parked, not refused)
        self.own = own
        #: tensor objects viewing a storage, counted before the store made views of it
        self.known_viewers = viewers or {}
        self.report = CollectReport()
        self._groups: dict[int, StorageGroup] = {}
        self._live: list[StorageGroup] = []
        self._live_ids: set[int] = set()
        self._seen: set[int] = set()

    def feed(self, items: Iterable[Item]) -> Iterator[StorageGroup]:
        """Consume ``items``; yield each storage group when it first holds a tensor with elements."""
        groups, seen, live_ids, device = self._groups, self._seen, self._live_ids, self.device
        strided = torch.strided
        for category, kind, name, t, source, flags in items:
            dt = None
            if type(t) not in _PLAIN:
                t, dt = split_dtensor(t)
                if not isinstance(t, torch.Tensor):
                    raise UnsupportedTensorError(f"{name}: expected a tensor, got {type(t).__name__}")
            tid = id(t)
            if tid in seen:
                continue  # the same object under a second name (tied weights)
            seen.add(tid)
            if t.layout is not strided or t.is_nested:
                raise UnsupportedTensorError(
                    f"{name}: cannot offload a {t.layout} tensor; only dense strided tensors (and DTensors of "
                    f"them) are supported"
                )
            if t.device != device and not same_device(t.device, device):
                self._skip_host_resident(category, name, t, flags)  # or raise
                continue
            try:
                storage = t.untyped_storage()
            except Exception as e:  # noqa: BLE001 - wrapper subclasses without storage
                raise UnsupportedTensorError(
                    f"{name}: a {type(t).__name__} whose storage cannot be captured ({e}); register its inner "
                    f"tensors instead"
                ) from e
            sid = storage._cdata
            g = groups.get(sid)
            if g is None:
                g = groups[sid] = self._new_group(sid, storage, t, category, kind, source, name)
            elif g.dtype != t.dtype or g.category is not category:
                _refuse_shared(g, t, name, category)
            if flags & EXPLICIT_KIND:
                g.kind = kind  # an explicit label (e.g. "ddp_buffer") wins over "param"/"grad"
            g.refs.append(TensorRef(name, t, t.storage_offset(), tuple(t.shape), t.stride(), dt))
            if sid not in live_ids and g.nbytes and t.numel():
                live_ids.add(sid)
                self._live.append(g)
                yield g

    def _new_group(self, sid: int, storage: Any, t: torch.Tensor, category: Category, kind: str, source: str,
                   name: str) -> StorageGroup:
        """The group of a storage seen for the first time, validated (once per storage)."""
        g = StorageGroup(sid, storage, t.device, t.dtype, category, kind, source, storage.nbytes())
        if g.nbytes == 0 and t.numel() > 0:
            raise StoreStateError(
                f"{name} views a storage whose memory was already freed (0 bytes); is this state "
                f"offloaded by another store, or released by the framework?"
            )
        if is_placeholder(sid):
            raise StoreStateError(
                f"{name} is offloaded by an offload store (its bytes are in host memory); reload() that "
                f"store first (or recover() it after a TensorChangedError)"
            )
        if not storage.resizable() and sid not in self.own:  # the store's own flat buffer: see release_layouts
            raise UnsupportedTensorError(
                f"{name}: its storage is not resizable, so the store cannot release it: memory from numpy "
                f"(torch.from_numpy), DLPack or from_blob, or a storage torch marked so when it was exported "
                f"(t.numpy(), a DLPack capsule) before it was ever offloaded. Attach a torch-allocated copy "
                f"(t = t.clone(); a parameter: with torch.no_grad(): p.data = p.data.clone()) and export copies "
                f"(p.detach().clone().numpy()). Nothing was moved"
            )
        known = self.known_viewers.get(sid)
        if known is not None:
            g.viewers, g.mark = known
        elif storage_use_count is not None:
            g.viewers = storage_use_count(sid) - 1  # minus the Python storage object held here
            g.mark = own_view_mark()
        if g.nbytes % g.dtype.itemsize:
            raise MixedDtypeError(
                f"{name}: its storage is {g.nbytes} bytes, not a whole number of {g.dtype} elements; "
                f"it is shared with a tensor of another dtype"
            )
        return g

    def _skip_host_resident(self, category: Category, name: str, t: torch.Tensor, flags: int) -> None:
        """A tensor on another device: left out if it may stay in host memory, else refused."""
        device = self.device
        if flags & HOST_RESIDENT_OK and t.device.type == "cpu" and device.type != "cpu":
            self.report.skipped_host_resident.append(name)
            self.report.host_resident.append((category, name, t))
            return
        raise WrongDeviceError(
            f"{name} is on {t.device} but this store's runtime works on {device}; move it to "
            f"{device} before attaching, or use a store whose runtime device is {t.device}"
        )

    def finish(self) -> tuple[list[StorageGroup], CollectReport]:
        """The groups to move, in the order :meth:`feed` yielded them, and what was left out."""
        report = self.report
        own_idx: dict[int, list[tuple[int, int]]] | None = None  # built once, when a storage needs it
        for sid, g in self._groups.items():
            if sid not in self._live_ids:
                report.skipped_zero_size.extend(r.name for r in g.refs)
                continue
            if 0 <= g.viewers <= len(g.refs):
                continue
            _attach_view_bases(g)
            if 0 <= g.viewers <= len(g.refs):
                continue
            if own_idx is None:
                own_idx = own_views_index()
            mine = sum(1 for mark, _ in own_idx.get(sid, ()) if mark < g.mark)
            if g.viewers > len(g.refs) + mine:
                if sid not in self.own:
                    aliases = find_views(sid, {id(r.tensor) for r in g.refs})  # one walk of every object, for both
                    if aliases or not settles(g):
                        raise unattached_alias_error(g, aliases)
                    continue
                report.stray_views[sid] = {id(r.tensor) for r in g.refs}
        if report.skipped_zero_size:
            logger.debug("left %d zero-size tensors in place: %s", len(report.skipped_zero_size),
                         report.skipped_zero_size[:5])
        return self._live, report


BASE_SUFFIX = "#base"
"""A view's autograd base the store attaches with it is named after the view plus this (``params.v#base``); like
every name with a ``#`` it is not saved in checkpoints (it is not a tensor of the model's state dict)."""


def _attach_view_bases(g: StorageGroup) -> None:
    """Attach the autograd bases (``t._base``) of the group's registered views that view the same storage and are
    not registered themselves, as refs of the group: they are parked with the views and re-pointed with them.

    A base is either alive only through its views (``torch.arange(24.).reshape(4, 6)`` keeps the arange result)
    or a tensor the caller holds (``attach_tensors("params", {"v": w.t()})`` with ``w`` not attached). Left out,
    the second would be left on the released storage (reading it read freed memory); attached, it raises
    ``OffloadedTensorError`` while offloaded and holds its exact bytes after the reload. (A view of another dtype,
    ``w.view(torch.int32)``, has no autograd base: ``w`` is then an unattached alias, refused as such.)"""
    ids = {id(r.tensor) for r in g.refs}
    for r in list(g.refs):
        b = r.tensor._base
        if b is None or id(b) in ids or b.untyped_storage()._cdata != g.storage_id:
            continue
        ids.add(id(b))
        g.refs.append(TensorRef(r.name + BASE_SUFFIX, b, b.storage_offset(), tuple(b.shape), b.stride()))


ALIAS_SETTLE_S = 0.5
"""How long an offload waits for a storage's uses to fall to what it accounts for when none of the extra ones is a
tensor Python can reach: a collective's work object (Gloo's, NCCL's) holds its tensors on the backend's own thread
for a moment after ``wait()`` has returned, and a Megatron step ends with such collectives on its buffers."""


def settles(g: StorageGroup, limit_s: float = ALIAS_SETTLE_S) -> bool:
    """Whether the uses of ``g``'s storage beyond its refs and the store's own views, none of them a tensor Python
    can reach (the caller checked: :func:`~refimpl.store.state.storage_views.find_views` found none), are references
    held outside Python that go within ``limit_s`` (polled every 2 ms; :data:`ALIAS_SETTLE_S`). False where the
    count cannot be read, and after ``limit_s`` where the uses stay (a holder that keeps them: the error)."""
    if storage_use_count is None:
        return False
    storage = g.refs[0].tensor.untyped_storage()  # held while polling: one use of the count
    deadline = time.monotonic() + limit_s
    while True:
        mine = len(own_views_of(g.storage_id, before=own_view_mark()))
        if storage_use_count(storage._cdata) - 1 <= len(g.refs) + mine:
            logger.info("the storage of %s: %d use(s) held outside Python went before the offload released it",
                        g.refs[0].name, g.viewers - len(g.refs))
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def unattached_alias_error(g: StorageGroup, aliases: list[torch.Tensor] | None = None) -> UnattachedAliasError:
    """The error for a storage that tensor objects the store does not know also view (``aliases``: those Python
    reaches, where the caller already looked them up)."""
    extra = g.viewers - len(g.refs)
    found = describe_aliases(g.storage_id, {id(r.tensor) for r in g.refs}, views=aliases)
    names = ", ".join(r.name for r in g.refs[:3]) + (" ..." if len(g.refs) > 3 else "")
    return UnattachedAliasError(
        f"the storage of {names} ({g.nbytes} bytes) is also viewed by {extra} tensor object(s) not attached to "
        f"this store ({'; '.join(found) if found else 'not reachable from Python'}): releasing it would leave them "
        f"on freed memory and a reload would not bring them back. Attach them too (a flat buffer whose views "
        f"are the parameters: attach_tensors(category, {{'flat': buffer}}, kind='ddp_buffer')), or drop them "
        f"before offloading. Nothing was moved"
    )


def group_by_storage(items: Iterable[Item], device: torch.device, viewers: dict[int, ViewCount] | None = None,
                     own: frozenset[int] = frozenset()) -> tuple[list[StorageGroup], CollectReport]:
    """Validate ``items`` and group them by storage (all at once; see :class:`StorageGrouper`).

    Raises a :class:`StoreError` subclass naming the tensor for anything that
    cannot be moved bit-exact: a non-strided or opaque tensor, a tensor on
    another device, a storage viewed with two dtypes or claimed by two
    categories, a view of a storage whose memory is already freed, a
    non-resizable storage, a storage that tensor objects the store does not know
    also view (:class:`UnattachedAliasError`; ``viewers`` gives counts taken
    before the store made views of its own; for the store's own flat buffers,
    ``own``, such views are reported in ``stray_views`` instead). Storages
    whose registered tensors all have zero elements are left out (reported).
    """
    grouper = StorageGrouper(device, viewers, own)
    for _ in grouper.feed(items):
        pass
    return grouper.finish()


__all__ = [
    "ALIAS_SETTLE_S",
    "BASE_SUFFIX",
    "CollectReport",
    "StorageGroup",
    "StorageGrouper",
    "ViewCount",
    "group_by_storage",
    "same_device",
    "settles",
    "storage_view",
    "unattached_alias_error",
]
