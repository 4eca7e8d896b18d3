"""The offload store: a worker's training state leaves the GPU and comes back bit-exact.

    store = OffloadStore(runtime, backend="local", config=StoreConfig())
    store.attach_module(model, name="model")          # params (FSDP2 aware), grads, buffers
    store.attach_optimizer(optimizer, name="optim")   # torch.optim state
    store.offload(); ...; store.reload()

The package stands in rooms, each importing only the rooms below it:

* the leaves: :mod:`~refimpl.store.config` (categories, :class:`StoreConfig`), :mod:`~refimpl.store.errors`,
  :mod:`~refimpl.store.stats` (:class:`StoreStats` and the typed figures it reads), :mod:`~refimpl.store.debug`;
* :mod:`refimpl.store.state`: what is registered and where it points (collectors, entries, flat layouts and the
  store's vocabulary in :mod:`~refimpl.store.state.layout`, parking and the access guard);
* :mod:`refimpl.store.backends`: where host bytes live (the backend seam, ``local``, ``local_dedup``, the pinned
  pool, replica groups);
* :mod:`refimpl.store.moves`: one offload (:mod:`~refimpl.store.moves.offload`) or reload
  (:mod:`~refimpl.store.moves.reload`) in flight, its stages, paths, copies and release;
* the face: :class:`OffloadStore` (:mod:`refimpl.store.store`), what it holds
  (:mod:`~refimpl.store.holdings`), backends by name (:mod:`~refimpl.store.registry`), checkpoints;
* :mod:`refimpl.store.clients`: torch DDP and Megatron-core attached in one call.
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
from refimpl.store.backends.pool import HostBuffer, PageableFallbackWarning, PinnedHostPool, PoolStats
from refimpl.store.registry import create_backend, register_backend
from refimpl.store.state.guard import OffloadedTensorError
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutState, StorageEntry, TensorRef
from refimpl.store.state.parking import is_parked
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
