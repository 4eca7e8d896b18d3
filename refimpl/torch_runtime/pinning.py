"""Host buffers page-locked at their exact size with ``cudaHostRegister``.

[Note: why register instead of ``pin_memory()``]
``torch.empty(..., pin_memory=True)`` goes through PyTorch's caching host
allocator, which rounds every request up to a power of two and keeps the
blocks for reuse: a 5 GiB state pins 8 GiB. Here the buffer is allocated with
the exact byte count and registered with ``cudaHostRegister``, so what is
pinned is what is used (rounded only to whole pages by the kernel).

[Note: why the buffer comes from its own mapping]
The driver page-locks whole pages and refuses to register a range that
overlaps one already registered. Two small ``torch.empty`` buffers from the
C heap can share a page, so the second registration would fail. Each pinned
buffer therefore gets its own anonymous ``mmap`` (page-aligned, zero-filled)
and the tensor is a view of exactly ``numel`` elements of it.

Without CUDA, :class:`HostPinner` hands out plain memory and only counts the
bytes asked to be pinned, so accounting is identical on CPU-only machines.
"""
from __future__ import annotations

import logging
import mmap
import threading
import weakref
import warnings
from dataclasses import dataclass

import torch

from refimpl.runtime.base import PinningError

logger = logging.getLogger(__name__)

_PAGE = mmap.PAGESIZE


@dataclass
class _Registration:
    buffer: torch.Tensor  # held so the memory cannot be unmapped while registered
    nbytes: int
    registered: bool  # True when cudaHostRegister succeeded (False: accounting only)


class HostPinner:
    """Allocates host buffers, pins them at their exact size, and counts what is pinned.

    ``use_cuda`` selects real registration; without it the buffers are plain
    memory and only :attr:`pinned_bytes` / :attr:`registrations` change.
    A pinned buffer stays allocated and registered until :meth:`free`, like
    ``cudaHostAlloc`` memory until ``cudaFreeHost``; dropping every reference
    does not unpin it. Thread-safe: several threads may pin at once (the
    registrations run concurrently; only the bookkeeping is serialised).
    """

    def __init__(self, use_cuda: bool) -> None:
        self.use_cuda = use_cuda
        self._live: dict[int, _Registration] = {}
        self._lock = threading.Lock()
        #: bytes currently pinned (or, without CUDA, marked pinned)
        self.pinned_bytes = 0
        #: number of successful pin operations over this pinner's life
        self.registrations = 0
        #: high-water mark of :attr:`pinned_bytes`
        self.peak_pinned_bytes = 0
        # A runtime dropped without free_host for each buffer must not leave registrations
        # behind: the mappings would be unmapped while still registered, and a later mapping
        # at the same address fails cudaHostRegister with "already mapped" (error 712).
        # The finalizer holds the registry (not self), so the buffers stay mapped until
        # they are unregistered.
        weakref.finalize(self, _unregister_all, self._live)

    # ------------------------------------------------------------------ allocate

    def alloc(self, numel: int, dtype: torch.dtype, *, pinned: bool, tag: str = "") -> torch.Tensor:
        """A new 1-D CPU tensor of exactly ``numel`` elements, page-locked if ``pinned``."""
        if numel < 0:
            raise ValueError(f"alloc_host({tag!r}): numel must be >= 0, got {numel}")
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if not pinned:
            return torch.empty(numel, dtype=dtype)
        if not self.use_cuda or nbytes == 0:
            t = torch.empty(numel, dtype=dtype)
            self._track(t, nbytes, registered=False)
            return t
        t = self._mapped(numel, dtype, nbytes)
        status = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0)
        rc = int(status)
        if rc != 0:
            raise PinningError(
                f"cudaHostRegister of {nbytes} bytes ({nbytes / 2**30:.3f} GiB) for {tag or 'a host buffer'} "
                f"failed with CUDA error {rc} ({_error_string(status)}); currently pinned by this process: "
                f"{self.pinned_bytes} bytes. Raise the locked-memory limit (`ulimit -l unlimited`, or "
                f"memlock in the container/systemd config) or free host memory, or offload less state."
            )
        self._track(t, nbytes, registered=True)
        logger.debug("pinned %d bytes at 0x%x for %s", nbytes, t.data_ptr(), tag or "host buffer")
        return t

    def free(self, tensor: torch.Tensor) -> None:
        """Unregister a pinned buffer from :meth:`alloc` (or any view of it).

        Pageable buffers and buffers already freed have nothing to unpin and are left alone.
        """
        with self._lock:
            reg = self._live.pop(_key(tensor), None)
        if reg is None:
            return
        tensor = reg.buffer
        if reg.registered:
            status = torch.cuda.cudart().cudaHostUnregister(tensor.data_ptr())
            rc = int(status)
            if rc != 0:
                raise PinningError(
                    f"cudaHostUnregister of {reg.nbytes} bytes at 0x{tensor.data_ptr():x} failed with CUDA "
                    f"error {rc} ({_error_string(status)}); the buffer was not registered by this runtime or "
                    f"was already freed. Call free_host once per alloc_host(pinned=True) buffer."
                )
        with self._lock:
            self.pinned_bytes -= reg.nbytes
        logger.debug("unpinned %d bytes", reg.nbytes)

    def is_tracked(self, tensor: torch.Tensor) -> bool:
        """True if ``tensor`` is (a view of) a live pinned buffer from :meth:`alloc`."""
        with self._lock:
            return _key(tensor) in self._live

    # ------------------------------------------------------------------ internals

    def _track(self, t: torch.Tensor, nbytes: int, *, registered: bool) -> None:
        with self._lock:
            self._live[_key(t)] = _Registration(t, nbytes, registered)
            self.pinned_bytes += nbytes
            self.registrations += 1
            self.peak_pinned_bytes = max(self.peak_pinned_bytes, self.pinned_bytes)

    @staticmethod
    def _mapped(numel: int, dtype: torch.dtype, nbytes: int) -> torch.Tensor:
        """``numel`` elements of a private, page-aligned anonymous mapping."""
        mapping = mmap.mmap(-1, -(-nbytes // _PAGE) * _PAGE)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # frombuffer warns about non-resizable buffers
            # The tensor holds a reference to the mapping; it is unmapped when the tensor dies.
            return torch.frombuffer(mapping, dtype=dtype, count=numel)


def _unregister_all(live: dict[int, "_Registration"]) -> None:
    """Unregister every buffer still registered (a pinner being collected or the process exiting)."""
    regs = list(live.values())
    live.clear()
    for reg in regs:
        if reg.registered:
            try:
                torch.cuda.cudart().cudaHostUnregister(reg.buffer.data_ptr())
            except Exception:  # noqa: BLE001 - best effort at teardown
                logger.debug("cudaHostUnregister at teardown failed", exc_info=True)


def _key(tensor: torch.Tensor) -> int:
    """Identity of a tensor's storage, shared by all its views (0-byte storages have no address)."""
    storage = tensor.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else id(storage)


def _error_string(status: object) -> str:
    try:
        return str(torch.cuda.cudart().cudaGetErrorString(status))
    except Exception:  # noqa: BLE001 - the name is a courtesy; the code is in the message
        return "unknown CUDA error"


def host_memory() -> tuple[int, int]:
    """``(available, total)`` host memory in bytes from ``/proc/meminfo``."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    fields[key] = int(parts[0]) * 1024
    except OSError as e:
        raise RuntimeError(f"cannot read /proc/meminfo for host memory figures: {e}") from e
    total = fields.get("MemTotal", 0)
    available = fields.get("MemAvailable", fields.get("MemFree", 0))
    return available, total
