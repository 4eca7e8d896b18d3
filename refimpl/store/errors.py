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


class StoreClosedError(StoreStateError):
    """An operation on a store after :meth:`~refimpl.store.OffloadStore.close`; make a new store."""


class UnknownBackendError(StoreError):
    """``OffloadStore(backend=...)`` names a backend nobody registered."""


class CheckpointError(StoreError):
    """Base class of the errors of checkpoints of the store's state (:mod:`refimpl.store.checkpoint`)."""


class CheckpointPathError(CheckpointError):
    """The requested tensors cannot be read on the chosen path (e.g. dedup slices, partly offloaded)."""


class CheckpointIntegrityError(CheckpointError):
    """A checkpoint's bytes do not match the checksum written with them (a flipped bit, a truncated file),
    or it carries no checksums to verify. ``tensor`` and ``file`` name what failed (None if unknown).
    Raised before anything was written into the load's target."""

    def __init__(self, message: str, tensor: str | None = None, file: str | None = None) -> None:
        super().__init__(message)
        self.tensor, self.file = tensor, file

    def __reduce__(self):  # noqa: ANN204 - DCP sends a rank's error to the others pickled
        return type(self), (str(self), self.tensor, self.file)


class CheckpointFailedError(CheckpointError):
    """A DCP save or load failed (on this rank or another: ``ranks``); torch's ``CheckpointException``,
    which ``except Exception`` does not catch, is the ``__cause__``. A failed load left its target as it was."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)

    def __reduce__(self):  # noqa: ANN204 - pickled like CheckpointIntegrityError
        return type(self), (str(self), self.ranks)


__all__ = [
    "CheckpointError",
    "CheckpointFailedError",
    "CheckpointIntegrityError",
    "CheckpointPathError",
    "MixedDtypeError",
    "SharedStorageError",
    "StoreClosedError",
    "StoreError",
    "StoreStateError",
    "TensorChangedError",
    "UnattachedAliasError",
    "UnknownBackendError",
    "UnsupportedTensorError",
    "WrongDeviceError",
]
