"""The error tree of the communicator lifecycle: one root, :class:`LifecycleError`.

Shared by :mod:`refimpl.comm.lifecycle` (which raises most of them) and
:mod:`refimpl.comm.role_groups` (which raises the peer and memory failures), so it
lives below both.
"""
from __future__ import annotations

from refimpl.comm.agreement import AgreementError


class LifecycleError(RuntimeError):
    """Base class of lifecycle errors."""


class PeerFailedError(LifecycleError):
    """Another rank failed a step; this rank aborted its groups too, so all fail together."""


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
