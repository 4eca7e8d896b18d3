"""torch ``DistributedDataParallel`` as a client of the offload store.

Theory of operation
-------------------
DDP's reducer registers a hook on each parameter's gradient accumulator
(``p.expand_as(p).grad_fn.next_functions[0][0]``) and all-reduces the gradients
through its own communication buckets: flat tensors it allocates and owns in
C++, which Python never sees. The store keeps each parameter's autograd
identity across offload and reload (see [Note: autograd identity] in
:mod:`refimpl.store.state.repoint`), so the reducer's hooks keep firing.

* ``gradient_as_bucket_view=False``: ``p.grad`` are tensors of their own; the
  module's parameters, gradients and buffers and the optimizer state are
  attached as usual. The reducer's buckets (gradient-sized) stay on the device:
  nothing reachable from Python views them, so they are neither moved nor freed.
* ``gradient_as_bucket_view=True``: each ``p.grad`` *is* one of the reducer's
  views of its bucket (the same tensor object), and the reducer keeps more
  views of that storage in C++ (the flat bucket, its output views). Re-pointing
  ``p.grad`` elsewhere would leave those on freed memory, which the store
  refuses (``UnattachedAliasError``). So the gradients are not given to the
  store: :class:`DDPClient` releases each bucket storage *in place* instead.
  Offload copies its bytes to host memory, parks the visible ``p.grad`` views
  (see :mod:`refimpl.store.state.parking`) and shrinks the storage to 0 bytes; reload
  grows the same storage object back, copies the bytes in and points ``p.grad``
  back where it was. Every view the reducer holds (they reference the storage,
  not an address) is valid again and sees the same bytes. A bucket is reachable
  only through a defined ``p.grad``: after ``zero_grad(set_to_none=True)`` the
  buckets stay on the device (their contents are overwritten by the next
  backward, so nothing is lost); ``zero_grad(set_to_none=False)`` lets them go.

Use :meth:`DDPClient.offload` / :meth:`DDPClient.reload` (or their async twins)
in place of the store's; they run the store's and then the buckets'.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

import torch

from refimpl.arguments import ArgumentTypeError, expect_name
from refimpl.runtime.base import CopyKind
from refimpl.store.arguments import check_optimizer
from refimpl.store.clients.base import StoreClient
from refimpl.store.config import Category
from refimpl.store.errors import StoreStateError
from refimpl.store.state.parking import ViewPlace, park_views, repoint_views
from refimpl.store.store import check_store

logger = logging.getLogger(__name__)


class _Named(Mapping):
    """A module's parameters or buffers by name, read afresh at every offload (for ``attach_tensors``)."""

    def __init__(self, module: torch.nn.Module, what: str) -> None:
        self.module, self.what = module, what

    def _pairs(self) -> list[tuple[str, torch.Tensor]]:
        named = self.module.named_parameters if self.what == "params" else self.module.named_buffers
        return [(n, t) for n, t in named(remove_duplicate=False) if t is not None]

    def __getitem__(self, key: str) -> torch.Tensor:
        return dict(self._pairs())[key]

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, _ in self._pairs()])

    def __len__(self) -> int:
        return len(self._pairs())

    def items(self):  # noqa: ANN201 - one pass, not a lookup per key
        """``(name, tensor)`` pairs in module order."""
        return self._pairs()


class _GradView(NamedTuple):
    """Where a parked ``p.grad`` pointed into its bucket storage, and its name for the guard."""

    name: str
    tensor: torch.Tensor
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _Bucket:
    """One reducer bucket storage released in place, with the ``p.grad`` views of it and its host copy."""

    def __init__(self, storage: Any, nbytes: int) -> None:
        self.storage, self.nbytes = storage, nbytes
        self.views: list[_GradView] = []
        self.host: torch.Tensor | None = None


class DDPClient(StoreClient):
    """A DDP model (and optionally its optimizer) attached to ``store``; made by :func:`attach_ddp`."""

    def __init__(self, store: Any, ddp: Any, optimizer: Any = None, name: str = "model") -> None:
        call = "attach_ddp(store, ddp, optimizer, name)"
        check_store(store, call)
        module = getattr(ddp, "module", None)
        if not isinstance(module, torch.nn.Module) or not hasattr(ddp, "gradient_as_bucket_view"):
            hint = ("; wrap it in DistributedDataParallel first, or attach a plain model with store.attach_module"
                    if isinstance(ddp, torch.nn.Module) else "")
            raise ArgumentTypeError(
                f"{call}: ddp must be a torch DistributedDataParallel, got {type(ddp).__name__}{hint}")
        check_optimizer(optimizer, call, optional=True)
        expect_name(name, call, "name")
        self.store, self.ddp, self.module, self.name = store, ddp, module, name
        self.bucket_view = bool(ddp.gradient_as_bucket_view)
        self._buckets: list[_Bucket] = []
        if self.bucket_view:
            store.attach_tensors(Category.PARAMS, _Named(module, "params"), name=name, kind="param")
            store.attach_tensors(Category.BUFFERS, _Named(module, "buffers"), name=f"{name}.buffers", kind="buffer")
        else:
            store.attach_module(module, name=name)
        if optimizer is not None:
            store.attach_optimizer(optimizer, name=f"{name}.optim")

    @property
    def buckets_offloaded(self) -> int:
        """How many reducer bucket storages are released in place now (``gradient_as_bucket_view=True``)."""
        return len(self._buckets)

    async def offload_async(self, include: Iterable[Category | str] | Category | str | None = None,
                            drop_grads: bool = False) -> None:
        """Async :meth:`offload`. ``drop_grads``: buckets are released without a copy (zeros on reload)."""
        await self.store.offload_async(include, drop_grads=drop_grads)
        if self.bucket_view and Category.GRADS in Category.select(include) and not self._buckets:
            await self._offload_buckets(drop_grads)

    async def reload_async(self, include: Iterable[Category | str] | Category | str | None = None) -> None:
        """Async :meth:`reload`."""
        if self._buckets and Category.GRADS in Category.select(include):
            await self._reload_buckets()
        await self.store.reload_async(include)

    def _find_buckets(self) -> list[_Bucket]:
        """The bucket storages the defined ``p.grad`` view, each with its views (module order)."""
        by_storage: dict[int, _Bucket] = {}
        params = {id(p): (n, p) for n, p in self.module.named_parameters()}
        for pname, p in params.values():
            g = p.grad
            if g is None:
                continue
            st = g.untyped_storage()
            if st._cdata == p.untyped_storage()._cdata:
                raise StoreStateError(f"{self.name}: a gradient shares its parameter's storage; cannot offload it")
            b = by_storage.get(st._cdata)
            if b is None:
                b = by_storage[st._cdata] = _Bucket(st, st.nbytes())
            b.views.append(_GradView(f"{self.name}.{pname}.grad", g, g.storage_offset(), tuple(g.shape),
                                     tuple(g.stride())))
        return list(by_storage.values())

    async def _offload_buckets(self, drop_grads: bool) -> None:
        rt = self.store.rt
        buckets = self._find_buckets()
        for b in buckets:
            if not drop_grads:
                b.host = rt.alloc_host(b.nbytes, torch.uint8, tag="ddp.bucket")
                await rt.copy_async(b.host, _bytes(b.storage), CopyKind.D2H)
        parking = self.store.parking
        for b in buckets:
            park_views(parking, ((v.name, v.tensor) for v in b.views), where=parking.site)
            rt.release(_bytes(b.storage))
        self._buckets = buckets
        logger.debug("%s: released %d DDP bucket storages in place (%d bytes)", self.name, len(buckets),
                     sum(b.nbytes for b in buckets))

    async def _reload_buckets(self) -> None:
        rt = self.store.rt
        for b in self._buckets:
            b.storage.resize_(b.nbytes)
            flat = _bytes(b.storage)
            if b.host is None:
                flat.zero_()
            else:
                await rt.copy_async(flat, b.host, CopyKind.H2D)
                rt.free_host(b.host)
                b.host = None
            repoint_views(ViewPlace(v.tensor, b.storage, v.offset, v.size, v.stride) for v in b.views)
        self._buckets = []


def _bytes(storage: Any) -> torch.Tensor:
    """A 1-D uint8 tensor over all of ``storage``."""
    t = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return t.set_(storage, 0, (storage.nbytes(),), (1,))


def attach_ddp(store: Any, ddp: Any, optimizer: Any = None, name: str = "model") -> DDPClient:
    """Attach a torch ``DistributedDataParallel`` model (and ``optimizer``) to ``store`` in one call.

    Returns the :class:`DDPClient` whose ``offload``/``reload`` to call (they cover the reducer's
    buckets when ``gradient_as_bucket_view=True``; see :mod:`refimpl.store.clients.ddp`)."""
    return DDPClient(store, ddp, optimizer, name)


__all__ = ["DDPClient", "attach_ddp"]
