"""One offload store per framework object (a module, an optimizer), made at first use.

The drop-ins take the framework's objects and nothing else, so the store behind an object is found
from the object. [Note: where the store lives] A ``weakref.WeakKeyDictionary`` from object to store
would never let either go: the store holds the object strongly (it walks it at every offload), so the
value keeps its own key alive. The store therefore lives on the object, in a slot attribute, and the
pair is one reference cycle that the garbage collector frees with the object. The slot is copied as an
empty slot (``copy.deepcopy`` of a model gets a store of its own at its first offload) and pickled as
an empty slot; :data:`REGISTRY` lists the live slots weakly, for :func:`stores`.

Every store of a process uses one :class:`~refimpl.torch_runtime.TorchRuntime`, made at the first
call (after ``torch.distributed.init_process_group``, on ``cuda:<current>`` or the CPU) unless
:func:`use_runtime` set one before.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable

from refimpl.store import OffloadStore, StoreConfig
from refimpl.torch_runtime import TorchRuntime

logger = logging.getLogger(__name__)

#: the attribute of a framework object that holds its store's slot
SLOT_ATTR = "_timeshare_offload_slot"

_runtime: TorchRuntime | None = None
_lock = threading.Lock()


class StoreSlot:
    """Holds the store of one framework object (and what the integration keeps beside it: ``extra``)."""

    def __init__(self, owner: Any, store: Any, extra: Any = None) -> None:
        self.owner_type = type(owner).__name__
        self.store = store
        self.extra = extra

    def __deepcopy__(self, memo: dict) -> None:
        return None  # a copied object starts without a store (its tensors are other tensors)

    def __reduce__(self) -> tuple:
        return (_empty_slot, ())


def _empty_slot() -> None:
    return None


#: every live slot (weakly): what :func:`stores` lists
REGISTRY: "weakref.WeakSet[StoreSlot]" = weakref.WeakSet()


def runtime() -> TorchRuntime:
    """The process's runtime for the drop-ins' stores: the one :func:`use_runtime` set, else a
    ``TorchRuntime()`` made now and kept."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = TorchRuntime()
            logger.info("integration stores run on %s", _runtime.device)
        return _runtime


def use_runtime(rt: TorchRuntime | None) -> None:
    """Make the drop-ins' stores made from now on use ``rt`` (None: a fresh ``TorchRuntime()`` at the next
    first use). Stores already made keep theirs."""
    global _runtime
    with _lock:
        _runtime = rt


def store_config() -> StoreConfig:
    """The drop-ins' store configuration: the defaults, except that the drop-in empties the device cache
    itself when the framework's call asks for it (``empty_cache=``), not the store after every offload."""
    return StoreConfig(empty_cache=False)


def slot_of(obj: Any) -> StoreSlot | None:
    """The slot of ``obj`` (None before its first offload through a drop-in)."""
    slot = obj.__dict__.get(SLOT_ATTR) if hasattr(obj, "__dict__") else None
    return slot if isinstance(slot, StoreSlot) else None


def store_of(obj: Any) -> OffloadStore | None:
    """The store behind ``obj`` (a module, an optimizer, a Megatron model chunk), or None if no drop-in
    has moved it yet."""
    slot = slot_of(obj)
    return slot.store if slot is not None else None


def slot_for(obj: Any, make: Callable[[OffloadStore], Any]) -> StoreSlot:
    """``obj``'s slot, made now if it has none: a new store on :func:`runtime`, then ``make(store)``
    attaches ``obj`` and returns what to keep in ``slot.extra``."""
    slot = slot_of(obj)
    if slot is not None:
        return slot
    store = OffloadStore(runtime(), config=store_config())
    try:
        extra = make(store)
    except BaseException:
        store.close()
        raise
    slot = StoreSlot(obj, store, extra)
    obj.__dict__[SLOT_ATTR] = slot  # not setattr: nn.Module.__setattr__ would look at the value first
    REGISTRY.add(slot)
    return slot


def forget(obj: Any) -> bool:
    """Close ``obj``'s store and drop it (its host memory is freed). Refused while state is offloaded:
    the host copy is then the only copy. True if there was a store."""
    slot = slot_of(obj)
    if slot is None:
        return False
    offloaded = [c for c in ("params", "grads", "optimizer", "buffers") if slot.store.is_offloaded(c)]
    if offloaded:
        from refimpl.integrations.errors import IntegrationError

        raise IntegrationError(f"forget({slot.owner_type}): {offloaded} are offloaded and their only copy is "
                               f"the store's host memory; load them first")
    slot.store.close()
    del obj.__dict__[SLOT_ATTR]
    return True


def stores() -> list[tuple[str, OffloadStore]]:
    """(owner type name, store) of every live drop-in store of this process."""
    return [(s.owner_type, s.store) for s in list(REGISTRY)]


__all__ = ["REGISTRY", "SLOT_ATTR", "StoreSlot", "forget", "runtime", "slot_for", "slot_of", "store_config",
           "store_of", "stores", "use_runtime"]
