"""Offload backends: where an offloaded layout's bytes live in host memory.

* :mod:`~refimpl.store.backends.base`: the seam (:class:`StoreBackend`, required: ``offload`` and
  ``reload``; :class:`LayoutSource`, what a backend reads the device through) and the optional
  :class:`StreamingBackend` protocol.
* :mod:`~refimpl.store.backends.local`: ``local``, a full pinned copy per rank (streams).
* :mod:`~refimpl.store.backends.dedup`: ``local_dedup``, replicated state kept 1/N per replica-group
  member and all-gathered on reload (options and slices in :mod:`~refimpl.store.backends.dedup_config`).

Backends are found by name in :mod:`refimpl.store.registry`.
"""
from refimpl.store.backends.base import LayoutSource, StoreBackend, StreamingBackend, streams
from refimpl.store.backends.local import LocalBackend

__all__ = ["LayoutSource", "LocalBackend", "StoreBackend", "StreamingBackend", "streams"]
