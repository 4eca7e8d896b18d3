"""What every client of the store offers a caller: the store's runtime, whether a category is offloaded, and
synchronous ``offload`` / ``reload`` around the client's own ``offload_async`` / ``reload_async`` (so a
:class:`~refimpl.worker.WorkerStateControl` drives a client as it drives a store)."""
from __future__ import annotations

from typing import Any, Iterable

from refimpl.store.config import Category


class StoreClient:
    """Base of the clients (:class:`~refimpl.store.clients.ddp.DDPClient`,
    :class:`~refimpl.store.clients.megatron.MegatronClient`): ``store`` is the attached
    :class:`~refimpl.store.OffloadStore`; subclasses define ``offload_async`` and ``reload_async``."""

    store: Any

    @property
    def rt(self) -> Any:
        """The store's runtime (so a :class:`~refimpl.worker.WorkerStateControl` can drive this client)."""
        return self.store.rt

    def is_offloaded(self, category: Category | str) -> bool:
        """:meth:`OffloadStore.is_offloaded`."""
        return self.store.is_offloaded(category)

    def offload(self, include: Iterable[Category | str] | Category | str | None = None,
                drop_grads: bool = False) -> None:
        """The client's :meth:`offload_async`, run to completion (see the client's module docstring)."""
        self.store.rt.run(self.offload_async(include, drop_grads=drop_grads))

    def reload(self, include: Iterable[Category | str] | Category | str | None = None) -> None:
        """The client's :meth:`reload_async`, run to completion (see the client's module docstring)."""
        self.store.rt.run(self.reload_async(include))

    async def offload_async(self, include: Iterable[Category | str] | Category | str | None = None,
                            drop_grads: bool = False) -> None:
        """The client's offload (defined by each client)."""
        raise NotImplementedError

    async def reload_async(self, include: Iterable[Category | str] | Category | str | None = None) -> None:
        """The client's reload (defined by each client)."""
        raise NotImplementedError


__all__ = ["StoreClient"]
