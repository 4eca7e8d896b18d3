"""The synchronous facade of a :class:`refimpl.comm.PGLifecycle` (``PGLifecycle.sync``), for TorchRuntime.

Every method runs the lifecycle's coroutine with ``runtime.run`` and returns its
result; the operations, their agreements and their errors are the lifecycle's.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Iterable, Protocol

from refimpl.comm.states import PGPolicy, PGState
from refimpl.runtime.base import Runtime


class AsyncLifecycle(Protocol):
    """What the facade drives: :class:`refimpl.comm.PGLifecycle`'s operations (declared here, so no import cycle)."""

    rt: Runtime
    state: PGState

    def start(self) -> Awaitable[None]:
        """See :meth:`PGLifecycle.start`."""
        ...

    def agree(self, flag: bool) -> Awaitable[bool]:
        """See :meth:`PGLifecycle.agree`."""
        ...

    def pause(self, release_memory: Callable[[], Any] | None = None, *,
              policy: PGPolicy | None = None) -> Awaitable[PGState]:
        """See :meth:`PGLifecycle.pause`."""
        ...

    def weight_sync(self, fn: Callable[[], Any]) -> Awaitable[Any]:
        """See :meth:`PGLifecycle.weight_sync`."""
        ...

    def resume(self) -> Awaitable[PGState]:
        """See :meth:`PGLifecycle.resume`."""
        ...

    def use(self, names: Iterable[str] | None = None) -> Awaitable[PGState]:
        """See :meth:`PGLifecycle.use`."""
        ...

    def run_on(self, names: Iterable[str] | None, fn: Callable[[], Any]) -> Awaitable[Any]:
        """See :meth:`PGLifecycle.run_on`."""
        ...


class BlockingPGLifecycle:
    """Synchronous facade of a :class:`PGLifecycle` on a runtime that runs coroutines at once (TorchRuntime)."""

    def __init__(self, lifecycle: AsyncLifecycle) -> None:
        self.lifecycle = lifecycle

    @property
    def state(self) -> PGState:
        """The lifecycle's current :class:`PGState` on this rank."""
        return self.lifecycle.state

    def start(self) -> None:
        """See :meth:`PGLifecycle.start`."""
        self.lifecycle.rt.run(self.lifecycle.start())

    def agree(self, flag: bool) -> bool:
        """See :meth:`PGLifecycle.agree`."""
        return self.lifecycle.rt.run(self.lifecycle.agree(flag))

    def pause(self, release_memory: Callable[[], Any] | None = None, *, policy: PGPolicy | None = None) -> PGState:
        """See :meth:`PGLifecycle.pause`."""
        return self.lifecycle.rt.run(self.lifecycle.pause(release_memory, policy=policy))

    def weight_sync(self, fn: Callable[[], Any]) -> Any:
        """See :meth:`PGLifecycle.weight_sync`."""
        return self.lifecycle.rt.run(self.lifecycle.weight_sync(fn))

    def resume(self) -> PGState:
        """See :meth:`PGLifecycle.resume`."""
        return self.lifecycle.rt.run(self.lifecycle.resume())

    def use(self, names: Iterable[str] | None = None) -> PGState:
        """See :meth:`PGLifecycle.use` (:mod:`refimpl.comm.lazy_wake`)."""
        return self.lifecycle.rt.run(self.lifecycle.use(names))

    def run_on(self, names: Iterable[str] | None, fn: Callable[[], Any]) -> Any:
        """See :meth:`PGLifecycle.run_on` (:mod:`refimpl.comm.lazy_wake`)."""
        return self.lifecycle.rt.run(self.lifecycle.run_on(names, fn))


__all__ = ["AsyncLifecycle", "BlockingPGLifecycle"]
