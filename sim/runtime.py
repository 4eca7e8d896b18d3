"""``SimRuntime``: the runtime seam implemented for one simulated rank.

Protocol code awaits the same operations it awaits on ``TorchRuntime``; here
each one suspends the rank's coroutine until the simulated time at which it
finishes (see :mod:`sim.kernel.engine`). Time comes from the world's
:class:`~sim.machine.protocols.Transport`, :class:`~sim.machine.protocols.CollectiveCost` and
:class:`~sim.machine.protocols.CommCosts`; memory is charged to its
:class:`~sim.machine.protocols.Memory`; faults come from its
:class:`~sim.machine.protocols.FaultHooks` (see :mod:`sim.machine.protocols`).

Payloads: with ``payload="real"`` buffers are real (small) CPU tensors and
copies and collectives move real bytes; with ``"meta"`` they are meta tensors
that cost no memory and move nothing, while the ledgers still count every byte.

Memory bookkeeping per buffer (including buffers dropped without ``release``)
is in :mod:`sim.machine.allocator`.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, Sequence

import torch

from refimpl.runtime.base import (
    WORLD, CommMemory, CopyKind, CopyStats, GroupError, GroupSpec, GroupSuspendedError, MemoryInfo,
    PinningError, ReduceOp, Runtime, check_same_shape,
)
from sim.groups import GroupState, OutsiderGroup, RankGroup
from sim.machine.allocator import RankAllocator
from sim.kernel.engine import Crash, Process, SimFuture, Timeout
from sim.kernel.errors import SimUsageError
from sim.machine.protocols import FaultAction, FaultKind
from refimpl.runtime.votes import Ballot, Verdict
from sim.rendezvous import CREATE_SEQ, HangBlocker, describe

if TYPE_CHECKING:  # pragma: no cover
    from sim.groups import GroupBook
    from sim.kernel.engine import Engine
    from sim.machine.protocols import CommCosts, FaultHooks, Memory, Transport
    from sim.rendezvous import Rendezvous
    from sim.votes import VoteBox

log = logging.getLogger(__name__)


class RankHost(Protocol):
    """What a :class:`SimRuntime` reads of the world that made it (:class:`sim.SimWorld` is one).

    Declared here, with the runtime that needs it, so this module stays below the world.
    """

    world_size: int
    payload_real: bool
    group_timeouts: bool
    engine: "Engine"
    transport: "Transport"
    memory: "Memory"
    faults: "FaultHooks | None"
    comm: "CommCosts"
    rendezvous: "Rendezvous"
    votes: "VoteBox"
    groups: "GroupBook"

    def resolve_backend(self, spec: GroupSpec) -> GroupSpec:
        """``spec`` with its backend filled in."""


_COPY_LABEL = {k: f"copy {k.value}" for k in CopyKind}


def _storage_covers(t: torch.Tensor) -> bool:
    """True if ``t``'s storage still holds every element its view reaches."""
    if t.numel() == 0:
        return True
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.untyped_storage().nbytes() >= (last + 1) * t.element_size()


class SimRuntime(Runtime):
    """One simulated rank of a :class:`sim.SimWorld`. Create through the world, not directly."""

    def __init__(self, world: RankHost, rank: int):
        self.world = world
        self.rank = rank
        self.world_size = world.world_size
        self.device = torch.device("cpu") if world.payload_real else torch.device("meta")
        self.copy_stats = CopyStats()
        self.last_op = "started"
        self.process: Process | None = None
        self.crashed = False
        self._engine = world.engine
        self._memory = world.memory
        self._faults = world.faults
        self._groups: dict[str, RankGroup | OutsiderGroup] = {}  # see [Note: one object per group] in sim.groups
        freed = getattr(world.transport, "device_freed", None)  # optional: a transport that simulates the scrub
        self.allocator = RankAllocator(world.memory, rank, self.device,
                                       None if freed is None else functools.partial(freed, rank))
        self._copies: list[SimFuture] = []
        self._copies_compact_at = 64

    def __repr__(self) -> str:
        return f"<SimRuntime rank {self.rank}/{self.world_size}>"

    # ---- memory -------------------------------------------------------------

    def alloc_device(self, numel: int, dtype: torch.dtype, *, tag: str = "") -> torch.Tensor:
        """A 1-D device buffer; charged to the simulated memory (may raise SimOutOfMemoryError)."""
        return self.allocator.alloc_device(numel, dtype, tag)

    def release(self, tensor: torch.Tensor) -> None:
        """Resize the tensor's storage to 0 bytes and return its memory to the ledger now."""
        self.allocator.release(tensor)

    def empty_cache(self) -> None:
        """Return bytes of dropped buffers (the allocator cache) to the device ledger."""
        self.allocator.empty_cache()

    def alloc_host(self, numel: int, dtype: torch.dtype, *, pinned: bool = True, tag: str = "") -> torch.Tensor:
        """A 1-D host buffer of exactly ``numel`` elements, charged to the host ledger."""
        if pinned and self._faults is not None:
            nbytes = int(numel) * dtype.itemsize
            action = self._faults.on_pin(self.rank, nbytes)
            if action is not None:
                if action.kind is not FaultKind.RAISE:
                    raise SimUsageError(f"on_pin supports only FaultAction.fail(...), got {action.kind.value}")
                exc = action.exc
                raise exc if exc is not None else PinningError(f"rank {self.rank}: pinning {nbytes:,} bytes failed")
        return self.allocator.alloc_host(numel, dtype, pinned, tag)

    def free_host(self, tensor: torch.Tensor) -> None:
        """Unpin and drop a buffer from :meth:`alloc_host`; its storage is emptied."""
        self.allocator.free_host(tensor)

    def memory_info(self) -> MemoryInfo:
        """Free/total device bytes from the simulated memory."""
        return self._memory.device_info(self.rank)

    # ---- copies -------------------------------------------------------------

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, kind: CopyKind) -> SimFuture:
        """Start a copy; the bytes land in ``dst`` when the transport says the copy finished."""
        check_same_shape(dst, src)
        nbytes = src.numel() * src.element_size()
        self.copy_stats.record(kind, nbytes)
        self.last_op = label = _COPY_LABEL[kind]
        engine = self._engine
        if engine.tracing:
            engine.trace.append((engine.now, self.rank, label, nbytes))
        fut = SimFuture(label)
        copies = self._copies
        if len(copies) >= self._copies_compact_at:  # drop finished ones; amortised O(1)
            copies[:] = [c for c in copies if not c._done]
            self._copies_compact_at = max(64, 2 * len(copies))
        copies.append(fut)
        self.world.transport.start(self.rank, kind, nbytes, functools.partial(self._copy_done, fut, dst, src))
        return fut

    def _copy_done(self, fut: SimFuture, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self.world.payload_real:
            for side, t in (("source", src), ("destination", dst)):
                if not _storage_covers(t):  # torch would read or write freed memory (it can crash the process)
                    fut.fail(SimUsageError(
                        f"rank {self.rank}: the copy's {side} was released or resized before the copy completed "
                        f"({t.untyped_storage().nbytes()} bytes of storage left for a {tuple(t.shape)} "
                        f"{t.dtype} view); await the copy before releasing its buffers"
                    ))
                    return
            try:
                if dst.shape == src.shape:
                    dst.copy_(src)
                else:
                    dst.view(-1).copy_(src.reshape(-1))
            except RuntimeError as exc:
                fut.fail(SimUsageError(
                    f"rank {self.rank}: copy failed when it completed ({exc}); was a buffer released or "
                    "resized before the copy was awaited?"
                ))
                return
        fut.resolve(None)

    async def synchronize(self) -> None:
        """Wait for every copy this rank issued."""
        pending, self._copies = self._copies, []
        for fut in pending:
            if not fut._done:
                await fut

    # ---- groups -------------------------------------------------------------

    def _group(self, name: str) -> RankGroup | OutsiderGroup:
        rg = self._groups.get(name)
        if rg is None:
            known = list(self._groups)
            shown = f"{known[:16]} and {len(known) - 16} more" if len(known) > 16 else str(known)
            raise GroupError(f"rank {self.rank}: unknown group {name!r}; known: {shown}")
        return rg

    def _install(self, spec: GroupSpec) -> RankGroup:
        """A member's fresh record of ``spec`` (live)."""
        rg = RankGroup(spec, GroupState.LIVE, True, spec.group_rank(self.rank))
        self._groups[spec.name] = rg
        return rg

    def _install_outsider(self, spec: GroupSpec, state: GroupState) -> None:
        """This rank's record of a group it is not a member of: the world's shared one for ``spec`` in ``state``."""
        self._groups[spec.name] = self.world.groups.outsider(spec, state)

    def join_world_group(self, spec: GroupSpec) -> None:
        """Install the world's default group on this rank and charge its communicator memory.

        The world calls this once per rank while it is built (no rendezvous: every rank starts in it).
        """
        self._charge_comm(self._install(self.world.groups.intern(spec)))

    def _charge_comm(self, rg: RankGroup, suspendable_only: bool = False) -> None:
        mem = self.world.comm.memory(self.world.resolve_backend(rg.spec), self.rank)
        tag = f"comm {rg.spec.name}"
        if suspendable_only:
            self._memory.alloc_device(self.rank, mem.suspendable, tag)
            rg.held = CommMemory(mem.suspendable, rg.held.persistent)
        else:
            self._memory.alloc_device(self.rank, mem.suspendable + mem.persistent, tag)
            rg.held = mem

    def _uncharge_comm(self, rg: RankGroup, suspendable_only: bool = False) -> None:
        tag = f"comm {rg.spec.name}"
        held = rg.held
        if suspendable_only:
            self._memory.free_device(self.rank, held.suspendable, tag)
            rg.held = CommMemory(0, held.persistent)
        else:
            self._memory.free_device(self.rank, held.suspendable + held.persistent, tag)
            rg.held = CommMemory()

    async def _create(self, spec: GroupSpec) -> None:
        """Members rendezvous, then each charges its communicator memory. ``spec`` is the world's (interned)."""
        if not spec.has_member(self.rank):  # a lookup, where `in spec.ranks` scans the tuple
            self._install_outsider(spec, GroupState.LIVE)
            return
        op = "new_group" if spec.generation == 0 else "recreate_group"
        self.last_op = describe(op, spec, CREATE_SEQ)
        self._engine.record(self._engine.now, self.rank, self.last_op)
        if self._faults is not None:
            action = self._faults.on_group_create(self.rank, spec)
            if action is not None:
                await self._apply(action, f"in {self.last_op}")
        resolved = self.world.resolve_backend(spec)
        arrival = self.world.rendezvous.arrive(
            spec, spec.group_rank(self.rank), CREATE_SEQ, "create_group", resolved,
            f"{op}(ranks={list(spec.ranks[:8])}{'...' if spec.size > 8 else ''}, backend={resolved.backend})",
            None, 0,
        )
        if self.world.group_timeouts:
            self.world.rendezvous.arm_timeout(arrival, spec.timeout_s, self.rank)
        await arrival.future
        rg = self._install(spec)
        try:
            self._charge_comm(rg)
        except BaseException:
            rg.state = GroupState.DESTROYED
            raise

    async def new_group(self, spec: GroupSpec) -> None:
        """Create a group; members rendezvous (non-members return at once)."""
        old = self._groups.get(spec.name)
        if old is not None and (old.state is not GroupState.DESTROYED or spec.generation <= old.spec.generation):
            raise GroupError(
                f"rank {self.rank}: group {spec.name!r} already exists ({old.state.value}, generation "
                f"{old.spec.generation}); use recreate_group, or destroy it and pass a higher generation"
            )
        await self._create(self.world.groups.intern(spec))

    async def destroy_group(self, name: str, *, abort: bool = False) -> None:
        """Destroy the group's communicator (no-op if already destroyed); the spec is kept."""
        for exc in (await self.destroy_groups([name], abort=abort)).values():
            raise exc

    async def destroy_groups(self, names: Sequence[str], *, abort: bool = False) -> dict[str, Exception]:
        """Destroy the groups with their waits overlapped, as :class:`refimpl.torch_runtime.TorchRuntime` does: every
        destroy starts now and the call returns when the slowest has ended (each waits for its own proxy poll
        timeout, :meth:`sim.machine.collectives.NcclComm.destroy_time`). Errors per group; already destroyed ones are
        skipped, as :meth:`destroy_group` does."""
        errors: dict[str, Exception] = {}
        todo, longest, timed = [], 0.0, False
        for name in names:
            try:
                if name == WORLD:
                    raise GroupError(f"rank {self.rank}: the {WORLD!r} group is never destroyed")
                rg = self._group(name)
            except Exception as exc:  # noqa: BLE001 - the others are destroyed all the same
                errors[name] = exc
                continue
            if rg.state is GroupState.DESTROYED:
                continue
            self.last_op = f"destroy_group {name!r}{' (abort)' if abort else ''}"
            self._engine.record(self._engine.now, self.rank, self.last_op)
            if rg.member and not abort:
                timed = True
                longest = max(longest, self.world.comm.destroy_time(self.world.resolve_backend(rg.spec)))
            todo.append(rg)
        if timed:
            await self.sleep(longest)
        for rg in todo:
            if rg.member:
                self._uncharge_comm(rg)
                rg.state = GroupState.DESTROYED
            else:  # the shared record of the group destroyed
                self._install_outsider(rg.spec, GroupState.DESTROYED)
        return errors

    async def recreate_group(self, name: str) -> GroupSpec:
        """Rebuild a destroyed group under the next generation (every attempt takes a new one)."""
        rg = self._group(name)
        if rg.state is not GroupState.DESTROYED:
            raise GroupError(f"rank {self.rank}: group {name!r} is {rg.state.value}; destroy it before recreate_group")
        new = self.world.groups.next_generation(rg.spec)  # the world's object, shared by the members
        if rg.member:
            rg.spec = new  # a failed attempt still uses up its generation (fresh store prefix per attempt)
        await self._create(new)
        return new

    def group_spec(self, name: str) -> GroupSpec:
        """The spec this rank knows for ``name`` (live, suspended or destroyed)."""
        return self._group(name).spec

    def is_member(self, name: str) -> bool:
        """True if this rank is one of group ``name``'s ranks (its record says so: no scan of the rank tuple)."""
        return self._group(name).member

    def group_live(self, name: str) -> bool:
        """True if the group exists and is not destroyed."""
        rg = self._groups.get(name)
        return rg is not None and rg.state is not GroupState.DESTROYED

    def group_names(self) -> list[str]:
        """Names of all groups this rank knows, in creation order."""
        return list(self._groups)

    def group_suspended(self, name: str) -> bool:
        """True if this rank has suspended the group's communicator."""
        rg = self._groups.get(name)
        return rg is not None and rg.state is GroupState.SUSPENDED

    def comm_memory(self, name: str) -> CommMemory:
        """Communicator memory held now: full when live, the persistent part when suspended."""
        return self._group(name).held

    def _suspendable(self, name: str, verb: str) -> RankGroup:
        rg = self._group(name)
        if not rg.member:
            raise GroupError(f"rank {self.rank}: cannot {verb} group {name!r}: not a member {rg.spec.ranks}")
        if rg.state is GroupState.DESTROYED:
            raise GroupError(f"rank {self.rank}: cannot {verb} group {name!r}: it is destroyed")
        backend = self.world.resolve_backend(rg.spec).backend
        if backend != "nccl":
            raise GroupError(
                f"rank {self.rank}: cannot {verb} group {name!r}: backend {backend!r} has no communicator "
                "memory to suspend; destroy it or keep it live"
            )
        return rg

    async def suspend_group(self, name: str) -> None:
        """Free the suspendable communicator memory; collectives then raise GroupSuspendedError."""
        rg = self._suspendable(name, "suspend")
        if rg.state is GroupState.SUSPENDED:
            raise GroupError(f"rank {self.rank}: group {name!r} is already suspended")
        self.last_op = f"suspend_group {name!r}"
        self._engine.record(self._engine.now, self.rank, self.last_op)
        await self.sleep(self.world.comm.suspend_time(self.world.resolve_backend(rg.spec)))
        self._uncharge_comm(rg, suspendable_only=True)
        rg.state = GroupState.SUSPENDED

    async def resume_group(self, name: str) -> None:
        """Re-allocate a suspended communicator's memory (may raise SimOutOfMemoryError)."""
        rg = self._suspendable(name, "resume")
        if rg.state is not GroupState.SUSPENDED:
            raise GroupError(f"rank {self.rank}: group {name!r} is not suspended")
        self.last_op = f"resume_group {name!r}"
        self._engine.record(self._engine.now, self.rank, self.last_op)
        self._charge_comm(rg, suspendable_only=True)
        await self.sleep(self.world.comm.resume_time(self.world.resolve_backend(rg.spec)))
        rg.state = GroupState.LIVE

    # ---- collectives --------------------------------------------------------

    def _collective_group(self, name: str, op: str) -> RankGroup:
        rg = self._groups.get(name)
        if rg is None:
            raise GroupError(f"rank {self.rank}: {op} on unknown group {name!r}; known: {list(self._groups)}")
        if rg.state is not GroupState.LIVE:
            if rg.state is GroupState.SUSPENDED:
                raise GroupSuspendedError(
                    f"rank {self.rank}: {op} on group {name!r} whose communicator is suspended; resume_group first"
                )
            raise GroupError(f"rank {self.rank}: {op} on group {name!r}, which is destroyed; recreate_group first")
        if not rg.member:
            raise GroupError(f"rank {self.rank}: {op} on group {name!r}, which it is not a member of {rg.spec.ranks}")
        return rg

    async def _collective(
        self, rg: RankGroup, op: str, signature: tuple, detail: str, payload: Any, nbytes: int,
        timeout_s: float | None,
    ) -> None:
        seq = rg.seq
        rg.seq = seq + 1
        spec = rg.spec
        self.last_op = desc = describe(op, spec, seq)
        engine = self._engine
        if engine.tracing:
            engine.trace.append((engine.now, self.rank, desc))
        corrupt = False
        if self._faults is not None:
            action = self._faults.on_collective(self.rank, spec.name, op, seq)
            if action is not None:
                if action.kind is FaultKind.CORRUPT:
                    corrupt = True
                else:
                    await self._apply(action, f"entering {desc}")
        rdv = self.world.rendezvous
        arrival = rdv.arrive(spec, rg.group_rank, seq, op, signature, detail, payload, nbytes, corrupt)
        if timeout_s is None and self.world.group_timeouts:
            timeout_s = spec.timeout_s
        if timeout_s is not None:
            rdv.arm_timeout(arrival, timeout_s, self.rank)
        await arrival.future

    async def all_gather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """``output`` receives every member's ``input`` in group-rank order."""
        rg = self._collective_group(group, "all_gather")
        n, m = rg.spec.size, input.numel()
        if output.dtype != input.dtype or output.numel() != n * m:
            raise ValueError(
                f"rank {self.rank}: all_gather on {group!r} needs an output of {n} x {m} {input.dtype} elements, "
                f"got {output.numel()} {output.dtype}"
            )
        detail = f"all_gather({input.dtype}, {m} elems per rank)"
        await self._collective(rg, "all_gather", ("all_gather", input.dtype, m, None), detail,
                               (output, input), n * m * input.element_size(), timeout_s)

    async def all_reduce(
        self, tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """Reduce ``tensor`` in place across the group (group-rank order, same bits everywhere)."""
        rg = self._collective_group(group, "all_reduce")
        m = tensor.numel()
        detail = f"all_reduce({op.value}, {tensor.dtype}, {m} elems)"
        await self._collective(rg, "all_reduce", ("all_reduce", tensor.dtype, m, op), detail,
                               tensor, m * tensor.element_size(), timeout_s)

    async def broadcast(
        self, tensor: torch.Tensor, src: int, group: str = WORLD, *, timeout_s: float | None = None
    ) -> None:
        """Copy global rank ``src``'s tensor to every member."""
        rg = self._collective_group(group, "broadcast")
        if src not in rg.spec.ranks:
            raise GroupError(f"rank {self.rank}: broadcast src {src} is not a member of group {group!r} {rg.spec.ranks}")
        m = tensor.numel()
        detail = f"broadcast(src={src}, {tensor.dtype}, {m} elems)"
        await self._collective(rg, "broadcast", ("broadcast", tensor.dtype, m, src), detail,
                               tensor, m * tensor.element_size(), timeout_s)

    async def barrier(self, group: str = WORLD, *, timeout_s: float | None = None) -> None:
        """Return once every member has entered the barrier."""
        rg = self._collective_group(group, "barrier")
        await self._collective(rg, "barrier", ("barrier",), "barrier()", None, 0, timeout_s)

    # ---- votes and arrivals -------------------------------------------------

    async def vote(self, key: str, ranks: Sequence[int], point: str, code: int = 0, marks: Iterable[int] = (), *,
                   timeout_s: float, wait: bool = True) -> Verdict | None:
        """Cast a ballot in the world's :class:`sim.votes.VoteBox`; see :meth:`Runtime.vote`."""
        ranks = tuple(ranks)
        if self.rank not in ranks:
            raise GroupError(f"rank {self.rank}: vote {key!r} among ranks {ranks} it is not one of")
        self.last_op = f"vote {key!r} at {point!r}"
        box = self.world.votes
        v = box.cast(key, ranks, Ballot(self.rank, point, code, frozenset(marks)), timeout_s)
        if not wait:
            return v.verdict
        if v.verdict is None:
            box.arm_timeout(v, self.rank, timeout_s)
        return await v.future

    def mark_arrival(self, group: str, point: str) -> None:
        """Count this arrival (a counter in the world's vote box)."""
        self.world.votes.mark(self._group(group).spec, point, self.rank)

    def absent_ranks(self, group: str, point: str) -> tuple[int, ...] | None:
        """Members whose count at ``point`` is below this rank's."""
        return self.world.votes.absent(self._group(group).spec, point, self.rank)

    # ---- time, faults, spans ------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since the world started."""
        return self._engine.now

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass."""
        if seconds > 0:
            await Timeout(seconds)
        elif not seconds >= 0:  # negative or NaN
            raise ValueError(f"sleep needs seconds >= 0, got {seconds}")

    async def point(self, name: str) -> None:
        """A named protocol point: the fault hooks may crash, hang, fail or delay the rank here."""
        self.last_op = f"point {name!r}"
        if self._faults is not None:
            action = self._faults.on_point(self.rank, name)
            if action is not None:
                await self._apply(action, f"at point {name!r}")

    async def _apply(self, action: FaultAction, where: str) -> None:
        kind = action.kind
        engine = self._engine
        engine.record(engine.now, self.rank, "fault", kind.value, where)
        log.info("rank %d: injected %s %s", self.rank, kind.value, where)
        if kind is FaultKind.DELAY:
            await self.sleep(action.delay_s)
        elif kind is FaultKind.RAISE:
            raise action.exc  # type: ignore[misc]
        elif kind is FaultKind.CRASH:
            self.crashed = True
            self.last_op = f"crashed {where}"
            self.world.rendezvous.peer_lost(self.rank)  # its connections close (if the world models that)
            await Crash(where)
        elif kind is FaultKind.HANG:
            self.last_op = f"hung {where}"
            await SimFuture(f"hung {where} (injected fault)", HangBlocker(where))
        else:
            raise SimUsageError(f"rank {self.rank}: fault {kind.value} cannot be applied {where} (collectives only)")

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Record a phase in :attr:`spans` and in the engine trace."""
        engine = self._engine
        start = engine.now
        engine.record(start, self.rank, "begin", name)
        try:
            yield
        finally:
            end = engine.now
            self._spans().append((name, start, end))
            engine.record(end, self.rank, "end", name)

    def run(self, coro: Any) -> Any:
        """Not available: the simulator drives coroutines; use ``world.run(fn)``."""
        if hasattr(coro, "close"):
            coro.close()
        raise SimUsageError("SimRuntime cannot drive a coroutine synchronously; run protocol code with world.run(fn)")


__all__ = ["GroupState", "RankGroup", "RankHost", "SimRuntime"]
