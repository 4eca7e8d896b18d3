"""Readers of a store's host buffers: async checkpoint writes that the next offload must wait for.

An async DCP save of offloaded ``local`` state hands DCP the store's pinned host
buffers themselves (:mod:`refimpl.store.checkpoint`); they must not be
overwritten until the write has finished. :func:`hold_host_buffers` registers
the save's future; the store's offload calls :func:`wait_for_host_readers`
before it copies anything into them. Reload only reads the buffers and does not wait.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any

log = logging.getLogger(__name__)

_READERS: "weakref.WeakKeyDictionary[Any, list[Any]]" = weakref.WeakKeyDictionary()


def hold_host_buffers(store: Any, future: Any) -> None:
    """Keep ``store``'s host buffers from being overwritten until ``future`` (``.result()``) completes."""
    _READERS.setdefault(store, []).append(future)


def host_readers_pending(store: Any) -> int:
    """How many registered readers of ``store``'s host buffers have not finished."""
    return sum(1 for f in _READERS.get(store, []) if not f.done())


def wait_for_host_readers(store: Any) -> int:
    """Block until every registered reader of the host buffers is done; returns how many were waited for.

    A failed write is logged, not raised: the offload that waits did not
    cause it, and the save's own future reports it to whoever awaits it.
    """
    readers = _READERS.pop(store, [])
    waited = 0
    for f in readers:
        if not f.done():
            waited += 1
            log.info("offload waits for an async checkpoint write that still reads the host buffers")
        try:
            f.result()
        except Exception as e:  # noqa: BLE001 - reported by the save's own future
            log.warning("an async checkpoint reading the host buffers failed: %s", e)
    return waited


__all__ = ["hold_host_buffers", "host_readers_pending", "wait_for_host_readers"]
