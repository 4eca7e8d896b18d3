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

:mod:`refimpl.store.state.grouping` then validates every item and groups items by
storage; tensors sharing a storage are stored once. Nothing moves in either
module, so a validation error loses nothing. Both are the first stage of the
store's offload (see :mod:`refimpl.store.moves.offload`).
"""
from __future__ import annotations

import abc
from typing import Any, Iterator, Mapping, NamedTuple

import torch

from refimpl.store.config import Category
from refimpl.store.errors import StoreStateError, UnsupportedTensorError


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

    def __init__(self, category: Category, tensors: Mapping[str, Any], name: str, kind: str | None = None,
                 host_resident_ok: bool = False) -> None:
        super().__init__(name)
        self.host_resident_ok = host_resident_ok
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
        flags = (EXPLICIT_KIND if self.explicit_kind else 0) | (HOST_RESIDENT_OK if self.host_resident_ok else 0)
        for key, t in self.tensors.items():
            if not isinstance(plain_tensor(t), torch.Tensor):  # a DTensor (or duck-typed one) is accepted
                raise UnsupportedTensorError(f"{self.name}.{key}: expected a tensor, got {type(t).__name__}")
            yield _item(Item, (self.category, self.kind, f"{self.name}.{key}", t, self.name, flags))

    def tensor_objects(self, categories: frozenset[Category]) -> Iterator[Any]:
        """What :meth:`items` yields, tensors only (same order, same error for a value that is no tensor)."""
        if self.category not in categories:
            return
        plain = (torch.Tensor, torch.nn.Parameter)
        for key, t in self.tensors.items():
            if type(t) not in plain and not isinstance(plain_tensor(t), torch.Tensor):
                raise UnsupportedTensorError(f"{self.name}.{key}: expected a tensor, got {type(t).__name__}")
            yield t


class Attached:
    """Every collector attached to one store, in attach order: what an offload collects from."""

    def __init__(self) -> None:
        self.collectors: list[Collector] = []

    def add(self, collector: Collector) -> None:
        """Attach ``collector``; its name must be new."""
        if any(c.name == collector.name for c in self.collectors):
            raise ValueError(f"a source named {collector.name!r} is already attached; pick another name")
        self.collectors.append(collector)

    def check_phase(self) -> None:
        """Every collector's check that no training phase is mid-step."""
        for c in self.collectors:
            c.check_phase()

    def items(self, cats: frozenset[Category]) -> Iterator[Item]:
        """The items of ``cats`` from every collector, in attach order."""
        for c in self.collectors:
            yield from c.items(cats)

    def tensor_objects(self, cats: frozenset[Category]) -> Iterator[Any]:
        """What :meth:`items` yields, tensors only."""
        for c in self.collectors:
            yield from c.tensor_objects(cats)


__all__ = [
    "Attached",
    "EXPLICIT_KIND",
    "HOST_RESIDENT_OK",
    "Collector",
    "Item",
    "ModuleCollector",
    "OptimizerCollector",
    "TensorsCollector",
    "plain_tensor",
    "split_dtensor",
]
