"""The role's groups and the agreed operations on them (suspend, resume, destroy, rebuild, canary).

[Note: agreed steps] Every operation here ends with one ``all_reduce(MIN)`` on
the control group of ``[succeeded, first failing rank, *votes]``. If any rank
failed, every rank runs the fallback (abort all role groups, preservation off,
FAILED) and raises; the failing rank its own error, the others
:class:`PeerFailedError` naming the lowest failing rank.

[Note: walking groups] Suspend, resume and group creation synchronise the
members of a communicator inside NCCL or the rendezvous (``ncclCommSuspend``
runs ``cudaDeviceSynchronize`` and a bootstrap barrier; resume runs three
barriers), with no timeout. So every rank walks *all* role groups in one
global order (sorted names; a cycle of waits is impossible, as with ordered
locks) and a local failure on one group does **not** stop the walk: the rank
still enters the following groups, where its peers may be waiting for it, and
reports the failure at the single agreement at the end. Failures that would
happen *before* NCCL's barrier (a communicator already in error, too little
free memory to resume) are caught by a preflight that is agreed first, so no
rank enters a barrier that a peer will skip. Walking in parallel costs each
rank only its own groups' time, where one agreement per group would serialise
all groups of the job. One case no protocol can cover: a rank whose group
*creation* fails before it reaches the rendezvous leaves that group's peers
waiting inside the runtime call until the group's creation timeout
(``GroupSpec.timeout_s``; torch's store barrier and NCCL init are bounded by
it); they then vote, and every rank fails together. The rebuild walk's
agreement waits that creation timeout on top of the agreement timeout, so a
rank whose bind failed (address in use) does not give up on peers still in the
rendezvous (torch's default: 600 s against 300 s): every rank retries together.

[Note: no creation before an agreement] torch pairs group creations by their
order in the process (``dist.new_group`` names a group by a process-wide
counter), not by name. Two lifecycles of one process (two roles) whose rebuilds
ranks ran in different orders paired one role's group on one rank with the
other role's on the next: each role's weight sync summed the other's data. So a
rebuild runs only after an agreement of its operation: one the operation already
ran (a lazy wake's ``use.request``, a canary, a resume walk), else an agreed
``rebuild.preflight`` first. Agreements carry their lifecycle's scope
(:mod:`refimpl.comm.agreement`), so ranks in different roles fail there, on
every rank, before any group is created.

[Note: interrupts] An interrupt (``KeyboardInterrupt``: Ctrl-C, a cancelled
Ray call; any ``BaseException`` but ``GeneratorExit``) inside a step or a walk
is a failure like any other: the rank takes it to the step's agreement (its
peers are waiting there), every rank falls back, and the interrupt is re-raised
on the rank that got it. Interrupted while waiting at an agreement (or
anywhere else in an operation), a rank falls back alone and re-raises
(``PGLifecycle``'s operations do it); its peers time out at that agreement.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Awaitable, Callable, Collection, Protocol, Sequence, TypeVar

import torch

from refimpl.comm.agreement import AgreementError, ControlGroup
from refimpl.comm.cooldown import PortCooldown
from refimpl.comm.errors import PeerFailedError, ResumeMemoryError
from refimpl.comm.lifecycle_config import LifecycleConfig, LifecycleStats
from refimpl.runtime.base import (
    AddressInUseError,
    CollectiveFailedError,
    CollectiveTimeoutError,
    CommMemory,
    GroupError,
    ReduceOp,
    Runtime,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


async def _nothing() -> None:
    """The local part of an agreement that only checks that every rank is at the same point of the same role."""


class AgreedFailureHandler(Protocol):
    """Who decides what an agreed failure of the role's groups means (:class:`PGLifecycle` does).

    :meth:`fall_back` is awaited on every rank, once every rank knows that some
    rank failed at ``point``, before the failure is raised; it must abort the
    role's groups (:meth:`RoleGroups.abort_all`) and must not raise.
    """

    async def fall_back(self, point: str, cause: BaseException) -> None:
        """Abort the role's groups and record the failure (``cause``: this rank's error or the peer's)."""
        ...


class RoleGroups:
    """A role's groups on one rank, operated on together with every other rank.

    ``on_failure`` (an :class:`AgreedFailureHandler`, the lifecycle) falls back
    on every rank before an agreed failure is raised.
    """

    def __init__(
        self,
        rt: Runtime,
        names: tuple[str, ...],
        control: ControlGroup,
        config: LifecycleConfig,
        stats: LifecycleStats,
        cooldown: PortCooldown,
        on_failure: AgreedFailureHandler,
    ) -> None:
        self.rt = rt
        self.names = names
        self.control = control
        self.config = config
        self.stats = stats
        self.cooldown = cooldown
        self.on_failure = on_failure
        #: bytes each of this rank's groups released when suspended (what a resume takes back)
        self.suspended_bytes: dict[str, int] = {}
        self._agreements_at_start = 0

    def member(self, name: str) -> bool:
        """True if this rank is a member of group ``name`` (:meth:`Runtime.is_member`)."""
        return self.rt.is_member(name)

    def comm_memory(self) -> CommMemory:
        """NCCL memory the live groups hold on this rank (runtime's view)."""
        sus = per = 0
        for name in self.names:
            if self.rt.group_live(name) and self.member(name):
                m = self.rt.comm_memory(name)
                sus, per = sus + m.suspendable, per + m.persistent
        return CommMemory(sus, per)

    # ------------------------------------------------------------------ agreement

    def begin_operation(self) -> None:
        """A public operation of the lifecycle starts: no group is created before one of its agreements
        (:meth:`rebuild_all`; [Note: no creation before an agreement])."""
        self._agreements_at_start = self.control.count

    async def outcome(self, point: str, error: BaseException | None, votes: list[int], *,
                      extra_wait_s: float = 0.0) -> list[int]:
        """Agree on ``[succeeded, first failing rank, *votes]``; fall back and raise if any rank failed.

        ``error`` may be an interrupt (``KeyboardInterrupt``, a cancelled call): it is agreed as a
        failure like any other, then re-raised here. ``extra_wait_s``: how much longer than the
        agreement timeout a peer may take to arrive (a walk whose peers may wait out a group's
        creation timeout first).
        """
        rt = self.rt
        try:
            ok, first, *agreed = await self.control.reduce_min(
                rt, [int(error is None), rt.world_size if error is None else rt.rank, *votes], point,
                timeout_s=self.control.timeout_s + extra_wait_s,
            )
        except AgreementError as exc:
            await self.on_failure.fall_back(point, error or exc)
            if error is not None:
                raise error from exc
            raise
        if not ok:
            cause = error or PeerFailedError(
                f"rank {rt.rank}: rank {first} failed at {point!r}; the role's groups are aborted on every rank",
                (first,),
            )
            await self.on_failure.fall_back(point, cause)
            raise cause
        return agreed

    async def step(
        self, point: str, action: Callable[[], Awaitable[T]], *, vote: Callable[[T], bool] | None = None
    ) -> tuple[T, bool]:
        """Run ``action`` on this rank, then agree that it succeeded everywhere (and on ``vote``)."""
        error: BaseException | None = None
        result: Any = None
        try:
            await self.rt.point(f"lifecycle.{point}")
            result = await action()
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure goes through the agreed fallback, an interrupt too
            error = exc
            log.error("rank %d: %s failed: %r", self.rt.rank, point, exc)
        my_vote = bool(vote(result)) if (vote is not None and error is None) else error is None
        (agreed,) = await self.outcome(point, error, [int(my_vote)])
        return result, bool(agreed)

    async def walk(self, point: str, fn: Callable[[str], Awaitable[bool | None]], *,
                   destroy_after: Sequence[str] = (), extra_wait_s: float = 0.0) -> list[bool]:
        """``fn(name)`` for every role group in order on every rank; agreed per-group results.

        ``fn`` returning False is a soft "no" for that group (e.g. a port still in
        use); raising is a failure. Neither stops the walk (see the module note).
        ``extra_wait_s``: see :meth:`outcome`. ``destroy_after``: groups destroyed all together once ``fn`` has seen every
        group (:meth:`Runtime.destroy_groups`; ``LifecycleConfig.parallel_destroy``);
        a failed destroy is a failure like any other, so once the walk returns every
        rank destroyed them all.
        """
        error: BaseException | None = None
        try:
            await self.rt.point(f"lifecycle.{point}")
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - an interrupt too: agreed below, then re-raised
            error = exc
        votes = []
        for name in self.names:
            ok = False
            try:
                ok = (await fn(name)) is not False
            except GeneratorExit:
                raise
            except BaseException as exc:  # noqa: BLE001 - keep walking (an interrupt too); peers may wait in the next group
                log.error("rank %d: %s of group %r failed: %r", self.rt.rank, point, name, exc)
                error = error or exc
            votes.append(int(ok))
        if destroy_after:
            try:
                failed = await self.rt.destroy_groups(list(destroy_after))
            except GeneratorExit:
                raise
            except BaseException as exc:  # noqa: BLE001 - agreed below like any failure of the walk
                failed = {name: exc for name in destroy_after}
            for name, exc in failed.items():
                log.error("rank %d: %s of group %r failed: %r", self.rt.rank, point, name, exc)
                error = error or exc
        agreed = await self.outcome(point, error, votes, extra_wait_s=extra_wait_s)
        return [bool(v) for v in agreed]

    # ------------------------------------------------------------------ operations

    async def abort_all(self) -> None:
        """Abort every live role group at once (failure path: no graceful shutdown, no wait)."""
        for name in self.names:
            try:
                if self.rt.group_live(name):
                    await self.rt.destroy_group(name, abort=True)
            except Exception:  # noqa: BLE001 - already failing; keep aborting the rest
                log.exception("rank %d: abort of group %r failed", self.rt.rank, name)
        self.suspended_bytes.clear()
        self.cooldown.defer(self.rt.now())

    async def suspend_all(self) -> None:
        """``suspend_group`` on every member group: agreed preflight, ordered walk, agreed result."""
        async def preflight() -> None:
            for name in self.names:
                if self.member(name):
                    # reads ncclCommMemStats: a communicator in error fails here, before any barrier
                    self.suspended_bytes[name] = self.rt.comm_memory(name).suspendable

        async def one(name: str) -> None:
            if self.member(name):
                await self.rt.suspend_group(name)
                self.stats.comm_suspends += 1

        with self.rt.span("lifecycle.suspend"):
            await self.step("suspend.preflight", preflight)
            await self.walk("suspend", one)

    async def resume_all(self, only: Collection[str] | None = None) -> None:
        """``resume_group`` on every member group (or those in ``only``), after agreeing that every rank has the memory."""
        chosen = set(self.names if only is None else only)

        async def preflight() -> None:
            need = sum(self.suspended_bytes.get(n, 0) for n in self.names if n in chosen and self.member(n))
            self.rt.empty_cache()  # blocks cached by the allocator can be handed back to the driver
            free = self.rt.memory_info().free
            if need > free:
                raise ResumeMemoryError(
                    f"rank {self.rt.rank}: resuming the role's communicators needs {need:,} bytes of device "
                    f"memory but only {free:,} are free; release the rollout engine's memory before resuming"
                )

        async def one(name: str) -> None:
            if name in chosen and self.member(name):
                await self.rt.resume_group(name)
                self.stats.comm_resumes += 1
                self.suspended_bytes.pop(name, None)

        with self.rt.span("lifecycle.resume_comms"):
            await self.step("resume.preflight", preflight)
            await self.walk("resume", one)

    async def destroy_all(self, *, inline_wait: bool) -> None:
        """Destroy every live role group; then wait the port cooldown now (baseline) or defer it."""
        together = [n for n in self.names if self.rt.group_live(n)] if self.config.parallel_destroy else []

        async def one(name: str) -> None:
            if together:
                return
            if self.rt.group_live(name):
                await self.rt.destroy_group(name)
                self.stats.destroys += 1

        with self.rt.span("lifecycle.destroy"):
            await self.walk("destroy", one, destroy_after=together)
        self.stats.destroys += len(together)  # the walk returns only if every rank destroyed them all
        self.cooldown.defer(self.rt.now())
        if inline_wait:
            await self.cooldown.wait(self.rt)

    async def rebuild_all(self, only: Collection[str] | None = None) -> None:
        """Recreate every destroyed role group (or those in ``only``) with its original arguments (next generation).

        Waits only for what is left of the cooldown. A group that some rank
        could not bind (port in TIME_WAIT, or a peer that hit one and never
        arrived) is aborted everywhere and retried after a full cooldown, up to
        ``rebuild_retries`` times.
        """
        rt = self.rt
        await self.cooldown.wait(rt)
        if self.control.count == self._agreements_at_start:  # [Note: no creation before an agreement]
            await self.step("rebuild.preflight", _nothing)
        todo = [n for n in self.names if not rt.group_live(n) and (only is None or n in only)]

        async def one(name: str) -> bool:
            if name not in todo or rt.group_live(name):
                return True
            try:
                await rt.recreate_group(name)
            except (AddressInUseError, CollectiveTimeoutError) as exc:
                log.warning("rank %d: rebuilding %r: %s", rt.rank, name, exc)
                return False
            self.stats.rebuilds += 1
            return True

        rebuilt = list(todo)
        with rt.span("lifecycle.rebuild"):
            for attempt in range(self.config.rebuild_retries + 1):
                # a rank whose bind failed reaches the agreement at once, its peers only after the group's
                # creation timeout (they wait in its rendezvous): it waits that much longer, so the retry runs
                creation_s = max((rt.group_spec(n).timeout_s for n in todo), default=0.0)
                bound = await self.walk("rebuild", one, extra_wait_s=creation_s)
                todo = [n for n, ok in zip(self.names, bound) if not ok]
                if not todo:
                    if self.config.warm_rebuilt:
                        await self.warm(rebuilt)
                    return
                self.stats.address_in_use_retries += 1
                for name in todo:  # undo the half-built groups on every rank, then retry together
                    try:
                        if rt.group_live(name):
                            await rt.destroy_group(name, abort=True)
                    except Exception:  # noqa: BLE001 - the retry recreates it anyway
                        log.exception("rank %d: aborting half-built group %r failed", rt.rank, name)
                self.cooldown.defer(rt.now())
                if attempt < self.config.rebuild_retries:
                    await self.cooldown.wait(rt)
            err = AddressInUseError(
                f"rank {rt.rank}: groups {todo} could not be rebuilt in {self.config.rebuild_retries + 1} attempts: "
                "their ports stayed in use; raise LifecycleConfig.cooldown_s or look for a port conflict"
            )
            await self.on_failure.fall_back("rebuild", err)
            raise err

    async def warm(self, names: Collection[str]) -> None:
        """Create the communicators of the rebuilt groups ``names`` now (``LifecycleConfig.warm_rebuilt``): one
        one-element all-reduce on each group this rank is a member of, in group order, and on a group of more than
        two ranks a one-element all-gather after it; agreed as one step. (A group's spec may leave its backend to
        the runtime's default, so every rebuilt group is warmed: on Gloo, which creates its connections at once,
        each costs one small collective.) [Note: the ring's warm-up]"""
        rt = self.rt
        todo = [n for n in self.names if n in names and self.member(n)]

        async def run() -> None:
            meta = rt.device.type == "meta"
            for name in todo:
                buf = torch.zeros(1) if meta else rt.alloc_device(1, torch.float32, tag="lifecycle.warm")
                await rt.all_reduce(buf, ReduceOp.SUM, name, timeout_s=self.config.canary_timeout_s)
                n = rt.group_size(name)
                if n > 2:
                    # [Note: the ring's warm-up] NCCL connects, at a communicator's first collective, only the
                    # algorithm that collective runs (its runtime connect). A one-element all-reduce of more than
                    # two ranks may run as a tree (NCCL's tuner scores tree and ring within a few microseconds of
                    # each other on one node), and then the ring that FSDP2's all-gathers and reduce-scatters run
                    # would connect at the training step's first one instead of here. An all-gather runs only as a
                    # ring on one node (no NVLS tree for it, PAT only at one GPU a node), so it connects the ring
                    # whatever the all-reduce chose; on two ranks NCCL's log shows the all-reduce connects the
                    # ring ("Connected all rings" after every two-rank creation), so nothing is added there.
                    out = torch.zeros(n) if meta else rt.alloc_device(n, torch.float32, tag="lifecycle.warm")
                    await rt.all_gather_into_tensor(out, buf, name, timeout_s=self.config.canary_timeout_s)
                    if not meta:
                        rt.release(out)
                if not meta:
                    rt.release(buf)
            self.stats.warm_ups += len(todo)

        with rt.span("lifecycle.warm"):
            await self.step("warm", run)

    async def canary(self, only: Collection[str] | None = None) -> list[str]:
        """A bounded all-reduce on every member group (or those in ``only``); problems found on this rank."""
        rt = self.rt
        problems = []
        for name in self.names:
            if not self.member(name) or (only is not None and name not in only):
                continue
            # a device buffer, as the communicator needs; a host scalar where device buffers carry no data (meta)
            on_device = rt.device.type != "meta"
            buf = rt.alloc_device(1, torch.float32, tag="lifecycle.canary") if on_device else torch.zeros(1)
            buf.fill_(self.config.canary_value)
            try:
                await rt.all_reduce(buf, ReduceOp.SUM, name, timeout_s=self.config.canary_timeout_s)
            except (CollectiveTimeoutError, CollectiveFailedError, GroupError) as exc:
                # not released: a collective that timed out may still read or write its buffer
                problems.append(f"group {name!r}: {exc}")
                continue
            got = float(buf.float().cpu().item())
            if on_device:
                rt.release(buf)
            want = float(rt.group_size(name))
            if not math.isclose(got, want, rel_tol=0, abs_tol=1e-3):
                problems.append(f"group {name!r}: canary sum {got:g}, expected {want:g}")
        return problems


__all__ = ["AgreedFailureHandler", "RoleGroups"]
