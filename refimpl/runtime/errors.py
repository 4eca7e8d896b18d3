"""The error of a step that a peer rank failed, and the two error roots it belongs to.

Two protocol packages end an operation the same way on every rank: the process-group
lifecycle agrees each step with an ``all_reduce(MIN)`` on its control group
(:mod:`refimpl.comm.role_groups`), and the store's ``local_dedup`` backend settles each
offload and reload with a vote (:meth:`Runtime.vote <refimpl.runtime.base.Runtime.vote>`).
When some other rank failed its part, this rank undoes its own part too and raises
:class:`PeerFailedError` naming the failed ranks: one class for that one meaning.

A caller catches errors by the package it called: ``except LifecycleError`` around the
lifecycle, ``except DedupError`` around a ``local_dedup`` offload or reload. Both must
catch a peer's failure, so :class:`PeerFailedError` derives from both roots, and the
roots stand here beside it, below the two packages (which stand side by side and do not
import each other). Each package exports its root under the same name as before
(``refimpl.comm.LifecycleError``; ``DedupError`` beside the other ``local_dedup`` errors
of :mod:`refimpl.store`); the other errors of each tree stay in their package.
"""
from __future__ import annotations


class LifecycleError(RuntimeError):
    """Base class of lifecycle errors (:mod:`refimpl.comm`)."""


class DedupError(RuntimeError):
    """Base class of the errors of the store's ``local_dedup`` backend."""


class PeerFailedError(LifecycleError, DedupError):
    """Another rank failed a step that every rank agreed or voted on; this rank undid its part too, so all fail together.

    ``ranks``: the ranks known to have failed (the lifecycle's agreement names the lowest one;
    a ``local_dedup`` vote names every failed rank).
    """

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


__all__ = ["DedupError", "LifecycleError", "PeerFailedError"]
