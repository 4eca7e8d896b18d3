"""The runtime seam: the one interface protocol code talks to.

Theory of operation
-------------------
Every piece of protocol logic in this project (the offload store, dedup, the
process-group lifecycle, NCCL suspend, worker control) is written once, as
``async def`` code that awaits operations of a :class:`Runtime`. Two
implementations exist:

* :class:`refimpl.torch_runtime.TorchRuntime` runs on real tensors (CUDA or CPU) and
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
6. An outcome every rank must share (did an offload commit on every rank, or
   roll back on every rank) is settled by :meth:`Runtime.vote`, never read off
   a collective with a timeout (see :mod:`refimpl.runtime.votes`).
"""
from __future__ import annotations

import abc
import contextlib
from typing import Any, Awaitable, Coroutine, Generator, Iterable, Iterator, Sequence, TypeVar

import torch

from refimpl.runtime.types import (
    AddressInUseError, CollectiveFailedError, CollectiveTimeoutError, CommMemory, CopyKind, CopyStats, GroupError,
    GroupSpec, GroupSuspendedError, MemoryInfo, PinningError, ReduceOp, RuntimeSeamError,
)
from refimpl.runtime.votes import Ballot, Verdict, single_rank_verdict, space_name

T = TypeVar("T")

WORLD = "world"
"""Name of the group of all ranks; it exists from the start and is never destroyed."""


# --------------------------------------------------------------------------- awaitables


class Completion(abc.ABC):
    """Handle of an asynchronous copy; ``await completion`` waits for it."""

    @abc.abstractmethod
    def done(self) -> bool:
        """True once the copy has finished (never blocks)."""

    @abc.abstractmethod
    def __await__(self) -> Generator[Any, None, None]:
        ...

    def order_on_device(self) -> bool:
        """Make what the calling thread queues next on its current device stream run after this copy, without
        blocking the host; True where that is done (or the copy is already complete), False where the runtime
        cannot order device work on a copy and the caller must await it instead (the default)."""
        return self.done()


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
    #: whether :meth:`Completion.order_on_device` orders device work after a copy without blocking the host
    #: (TorchRuntime; the simulator does not, so a streamed reload there waits for its copies at once)
    orders_on_device: bool = False

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

    def paced_copies(self, window_bytes: int | None) -> contextlib.AbstractContextManager[None]:
        """A context in which :meth:`copy_async` keeps at most ``window_bytes`` of host-to-device copies queued on the
        device and issues the rest a window at a time as the earlier ones complete, so that another stream's copies
        never wait behind more than that (TorchRuntime: [Note: paced copies] in :mod:`refimpl.torch_runtime.copy_stream`). The default, and
        ``None`` or 0: copies are issued as asked for."""
        return contextlib.nullcontext()

    def copies_on_sms(self, ctas: int | None) -> contextlib.AbstractContextManager[None]:
        """A context in which :meth:`copy_async`'s host-to-device copies from pinned host memory are made by a kernel
        of ``ctas`` programs instead of the copy engine, which then serves the caller's own copies without making
        them wait behind these (TorchRuntime: [Note: copies on SMs] in :mod:`refimpl.torch_runtime.sm_copy`; a
        device that cannot read host memory directly falls back to the engine). The default, and ``None`` or 0:
        copies are made as outside."""
        return contextlib.nullcontext()

    def prepare_copies_on_sms(self) -> None:
        """Build what :meth:`copies_on_sms` runs (TorchRuntime: the copy kernel, compiled or loaded from Triton's
        cache, so that its cost is paid here instead of by the first copy). The default: nothing."""

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

    # ---- votes and arrivals (refimpl.runtime.votes) --------------------------

    async def vote(self, key: str, ranks: Sequence[int], point: str, code: int = 0, marks: Iterable[int] = (), *,
                   timeout_s: float, wait: bool = True) -> Verdict | None:
        """Cast this rank's ballot in the vote ``key`` among ``ranks`` and return the :class:`Verdict` every rank reads.

        Settled by the last ballot in (complete) or by the first rank that waits ``timeout_s`` in vain (timed out,
        naming the absent ranks); see :mod:`refimpl.runtime.votes`. ``wait=False``: cast and return at once (the
        verdict if this ballot settled it, else None). The default serves a vote among this rank alone.
        """
        ballot = Ballot(self.rank, point, code, frozenset(marks))
        if tuple(ranks) != (self.rank,):
            raise GroupError(f"{type(self).__name__} cannot hold a vote among ranks {tuple(ranks)}")
        return single_rank_verdict(key, ballot, timeout_s)

    def vote_space(self, kind: str, about: str = "") -> str:
        """A fresh key space for votes of ``kind`` (``"local_dedup"``) about ``about`` (what the votes decide, the same
        text on every rank: a store's or a role's name): ``n`` counts this rank's spaces of that kind about that
        (per runtime here; per process in TorchRuntime, whose vote store every runtime of the process shares), and the
        name is :func:`refimpl.runtime.votes.space_name`. Ranks that create the spaces about one thing in the same
        order get the same names, whatever order they create spaces about other things in."""
        counts = self.__dict__.setdefault("_vote_spaces", {})
        n = counts[(kind, about)] = counts.get((kind, about), -1) + 1
        return space_name(kind, about, n)

    def mark_arrival(self, group: str, point: str) -> None:
        """Note that this rank reached ``point`` on ``group`` (its current generation) once more, before a collective
        whose timeout should name the members that never came (:meth:`absent_ranks`). Default: nothing."""

    def absent_ranks(self, group: str, point: str) -> tuple[int, ...] | None:
        """Members of ``group`` that reached ``point`` (this generation) fewer times than this rank, or None where the
        runtime cannot tell (the default)."""
        return None

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
        simulator, CPU); :class:`~refimpl.torch_runtime.TorchRuntime` synchronizes the
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
    "Ballot",
    "Verdict",
    "check_same_shape",
    "gather",
    "run_sync",
]
