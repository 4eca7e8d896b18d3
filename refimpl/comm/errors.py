"""The error tree of the communicator lifecycle: one root, :class:`LifecycleError`.

Shared by :mod:`refimpl.comm.lifecycle` (which raises most of them) and
:mod:`refimpl.comm.role_groups` (which raises the peer and memory failures), so it
lives below both. The root and :class:`PeerFailedError` are defined on the seam
(:mod:`refimpl.runtime.errors`), because the store's ``local_dedup`` backend raises the
same peer failure; they are the same classes under the same names here.
"""
from __future__ import annotations

from refimpl.comm.agreement import AgreementError
from refimpl.runtime.errors import LifecycleError, PeerFailedError


class ResumeMemoryError(LifecycleError):
    """Too little free device memory to resume the suspended communicators."""


class LifecycleStateError(LifecycleError):
    """An operation was called in a state that does not allow it (e.g. pause while paused)."""


class LifecycleFailedError(LifecycleError):
    """The lifecycle failed earlier; its groups are aborted and it cannot be used again."""


class PolicyMismatchError(AgreementError):
    """Ranks asked for different pause policies."""


__all__ = [
    "LifecycleError",
    "LifecycleFailedError",
    "LifecycleStateError",
    "PeerFailedError",
    "PolicyMismatchError",
    "ResumeMemoryError",
]
