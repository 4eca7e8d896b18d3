"""One operation at a time on one store: :class:`OperationLock`."""
from __future__ import annotations

import contextlib
import threading
from types import TracebackType
from typing import Iterator

from refimpl.store.errors import StoreClosedError, StoreStateError


class OperationLock:
    """Serialises a store's operations: another thread waits; the same thread (a second coroutine on its event
    loop, a callback inside an operation) gets a :class:`StoreStateError` instead of a deadlock; once the store is
    :attr:`closed`, every operation gets a :class:`StoreClosedError`.

    ``with lock(op):`` holds it for the operation named ``op`` (``"offload"``, ``"reload"``, ...).
    """

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        #: the thread holding the lock, or None
        self.owner: int | None = None
        #: the operation running now, or None
        self.busy: str | None = None
        #: set by ``OffloadStore.close()``: every later operation is refused
        self.closed = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Held while a read of the store's state (its stats, its host views) runs: another thread's operation
        changes that state (the offloaded categories, the layouts) as it goes, so the read waits for it to end; on
        the thread running the operation (a callback inside it) the read runs at once."""
        if self.owner == threading.get_ident():
            yield
            return
        with self.mutex:
            yield

    def __call__(self, op: str) -> "_Held":
        """The lock held for operation ``op`` (a context manager); refused on a closed store."""
        if self.closed:
            raise StoreClosedError(f"{op} on a closed OffloadStore: close() freed its host memory; make a new "
                                   f"OffloadStore and attach the state to it")
        return _Held(self, op)


class _Held:
    """:class:`OperationLock` held for one operation (a plain class: no generator frames, as a
    ``contextlib.contextmanager`` would add to every store operation)."""

    __slots__ = ("lock", "op")

    def __init__(self, lock: OperationLock, op: str) -> None:
        self.lock, self.op = lock, op

    def __enter__(self) -> None:
        lock, me = self.lock, threading.get_ident()
        if lock.owner == me:
            raise StoreStateError(
                f"{self.op} while {lock.busy} is in progress on this store in the same thread; await the first "
                f"operation before starting another (one store serves one operation at a time)"
            )
        lock.mutex.acquire()
        lock.owner, lock.busy = me, self.op

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        lock = self.lock
        lock.owner = lock.busy = None
        lock.mutex.release()


__all__ = ["OperationLock"]
