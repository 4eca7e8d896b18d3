"""The runtime seam: the one interface protocol code talks to.

Theory of operation
-------------------
Every piece of protocol logic in this project (the offload store, dedup, the
process-group lifecycle, NCCL suspend, worker control) is written once, as
``async def`` code that awaits operations of a :class:`Runtime`. Two
implementations exist:

* :class:`refimpl.runtime.TorchRuntime` runs on real tensors (CUDA or CPU) and
  ``torch.distributed`` (NCCL or Gloo). Its awaitables complete at once, so
  :meth:`Runtime.run` drives a coroutine to completion synchronously and the
  public API of the store and lifecycle stays synchronous for users.
* :class:`sim.SimRuntime` runs simulated ranks inside a deterministic
  discrete-event engine. Its awaitables suspend the rank's coroutine until the
  simulated completion time; time comes from the topology model, memory from
  ledgers, faults from a fault plan.

Rules protocol code follows:

1. Device and host buffers are allocated through :meth:`Runtime.alloc_device`
   and :meth:`Runtime.alloc_host`, and memory is returned with
   :meth:`Runtime.release`, so the simulator's ledgers see every byte.
2. Copies between device and host go through :meth:`Runtime.copy_async`, which
   is ordered after the compute already queued on the device and returns a
   :class:`Completion` to await.
3. Collectives name a group (``"world"`` always exists). Ranks in group
   operations are *global* ranks, as in ``torch.distributed``.
4. Time is read with :meth:`Runtime.now` and passed with :meth:`Runtime.sleep`;
   never ``time.time()`` or ``time.sleep()`` (the simulator has no wall clock).
5. Nothing under ``refimpl/`` except the runtime adapters imports
   ``torch.distributed`` or calls ``torch.cuda``; a test enforces it.
"""
from __future__ import annotations

import abc
import contextlib
import enum
import functools
from dataclasses import dataclass, field
from typing import Any, Awaitable, Coroutine, Generator, Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")

WORLD = "world"
"""Name of the group of all ranks; it exists from the start and is never destroyed."""


class ReduceOp(enum.Enum):
    """Reductions supported by :meth:`Runtime.all_reduce`."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"


class CopyKind(enum.Enum):
    """Direction of a :meth:`Runtime.copy_async`."""

    D2H = "d2h"
    H2D = "h2d"
    D2D = "d2d"


# --------------------------------------------------------------------------- errors


class RuntimeSeamError(RuntimeError):
    """Base class of errors raised through the runtime seam."""


class GroupError(RuntimeSeamError):
    """A group operation was invalid: unknown name, duplicate, not a member, destroyed."""


class GroupSuspendedError(GroupError):
    """A collective was issued on a group whose communicator is suspended."""


class CollectiveTimeoutError(RuntimeSeamError):
    """A collective did not complete within its ``timeout_s``."""


class CollectiveFailedError(RuntimeSeamError):
    """A collective failed (NCCL error, peer gone, injected fault)."""


class PinningError(RuntimeSeamError):
    """Host memory could not be pinned (ulimit -l, out of memory, driver error)."""


class AddressInUseError(RuntimeSeamError):
    """A group rebuild failed because its rendezvous port is still in TIME_WAIT."""


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class GroupSpec:
    """Everything needed to (re)create a process group with the same arguments.

    ``ranks`` are global ranks, sorted. ``backend`` is ``"nccl"``, ``"gloo"`` or
    ``None`` for the runtime's default. ``generation`` counts rebuilds; each
    generation uses a fresh store prefix so stale keys of an earlier one are
    never read.
    """

    name: str
    ranks: tuple[int, ...]
    backend: str | None = None
    timeout_s: float = 600.0
    options: tuple[tuple[str, Any], ...] = ()
    generation: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise GroupError("a group needs a non-empty name")
        if len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise GroupError(f"group {self.name!r}: ranks must be distinct and non-empty, got {self.ranks}")
        if tuple(sorted(self.ranks)) != self.ranks:
            object.__setattr__(self, "ranks", tuple(sorted(self.ranks)))
        if self.timeout_s <= 0:
            raise GroupError(f"group {self.name!r}: timeout_s must be > 0, got {self.timeout_s}")

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return len(self.ranks)

    def group_rank(self, global_rank: int) -> int:
        """Position of ``global_rank`` within this group."""
        pos = self._positions.get(global_rank)
        if pos is None:
            raise GroupError(f"rank {global_rank} is not a member of group {self.name!r} {self.ranks}")
        return pos

    @functools.cached_property
    def _positions(self) -> dict[int, int]:
        # rank -> position, built on first use: ``ranks.index`` made every member's
        # lookup O(size), so installing a 16,384-rank world group was O(n^2)
        return {r: i for i, r in enumerate(self.ranks)}

    @property
    def store_prefix(self) -> str:
        """``"<name>/gen<generation>"``: this generation's key prefix in the rendezvous store."""
        return f"{self.name}/gen{self.generation}"


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory as the driver sees it (``cudaMemGetInfo``), in bytes."""

    free: int
    total: int

    @property
    def used(self) -> int:
        """``total - free``: bytes in use on the device as the driver counts them (other processes' included)."""
        return self.total - self.free


@dataclass(frozen=True)
class CommMemory:
    """Memory a group's communicator holds on this rank, in bytes.

    ``suspendable`` is what a suspend frees (``ncclStatGpuMemSuspend``);
    ``persistent`` stays allocated while suspended.
    """

    suspendable: int = 0
    persistent: int = 0


@dataclass
class CopyStats:
    """Counts of copies issued through a runtime, by kind (for tests and benchmarks)."""

    count: dict[CopyKind, int] = field(default_factory=lambda: {k: 0 for k in CopyKind})
    bytes: dict[CopyKind, int] = field(default_factory=lambda: {k: 0 for k in CopyKind})

    def record(self, kind: CopyKind, nbytes: int) -> None:
        """Count one copy of ``kind`` and its ``nbytes``."""
        self.count[kind] += 1
        self.bytes[kind] += nbytes

    @property
    def host_copies(self) -> int:
        """Number of copies that crossed to or from the host (D2H plus H2D)."""
        return self.count[CopyKind.D2H] + self.count[CopyKind.H2D]


# --------------------------------------------------------------------------- awaitables


class Completion(abc.ABC):
    """Handle of an asynchronous copy; ``await completion`` waits for it."""

    @abc.abstractmethod
    def done(self) -> bool:
        """True once the copy has finished (never blocks)."""

    @abc.abstractmethod
    def __await__(self) -> Generator[Any, None, None]:
        ...


class Ready(Completion):
    """A completion that is already done (used by synchronous paths)."""

    def done(self) -> bool:
        """Always True."""
        return True

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


async def gather(*aws: Awaitable[T]) -> list[T]:
    """Await several awaitables in order; the runtime-neutral ``asyncio.gather``.

    Copies issued before this call already run concurrently; awaiting them in
    order just waits for the last to finish.
    """
    out = []
    for a in aws:
        out.append(await a)
    return out


# --------------------------------------------------------------------------- the seam


class Runtime(abc.ABC):
    """The interface protocol code is written against. See the module docstring."""

    #: this process's (or simulated rank's) global rank
    rank: int
    #: number of ranks in the job
    world_size: int
    #: device on which :meth:`alloc_device` places buffers ("cuda:N", "cpu" or "meta")
    device: torch.device
    #: copy counters; tests use them to prove no host traffic happened
    copy_stats: CopyStats

    # ---- memory -------------------------------------------------------------

    @abc.abstractmethod
    def alloc_device(self, numel: int, dtype: torch.dtype, *, tag: str = "") -> torch.Tensor:
        """A new 1-D device buffer of ``numel`` elements (contents undefined).

        ``tag`` names the holder in memory ledgers and error messages.
        """

    @abc.abstractmethod
    def alloc_host(self, numel: int, dtype: torch.dtype, *, pinned: bool = True, tag: str = "") -> torch.Tensor:
        """A new 1-D host buffer of exactly ``numel`` elements.

        With ``pinned`` the buffer is page-locked at its exact size
        (``cudaHostRegister``, no power-of-two rounding); raises
        :class:`PinningError` naming the size when that fails. Without CUDA,
        plain host memory is returned and ``pinned`` only affects accounting.
        """

    @abc.abstractmethod
    def free_host(self, tensor: torch.Tensor) -> None:
        """Unpin (if pinned) and drop a buffer from :meth:`alloc_host`."""

    @abc.abstractmethod
    def release(self, tensor: torch.Tensor) -> None:
        """Return a device tensor's memory now, keeping the tensor object.

        The tensor's storage is resized to 0 bytes, so every view of it sees an
        empty storage until new storage is attached.
        """

    @abc.abstractmethod
    def memory_info(self) -> MemoryInfo:
        """Device free/total bytes as the driver reports them (not allocator counters)."""

    def empty_cache(self) -> None:
        """Return cached, unused device blocks to the driver (no-op where there is no cache)."""

    # ---- copies -------------------------------------------------------------

    @abc.abstractmethod
    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, kind: CopyKind) -> Completion:
        """Copy ``src`` into ``dst`` (same numel and dtype) on the copy stream.

        The copy is ordered after all compute already queued on the device, so
        it reads the finished values. Await the returned completion before
        reading ``dst`` or releasing ``src``.
        """

    @abc.abstractmethod
    async def synchronize(self) -> None:
        """Wait for all queued device work (compute and copies) of this rank."""

    # ---- groups -------------------------------------------------------------

    @abc.abstractmethod
    async def new_group(self, spec: GroupSpec) -> None:
        """Create a group; every rank calls it (members and non-members alike)."""

    @abc.abstractmethod
    async def destroy_group(self, name: str, *, abort: bool = False) -> None:
        """Destroy a group and free its communicator. ``abort`` skips the graceful
        shutdown (used on the failure path). The spec is kept for :meth:`recreate_group`."""

    async def destroy_groups(self, names: Sequence[str], *, abort: bool = False) -> dict[str, Exception]:
        """Destroy every group in ``names``, all of them whatever fails (walk, don't stop); returns the error each
        failing group raised (empty: all destroyed).

        The default destroys them one after the other with :meth:`destroy_group`. A runtime may overlap them: an
        initialised NCCL communicator's destroy waits for its proxy thread's next 500 ms poll timeout, so 14 groups
        destroyed one by one right after their inits take three periods where overlapped ones take one
        ([Note: the proxy's 500 ms poll] in :mod:`sim.presets`; ``bench/gpu/parallel_destroy_probe.py``).
        """
        errors: dict[str, Exception] = {}
        for name in names:
            try:
                await self.destroy_group(name, abort=abort)
            except Exception as exc:  # noqa: BLE001 - every group is destroyed; the caller agrees on failures
                errors[name] = exc
        return errors

    @abc.abstractmethod
    async def recreate_group(self, name: str) -> GroupSpec:
        """Rebuild a destroyed group with its original ranks, backend, timeout and
        options, under the next generation's store prefix. Returns the new spec.
        May raise :class:`AddressInUseError`."""

    def foreign_group_ranks(self, handle: Any) -> tuple[int, ...]:
        """The global ranks of a process-group object this runtime did not create (a training
        framework's own group, e.g. one of Megatron's ``parallel_state`` groups), sorted.

        Raises :class:`NotImplementedError` on runtimes without such objects (the simulator)."""
        raise NotImplementedError(f"{type(self).__name__} has no foreign process groups")

    def foreign_group_spec(self, name: str, handle: Any) -> GroupSpec:
        """The spec of a framework's own process-group object under ``name``: its ranks, and its backend and
        timeout as it was created. Raises :class:`NotImplementedError` where there are no such objects."""
        raise NotImplementedError(f"{type(self).__name__} has no foreign process groups")

    async def adopt_group(self, spec: GroupSpec, handle: Any) -> None:
        """Register a group a framework created as ``spec.name`` (``handle``: its group object on the members,
        None on the other ranks; every rank calls it, in the same order), so a lifecycle can destroy and rebuild
        it like its own. A rebuild re-creates it with its original arguments and leaves every reference the
        framework holds to the old object naming the new one. Raises :class:`NotImplementedError` where there
        are no such objects (the simulator)."""
        raise NotImplementedError(f"{type(self).__name__} has no foreign process groups")

    @abc.abstractmethod
    def group_spec(self, name: str) -> GroupSpec:
        """The spec of a known group (live, suspended or destroyed)."""

    @abc.abstractmethod
    def group_live(self, name: str) -> bool:
        """True if the group exists and is not destroyed (it may be suspended)."""

    @abc.abstractmethod
    def group_names(self) -> list[str]:
        """Names of all groups this runtime knows, live or destroyed."""

    # communicator memory control (NCCL suspend/resume). Runtimes without it say so.

    def comm_memory(self, name: str) -> CommMemory:
        """Memory the group's communicator holds on this rank."""
        return CommMemory()

    async def suspend_group(self, name: str) -> None:
        """Release the group's communicator memory, keeping the group. Collectives on
        it raise :class:`GroupSuspendedError` until :meth:`resume_group`."""
        raise GroupError(f"{type(self).__name__} cannot suspend communicators")

    async def resume_group(self, name: str) -> None:
        """Re-allocate a suspended communicator's memory."""
        raise GroupError(f"{type(self).__name__} cannot resume communicators")

    def group_suspended(self, name: str) -> bool:
        """True while group ``name``'s communicator is suspended on this rank (after :meth:`suspend_group`, before
        :meth:`resume_group`). The default, for runtimes that cannot suspend, is always False."""
        return False

    # ---- collectives --------------------------------------------------------

    @abc.abstractmethod
    async def all_gather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """``output`` (group size x input numel) receives every member's ``input`` in group-rank order."""

    @abc.abstractmethod
    async def all_reduce(
        self, tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """Reduce ``tensor`` in place across the group."""

    @abc.abstractmethod
    async def broadcast(
        self, tensor: torch.Tensor, src: int, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """Copy global rank ``src``'s ``tensor`` to every member, in place."""

    @abc.abstractmethod
    async def barrier(self, group: str = WORLD, *, timeout_s: float | None = None) -> None:
        """Return once every member has entered the barrier."""

    # ---- time ---------------------------------------------------------------

    @abc.abstractmethod
    def now(self) -> float:
        """Seconds on a monotonic clock (simulated time in the simulator)."""

    @abc.abstractmethod
    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""

    # ---- observability and fault points ------------------------------------

    async def point(self, name: str) -> None:
        """A named protocol point (e.g. ``"lifecycle.canary"``, ``"store.offload.copy"``).

        TorchRuntime does nothing here; the simulator's fault plan may crash,
        hang or fail the rank at a named point.
        """

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Record the time spent in a protocol phase (``"offload"``, ``"reload"`` ...).

        Spans are kept in :attr:`spans` as ``(name, start, end)`` on this
        runtime's clock; the simulator also writes them to its trace.

        A span ends when the device work issued inside it ends, not when the
        host has queued it: on a normal exit :meth:`settle_device` runs before
        the end is read (a synchronize on CUDA), so a span around an NCCL
        collective or a copy measures the transfer. On an exception the end is
        read at once: a collective that failed or timed out may never finish,
        and waiting for it would turn an error into a hang.
        """
        start = self.now()
        finished = False
        try:
            yield
            finished = True
        finally:
            if finished:
                self.settle_device()
            self._spans().append((name, start, self.now()))

    def settle_device(self) -> None:
        """Block until the device work this rank has queued is done (closes :meth:`span`).

        A no-op where awaitables already complete with their device work (the
        simulator, CPU); :class:`~refimpl.runtime.TorchRuntime` synchronizes the
        CUDA device.
        """

    @property
    def spans(self) -> list[tuple[str, float, float]]:
        """Recorded ``(phase, start, end)`` tuples, oldest first."""
        return self._spans()

    def _spans(self) -> list[tuple[str, float, float]]:
        try:
            return self.__dict__["_span_log"]
        except KeyError:
            return self.__dict__.setdefault("_span_log", [])

    # ---- driving ------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Drive ``coro`` to completion synchronously and return its result.

        Valid only where every awaitable completes at once (TorchRuntime). The
        simulator drives coroutines itself and raises here.
        """
        return run_sync(coro)

    # ---- helpers protocol code may use --------------------------------------

    def group_size(self, name: str) -> int:
        """Number of ranks in group ``name`` (raises :class:`GroupError` for an unknown group)."""
        return self.group_spec(name).size

    def group_rank(self, name: str) -> int:
        """This rank's position in group ``name``; raises :class:`GroupError` if it is not a member or the group is
        unknown."""
        return self.group_spec(name).group_rank(self.rank)

    def is_member(self, name: str) -> bool:
        """True if this rank is one of group ``name``'s ranks, whether the group is live, suspended or destroyed;
        raises :class:`GroupError` for an unknown group."""
        return self.rank in self.group_spec(name).ranks


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine whose awaitables all complete immediately.

    Raises ``RuntimeError`` if the coroutine tries to suspend, which means it
    awaited something that is not a TorchRuntime operation (an asyncio future,
    a simulator event).
    """
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError(
        f"protocol coroutine suspended on {yielded!r}; run_sync can only drive code that awaits "
        "runtime operations of a synchronous runtime (TorchRuntime)"
    )


def check_same_shape(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``dst`` and ``src`` can be copied one to one."""
    if dst.dtype != src.dtype:
        raise ValueError(f"copy dtype mismatch: dst {dst.dtype} vs src {src.dtype}; the runtime never casts")
    if dst.numel() != src.numel():
        raise ValueError(f"copy size mismatch: dst has {dst.numel()} elements, src {src.numel()}")


__all__ = [
    "WORLD",
    "AddressInUseError",
    "CollectiveFailedError",
    "CollectiveTimeoutError",
    "CommMemory",
    "Completion",
    "CopyKind",
    "CopyStats",
    "GroupError",
    "GroupSpec",
    "GroupSuspendedError",
    "MemoryInfo",
    "PinningError",
    "Ready",
    "ReduceOp",
    "Runtime",
    "RuntimeSeamError",
    "check_same_shape",
    "gather",
    "run_sync",
]
