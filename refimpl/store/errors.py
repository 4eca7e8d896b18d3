"""Errors of the offload store.

Every error is raised *before* anything is released (validation happens first),
or after a rollback, so a caught :class:`StoreError` leaves the state where it
was: on the device if an offload was refused, in host memory if a reload was
refused.
"""
from __future__ import annotations


class StoreError(RuntimeError):
    """Base class of offload-store errors."""


class MixedDtypeError(StoreError):
    """Tensors viewing one storage use different dtypes; the store never casts."""


class UnsupportedTensorError(StoreError):
    """A tensor whose bytes cannot be captured at storage level (sparse, nested, opaque subclass)."""


class WrongDeviceError(StoreError):
    """A registered tensor is not on the runtime's device."""


class SharedStorageError(StoreError):
    """One storage is registered under two categories (or two placements)."""


class TensorChangedError(StoreError):
    """A registered tensor was resized or re-pointed while its state was offloaded."""


class UnattachedAliasError(StoreError):
    """A storage is also viewed by tensor objects not attached to the store (they would dangle)."""


class StoreStateError(StoreError):
    """The store or a framework object is in a state that does not allow the call."""


class UnknownBackendError(StoreError):
    """``OffloadStore(backend=...)`` names a backend nobody registered."""


__all__ = [
    "MixedDtypeError",
    "SharedStorageError",
    "StoreError",
    "StoreStateError",
    "TensorChangedError",
    "UnattachedAliasError",
    "UnknownBackendError",
    "UnsupportedTensorError",
    "WrongDeviceError",
]
