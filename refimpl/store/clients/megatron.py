"""Megatron-core as a client of the offload store: a model and its optimizer attached in one call.

Theory of operation
-------------------
Megatron's ``DistributedDataParallel`` keeps parameters and gradients in flat
buffers (``_ParamAndGradBuffer.param_data`` with the distributed optimizer,
``grad_data`` always), one per dtype and per dense/expert parameter set, and
many tensors view them: the parameters, their ``main_grad``, each bucket's
``param_data``/``grad_data``, the bucket groups' cached shard lists, the
distributed optimizer's shard views and the fp32 master shards' ``.grad``.
Every view must move with its buffer, and the store refuses to release a
storage that an unattached tensor still views. :func:`attach_megatron` finds
them all by walking the objects Megatron built (the DDP wrapper, its buffers,
buckets and bucket groups, every optimizer of a ``ChainedOptimizer``), so
nobody lists views by hand:

* given to the store (``attach_tensors``): each buffer, the parameters,
  ``main_grad``, the module's buffers, the optimizers' fp32 master weights
  (``shard_fp32_from_float16_groups`` / ``fp32_from_float16_groups``, found as
  the torch optimizer's parameters) and their state (Adam's ``exp_avg``,
  ``exp_avg_sq``, ``step``; a ``step`` on the host, as torch's Adam keeps it
  unless capturable, stays there and is counted in ``skipped_host_resident``). Those tensors have the same shapes on every
  data-parallel rank, which ``local_dedup``'s layout agreement needs.
* kept by the client: every other view found (bucket and shard views; the
  distributed optimizer's are rank-specific). :class:`MegatronClient` parks
  them before the store's offload and points them back into their buffer, at
  the same offset, after the reload.

Replica groups (``local_dedup``, :func:`megatron_dedup_config`): a parameter
buffer is identical over its buffer's ``data_parallel_group`` (the dense data-
parallel group, or the expert-data-parallel group for expert buffers); with the
non-distributed optimizer so are the parameters, the all-reduced gradient
buffer, the master weights and the optimizer state (over the group of the
buffers the optimizer's parameters live in). The distributed optimizer's
master shards and state, and its gradient buffers (reduce-scattered: only
this rank's shard is reduced), are local.

Megatron registers its gradient hooks on each parameter's gradient accumulator;
the store keeps those across a reload ([Note: autograd identity] in
:mod:`refimpl.store.state.repoint`). Megatron itself is not imported here: the
objects are read by duck typing (``buffers``, ``expert_parallel_buffers``,
``chained_optimizers``, ``optimizer``), so megatron-core stays optional.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

import torch

from refimpl.arguments import expect_name
from refimpl.store.backends.dedup_config import DedupConfig
from refimpl.store.backends.replica import LOCAL, ReplicaGroup, ReplicaPolicy
from refimpl.store.clients.base import StoreClient
from refimpl.store.config import Category
from refimpl.store.errors import StoreError
from refimpl.store.state.parking import Parking, ViewPlace, park_views, repoint_views
from refimpl.store.store import check_store

logger = logging.getLogger(__name__)

_SKIP_ATTRS = frozenset({"_modules", "_parameters", "_buffers", "_forward_hooks", "_forward_pre_hooks",
                         "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks"})


class MegatronModelError(TypeError):
    """What was passed is not a Megatron-core DDP model (or model chunks) and optimizer."""


def _walkable(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith("megatron") or isinstance(obj, torch.optim.Optimizer)


def walk_tensors(roots: Iterable[Any]) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``roots`` through Megatron objects (and torch optimizers), lists,
    tuples and dicts (keys too), and tensors' ``.grad``, ``._base`` and attributes (``main_grad``), in a
    deterministic order; each object once. Modules contribute their attributes, not their children."""
    seen: set[int] = set()
    stack = list(reversed(list(roots)))
    while stack:
        obj = stack.pop()
        if obj is None or isinstance(obj, (str, bytes, int, float, bool)) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            yield obj
            more = [obj.grad] if obj.grad is not None else []
            if obj._base is not None:  # a view keeps its base alive in C++ (``x.detach().view(-1)[a:b]``)
                more.append(obj._base)
            more += [v for v in getattr(obj, "__dict__", {}).values() if isinstance(v, torch.Tensor)]
            stack.extend(reversed(more))
        elif isinstance(obj, (list, tuple)):
            stack.extend(reversed(obj))
        elif isinstance(obj, dict):
            pairs = []
            for k, v in obj.items():
                pairs += [k, v]
            stack.extend(reversed(pairs))
        elif _walkable(obj):
            attrs = [v for k, v in vars(obj).items() if k not in _SKIP_ATTRS] if hasattr(obj, "__dict__") else []
            stack.extend(reversed(attrs))


class _View(NamedTuple):
    """A view the client re-points itself: its base (a tensor given to the store) and where in it."""

    tensor: torch.Tensor
    base: torch.Tensor
    offset: int  # relative to the base's storage offset
    size: tuple[int, ...]
    stride: tuple[int, ...]
    category: Category
    #: for the guard's errors: ``a view of <the name its base was given to the store under>``
    name: str


class _Plan:
    """One offload's tensors: per category, name -> tensor for the store; and the client's own views."""

    def __init__(self) -> None:
        self.store: dict[Category, dict[str, torch.Tensor]] = {c: {} for c in Category}
        self.views: list[_View] = []
        self._ids: set[int] = set()
        self.by_storage: dict[int, tuple[torch.Tensor, Category, str]] = {}

    def add(self, category: Category, name: str, t: Any) -> None:
        """Give ``t`` to the store under ``name`` (once per tensor object; the first name wins)."""
        if not isinstance(t, torch.Tensor) or id(t) in self._ids:
            return
        self._ids.add(id(t))
        self.store[category][name] = t
        self.by_storage.setdefault(t.untyped_storage()._cdata, (t, category, name))

    def view(self, t: torch.Tensor) -> None:
        """Keep ``t`` as a client-side view if it views a storage given to the store and is not given itself."""
        if id(t) in self._ids or t.numel() == 0:
            return
        hit = self.by_storage.get(t.untyped_storage()._cdata)
        if hit is None:
            return
        self._ids.add(id(t))
        base, category, name = hit
        self.views.append(_View(t, base, t.storage_offset() - base.storage_offset(), tuple(t.shape),
                                tuple(t.stride()), category, f"a view of {name}"))


def _chunks(model: Any) -> list[Any]:
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    for c in chunks:
        if not (hasattr(c, "buffers") and hasattr(c, "module") and isinstance(c, torch.nn.Module)
                and isinstance(getattr(c, "buffers", None), list)):
            raise MegatronModelError(
                f"attach_megatron expects Megatron-core DistributedDataParallel model chunks, got {type(c).__name__}; "
                f"wrap the model in megatron.core.distributed.DistributedDataParallel first")
    return chunks


def _optimizers(optimizer: Any) -> list[Any]:
    if optimizer is None:
        return []
    subs = getattr(optimizer, "chained_optimizers", None)
    out = list(subs) if subs is not None else [optimizer]
    for o in out:
        if not isinstance(getattr(o, "optimizer", None), torch.optim.Optimizer):
            raise MegatronModelError(f"attach_megatron expects a Megatron optimizer (get_megatron_optimizer), "
                                     f"got {type(o).__name__}")
    return out


class MegatronState:
    """What a Megatron-core model and optimizer hold: buffers, optimizers, and the walk (:meth:`plan`)."""

    def __init__(self, model: Any, optimizer: Any = None, name: str = "megatron") -> None:
        self.name = name
        self.chunks = _chunks(model)
        self.optimizers = _optimizers(optimizer)
        #: every DDP buffer, dense then expert, chunk by chunk: (buffer, is_expert)
        self.buffers = [(b, expert) for c in self.chunks
                        for expert, bufs in ((False, c.buffers), (True, getattr(c, "expert_parallel_buffers", [])))
                        for b in bufs]
        self._param_buffer = {id(p): i for i, (b, _) in enumerate(self.buffers) for p in _buffer_params(b)}

    # ------------------------------------------------------------------ what there is

    def distributed(self, index: int) -> bool:
        """True if ``self.optimizers[index]`` is Megatron's distributed optimizer (sharded state)."""
        return hasattr(self.optimizers[index], "shard_fp32_from_float16_groups")

    def optimizer_buffer(self, index: int) -> int | None:
        """Index into :attr:`buffers` of a buffer holding a parameter of optimizer ``index`` (None: none)."""
        for t in walk_tensors([self.optimizers[index]]):
            b = self._param_buffer.get(id(t))
            if b is not None:
                return b
        return None

    def plan(self) -> _Plan:
        """Walk the model and optimizers: what goes to the store under which name, and the other views."""
        p, n = _Plan(), self.name
        for i, (b, _) in enumerate(self.buffers):
            p.add(Category.PARAMS, f"b{i}.param_data", getattr(b, "param_data", None))
            p.add(Category.GRADS, f"b{i}.grad_data", getattr(b, "grad_data", None))
        for c, chunk in enumerate(self.chunks):
            for pname, param in chunk.named_parameters(remove_duplicate=False):
                i = self._param_buffer.get(id(param))
                where = f"b{i}" if i is not None else f"c{c}"
                p.add(Category.PARAMS, f"{where}.param.{pname}", param)
                p.add(Category.GRADS, f"{where}.main_grad.{pname}", getattr(param, "main_grad", None))
                if param.grad is not None:
                    p.add(Category.GRADS, f"{where}.grad.{pname}", param.grad)
            for bname, buf in chunk.named_buffers(remove_duplicate=False):
                p.add(Category.BUFFERS, f"c{c}.buffer.{bname}", buf)
        for j, opt in enumerate(self.optimizers):
            torch_opt = opt.optimizer
            k = 0
            for group in torch_opt.param_groups:
                for master in group["params"]:
                    if id(master) not in self._param_buffer:
                        p.add(Category.OPTIMIZER, f"o{j}.master.{k}", master)
                    for key, v in torch_opt.state.get(master, {}).items():
                        p.add(Category.OPTIMIZER, f"o{j}.state.{k}.{key}", v)
                    if master.grad is not None and master.grad.untyped_storage()._cdata not in p.by_storage:
                        p.add(Category.GRADS, f"o{j}.master_grad.{k}", master.grad)
                    k += 1
        for t in walk_tensors([*self.chunks, *self.optimizers]):
            p.view(t)
        logger.debug("%s: %d tensors to the store, %d views kept by the client", n,
                     sum(len(v) for v in p.store.values()), len(p.views))
        return p



class MegatronClient(StoreClient):
    """A Megatron-core model and optimizer attached to a store; made by :func:`attach_megatron`."""

    def __init__(self, store: Any, model: Any, optimizer: Any = None, name: str = "megatron") -> None:
        check_store(store, "attach_megatron(store, model, optimizer, name)")
        expect_name(name, "attach_megatron(store, model, optimizer, name)", "name")
        self.store, self.name = store, name
        self.state = MegatronState(model, optimizer, name)
        self._plan: _Plan | None = None
        self._parked: list[_View] = []
        for cat in (Category.PARAMS, Category.GRADS, Category.BUFFERS, Category.OPTIMIZER):
            # host tensors (torch Adam's ``step`` unless capturable) need no offload: left in place, counted
            store.attach_tensors(cat, _PlanView(self, cat), name=f"{name}.{cat.value}",
                                 host_resident_ok=cat is Category.OPTIMIZER, pin_ahead=False)
        self._pin_ahead()

    def _pin_ahead(self) -> None:
        """Pin ahead (``StoreConfig.pin_ahead``) with the client's views parked, so they count as attached;
        a view nobody attached still makes the store refuse, and that is logged (the offload raises it)."""
        if self.store.config.pin_ahead_mode(self.store.rt.device.type) != "background":
            return
        self._plan = plan = self.state.plan()
        _park(plan.views, self.store.parking)
        try:
            self.store.pin_ahead()
        except (StoreError, RuntimeError, ValueError) as e:  # the offload reports it, where nothing moves
            logger.warning("pinning ahead at attach of %r skipped (%s: %s)", self.name, type(e).__name__, e)
        finally:
            _repoint(plan.views)
            self._plan = None

    def current(self) -> _Plan:
        """The plan of the offload in progress (a fresh one outside the client's offload)."""
        return self._plan if self._plan is not None else self.state.plan()

    # ------------------------------------------------------------------ offload / reload

    async def offload_async(self, include: Iterable[Category | str] | Category | str | None = None,
                            drop_grads: bool = False) -> None:
        """Async :meth:`offload`. If the store's offload fails (nothing moved), the views are put back."""
        cats = Category.select(include)
        self._plan = plan = self.state.plan()
        parked = {id(v.tensor) for v in self._parked}
        views = [v for v in plan.views if v.category in cats and id(v.tensor) not in parked]
        _park(views, self.store.parking)
        try:
            await self.store.offload_async(include, drop_grads=drop_grads)
        except BaseException:
            _repoint(views)
            raise
        finally:
            self._plan = None
        self._parked.extend(views)

    async def reload_async(self, include: Iterable[Category | str] | Category | str | None = None) -> None:
        """Async :meth:`reload`."""
        await self.store.reload_async(include)
        cats = Category.select(include)
        back = [v for v in self._parked if v.category in cats]
        _repoint(back)
        self._parked = [v for v in self._parked if v.category not in cats]


class _PlanView(Mapping):
    """One category of the client's current plan, as the mapping ``attach_tensors`` reads at every offload."""

    def __init__(self, client: MegatronClient, category: Category) -> None:
        self.client, self.category = client, category

    def _d(self) -> dict[str, torch.Tensor]:
        return self.client.current().store[self.category]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._d()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d())

    def __len__(self) -> int:
        return len(self._d())

    def items(self):  # noqa: ANN201 - one plan per read, not one per key
        """``(name, tensor)`` pairs of this category."""
        return self._d().items()


def _buffer_params(buffer: Any) -> list[Any]:
    params = getattr(buffer, "params", None)
    if params is None:
        params = list(getattr(buffer, "param_index_map", {}) or ())
    return list(params)


def _park(views: list[_View], parking: Parking) -> None:
    park_views(parking, ((v.name, v.tensor) for v in views))  # before the store's offload: no debug site yet


def _repoint(views: list[_View]) -> None:
    # the base is where the store put it (a view of its flat buffer after a reload): read it now
    repoint_views(ViewPlace(v.tensor, v.base.untyped_storage(), v.base.storage_offset() + v.offset, v.size, v.stride)
                  for v in views)


def megatron_replica_policy(rt: Any, model: Any, optimizer: Any = None, name: str = "megatron") -> ReplicaPolicy:
    """The :class:`ReplicaPolicy` of a Megatron model's and optimizer's state for ``local_dedup`` (see the
    module docstring); ``name`` as given to :func:`attach_megatron`.

    ``rt`` reads the ranks of Megatron's process groups (:meth:`Runtime.foreign_group_ranks`)."""
    client = MegatronState(model, optimizer, name)
    n, overrides = name, []
    groups = []
    for i, (b, expert) in enumerate(client.buffers):
        ranks = rt.foreign_group_ranks(b.data_parallel_group)
        groups.append(ReplicaGroup(ranks, label="edp" if expert else "dp"))
    dist_buffers: set[int] = set()
    for j in range(len(client.optimizers)):
        i = client.optimizer_buffer(j)
        if i is None:
            continue
        if client.distributed(j):
            dist_buffers.add(i)
            overrides.append((f"{n}.{Category.OPTIMIZER.value}.o{j}.*", LOCAL))
        else:
            overrides.append((f"{n}.{Category.OPTIMIZER.value}.o{j}.*", groups[i]))
    for i, g in enumerate(groups):
        overrides.append((f"{n}.{Category.PARAMS.value}.b{i}.*", g))
        overrides.append((f"{n}.{Category.GRADS.value}.b{i}.*", LOCAL if i in dist_buffers else g))
    overrides.append((f"{n}.*", LOCAL))
    return ReplicaPolicy(overrides=tuple(overrides))


def megatron_dedup_config(rt: Any, model: Any, optimizer: Any = None, name: str = "megatron",
                          **options: Any) -> DedupConfig:
    """A ``local_dedup`` :class:`DedupConfig` whose policy is :func:`megatron_replica_policy`; ``options``
    are DedupConfig's other fields. ``OffloadStore(rt, backend="local_dedup", dedup=...)``."""
    return DedupConfig(policy=megatron_replica_policy(rt, model, optimizer, name), **options)


def attach_megatron(store: Any, model: Any, optimizer: Any = None, name: str = "megatron") -> MegatronClient:
    """Attach Megatron-core DDP model chunks (``model``: one chunk or a list) and their optimizer
    (a ``ChainedOptimizer``, a distributed or non-distributed Megatron optimizer) to ``store``.

    Returns the :class:`MegatronClient` whose ``offload``/``reload`` to call. For ``local_dedup``, make
    the store with ``dedup=megatron_dedup_config(rt, model, optimizer)`` (same ``name``)."""
    return MegatronClient(store, model, optimizer, name)


__all__ = ["MegatronClient", "MegatronModelError", "MegatronState", "attach_megatron", "megatron_dedup_config",
           "megatron_replica_policy", "walk_tensors"]
