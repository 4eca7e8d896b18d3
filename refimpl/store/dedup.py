"""The old import path of the ``local_dedup`` backend: :mod:`refimpl.store.backends.dedup` holds it now."""
from refimpl.store.backends.dedup import DEBUG_ENV, DedupBackend, debug_mode
from refimpl.store.backends.dedup_config import (
    DedupConfig, DedupError, LayoutMismatchError, MemberSlice, OperationMismatchError, PeerFailedError,
    PeerUnavailableError, ReplicaMismatchError, ReplicaShare, SlicePlan,
)

__all__ = ["DEBUG_ENV", "DedupBackend", "DedupConfig", "DedupError", "LayoutMismatchError", "MemberSlice",
           "OperationMismatchError", "PeerFailedError", "PeerUnavailableError", "ReplicaMismatchError",
           "ReplicaShare", "SlicePlan", "debug_mode"]
