"""The offload store: a worker's training state leaves the GPU and comes back bit-exact.

    store = OffloadStore(runtime, backend="local", config=StoreConfig())
    store.attach_module(model, name="model")          # params (FSDP2 aware), grads, buffers
    store.attach_optimizer(optimizer, name="optim")   # torch.optim state
    store.offload(); ...; store.reload()

See :mod:`refimpl.store.store` for the protocol, :mod:`refimpl.store.moves.offload`
and :mod:`refimpl.store.moves.reload` for one offload and one reload in flight,
:mod:`refimpl.store.state.layout` for the flat layouts and the store's vocabulary,
:mod:`refimpl.store.backends.pool` for pinned host memory, :mod:`refimpl.store.backends`
for the backend seam and :mod:`refimpl.store.registry` for backends by name.
"""
from refimpl.store.backends import LayoutSource, LocalBackend, StoreBackend, StreamingBackend
from refimpl.store.config import Category, StoreConfig
from refimpl.store.errors import (
    CheckpointError,
    CheckpointFailedError,
    CheckpointIntegrityError,
    CheckpointPathError,
    MixedDtypeError,
    SharedStorageError,
    StoreClosedError,
    StoreError,
    StoreStateError,
    TensorChangedError,
    UnattachedAliasError,
    UnknownBackendError,
    UnsupportedTensorError,
    WrongDeviceError,
)
from refimpl.store.state.guard import OffloadedTensorError
from refimpl.store.state.parking import is_parked
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutState, StorageEntry, TensorRef
from refimpl.store.backends.pool import HostBuffer, PageableFallbackWarning, PinnedHostPool, PoolStats
from refimpl.store.registry import create_backend, register_backend
from refimpl.store.stats import StoreStats
from refimpl.store.store import OffloadStore


__all__ = [
    "Category",
    "CheckpointError",
    "CheckpointFailedError",
    "CheckpointIntegrityError",
    "CheckpointPathError",
    "FlatLayout",
    "HostBuffer",
    "LayoutKey",
    "LayoutSource",
    "LayoutState",
    "LocalBackend",
    "MixedDtypeError",
    "OffloadStore",
    "OffloadedTensorError",
    "PageableFallbackWarning",
    "PinnedHostPool",
    "PoolStats",
    "SharedStorageError",
    "StorageEntry",
    "StoreBackend",
    "StoreClosedError",
    "StoreConfig",
    "StoreError",
    "StoreStateError",
    "StoreStats",
    "StreamingBackend",
    "TensorChangedError",
    "TensorRef",
    "UnattachedAliasError",
    "UnknownBackendError",
    "UnsupportedTensorError",
    "WrongDeviceError",
    "create_backend",
    "is_parked",
    "register_backend",
]
