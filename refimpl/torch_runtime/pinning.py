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

[Note: how the pages are faulted in (``HostPinner(prefault=...)``)]
Registering untouched memory makes ``cudaHostRegister`` fault in every 4 KiB
page itself (2.0 GB/s for 8 GiB on the H200, issue 16). ``prefault``:

* ``"none"``: register the untouched mapping (the behaviour before issue 16).
* ``"touch"``: write one byte per page first, then register (5.6-6.5 GB/s on
  the H200 by the issue's measurement: 0.9-1.0 s of touching for 8 GiB, then
  0.43-0.53 s of registering).
* ``"thp"``: the mapping is over-allocated by 2 MiB, the tensor starts at a
  2 MiB boundary, the range is ``madvise(MADV_HUGEPAGE)``-ed so each touch
  faults a whole transparent huge page (one fault per 2 MiB instead of 512),
  then registered. Where the kernel has THP off (``never``) the advice is a
  no-op and this is ``"touch"``. See :func:`thp_mode`.
* ``"populate"``: the mapping is made with ``MAP_POPULATE`` (the kernel
  faults every page at ``mmap`` time, in one call), then registered.

Which is fastest is measured by ``bench/gpu/pin_probe.py`` (GPU) and
``python -m bench.pin_touch`` (the touch part alone, on CPU).

Without CUDA, :class:`HostPinner` hands out plain memory and only counts the
bytes asked to be pinned, so accounting is identical on CPU-only machines.
(With ``prefault`` other than ``"none"`` the CPU path still maps and
touches the memory the same way, so the touch part is exercised by tests.)
"""
from __future__ import annotations

import ctypes
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
_HUGE = 2 << 20
#: the ways :class:`HostPinner` can fault the pages in before registering them
PREFAULT_MODES = ("none", "touch", "thp", "populate")
#: the mode :class:`~refimpl.torch_runtime.TorchRuntime` uses with CUDA unless told otherwise: the fastest
#: pinning ahead of the store on the 2 x H200 host (bench/results/2026-11-30-h200x2-all-policies/loop/pin.json,
#: 8 GiB: touch 12.38, thp 11.31, none 1.92 GB/s; tests/test_recorded_loop.py checks it against the record)
DEFAULT_CUDA_PREFAULT = "touch"


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

    def __init__(self, use_cuda: bool, *, prefault: str = "none") -> None:
        if prefault not in PREFAULT_MODES:
            raise ValueError(f"HostPinner: prefault must be one of {PREFAULT_MODES}, got {prefault!r}")
        self.use_cuda = use_cuda
        #: how pages are faulted in before ``cudaHostRegister`` (see the module notes)
        self.prefault = prefault
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
        if nbytes == 0 or (not self.use_cuda and self.prefault == "none"):
            t = torch.empty(numel, dtype=dtype)
            self._track(t, nbytes, registered=False)
            return t
        t = mapped_buffer(numel, dtype, nbytes, self.prefault)
        if not self.use_cuda:
            self._track(t, nbytes, registered=False)
            return t
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


def thp_mode() -> str:
    """The kernel's transparent-huge-page setting (``always``, ``madvise``, ``never``) or ``unknown``."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return "unknown"
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return "unknown"


def anon_huge_pages_kb(unknown: int = -1) -> int:
    """The machine's ``AnonHugePages`` in KiB (from /proc/meminfo), or ``unknown`` where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return unknown


def touch_pages(buf: torch.Tensor, stride: int = _PAGE) -> None:
    """Write one zero byte every ``stride`` bytes of ``buf`` so the kernel faults every page in now.

    The buffer's contents become unspecified where written (it is fresh memory).
    """
    flat = buf.view(-1).view(torch.uint8) if buf.numel() else buf.view(torch.uint8)
    if flat.numel():
        flat[::stride].zero_()


def mapped_buffer(numel: int, dtype: torch.dtype, nbytes: int, prefault: str = "none", *,
                  touch: bool = True) -> torch.Tensor:
    """``numel`` elements of ``dtype`` in their own private anonymous mapping, faulted in per ``prefault``.

    ``"none"``: untouched. ``"touch"``: one write per 4 KiB page. ``"thp"``: the
    tensor starts on a 2 MiB boundary of a mapping advised ``MADV_HUGEPAGE`` and
    is touched once per 2 MiB where the kernel grants huge pages (``thp_mode()``
    not ``never``), else per page. ``"populate"``: ``MAP_POPULATE``. The tensor
    holds the mapping; it is unmapped when the last view dies. ``touch=False``
    maps (and advises) but leaves the touching to the caller (e.g. on several threads).
    """
    if prefault not in PREFAULT_MODES:
        raise ValueError(f"prefault must be one of {PREFAULT_MODES}, got {prefault!r}")
    size = -(-nbytes // _PAGE) * _PAGE
    offset = 0
    if prefault == "populate" and hasattr(mmap, "MAP_POPULATE"):
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    elif prefault == "thp":
        mapping = mmap.mmap(-1, size + _HUGE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        offset = (-addr) % _HUGE
        advised = False
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                mapping.madvise(mmap.MADV_HUGEPAGE, offset, -(-size // _HUGE) * _HUGE)
                advised = thp_mode() in ("always", "madvise")
            except OSError as e:  # an old kernel or THP compiled out: fall back to 4 KiB pages
                logger.debug("madvise(MADV_HUGEPAGE) failed (%s); touching 4 KiB pages", e)
    else:
        mapping = mmap.mmap(-1, size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frombuffer warns about non-resizable buffers
        t = torch.frombuffer(mapping, dtype=dtype, count=numel, offset=offset)
    if not touch:
        return t
    if prefault == "touch":
        touch_pages(t)
    elif prefault == "thp":
        if advised:
            touch_pages(t, _HUGE)  # one fault per huge page where the kernel grants them
        touch_pages(t)  # every 4 KiB page not yet backed (no faults where huge pages were granted)
    return t


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
