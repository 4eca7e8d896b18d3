"""The switch-window lifecycle driver, pure parts: the Megatron group families over a DP x TP mesh and the
RL steps (train, pause, weight sync, rollout, resume) timed on any :class:`~refimpl.runtime.base.Runtime`.

``timeshare bench switch-window`` (:mod:`bench.switch_window`, which re-exports these names) runs it on a
simulated world and on TorchRuntime for the GPU measurement; ``timeshare plan --pg-groups megatron``
(:mod:`sim.plan`) takes its PG-policy switch costs from :func:`simulate` and :func:`summarize`.
"""
from __future__ import annotations

import itertools
import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
from refimpl.runtime.base import GroupSpec, ReduceOp, Runtime

log = logging.getLogger(__name__)

#: the Megatron group families of the Relax report (14 per rank), as dims of a (dp, tp) mesh
RELAX_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tp", ("tp",)), ("dp", ("dp",)), ("dp_cp", ("dp",)), ("mp", ("tp",)), ("tp_dp", ("dp", "tp")),
    ("tp_dp_cp", ("dp", "tp")), ("tp_cp", ("tp",)), ("pp", ()), ("cp", ()), ("embd", ()), ("pos_embd", ()),
    ("ep", ()), ("etp", ("tp",)), ("edp", ("dp",)),
)


def mesh_groups(dp: int, tp: int, families=RELAX_FAMILIES, *, backend: str | None = "nccl") -> list[GroupSpec]:
    """One group per family and per coordinate of the mesh dims it does not span (rank = dp_index * tp + tp_index)."""
    sizes = {"dp": dp, "tp": tp}
    specs = []
    for fam, dims in families:
        other = [d for d in ("dp", "tp") if d not in dims]
        combos = list(itertools.product(*(range(sizes[d]) for d in other)))
        for gi, fixed in enumerate(combos):
            ranks = []
            for inner in itertools.product(*(range(sizes[d]) for d in dims)):
                c = {**dict(zip(other, fixed)), **dict(zip(dims, inner))}
                ranks.append(c["dp"] * tp + c["tp"])
            specs.append(GroupSpec(fam if len(combos) == 1 else f"{fam}{gi}", tuple(sorted(ranks)), backend=backend))
    return specs


@dataclass
class StepTimes:
    """One RL step's switch phases on one rank, in seconds, and the memory held during the rollout.

    ``held_in_rollout``: NCCL memory of the role's groups (``ncclCommMemStats``; None where the
    loaded NCCL cannot say). ``device_used_in_rollout``: device memory in use as the driver sees it.
    ``first_use``: the training step's first collective on each group, right after the previous
    step's wake (outside the window): where a group rebuilt at wake pays torch's lazy NCCL init.
    """

    sleep: float
    update_weights: float
    wake_up: float
    held_in_rollout: int | None
    device_used_in_rollout: int
    state_in_rollout: str
    first_use: float = 0.0

    @property
    def total(self) -> float:
        return self.sleep + self.update_weights + self.wake_up


async def _touch(rt: Runtime, names: list[str]) -> None:
    """One small all-reduce per member group: the training step uses its groups (and creates lazy comms)."""
    for name in names:
        if rt.is_member(name):
            t = rt.alloc_device(1, torch.float32, tag="bench.touch")
            t.fill_(1.0)
            await rt.all_reduce(t, ReduceOp.SUM, name, timeout_s=120)
            rt.release(t)


async def run_steps(
    rt: Runtime, lc: PGLifecycle, *, steps: int, train_s: float, rollout_s: float, sync_group: str | None
) -> list[StepTimes]:
    """``steps`` RL steps on one rank: train, pause, weight sync, rollout, resume; the switch phases timed."""
    out = []
    await lc.start()
    for _ in range(steps):
        t_first = rt.now()
        await _touch(rt, list(lc.groups))
        first_use = rt.now() - t_first
        await rt.sleep(train_s)
        t0 = rt.now()
        await lc.pause()
        t1 = rt.now()

        async def sync() -> None:
            if sync_group is not None:
                await _touch(rt, [sync_group])

        await lc.weight_sync(sync)
        t2 = rt.now()
        rt.empty_cache()
        used = rt.memory_info().used
        try:
            comm = lc.comm_memory()
            held: int | None = comm.suspendable + comm.persistent
        except RuntimeError as exc:  # an NCCL without ncclCommMemStats cannot report it
            log.info("communicator memory unknown: %s", exc)
            held = None
        state = lc.state.name
        await rt.sleep(rollout_s)
        t3 = rt.now()
        await lc.resume()
        t4 = rt.now()
        out.append(StepTimes(t1 - t0, t2 - t1, t4 - t3, held, used, state, first_use))
    return out


@dataclass
class PolicyResult:
    """Steady-state means over ranks and the measured steps for one policy."""

    policy: str
    sleep: float
    update_weights: float
    wake_up: float
    total: float
    held_in_rollout_gib: float | None
    device_used_in_rollout_gib: float
    states: list[str] = field(default_factory=list)


def summarize(policy: PGPolicy, per_rank: list[list[StepTimes]], warmup: int) -> PolicyResult:
    """Mean over ranks of the steps after ``warmup`` (the slowest rank sets the window, so take the max)."""
    steady = [steps[warmup:] for steps in per_rank]
    def window(attr: str) -> float:
        return statistics.mean(max(getattr(r[i], attr) for r in steady) for i in range(len(steady[0])))
    return PolicyResult(
        policy=policy.name,
        sleep=window("sleep"), update_weights=window("update_weights"), wake_up=window("wake_up"),
        total=statistics.mean(max(r[i].total for r in steady) for i in range(len(steady[0]))),
        held_in_rollout_gib=None if any(s.held_in_rollout is None for r in steady for s in r)
        else max(s.held_in_rollout for r in steady for s in r) / 2**30,
        device_used_in_rollout_gib=max(s.device_used_in_rollout for r in steady for s in r) / 2**30,
        states=[s.state_in_rollout for s in per_rank[0]],
    )


def simulate(policy: PGPolicy, *, dp: int, tp: int, steps: int, train_s: float, rollout_s: float,
             cooldown_s: float, topology: "str | dict[str, Any] | None") -> list[list[StepTimes]]:
    """Run the steps on a simulated ``dp * tp`` rank job; returns each rank's step times.

    ``topology``: a preset name or file, or preset data; None for the simulator's defaults.
    """
    from sim.world import SimWorld

    kwargs: dict[str, Any] = {}
    if topology:
        from sim.collectives import NcclComm, TopologyCollectiveCost
        from sim.memory import TopologyMemory
        from sim.topology import Topology

        topo = Topology(topology) if isinstance(topology, dict) else Topology.from_preset(topology)
        # torch creates NCCL communicators lazily: the first collective of a (re)built group pays the init
        kwargs = dict(collective_cost=TopologyCollectiveCost(topo), memory=TopologyMemory(topo, record=False),
                      comm=NcclComm(topo, lazy_init=True, init_at_collective=True))
    world = SimWorld(dp * tp, trace=False, **kwargs)
    specs = mesh_groups(dp, tp)
    config = LifecycleConfig(policy=policy, cooldown_s=cooldown_s)

    async def rank(rt):
        lc = PGLifecycle(rt, specs, config=config)
        tp_group = next(s.name for s in specs if s.name.rstrip("0123456789") == "tp" and rt.rank in s.ranks)
        return await run_steps(rt, lc, steps=steps, train_s=train_s, rollout_s=rollout_s, sync_group=tp_group)

    return world.run(rank)


def first_use_after_wake(per_rank: list[list[StepTimes]], warmup: int) -> float:
    """Mean over the steps after ``warmup`` (and after the first step) of the slowest rank's first collectives.

    Step ``i``'s first collectives follow step ``i - 1``'s wake, so step 0 (group creation) is left out.
    """
    first = max(warmup, 1)
    return statistics.mean(max(r[i].first_use for r in per_rank) for i in range(first, len(per_rank[0])))


__all__ = ["RELAX_FAMILIES", "PolicyResult", "StepTimes", "first_use_after_wake", "mesh_groups", "run_steps",
           "simulate", "summarize"]
