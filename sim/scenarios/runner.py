"""Run a :class:`sim.scenarios.scenario.Scenario`: build the simulated world, run the RL steps, judge the result.

Each rank runs the same coroutine (:func:`rank_main`), which is the protocol
code of :mod:`refimpl` driven the way a trainer drives it:

1. set-up: allocate the model state (``rt.alloc_device``; real payloads get
   seeded values and a reference copy), create the process groups (through
   the :class:`refimpl.comm.PGLifecycle` when ``pg_policy`` names one), attach
   the state to an :class:`refimpl.store.OffloadStore`;
2. per step, five phases, each a ``rt.span``:

   * ``train``: the step uses every group the rank belongs to (a small
     all-reduce each, so lazily created NCCL communicators are initialised),
     then ``workload.train_s`` passes;
   * ``sleep``: the trainer's memory leaves the GPU: ``store.offload_async``
     (or a TMS-style pause: memory released, ``tms_pause_s`` passes), inside
     ``lifecycle.pause`` when there is a lifecycle;
   * ``update_weights``: the rollout engine takes its memory, then the export
     (if any): per bucket an H2D copy of this rank's share of the weights
     from a pinned host backup, an all-gather over the export group and the
     IPC hand-off (``ipc_s`` per step, spread over buckets), inside
     ``lifecycle.weight_sync``;
   * ``rollout``: ``workload.rollout_s`` passes; the engine's memory is then
     returned;
   * ``wake_up``: ``store.reload_async`` (or the TMS resume), then
     ``lifecycle.resume``;
3. the rank compares every tensor with its reference (real payloads).

:func:`run_scenario` turns the ranks' outcomes and the world's report into a
:class:`sim.scenarios.result.ScenarioResult` with the invariant violations found.
"""
from __future__ import annotations

import gc
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import torch

from refimpl.runtime.base import CopyKind, GroupSpec, ReduceOp, Runtime
from sim.machine.collectives import NcclComm, TopologyCollectiveCost
from sim.kernel.errors import CollectiveMismatchError, DeadlockError, SimError
from sim.machine.faults import FaultPlan
from sim.machine.flows import FlowTransport
from sim.machine.memory import TopologyMemory
from sim.presets.models import TensorSpec, build_state
from sim.scenarios.mesh_groups import MeshGroups, mesh_groups
from sim.scenarios.result import PHASE_ORDER as PHASES, RankOutcome, ScenarioResult, judge
from sim.scenarios.scenario import Scenario
from sim.machine.topology import Topology
from sim.world import SimWorld

log = logging.getLogger(__name__)



#: ledger tag of the rollout engine's memory (KV cache and weights of the inference engine)
ENGINE_TAG = "rollout engine"

# --------------------------------------------------------------------------- the world


def build_topology(scn: Scenario) -> Topology:
    """The scenario's topology (validated and built when the scenario was parsed)."""
    return scn.topo


def lifecycle_specs(scn: Scenario, groups: MeshGroups) -> list[GroupSpec]:
    """The groups the scenario's lifecycle manages (none with ``pg_policy`` none): every group of a family whose
    groups have ``lifecycle.min_ranks`` ranks or more, family by family."""
    if scn.pg_policy == "none":
        return []
    return [s for fam in groups.families if groups.size(fam) >= scn.lifecycle.min_ranks for s in groups.specs_of(fam)]


def build_world(scn: Scenario, topo: Topology, *, record_memory: bool = True,
                ranks: Any = None) -> tuple[SimWorld, FaultPlan | None]:
    """A SimWorld whose machine comes from the topology; the fault plan is fresh for this run. ``ranks``: the ranks
    that run (a folded run's active ones; None: all)."""
    plan = FaultPlan(scn.faults.faults) if scn.faults.faults else None
    world = SimWorld(
        scn.world_size,
        payload=scn.payload,
        seed=scn.seed,
        transport=FlowTransport(topo, streams=scn.streams),
        collective_cost=TopologyCollectiveCost(topo),
        memory=TopologyMemory(topo, record=record_memory),
        faults=plan,
        comm=NcclComm(topo, lazy_init=scn.lazy_init, proxy_wake=scn.wake_proxies),
        group_timeouts=scn.watchdog,  # a deployment's watchdog: each group's timeout_s (600 s, torch's default)
        trace=False,
        peer_loss_s=scn.peer_loss_s,  # a crashed rank's connections close (sim.rendezvous)
        ranks=ranks,
    )
    return world, plan


# --------------------------------------------------------------------------- one rank


@dataclass
class RankContext:
    """What every rank's coroutine needs (shared, read-only)."""

    scn: Scenario
    topo: Topology
    groups: MeshGroups
    state: list[TensorSpec]
    lifecycle_cls: Any = None
    outcomes: dict[int, RankOutcome] = field(default_factory=dict)
    #: the groups the lifecycle manages (:func:`lifecycle_specs`), made once for every rank
    managed: list[GroupSpec] | None = None

    def lifecycle_groups(self) -> list[GroupSpec]:
        """:func:`lifecycle_specs` of the scenario (computed on the first call)."""
        if self.managed is None:
            self.managed = lifecycle_specs(self.scn, self.groups)
        return self.managed


def _fill(t: torch.Tensor, seed: int, rank: int, index: int) -> None:
    g = torch.Generator().manual_seed(hash((seed, rank, index)) & 0x7FFFFFFF)
    if t.dtype.is_floating_point:
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype))
    else:
        t.copy_(torch.randint(0, 100, t.shape, generator=g, dtype=torch.int64).to(t.dtype))


async def _use_group(rt: Runtime, world: SimWorld, name: str) -> float:
    """One collective on ``name`` as the workload would; pays lazy NCCL init on first use. Returns the seconds
    this first use added beyond the collective itself (0 on a live group)."""
    extra = 0.0
    first_use = getattr(world.comm, "first_use", None)
    if first_use is not None:
        extra = first_use(world.resolve_backend(rt.group_spec(name)))
        await rt.sleep(extra)
    probe = rt.alloc_device(1, torch.float32, tag="workload.probe")
    if probe.device.type != "meta":
        probe.fill_(1.0)
    await rt.all_reduce(probe, ReduceOp.SUM, group=name)
    rt.release(probe)
    return extra


async def _export(rt: Runtime, world: SimWorld, ctx: RankContext, backup: torch.Tensor | None) -> None:
    """update_weights' export: H2D of this rank's share per bucket, all-gather over the group, IPC hand-off."""
    ex = ctx.scn.workload.export
    group = ctx.groups.groups_of(rt.rank).get(ex.group)
    if group is None or backup is None:
        return
    n = rt.group_size(group)
    share = sum(t.nbytes for t in ctx.state if t.category == "params")
    buckets = max(1, math.ceil(share * n / ex.bucket_bytes))
    per = math.ceil(share / buckets)
    for fam in ex.also_uses:  # e.g. the expert weights' broadcast: its first collective after a rebuild
        other = ctx.groups.groups_of(rt.rank).get(fam)
        if other is not None:
            await _use_group(rt, world, other)
    first_use = getattr(world.comm, "first_use", None)
    if first_use is not None:
        await rt.sleep(first_use(world.resolve_backend(rt.group_spec(group))))
    for _ in range(buckets):
        part = rt.alloc_device(per, torch.uint8, tag="export.bucket")
        await rt.copy_async(part, backup[:per], CopyKind.H2D)
        full = rt.alloc_device(per * n, torch.uint8, tag="export.gathered")
        await rt.all_gather_into_tensor(full, part, group=group)
        rt.release(part)
        await rt.sleep(ex.ipc_s / buckets)
        rt.release(full)


def _allocate_state(rt: Runtime, ctx: RankContext) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """This rank's state tensors by category and, for real payloads, a reference copy of each (seeded bytes, the
    same on the replicas of one shard)."""
    scn = ctx.scn
    real = scn.payload == "real"
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    reference: dict[str, torch.Tensor] = {}
    shard = _shard_id(scn, rt.rank)  # replicas of one shard hold the same bytes
    for i, spec in enumerate(ctx.state):
        t = rt.alloc_device(spec.numel, spec.dtype, tag=spec.category).view(spec.shape)
        if real:
            _fill(t, scn.seed, shard, i)
            reference[spec.name] = t.clone()
        tensors.setdefault(spec.category, {})[spec.name] = t
    return tensors, reference


async def _start_groups(rt: Runtime, ctx: RankContext) -> Any:
    """Create this rank's process groups: those outside the lifecycle once, as torch creates them, the others through
    a started lifecycle, which is returned (None when the lifecycle manages no group)."""
    scn = ctx.scn
    managed = ctx.lifecycle_groups()
    # the groups outside the lifecycle: created once, by their members (torch's new_group with
    # use_local_synchronization; a non-member's call would return at once and do nothing the run can see),
    # in family order (the order of every group's spec), this rank's group of each family
    for fam, name in ctx.groups.groups_of(rt.rank).items():
        if not (managed and ctx.groups.size(fam) >= scn.lifecycle.min_ranks):
            await rt.new_group(ctx.groups.spec(name))
    if not managed:
        return None
    lc_mod = ctx.lifecycle_cls
    cfg = lc_mod.LifecycleConfig(policy=lc_mod.PGPolicy(scn.pg_policy), cooldown_s=scn.lifecycle.cooldown_s,
                                 two_phase=scn.lifecycle.two_phase)
    lifecycle = lc_mod.PGLifecycle(rt, managed, config=cfg)
    await lifecycle.start()
    return lifecycle


@dataclass
class _SwitchWork:
    """What one rank does inside the switch: release its memory in ``sleep``, bring it back in ``wake_up``, and the
    weight sync's own work in ``update_weights``."""

    release: Callable[[], Awaitable[None]]
    restore: Callable[[], Awaitable[None]]
    weight_sync: Callable[[], Awaitable[None]]


async def _run_step(rt: Runtime, world: SimWorld, ctx: RankContext, lifecycle: Any, work: _SwitchWork,
                    touched: list[str], engine_bytes: int, phases: dict[str, float]) -> None:
    """One RL step on this rank: train, sleep, update_weights, rollout, wake_up, each phase timed into ``phases``."""
    w = ctx.scn.workload
    with _phase(rt, "train", phases):
        if w.touch_groups:  # the first collectives after the previous wake: their extra is switch cost
            phases["first_use_extra"] = 0.0
            for name in touched:
                phases["first_use_extra"] += await _use_group(rt, world, name)
        await rt.sleep(w.train_s)
    with _phase(rt, "sleep", phases):
        if lifecycle is not None:
            await lifecycle.pause(release_memory=work.release)
        else:
            await work.release()
    with _phase(rt, "update_weights", phases):
        if engine_bytes:  # the rollout engine is another process: its memory goes straight to the ledger
            world.memory.alloc_device(rt.rank, engine_bytes, ENGINE_TAG)
        if lifecycle is not None:
            await lifecycle.weight_sync(work.weight_sync)
        else:
            await work.weight_sync()
    with _phase(rt, "rollout", phases):
        await rt.sleep(w.rollout_s)
        if engine_bytes:
            world.memory.free_device(rt.rank, engine_bytes, ENGINE_TAG)
    with _phase(rt, "wake_up", phases):
        await work.restore()
        if lifecycle is not None:
            await lifecycle.resume()


def _judge_bytes(out: RankOutcome, tensors: dict[str, dict[str, torch.Tensor]], reference: dict[str, torch.Tensor],
                 real: bool, store: Any) -> None:
    """Whether this rank's state came back bit for bit (real payloads through the store), or why it is not compared."""
    if real and store is not None:
        bad = []
        for cat, named in tensors.items():
            for name, t in named.items():
                if not torch.equal(t.view(-1).view(torch.uint8), reference[name].view(-1).view(torch.uint8)):
                    bad.append(name)
        out.bitwise_equal = not bad
        out.mismatched = bad[:20]
    elif real:
        out.bitwise_note = "TMS pause is modelled as a fixed cost; contents are not simulated"
    else:
        out.bitwise_note = "meta payload: no bytes to compare"


async def rank_main(rt: Runtime, world: SimWorld, ctx: RankContext) -> RankOutcome:
    """The scenario's steps on one rank (see the module docstring)."""
    scn, w = ctx.scn, ctx.scn.workload
    out = RankOutcome(rank=rt.rank)
    ctx.outcomes[rt.rank] = out
    real = scn.payload == "real"
    tensors, reference = _allocate_state(rt, ctx)
    lifecycle = await _start_groups(rt, ctx)
    store = None
    if scn.offload.backend != "tms":
        from refimpl.store import OffloadStore

        store = OffloadStore(rt, backend=scn.offload.backend, **_dedup_kwargs(scn))
        for cat, named in sorted(tensors.items()):
            store.attach_tensors(cat, named, name=f"state.{cat}")
    backup = None
    if w.export is not None:
        share = sum(t.nbytes for t in ctx.state if t.category == "params")
        backup = rt.alloc_host(max(share, 1), torch.uint8, pinned=True, tag="weights backup")
    engine_bytes = _engine_bytes(rt, w)
    mine = ctx.groups.groups_of(rt.rank)
    my_groups = sorted(set(mine.values()))
    # the groups training uses: every one, or those of the families named (workload.touch_groups)
    touched = my_groups if not isinstance(w.touch_groups, tuple) else sorted(
        {g for fam, g in mine.items() if fam in w.touch_groups})
    paused = [(cat, name, t) for cat in scn.offload.include for name, t in sorted(tensors.get(cat, {}).items())]

    async def release() -> None:
        """The trainer's memory release in ``sleep`` (store offload or TMS pause)."""
        if store is not None:
            await store.offload_async(include=list(scn.offload.include))
            return
        for _cat, _name, t in paused:  # TMS pause: the pages go, the tensors stay
            rt.release(t)
        await rt.sleep(scn.offload.tms_pause_s)

    async def restore() -> None:
        """The trainer's memory coming back in ``wake_up`` (store reload or TMS resume)."""
        if store is not None:
            await store.reload_async(include=list(scn.offload.include))
            return
        for cat, name, t in paused:  # TMS resume: same tensors, pages mapped again (CPU backup restores bytes)
            fresh = rt.alloc_device(t.numel(), t.dtype, tag=cat)
            t.set_(fresh.untyped_storage(), 0, t.shape, t.stride())
            if real:
                t.copy_(reference[name])
        await rt.sleep(scn.offload.tms_resume_s)

    async def weight_sync() -> None:
        """update_weights' work inside the lifecycle's weight sync (the export, if any)."""
        if w.export is not None:
            await _export(rt, world, ctx, backup)

    work = _SwitchWork(release, restore, weight_sync)
    try:
        for _step in range(scn.steps):
            phases: dict[str, float] = {}
            out.phases.append(phases)
            await _run_step(rt, world, ctx, lifecycle, work, touched, engine_bytes, phases)
            out.state = lifecycle.state.name if lifecycle is not None else "-"
    finally:  # a failed rank still reports where its lifecycle ended
        if lifecycle is not None:
            out.state = lifecycle.state.name
            out.lifecycle_stats = dict(vars(lifecycle.stats))
    if store is not None:
        st = store.stats()
        out.host_pinned_store = st.host_pinned_bytes
    _judge_bytes(out, tensors, reference, real, store)
    out.finished = True
    return out


def _mesh_topology(scn: Scenario) -> Any:
    from refimpl.store.backends.replica import MeshTopology

    return MeshTopology(tuple(n for _, n in scn.mesh), tuple(d for d, _ in scn.mesh))


def _shard_id(scn: Scenario, rank: int) -> int:
    """The lowest rank of ``rank``'s replica group (``rank`` itself when nothing is replicated)."""
    if not scn.offload.replicate_over:
        return rank
    from refimpl.store.backends.replica import group_over_dims

    return group_over_dims(_mesh_topology(scn), rank, scn.offload.replicate_over).ranks[0]


def _dedup_kwargs(scn: Scenario) -> dict[str, Any]:
    """``local_dedup``'s config: all state replicated over ``offload.replicate_over``, groups declared
    up front (meta payloads move no bytes, so the group exchange cannot run)."""
    if scn.offload.backend != "local_dedup":
        return {}
    from refimpl.store.backends.dedup_config import DedupConfig
    from refimpl.store.backends.replica import MeshReplica, ReplicaPolicy

    mesh, dims = _mesh_topology(scn), scn.offload.replicate_over
    return {"dedup": DedupConfig(policy=ReplicaPolicy(overrides={"*": MeshReplica(mesh, dims)}),
                                 groups=tuple(mesh.groups_over(dims)))}


def _engine_bytes(rt: Runtime, w) -> int:
    if w.rollout_memory_gib:
        return int(w.rollout_memory_gib * 2**30)
    if w.rollout_memory_fraction:
        return int(w.rollout_memory_fraction * rt.memory_info().total)
    return 0


class _phase:
    """``rt.span(name)`` that also stores the phase's duration in ``phases``."""

    def __init__(self, rt: Runtime, name: str, phases: dict[str, float]):
        self.rt, self.name, self.phases = rt, name, phases
        self.span = rt.span(name)

    def __enter__(self) -> None:
        self.start = self.rt.now()
        self.span.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        self.span.__exit__(*exc)
        self.phases[self.name] = self.rt.now() - self.start
        return False


# --------------------------------------------------------------------------- the job


def run_scenario(scn: Scenario, *, record_memory: bool = True,
                 on_world: Any = None) -> tuple[ScenarioResult, SimWorld, FaultPlan | None]:
    """Run every rank of ``scn`` to the end; returns the judged result, the world (for traces) and the fault plan.

    ``on_world(world)``, if given, is called once the world is built (progress reporting watches its engine).
    """
    t0 = time.perf_counter()
    topo = build_topology(scn)
    world, plan = build_world(scn, topo, record_memory=record_memory)
    if on_world is not None:
        on_world(world)
    ctx = RankContext(scn, topo, mesh_groups(scn), build_state(scn.model))
    if scn.pg_policy != "none":
        from refimpl.comm import lifecycle as lc_mod

        ctx.lifecycle_cls = lc_mod
    error: dict[str, Any] | None = None
    results: list[Any] = []
    # [Note: no cyclic GC during a run] A 1,024-rank world holds a few hundred thousand
    # long-lived objects; every cyclic collection would walk them all (a third of the run
    # time). Buffers are returned by refcount (weakref.finalize on their storages), which
    # does not depend on the cyclic collector, so switching it off changes no result; it
    # only makes dropping a buffer caught in a reference cycle wait until the run ends.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        results = world.run(lambda rt: rank_main(rt, world, ctx), return_exceptions=True)
    except DeadlockError as exc:
        error = {"kind": "deadlock", "message": str(exc), "blocked": {str(k): v for k, v in exc.blocked.items()},
                 "cycle": exc.cycle, "absent": {str(k): v for k, v in exc.absent.items()}, "time": exc.time,
                 "stopped_at": exc.stopped_at}
    except CollectiveMismatchError as exc:
        error = {"kind": "collective_mismatch", "message": str(exc), "group": exc.group, "seq": exc.seq,
                 "ops": {str(k): v for k, v in exc.ops.items()}}
    except SimError as exc:
        error = {"kind": type(exc).__name__, "message": str(exc)}
    finally:
        if gc_was_enabled:
            gc.enable()
    wall = time.perf_counter() - t0
    outcomes = []
    for rank in range(scn.world_size):
        o = ctx.outcomes.get(rank) or RankOutcome(rank=rank)
        r = results[rank] if rank < len(results) else None
        proc = world.runtimes[rank].process
        if r is None and proc is not None and proc.exception is not None:  # the run stopped (deadlock) first
            r = proc.exception
        if isinstance(r, BaseException):
            o.error = f"{type(r).__name__}: {r}"
        outcomes.append(o)
    result = judge(scn, topo, world, plan, outcomes, error, wall)
    return result, world, plan


__all__ = ["PHASES", "MeshGroups", "RankContext", "build_topology", "build_world", "lifecycle_specs", "mesh_groups",
           "rank_main", "run_scenario"]
