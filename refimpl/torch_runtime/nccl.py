"""ctypes binding to the NCCL library *loaded in this process*: version, suspend/resume, memory stats.

Theory of operation
-------------------
NCCL >= 2.29.7 can release a communicator's dynamic GPU memory and get it back:

* ``ncclCommSuspend(comm, NCCL_SUSPEND_MEM)`` frees what ``ncclCommMemStats(comm,
  ncclStatGpuMemSuspend)`` reports; ``ncclStatGpuMemPersist`` stays allocated.
* ``ncclCommResume(comm)`` maps it back. The communicator and its process group
  survive; no rendezvous, no port, no rebuild.

Both calls synchronise the communicator's ranks (peer buffers are re-imported on
resume), so every member must suspend and resume the same communicators in the
same order, and must not issue collectives on them in between. Callers (the
runtime, driven by :class:`refimpl.comm.PGLifecycle`) walk groups in one global
order on every rank, which rules out a cycle of waits.

[Note: which library] torch reports the NCCL version it was *built* with
(``torch.cuda.nccl.version()``), not the one it runs with: with NCCL 2.32.3 in
``LD_PRELOAD`` torch 2.11 still says 2.28.9. :mod:`refimpl.torch_runtime.nccl_loader`
finds the ``libnccl.so*`` actually mapped in this process and this module asks
*it* ``ncclGetVersion``.

[Note: communicator handles] ``ProcessGroupNCCL._comm_ptr()`` (torch >= 2.8)
returns the ``ncclComm_t`` of the *current* CUDA device and 0 when the
communicator does not exist yet: torch creates it lazily on the first
collective unless the group was bound to a device (``device_id`` in
``init_process_group``). :func:`pg_comm_handles` pins the group's device, and
either skips a null communicator or creates it with a one-element all-reduce
(a collective: every member must call it).

Like the rest of :mod:`refimpl.torch_runtime`, the only package under ``refimpl/``
that imports ``torch.distributed`` or calls ``torch.cuda``, it is implementation:
protocol code reaches it through :meth:`refimpl.runtime.Runtime.suspend_group`.
"""
from __future__ import annotations

import ctypes
import enum
import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterable

from refimpl.torch_runtime.nccl_loader import (  # noqa: F401 - re-exported: the library's facts live here too
    MIN_SUSPEND_VERSION,
    NcclNotLoadedError,
    decode_version,
    find_loaded_nccl,
    format_version,
)
from refimpl.runtime.base import CommMemory

log = logging.getLogger(__name__)

NCCL_SUSPEND_MEM = 0x01
"""``ncclCommSuspend`` flag: release the communicator's dynamic GPU allocations."""


class CommMemStat(enum.IntEnum):
    """``ncclCommMemStat_t`` selectors, values as in NCCL's ``nccl.h`` (2.29.7 and later)."""

    GPU_MEM_SUSPEND = 0  #: bytes a suspend releases
    GPU_MEM_SUSPENDED = 1  #: 1 while suspended, 0 while active
    GPU_MEM_PERSIST = 2  #: bytes that stay allocated while suspended
    GPU_MEM_TOTAL = 3  #: all GPU memory NCCL tracks for the communicator


class NcclResult(enum.IntEnum):
    """``ncclResult_t`` codes."""

    SUCCESS = 0
    UNHANDLED_CUDA_ERROR = 1
    SYSTEM_ERROR = 2
    INTERNAL_ERROR = 3
    INVALID_ARGUMENT = 4
    INVALID_USAGE = 5
    REMOTE_ERROR = 6
    IN_PROGRESS = 7
    TIMEOUT = 8


class NcclError(RuntimeError):
    """An NCCL call returned an error code; the message carries NCCL's own explanation."""

    def __init__(self, call: str, code: int, detail: str = "") -> None:
        try:
            name = NcclResult(code).name
        except ValueError:
            name = f"code {code}"
        super().__init__(f"{call} failed with {name}" + (f": {detail}" if detail else ""))
        self.call = call
        self.code = code
        #: handles already suspended when a multi-communicator suspend failed
        self.suspended: list[int] = []


class NcclSymbolError(RuntimeError):
    """The loaded NCCL lacks a function this operation needs (it is older than 2.29.7)."""


# --------------------------------------------------------------------------- the library


class NcclLibrary:
    """The NCCL shared library loaded in this process, bound with ctypes.

    Use :meth:`load`; construct directly only to bind a specific handle.
    """

    _cached: "NcclLibrary | None" = None
    _lock = threading.Lock()

    def __init__(self, path: str, cdll: ctypes.CDLL) -> None:
        self.path = path
        self._lib = cdll
        get_version = self._fn("ncclGetVersion", [ctypes.POINTER(ctypes.c_int)])
        if get_version is None:
            raise NcclNotLoadedError(f"{path} has no ncclGetVersion: it is not an NCCL library")
        code = ctypes.c_int(0)
        rc = get_version(ctypes.byref(code))
        if rc != 0:
            raise NcclError("ncclGetVersion", rc)
        self.version_code = code.value
        self.version = decode_version(code.value)
        self._error_string = self._fn("ncclGetErrorString", [ctypes.c_int], ctypes.c_char_p)
        self._last_error = self._fn("ncclGetLastError", [ctypes.c_void_p], ctypes.c_char_p)
        self._suspend = self._fn("ncclCommSuspend", [ctypes.c_void_p, ctypes.c_int])
        self._resume = self._fn("ncclCommResume", [ctypes.c_void_p])
        self._mem_stats = self._fn(
            "ncclCommMemStats", [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
        )

    @classmethod
    def load(cls) -> "NcclLibrary":
        """The NCCL library loaded in THIS process (cached once found)."""
        with cls._lock:
            if cls._cached is None:
                path, cdll = find_loaded_nccl()
                cls._cached = cls(path, cdll)
                log.info(
                    "loaded NCCL %s from %s (suspend/resume: %s, mem stats: %s)",
                    format_version(cls._cached.version), path,
                    cls._cached.has_suspend_resume, cls._cached.has_mem_stats,
                )
            return cls._cached

    def _fn(self, name: str, argtypes: list[Any], restype: Any = ctypes.c_int) -> Any:
        try:
            fn = getattr(self._lib, name)
        except AttributeError:
            return None
        fn.argtypes = argtypes
        fn.restype = restype
        return fn

    # ---- facts ------------------------------------------------------------

    @property
    def has_suspend_resume(self) -> bool:
        """True if both ``ncclCommSuspend`` and ``ncclCommResume`` are exported."""
        return self._suspend is not None and self._resume is not None

    @property
    def has_mem_stats(self) -> bool:
        """True if ``ncclCommMemStats`` is exported."""
        return self._mem_stats is not None

    @property
    def version_string(self) -> str:
        """The loaded library's version as ``"major.minor.patch"`` (e.g. ``"2.29.7"``)."""
        return format_version(self.version)

    def __repr__(self) -> str:
        return f"NcclLibrary({self.version_string}, {self.path!r})"

    # ---- calls ------------------------------------------------------------

    def _check(self, call: str, rc: int, handle: int | None = None) -> None:
        if rc == 0:
            return
        detail = ""
        if handle and self._last_error is not None:
            msg = self._last_error(ctypes.c_void_p(handle))
            detail = msg.decode(errors="replace") if msg else ""
        if not detail and self._error_string is not None:
            msg = self._error_string(rc)
            detail = msg.decode(errors="replace") if msg else ""
        raise NcclError(call, rc, detail)

    def _require(self, fn: Any, name: str) -> Any:
        if fn is None:
            raise NcclSymbolError(
                f"{self.path} (NCCL {self.version_string}) has no {name}; it needs NCCL >= "
                f"{format_version(MIN_SUSPEND_VERSION)} (see docs/comm.md for how to deploy it)"
            )
        return fn

    def suspend(self, handle: int) -> None:
        """``ncclCommSuspend(handle, NCCL_SUSPEND_MEM)``."""
        fn = self._require(self._suspend, "ncclCommSuspend")
        self._check("ncclCommSuspend", fn(ctypes.c_void_p(_nonnull(handle)), NCCL_SUSPEND_MEM), handle)

    def resume(self, handle: int) -> None:
        """``ncclCommResume(handle)``."""
        fn = self._require(self._resume, "ncclCommResume")
        self._check("ncclCommResume", fn(ctypes.c_void_p(_nonnull(handle))), handle)

    def mem_stat(self, handle: int, stat: CommMemStat) -> int:
        """One ``ncclCommMemStats`` value."""
        fn = self._require(self._mem_stats, "ncclCommMemStats")
        value = ctypes.c_uint64(0)
        rc = fn(ctypes.c_void_p(_nonnull(handle)), int(stat), ctypes.byref(value))
        self._check(f"ncclCommMemStats({stat.name})", rc, handle)
        return int(value.value)


def _nonnull(handle: int) -> int:
    if not handle:
        raise ValueError("null ncclComm_t: the communicator was never created (see pg_comm_handles)")
    return int(handle)


# --------------------------------------------------------------------------- communicators


@dataclass(frozen=True)
class CommMemReport:
    """All four ``ncclCommMemStats`` values of one communicator, in bytes."""

    suspendable: int
    suspended: bool
    persistent: int
    total: int

    @property
    def consistent(self) -> bool:
        """NCCL reports ``total == persistent + suspendable``; False means the stat layout is not understood."""
        return self.total == self.persistent + self.suspendable


def comm_mem_stats(handle: int) -> CommMemory:
    """Memory one communicator holds on this rank *now*, via ``ncclCommMemStats``.

    ``ncclStatGpuMemSuspend`` counts the suspendable allocations whether or not
    they are suspended, so while ``ncclStatGpuMemSuspended`` is 1 the
    suspendable part held is 0 (the simulator reports it the same way).
    """
    lib = NcclLibrary.load()
    suspended = lib.mem_stat(handle, CommMemStat.GPU_MEM_SUSPENDED)
    return CommMemory(
        suspendable=0 if suspended else lib.mem_stat(handle, CommMemStat.GPU_MEM_SUSPEND),
        persistent=lib.mem_stat(handle, CommMemStat.GPU_MEM_PERSIST),
    )


def comm_mem_report(handle: int) -> CommMemReport:
    """Every ``ncclCommMemStats`` value of one communicator."""
    lib = NcclLibrary.load()
    return CommMemReport(
        suspendable=lib.mem_stat(handle, CommMemStat.GPU_MEM_SUSPEND),
        suspended=bool(lib.mem_stat(handle, CommMemStat.GPU_MEM_SUSPENDED)),
        persistent=lib.mem_stat(handle, CommMemStat.GPU_MEM_PERSIST),
        total=lib.mem_stat(handle, CommMemStat.GPU_MEM_TOTAL),
    )


def dedupe(handles: Iterable[int]) -> list[int]:
    """Non-null handles, each once, in first-seen order.

    One process group can be registered under several names; suspending its
    communicator twice is ``ncclInvalidUsage``.
    """
    out: dict[int, None] = {}
    for h in handles:
        if h:
            out.setdefault(int(h), None)
    return list(out)


def _synchronize_device() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def suspend_comms(handles: Iterable[int]) -> None:
    """Suspend each communicator (``NCCL_SUSPEND_MEM``), in the given order.

    Waits for queued device work first, so no kernel still uses the buffers.
    Every member rank must call this with the same communicators in the same
    order (NCCL synchronises them). On failure the error's ``suspended``
    attribute lists the handles already suspended; they are *not* resumed here,
    because a resume waits for the peers, which may not be resuming. The caller
    agrees with its peers on the failure and aborts the groups instead.
    """
    lib = NcclLibrary.load()
    todo = dedupe(handles)
    _synchronize_device()
    done: list[int] = []
    try:
        for h in todo:
            lib.suspend(h)
            done.append(h)
    except NcclError as exc:
        exc.suspended = list(done)
        raise
    log.debug("suspended %d NCCL communicator(s)", len(done))


def resume_comms(handles: Iterable[int]) -> None:
    """Resume each suspended communicator, in the given order (same rule as :func:`suspend_comms`)."""
    lib = NcclLibrary.load()
    for h in dedupe(handles):
        lib.resume(h)


# --------------------------------------------------------------------------- torch process groups


def _pg_device(pg: Any) -> Any:
    import torch

    bound = getattr(pg, "bound_device_id", None)
    if bound is not None:
        return bound
    return torch.device("cuda", torch.cuda.current_device())


def pg_comm_handles(pg: Any = None, *, create_lazy: bool = True) -> list[int]:
    """The NCCL communicator handles (``ncclComm_t`` as int) of a torch process group.

    ``pg=None`` means the default group. A group without an NCCL backend (Gloo) or a
    rank outside the group gives ``[]``. A communicator not created yet is created
    with a one-element all-reduce when ``create_lazy`` (every member must then call
    this together), and skipped otherwise.
    """
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available() or not dist.is_initialized():
        return []
    if pg is None:
        pg = dist.distributed_c10d._get_default_group()
    if pg is dist.GroupMember.NON_GROUP_MEMBER or pg is None:
        return []
    device = _pg_device(pg)
    try:
        backend = pg._get_backend(device)
    except RuntimeError:
        return []  # no backend for CUDA tensors: not an NCCL group
    if type(backend).__name__ != "ProcessGroupNCCL":
        return []
    comm_ptr = getattr(backend, "_comm_ptr", None)
    if comm_ptr is None:
        raise NcclSymbolError(
            f"torch {torch.__version__} has no ProcessGroupNCCL._comm_ptr() (added in torch 2.8); "
            "upgrade torch to suspend NCCL communicators"
        )
    with torch.cuda.device(device):
        handle = int(comm_ptr())
        if handle == 0 and create_lazy:
            probe = torch.zeros(1, device=device)
            dist.all_reduce(probe, group=pg)
            torch.cuda.synchronize(device)
            handle = int(comm_ptr())
    if handle == 0:
        log.debug("group %s has no NCCL communicator yet; skipped", getattr(pg, "group_name", pg))
        return []
    return [handle]


def unique_comm_handles(pgs: Iterable[Any], *, create_lazy: bool = True) -> list[int]:
    """Handles of several process groups, deduplicated, in the order given."""
    out: list[int] = []
    for pg in pgs:
        out.extend(pg_comm_handles(pg, create_lazy=create_lazy))
    return dedupe(out)


__all__ = [
    "MIN_SUSPEND_VERSION",
    "NCCL_SUSPEND_MEM",
    "CommMemReport",
    "CommMemStat",
    "NcclError",
    "NcclLibrary",
    "NcclNotLoadedError",
    "NcclResult",
    "NcclSymbolError",
    "comm_mem_report",
    "comm_mem_stats",
    "decode_version",
    "dedupe",
    "find_loaded_nccl",
    "format_version",
    "pg_comm_handles",
    "resume_comms",
    "suspend_comms",
    "unique_comm_handles",
]
