"""One simulated rank's buffers and the bytes the simulated memory is charged for them.

[Note: memory that is dropped without ``release``]
A device buffer whose storage is garbage-collected without ``release`` behaves
like a block returned to PyTorch's caching allocator: the driver
(``memory_info``) still counts it until ``empty_cache``, and later allocations
reuse it first (and an allocation that would not fit empties the cache and
retries, as PyTorch does). ``release`` returns memory at once. Host buffers
dropped without ``free_host`` are returned when their storage dies.

Buffers are recognised by their storage (``untyped_storage()._cdata``), so any
view of a buffer releases or frees it, as ``Runtime.release`` promises.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Callable

import torch

from sim.machine.protocols import Memory

log = logging.getLogger(__name__)

CACHE_TAG = "allocator cache"


class RankAllocator:
    """Allocates one rank's device and host tensors and keeps the simulated memory's ledger in step."""

    def __init__(self, memory: Memory, rank: int, device: torch.device,
                 on_returned: Callable[[int], None] | None = None):
        """``on_returned(nbytes)`` is called whenever device bytes go back to the driver (``release``,
        ``empty_cache``), e.g. to start the driver's scrub the transport simulates."""
        self._memory = memory
        self._on_returned = on_returned
        self.rank = rank
        self.device = device
        self._device: dict[int, tuple[int, str, Any]] = {}  # storage key -> (nbytes, tag, finalizer)
        self._host: dict[int, tuple[int, bool, str, Any]] = {}  # storage key -> (nbytes, pinned, tag, finalizer)
        self.cached = 0  # bytes of dropped device buffers the "allocator" still holds

    def alloc_device(self, numel: int, dtype: torch.dtype, tag: str) -> torch.Tensor:
        """A 1-D device tensor, charged to the simulated memory (may raise SimOutOfMemoryError)."""
        nbytes = int(numel) * dtype.itemsize
        mem, rank = self._memory, self.rank
        if self.cached:
            take = min(self.cached, nbytes)
            self.cached -= take
            mem.free_device(rank, take, CACHE_TAG)
        try:
            mem.alloc_device(rank, nbytes, tag)
        except torch.OutOfMemoryError:
            if not self.cached:
                raise
            self.empty_cache()  # what PyTorch's allocator does before giving up
            mem.alloc_device(rank, nbytes, tag)
        t = torch.empty(int(numel), dtype=dtype, device=self.device)
        storage = t.untyped_storage()
        key = storage._cdata
        fin = weakref.finalize(storage, self._device_dropped, key)
        fin.atexit = False
        self._device[key] = (nbytes, tag, fin)
        return t

    def _device_dropped(self, key: int) -> None:
        entry = self._device.pop(key, None)
        if entry is None:
            return
        nbytes, tag, _ = entry
        self._memory.free_device(self.rank, nbytes, tag)
        self._memory.alloc_device(self.rank, nbytes, CACHE_TAG)
        self.cached += nbytes

    def release(self, tensor: torch.Tensor) -> None:
        """Empty the tensor's storage (every view sees 0 bytes) and uncharge it now."""
        storage = tensor.untyped_storage()
        entry = self._device.pop(storage._cdata, None)
        storage.resize_(0)
        if entry is None:
            log.debug("rank %d: release of a storage not allocated by alloc_device; nothing to uncharge", self.rank)
            return
        nbytes, tag, fin = entry
        fin.detach()
        self._memory.free_device(self.rank, nbytes, tag)
        self._returned(nbytes)

    def empty_cache(self) -> None:
        """Return the bytes of dropped buffers to the device ledger."""
        if self.cached:
            n = self.cached
            self._memory.free_device(self.rank, n, CACHE_TAG)
            self.cached = 0
            self._returned(n)

    def _returned(self, nbytes: int) -> None:
        if self._on_returned is not None and nbytes:
            self._on_returned(nbytes)

    def alloc_host(self, numel: int, dtype: torch.dtype, pinned: bool, tag: str) -> torch.Tensor:
        """A 1-D host tensor of exactly ``numel`` elements, charged as pinned or pageable."""
        nbytes = int(numel) * dtype.itemsize
        self._memory.alloc_host(self.rank, nbytes, pinned, tag)
        t = torch.empty(int(numel), dtype=dtype, device=self.device)
        storage = t.untyped_storage()
        key = storage._cdata
        fin = weakref.finalize(storage, self._host_dropped, key)
        fin.atexit = False
        self._host[key] = (nbytes, pinned, tag, fin)
        return t

    def _host_dropped(self, key: int) -> None:
        entry = self._host.pop(key, None)
        if entry is not None:
            self._memory.free_host(self.rank, entry[0], entry[1], entry[2])

    def free_host(self, tensor: torch.Tensor) -> None:
        """Uncharge a buffer from :meth:`alloc_host` and empty its storage."""
        storage = tensor.untyped_storage()
        entry = self._host.pop(storage._cdata, None)
        if entry is None:
            raise ValueError(
                f"rank {self.rank}: free_host got a tensor that alloc_host of this rank did not allocate "
                "(or that was freed already)"
            )
        nbytes, pinned, tag, fin = entry
        fin.detach()
        storage.resize_(0)
        self._memory.free_host(self.rank, nbytes, pinned, tag)


__all__ = ["CACHE_TAG", "RankAllocator"]
