"""Collectors: turn a worker's state into tensors, and tensors into storages.

Theory of operation
-------------------
A collector knows one thing the user attached (a module, an optimizer, a dict
of tensors) and yields :class:`Item` s: one per registered tensor *object*,
with its category and a name. Collection runs at every offload, because the
state changes shape between offloads: optimizer state appears after the first
step, gradients come and go.

* :class:`ModuleCollector`: parameters, their ``.grad`` and buffers. A DTensor
  contributes its ``_local_tensor`` (the DTensor is kept for its mesh and
  placements). For FSDP2 (``fully_shard``) modules, found by duck typing
  through ``module._get_fsdp_state()._fsdp_param_group.fsdp_params``, each
  ``FSDPParam``'s padded ``_sharded_param_data`` is registered too: the local
  shard is a view into it, so both come back sharing one storage.
* :class:`OptimizerCollector`: every tensor in ``optimizer.state`` (AdamW's
  ``exp_avg``, ``exp_avg_sq``, ``step``; DTensor states via their local
  tensor). ``step`` counters that torch keeps on the CPU while the parameters
  are on an accelerator hold no device memory and are left where they are.
* :class:`TensorsCollector`: an explicit name->tensor mapping (fp32 master
  weights, DDP-style flat buffers with their parameter views, sim payloads).

:func:`group_by_storage` then validates every item and groups items by storage
(:class:`StorageGroup`); tensors sharing a storage are stored once. Nothing
moves here, so a validation error loses nothing.
"""
from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

import torch

from refimpl.store.config import Category
from refimpl.store.errors import (
    MixedDtypeError,
    SharedStorageError,
    StoreStateError,
    UnattachedAliasError,
    UnsupportedTensorError,
    WrongDeviceError,
)
from refimpl.store.layout import TensorRef
from refimpl.store.parking import (
    describe_aliases, is_placeholder, own_view, own_view_mark, own_views_index, storage_use_count,
)

logger = logging.getLogger(__name__)


class Item(NamedTuple):
    """One registered tensor object found by a collector.

    Collection runs per tensor at every offload (tens of thousands for a MoE), so collectors
    build items with ``_item(Item, (...))`` (``tuple.__new__``: no Python-level constructor
    call) and the steady-state check reads only :meth:`Collector.tensors`.
    """

    category: Category
    #: a finer label than the category for backends ("param", "grad", "optimizer", "ddp_buffer" ...)
    kind: str
    #: the registered name, e.g. ``model.layer.weight`` or ``optim.state.3.exp_avg``
    name: str
    #: the tensor object as registered (a DTensor stays a DTensor here)
    tensor: Any
    #: the attach name of the collector
    source: str
    #: a bitwise OR of :data:`HOST_RESIDENT_OK` and :data:`EXPLICIT_KIND`
    flags: int


_item = tuple.__new__  # _item(Item, (fields...)): an Item without the generated __new__'s Python frame

HOST_RESIDENT_OK = 1
"""A tensor on the host while the runtime device is an accelerator is left in place (not an error)."""
EXPLICIT_KIND = 2
"""``kind`` was given by the user (``attach_tensors(kind=...)``); it labels the whole storage."""


def split_dtensor(t: Any) -> tuple[torch.Tensor, Any]:
    """``(plain tensor to move, DTensor or None)``; DTensors are recognised by duck typing."""
    if hasattr(t, "_local_tensor") and hasattr(t, "placements") and hasattr(t, "device_mesh"):
        return t._local_tensor, t
    return t, None


def plain_tensor(t: Any) -> Any:
    """The plain tensor the store moves for ``t``: a DTensor's local tensor, else ``t`` itself."""
    if hasattr(t, "_local_tensor") and hasattr(t, "placements") and hasattr(t, "device_mesh"):
        return t._local_tensor
    return t


class ViewCount(NamedTuple):
    """How many tensor objects viewed a storage before the store made views of its own."""

    #: tensor objects viewing the storage (registered or not); -1: unknown
    viewers: int
    #: :func:`own_view_mark` when they were counted (the store's views made before it are among them)
    mark: int


class Collector(abc.ABC):
    """Yields the registered tensors of one attached object."""

    def __init__(self, name: str) -> None:
        self.name = name

    @abc.abstractmethod
    def items(self, categories: frozenset[Category]) -> Iterator[Item]:
        """Items of the given categories, in a deterministic order."""

    def tensor_objects(self, categories: frozenset[Category]) -> Iterator[Any]:
        """The ``tensor`` of every item :meth:`items` yields, in the same order, without building the
        items: the steady-state check's per-tensor loop (subclasses override it with a cheaper loop)."""
        for it in self.items(categories):
            yield it.tensor

    def check_phase(self) -> None:
        """Raise :class:`StoreStateError` if the object is mid-phase (default: always fine)."""


class ModuleCollector(Collector):
    """Parameters (plain, DTensor, FSDP2), gradients and buffers of an ``nn.Module``."""

    def __init__(self, module: torch.nn.Module, name: str) -> None:
        super().__init__(name)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"attach_module expects an nn.Module, got {type(module).__name__}")
        self.module = module

    def fsdp_params(self) -> list[Any]:
        """FSDP2 ``FSDPParam`` objects of every ``fully_shard``-ed submodule (duck typed)."""
        out: list[Any] = []
        seen: set[int] = set()
        for m in self.module.modules():
            get_state = getattr(m, "_get_fsdp_state", None)
            if not callable(get_state):
                continue
            try:
                state = get_state()
            except Exception:  # noqa: BLE001 - not an FSDP module after all
                continue
            group = getattr(state, "_fsdp_param_group", None)
            for fp in getattr(group, "fsdp_params", None) or ():
                if id(fp) not in seen:
                    seen.add(id(fp))
                    out.append(fp)
        return out

    def check_phase(self) -> None:
        """FSDP2 parameters must be resharded (offload runs between phases, not mid-step)."""
        for fp in self.fsdp_params():
            state = getattr(getattr(fp, "sharded_state", None), "name", "SHARDED")
            if state != "SHARDED":
                raise StoreStateError(
                    f"{self.name}: FSDP2 parameter {getattr(fp, '_param_fqn', fp)} is {state}, not SHARDED; "
                    f"offload between training phases (after backward/optimizer step), or call "
                    f"module.reshard() after a forward without backward"
                )

    def items(self, categories: frozenset[Category]) -> Iterator[Item]:
        """Params (+ FSDP2 padded shards), grads, buffers, in module order."""
        named = list(self.module.named_parameters(remove_duplicate=False))
        if Category.PARAMS in categories:
            by_param = {id(fp.sharded_param): fp for fp in self.fsdp_params() if hasattr(fp, "sharded_param")}
            for pname, p in named:
                yield _item(Item, (Category.PARAMS, "param", f"{self.name}.{pname}", p, self.name, 0))
                fp = by_param.pop(id(p), None)
                if fp is not None:
                    for attr in ("_sharded_param_data", "_sharded_post_forward_param_data"):
                        t = getattr(fp, attr, None)
                        if isinstance(t, torch.Tensor):
                            yield _item(Item, (Category.PARAMS, "param", f"{self.name}.{pname}#{attr}", t, self.name, 0))
        if Category.GRADS in categories:
            for pname, p in named:
                if p.grad is not None:
                    yield _item(Item, (Category.GRADS, "grad", f"{self.name}.{pname}.grad", p.grad, self.name, 0))
        if Category.BUFFERS in categories:
            for bname, b in self.module.named_buffers(remove_duplicate=False):
                if b is not None:
                    yield _item(Item, (Category.BUFFERS, "buffer", f"{self.name}.{bname}", b, self.name, 0))

    def tensor_objects(self, categories: frozenset[Category]) -> Iterator[Any]:
        """What :meth:`items` yields, tensors only (same order; no names built)."""
        params = [p for _, p in self.module.named_parameters(remove_duplicate=False)]
        if Category.PARAMS in categories:
            by_param = {id(fp.sharded_param): fp for fp in self.fsdp_params() if hasattr(fp, "sharded_param")}
            for p in params:
                yield p
                fp = by_param.pop(id(p), None) if by_param else None
                if fp is not None:
                    for attr in ("_sharded_param_data", "_sharded_post_forward_param_data"):
                        t = getattr(fp, attr, None)
                        if isinstance(t, torch.Tensor):
                            yield t
        if Category.GRADS in categories:
            for p in params:
                if p.grad is not None:
                    yield p.grad
        if Category.BUFFERS in categories:
            for _, b in self.module.named_buffers(remove_duplicate=False):
                if b is not None:
                    yield b


class OptimizerCollector(Collector):
    """Every tensor in a ``torch.optim.Optimizer``'s state, named ``<name>.state.<index>.<key>``."""

    def __init__(self, optimizer: Any, name: str) -> None:
        super().__init__(name)
        if not (hasattr(optimizer, "state") and hasattr(optimizer, "param_groups")):
            raise TypeError(f"attach_optimizer expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer

    def items(self, categories: frozenset[Category]) -> Iterator[Item]:
        """State tensors in parameter order (the order of ``optimizer.state_dict()``)."""
        if Category.OPTIMIZER not in categories:
            return
        index = 0
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if state:
                    for key, value in state.items():
                        if isinstance(value, torch.Tensor):
                            yield _item(Item, (Category.OPTIMIZER, "optimizer", f"{self.name}.state.{index}.{key}", value,
                                               self.name, HOST_RESIDENT_OK))
                index += 1

    def tensor_objects(self, categories: frozenset[Category]) -> Iterator[Any]:
        """What :meth:`items` yields, tensors only (same order; no names built)."""
        if Category.OPTIMIZER not in categories:
            return
        state = self.optimizer.state
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                s = state.get(p)
                if s:
                    for value in s.values():
                        if isinstance(value, torch.Tensor):
                            yield value


class TensorsCollector(Collector):
    """An explicit mapping of names to tensors, all of one category (read at every offload)."""

    def __init__(self, category: Category, tensors: Mapping[str, Any], name: str, kind: str | None = None) -> None:
        super().__init__(name)
        if not isinstance(tensors, Mapping):
            raise TypeError(f"attach_tensors expects a mapping of names to tensors, got {type(tensors).__name__}")
        self.category = category
        self.kind = kind or category.value
        self.explicit_kind = kind is not None
        self.tensors = tensors

    def items(self, categories: frozenset[Category]) -> Iterator[Item]:
        """The mapping's tensors, in its order."""
        if self.category not in categories:
            return
        flags = EXPLICIT_KIND if self.explicit_kind else 0
        for key, t in self.tensors.items():
            if not isinstance(plain_tensor(t), torch.Tensor):  # a DTensor (or duck-typed one) is accepted
                raise UnsupportedTensorError(f"{self.name}.{key}: expected a tensor, got {type(t).__name__}")
            yield _item(Item, (self.category, self.kind, f"{self.name}.{key}", t, self.name, flags))

    def tensor_objects(self, categories: frozenset[Category]) -> Iterator[Any]:
        """What :meth:`items` yields, tensors only (same order, same error for a value that is no tensor)."""
        if self.category not in categories:
            return
        plain = _PLAIN
        for key, t in self.tensors.items():
            if type(t) not in plain and not isinstance(plain_tensor(t), torch.Tensor):
                raise UnsupportedTensorError(f"{self.name}.{key}: expected a tensor, got {type(t).__name__}")
            yield t


# --------------------------------------------------------------------------- grouping


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
        (registered tensors are parked while the copies still read this view; see refimpl.store.parking)."""
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
    #: the store's own flat buffers that tensor objects it does not know also view: storage id -> the
    #: ids of the tensors it knows there (those views are parked at the release, see park_strays)
    stray_views: dict[int, set[int]] = field(default_factory=dict)


def same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality where an unspecified index matches any index of the same type."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


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
        groups, seen, live_ids, report, device = self._groups, self._seen, self._live_ids, self.report, self.device
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
                if flags & HOST_RESIDENT_OK and t.device.type == "cpu" and device.type != "cpu":
                    report.skipped_host_resident.append(name)
                    continue
                raise WrongDeviceError(
                    f"{name} is on {t.device} but this store's runtime works on {device}; move it to "
                    f"{device} before attaching, or use a store whose runtime device is {t.device}"
                )
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
                g = StorageGroup(sid, storage, t.device, t.dtype, category, kind, source, storage.nbytes())
                groups[sid] = g
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
                if not storage.resizable():
                    raise UnsupportedTensorError(
                        f"{name}: its storage is not resizable (memory from numpy, DLPack or from_blob that the "
                        f"store cannot release); attach a torch-allocated copy instead (t = t.clone())"
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
            elif g.dtype != t.dtype:
                raise MixedDtypeError(
                    f"{name} ({t.dtype}) views the same storage as "
                    f"{g.refs[0].name if g.refs else 'another tensor'} ({g.dtype}); the store never casts. "
                    f"Register tensors of one dtype per storage"
                )
            elif g.category is not category:
                raise SharedStorageError(
                    f"{name} ({category.value}) shares its storage with "
                    f"{g.refs[0].name if g.refs else 'another tensor'} ({g.category.value}); attach tensors that "
                    f"share storage under one category"
                )
            if flags & EXPLICIT_KIND:
                g.kind = kind  # an explicit label (e.g. "ddp_buffer") wins over "param"/"grad"
            g.refs.append(TensorRef(name, t, t.storage_offset(), tuple(t.shape), t.stride(), dt))
            if sid not in live_ids and g.nbytes and t.numel():
                live_ids.add(sid)
                self._live.append(g)
                yield g

    def finish(self) -> tuple[list[StorageGroup], CollectReport]:
        """The groups to move, in the order :meth:`feed` yielded them, and what was left out."""
        report = self.report
        own_idx: dict[int, list[tuple[int, int]]] | None = None  # built once, when a storage needs it
        for sid, g in self._groups.items():
            if sid not in self._live_ids:
                report.skipped_zero_size.extend(r.name for r in g.refs)
                continue
            if g.viewers <= len(g.refs):
                continue
            bases = _view_bases(g)
            if g.viewers <= len(g.refs) + len(bases):
                continue
            if own_idx is None:
                own_idx = own_views_index()
            mine = sum(1 for mark, _ in own_idx.get(sid, ()) if mark < g.mark)
            if g.viewers > len(g.refs) + len(bases) + mine:
                if sid not in self.own:
                    raise unattached_alias_error(g)
                report.stray_views[sid] = {id(r.tensor) for r in g.refs} | set(_view_bases(g))
        if report.skipped_zero_size:
            logger.debug("left %d zero-size tensors in place: %s", len(report.skipped_zero_size),
                         report.skipped_zero_size[:5])
        return self._live, report


def _view_bases(g: StorageGroup) -> dict[int, torch.Tensor]:
    """The autograd bases (``t._base``) of the group's registered views that view the same storage and are
    not registered themselves: alive only through the views (``torch.arange(24.).reshape(4, 6)`` keeps
    the arange result as its base)."""
    ids = {id(r.tensor) for r in g.refs}
    bases: dict[int, torch.Tensor] = {}
    for r in g.refs:
        b = r.tensor._base
        if b is not None and id(b) not in ids and b.untyped_storage()._cdata == g.storage_id:
            bases[id(b)] = b
    return bases


def unattached_alias_error(g: StorageGroup) -> UnattachedAliasError:
    """The error for a storage that tensor objects the store does not know also view."""
    bases = _view_bases(g)
    extra = g.viewers - len(g.refs) - len(bases)
    found = describe_aliases(g.storage_id, {id(r.tensor) for r in g.refs} | set(bases))
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
    "EXPLICIT_KIND",
    "HOST_RESIDENT_OK",
    "CollectReport",
    "Collector",
    "Item",
    "ModuleCollector",
    "OptimizerCollector",
    "StorageGroup",
    "StorageGrouper",
    "TensorsCollector",
    "ViewCount",
    "group_by_storage",
    "plain_tensor",
    "same_device",
    "unattached_alias_error",
    "split_dtensor",
    "storage_view",
]
