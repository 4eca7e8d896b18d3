"""Which device memory an offload gives back: the whole allocator cache, the store's own pool, or none.

[Note: what empty_cache costs]
On one H200 (the steady-profile record of a real 0.85 B model under FSDP2), a
steady offload's copies ran at the line and the offload still took 16-20 ms
more: ``torch.cuda.empty_cache`` made 161 ``cudaFree`` calls, one per cached
segment, most of them the training step's activation blocks and not the
store's state; and the reload that followed landed in freshly mapped driver
memory (two new ``cudaMalloc`` s), 0.87-0.89 x line. Three answers, one per
mode of :class:`DeviceCache`:

* ``"shared"`` (the default, as before): ``empty_cache`` returns every unused
  cached block to the driver, what another *process* needs to allocate.
* ``"private"``: the store's flat buffers (allocations tagged ``store.flat.*``)
  come from a private ``torch.cuda.MemPool``; ``empty_cache`` drops the pools
  none of whose blocks is allocated any more, and with them exactly the
  segments the store owned (``~MemPool`` frees that pool's segments only). The
  training step's cached blocks stay for the next step or role.
* ``"keep"``: ``empty_cache`` gives nothing back. When the next role runs in
  the same process (a colocated rollout engine on torch's allocator), it and
  then the reload reuse the cached blocks: no ``cudaFree`` and no fresh memory
  to map.

Without CUDA every mode is the plain allocation and ``empty_cache`` does nothing.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: the modes of :class:`DeviceCache`
DEVICE_CACHE_MODES = ("shared", "private", "keep")
#: tags of the allocations that the private pool takes
STORE_TAG_PREFIX = "store.flat"


class DeviceCache:
    """Device allocations and what :meth:`empty` returns to the driver; see [Note: what empty_cache costs]."""

    def __init__(self, device: torch.device, mode: str = "shared") -> None:
        if mode not in DEVICE_CACHE_MODES:
            raise ValueError(f"device cache mode {mode!r} is not one of {DEVICE_CACHE_MODES}; "
                             "check TIMESHARE_DEVICE_CACHE or the runtime's device_cache argument")
        self.device, self.mode = device, mode
        self._cuda = device.type == "cuda"
        self._pools: list[Any] = []  # private pools, the newest last (the one new store buffers go to)
        self.pools_released = 0

    def alloc(self, numel: int, dtype: torch.dtype, tag: str) -> torch.Tensor:
        """A new 1-D device buffer; from the private pool when the mode is ``"private"`` and ``tag`` is the store's."""
        if not (self._cuda and self.mode == "private" and tag.startswith(STORE_TAG_PREFIX)):
            return torch.empty(numel, dtype=dtype, device=self.device)
        if not self._pools:
            with torch.cuda.device(self.device):
                self._pools.append(torch.cuda.MemPool())
        with torch.cuda.use_mem_pool(self._pools[-1], device=self.device):
            return torch.empty(numel, dtype=dtype, device=self.device)

    def empty(self) -> None:
        """Return unused cached memory to the driver as the mode says (nothing without CUDA)."""
        if not self._cuda or self.mode == "keep":
            return
        if self.mode == "shared":
            torch.cuda.empty_cache()
            return
        kept = []
        for pool in self._pools:
            if _pool_in_use(pool):
                kept.append(pool)
            else:
                self.pools_released += 1  # dropped below: ~MemPool frees this pool's segments only
        self._pools = kept

    def pool_bytes(self) -> int:
        """Bytes the private pools hold from the driver now (0 in the other modes)."""
        return sum(seg.get("total_size", 0) for pool in self._pools for seg in _segments(pool))


def _segments(pool: Any) -> list[dict[str, Any]]:
    """The pool's segments (``MemPool.snapshot``; older torch takes no ``include_traces``)."""
    try:
        return list(pool.snapshot(include_traces=False))
    except TypeError:
        return list(pool.snapshot())


def _pool_in_use(pool: Any) -> bool:
    """True if any block of ``pool`` is allocated (its segments cannot be given back yet); True when the
    pool cannot be inspected (nothing is released that might still be used)."""
    try:
        return any(seg.get("allocated_size", 0) > 0 for seg in _segments(pool))
    except Exception as e:  # noqa: BLE001 - an allocator without pool snapshots: keep the pool
        logger.warning("private device pool not inspectable (%s: %s); its memory stays cached", type(e).__name__, e)
        return True


__all__ = ["DEVICE_CACHE_MODES", "DeviceCache", "STORE_TAG_PREFIX"]
