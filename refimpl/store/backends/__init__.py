"""Offload backends: where an offloaded layout's bytes live in host memory.

* :mod:`~refimpl.store.backends.base`: the seam (:class:`StoreBackend`, required: ``offload`` and
  ``reload``; :class:`LayoutSource`, what a backend reads the device through) and the optional
  :class:`StreamingBackend` protocol.
* :mod:`~refimpl.store.backends.local`: ``local``, a full pinned copy per rank (streams).
* :mod:`~refimpl.store.backends.dedup`: ``local_dedup``, replicated state kept 1/N per replica-group
  member and all-gathered on reload (options and slices in :mod:`~refimpl.store.backends.dedup_config`, its
  outcome votes in :mod:`~refimpl.store.backends.dedup_outcome`, its all-gathers in
  :mod:`~refimpl.store.backends.dedup_gather`; replica groups from meshes in
  :mod:`~refimpl.store.backends.replica`, agreed on and checked in :mod:`~refimpl.store.backends.replica_sync`).
* :mod:`~refimpl.store.backends.pool`: the pinned host memory every backend keeps its copies in, pinned once at
  its exact size; :mod:`~refimpl.store.backends.host_readers`: async checkpoint writes still reading it.

Backends are found by name in :mod:`refimpl.store.registry`.
"""
from refimpl.store.backends.base import LayoutSource, StoreBackend, StreamingBackend, streams
from refimpl.store.backends.local import LocalBackend

__all__ = ["LayoutSource", "LocalBackend", "StoreBackend", "StreamingBackend", "streams"]
