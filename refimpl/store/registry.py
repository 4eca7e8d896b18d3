"""Offload backends by name: what ``OffloadStore(backend="...")`` builds.

:func:`register_backend` ``(name, factory)`` with ``factory(runtime, pool, config,
**options) -> StoreBackend`` makes a backend known; ``local``
(:class:`~refimpl.store.backends.local.LocalBackend`) is always there, and
``local_dedup`` (:class:`~refimpl.store.backends.dedup.DedupBackend`) is imported on
first use. The registry lives apart from the backend seam
(:mod:`refimpl.store.backends`) so that the backends' modules import the seam
and the registry imports them, never the other way round.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from refimpl.runtime.base import Runtime
from refimpl.store.backends import LocalBackend, StoreBackend
from refimpl.store.backends.pool import PinnedHostPool
from refimpl.store.config import StoreConfig
from refimpl.store.errors import UnknownBackendError

BackendFactory = Callable[..., StoreBackend]
"""``factory(runtime, pool, config, **options) -> StoreBackend``."""

_REGISTRY: dict[str, BackendFactory] = {}

#: backends in modules of their own, imported on first use: name -> (module, factory attribute)
_LAZY: dict[str, tuple[str, str]] = {"local_dedup": ("refimpl.store.backends.dedup", "DedupBackend")}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make ``OffloadStore(backend=name)`` build its backend with ``factory``.

    Re-registering a name replaces the factory (so a module may be reloaded).
    """
    if not name or not isinstance(name, str):
        raise ValueError(f"a backend needs a non-empty string name, got {name!r}")
    _REGISTRY[name] = factory


def registered_backends() -> list[str]:
    """Names of the backends registered now (lazy ones appear once first used)."""
    return sorted(_REGISTRY)


def create_backend(
    name: str, runtime: Runtime, pool: PinnedHostPool, config: StoreConfig, **options: Any
) -> StoreBackend:
    """Build the backend registered as ``name`` (importing its module if it is a known lazy one)."""
    if name not in _REGISTRY and name in _LAZY:
        module, attr = _LAZY[name]
        register_backend(name, getattr(importlib.import_module(module), attr))
    factory = _REGISTRY.get(name)
    if factory is None:
        known = sorted(set(_REGISTRY) | set(_LAZY))
        raise UnknownBackendError(
            f"no offload backend named {name!r}; known: {known}. Register one with "
            f"refimpl.store.register_backend(name, factory)."
        )
    backend = factory(runtime, pool, config, **options)
    if not isinstance(backend, StoreBackend):
        raise UnknownBackendError(f"backend factory for {name!r} returned {type(backend).__name__}, not a StoreBackend")
    return backend


register_backend("local", LocalBackend)


__all__ = ["BackendFactory", "create_backend", "register_backend", "registered_backends"]
