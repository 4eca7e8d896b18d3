"""Device memory committed chunk by chunk under one reserved address range (CUDA VMM), for the probes.

:class:`VmmBuffer` reserves the address range (``cuMemAddressReserve``), and :meth:`VmmBuffer.commit` maps
physical chunks (``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess``) just before the copies into them are
issued; ``bench/gpu/h2d_scrub_probe.py`` times host-to-device copies into such a buffer beside ``cudaMalloc``
ones. The store does not use it (docs/store.md, "Why the phase gap matters", says what the probes found).

The buffer is a torch tensor built through ``__cuda_array_interface__``; when its last view
dies the chunks are unmapped and released (after a device synchronize: ``cuMemUnmap`` does not
wait for queued work) and the range is freed. Only committed elements may be touched.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import threading
import weakref

import torch

logger = logging.getLogger(__name__)

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
_CU_DEVICE_ATTRIBUTE_VMM_SUPPORTED = 102
_CUDA_ERROR_OUT_OF_MEMORY = 2

#: default size of one committed chunk: large enough that per-call overhead is noise, small enough
#: that the first copy starts after ~5 ms of mapping
DEFAULT_CHUNK_BYTES = 256 << 20


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class VmmError(RuntimeError):
    """A CUDA driver call of the virtual-memory path failed."""


class VmmOutOfMemoryError(VmmError, torch.OutOfMemoryError):
    """Committing a chunk found no free device memory."""


@functools.cache
def _driver() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    u64, sz, p = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.POINTER
    sigs = {
        "cuMemGetAllocationGranularity": [p(sz), p(_AllocationProp), ctypes.c_int],
        "cuMemAddressReserve": [p(u64), sz, sz, u64, u64],
        "cuMemAddressFree": [u64, sz],
        "cuMemCreate": [p(u64), sz, p(_AllocationProp), u64],
        "cuMemRelease": [u64],
        "cuMemMap": [u64, sz, sz, u64, u64],
        "cuMemUnmap": [u64, sz],
        "cuMemSetAccess": [u64, sz, p(_AccessDesc), sz],
        "cuDeviceGetAttribute": [p(ctypes.c_int), ctypes.c_int, ctypes.c_int],
        "cuCtxGetCurrent": [p(ctypes.c_void_p)],
        "cuGetErrorString": [ctypes.c_int, p(ctypes.c_char_p)],
    }
    for name, args in sigs.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            return None
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def _check(rc: int, what: str) -> None:
    if rc == 0:
        return
    lib = _driver()
    msg = ctypes.c_char_p()
    text = ""
    if lib is not None and lib.cuGetErrorString(rc, ctypes.byref(msg)) == 0 and msg.value:
        text = msg.value.decode(errors="replace")
    cls = VmmOutOfMemoryError if rc == _CUDA_ERROR_OUT_OF_MEMORY else VmmError
    raise cls(f"{what} failed: CUDA driver error {rc} ({text or 'unknown'})")


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = _CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location = _Location(_CU_MEM_LOCATION_TYPE_DEVICE, device)
    return prop


@functools.cache
def vmm_supported(device: int = 0) -> bool:
    """True if CUDA virtual memory management works for ``device`` in this process."""
    if not torch.cuda.is_available():
        return False
    lib = _driver()
    if lib is None:
        return False
    torch.cuda.init()
    val = ctypes.c_int()
    if lib.cuDeviceGetAttribute(ctypes.byref(val), _CU_DEVICE_ATTRIBUTE_VMM_SUPPORTED, device) != 0:
        return False
    return bool(val.value)


@functools.cache
def granularity(device: int) -> int:
    """The recommended physical chunk granularity of ``device`` in bytes (2 MiB on Hopper)."""
    lib = _driver()
    g = ctypes.c_size_t()
    prop = _prop(device)
    _check(lib.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop),
                                             _CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "cuMemGetAllocationGranularity")
    return g.value


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _ensure_context(device: int) -> None:
    """Make the primary context current in this thread (a finalizer may run on any thread)."""
    ctx = ctypes.c_void_p()
    if _driver().cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
        torch.cuda.set_device(device)
        torch.cuda.current_stream(device)  # forces the runtime to bind its primary context here


class _Mapping:
    """Owns one reserved address range and the physical chunks mapped into it (see :class:`VmmBuffer`).

    Torch's tensor keeps a reference to this object (through
    ``__cuda_array_interface__``); when the last one goes, :meth:`__del__`
    releases the memory and the address range.
    """

    def __init__(self, device: int, nbytes: int, chunk_bytes: int) -> None:
        self.device = device
        g = granularity(device)
        self.chunk_bytes = _round_up(max(chunk_bytes, g), g)
        self.reserved = _round_up(max(nbytes, 1), g)
        self.nbytes = nbytes
        self.ptr = 0
        self.handles: list[tuple[int, int, int]] = []  # (offset, size, handle)
        self.mapped = 0  # bytes mapped from the start of the range
        self.lock = threading.Lock()
        ptr = ctypes.c_ulonglong()
        _check(_driver().cuMemAddressReserve(ctypes.byref(ptr), self.reserved, g, 0, 0),
               f"cuMemAddressReserve({self.reserved} bytes)")
        self.ptr = ptr.value
        with _LIVE_LOCK:
            _LIVE[self.ptr] = weakref.ref(self)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 2}

    def commit(self, stop_bytes: int) -> None:
        """Map chunks until at least ``stop_bytes`` from the start are backed by memory."""
        stop = min(_round_up(stop_bytes, granularity(self.device)), self.reserved)
        lib = _driver()
        with self.lock:
            if not self.ptr:
                raise VmmError("commit on a VMM buffer whose memory was released")
            while self.mapped < stop:
                off = self.mapped
                size = min(self.chunk_bytes, self.reserved - off)
                handle = ctypes.c_ulonglong()
                prop = _prop(self.device)
                _check(lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0),
                       f"cuMemCreate({size} bytes) on cuda:{self.device}")
                rc = lib.cuMemMap(self.ptr + off, size, 0, handle.value, 0)
                if rc != 0:
                    lib.cuMemRelease(handle.value)
                    _check(rc, "cuMemMap")
                self.handles.append((off, size, handle.value))
                access = _AccessDesc(_Location(_CU_MEM_LOCATION_TYPE_DEVICE, self.device),
                                     _CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                self.mapped = off + size  # unmapped by release_physical even if the access call fails
                _check(lib.cuMemSetAccess(self.ptr + off, size, ctypes.byref(access), 1), "cuMemSetAccess")

    def release_physical(self) -> int:
        """Unmap and release every chunk (after the device finished its queued work); returns bytes freed.

        The address range stays reserved until this object dies, so a stale
        view faults instead of reading memory that was handed out again.
        """
        with self.lock:
            if not self.handles:
                return 0
            lib = _driver()
            _ensure_context(self.device)
            torch.cuda.synchronize(self.device)  # cuMemUnmap does not wait for kernels still using the memory
            errors, freed = [], 0
            for off, size, handle in reversed(self.handles):
                for rc, what in ((lib.cuMemUnmap(self.ptr + off, size), "cuMemUnmap"),
                                 (lib.cuMemRelease(handle), "cuMemRelease")):
                    if rc != 0:
                        errors.append(f"{what} rc={rc}")
                freed += size
            self.handles.clear()
            self.mapped = 0
        if errors:
            logger.error("releasing a VMM buffer of %d bytes on cuda:%d: %s", self.reserved, self.device,
                         ", ".join(errors))
        return freed

    def __del__(self) -> None:
        if not self.ptr:
            return
        try:
            self.release_physical()
            with _LIVE_LOCK:
                _LIVE.pop(self.ptr, None)
            rc = _driver().cuMemAddressFree(self.ptr, self.reserved)
            if rc != 0:
                logger.error("cuMemAddressFree of %d bytes on cuda:%d failed: rc=%d", self.reserved, self.device, rc)
        except Exception as e:  # noqa: BLE001 - a finalizer must not raise (interpreter shutdown, dead context)
            logger.debug("VMM buffer finalizer: %s", e)
        self.ptr = 0


_LIVE: dict[int, "weakref.ref[_Mapping]"] = {}
_LIVE_LOCK = threading.Lock()


def _mapping_of(tensor: torch.Tensor) -> _Mapping | None:
    if tensor.device.type != "cuda":
        return None
    ptr = tensor.untyped_storage().data_ptr()
    with _LIVE_LOCK:
        ref = _LIVE.get(ptr)
    return None if ref is None else ref()


def release_vmm(tensor: torch.Tensor) -> int:
    """Give the physical memory under ``tensor``'s :class:`VmmBuffer` back to the driver now.

    Returns the bytes freed (0 if ``tensor`` is not on a VMM buffer). Every
    view of the buffer is dead afterwards: touching one faults.
    """
    m = _mapping_of(tensor)
    return 0 if m is None else m.release_physical()


class VmmBuffer:
    """A 1-D device tensor over a reserved address range, backed by memory as it is committed.

    ``tensor`` exists at once (its first chunk committed); only what
    :meth:`commit` covered may be touched. The memory goes back to the driver
    when ``tensor``, every view of it and this object are gone, or at once
    through :func:`release_vmm`.
    """

    def __init__(self, numel: int, dtype: torch.dtype, device: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if numel <= 0:
            raise ValueError(f"VmmBuffer needs numel > 0, got {numel}")
        self.dtype = dtype
        self.numel = numel
        self._itemsize = torch.empty(0, dtype=dtype).element_size()
        self._map = _Mapping(device, numel * self._itemsize, chunk_bytes)
        # torch finds the device of a pointer through cudaPointerGetAttributes: map the first chunk first
        self._map.commit(1)
        self.tensor = torch.as_tensor(self._map, device=f"cuda:{device}").view(dtype)

    def commit(self, stop: int) -> None:
        """Back elements ``[0, stop)`` with memory (chunk by chunk; a no-op for what is already backed)."""
        if stop > self.numel:
            raise ValueError(f"VmmBuffer.commit({stop}) beyond the buffer's {self.numel} elements")
        self._map.commit(stop * self._itemsize)

    def commit_all(self) -> None:
        """Back the whole buffer with memory."""
        self.commit(self.numel)


__all__ = [
    "DEFAULT_CHUNK_BYTES", "VmmBuffer", "VmmError", "VmmOutOfMemoryError", "granularity", "release_vmm",
    "vmm_supported",
]
