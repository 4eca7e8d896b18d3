"""The old import path of the backend seam: :mod:`refimpl.store.backends` holds it now."""
from refimpl.store.backends.base import LayoutSource, StoreBackend, StreamingBackend, streams
from refimpl.store.backends.local import LocalBackend

__all__ = ["LayoutSource", "LocalBackend", "StoreBackend", "StreamingBackend", "streams"]
