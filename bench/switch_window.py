"""``timeshare bench switch-window``: what each process-group policy costs in the actor/rollout switch.

The switch window of one RL step is the time the trainer spends in ``sleep``
(pause), ``update_weights`` (weight sync) and ``wake_up`` (resume), the three
phases the Relax report measures. Only the lifecycle's own work is in the
window here (no trainer offload, a tiny weight-sync all-gather), so the figures
are what the policy costs, and the rollout between pause and resume is where a
deferred cooldown can hide. Policies:

* ``DESTROY``: the Relax baseline (destroy with an inline port wait, rebuild
  for the weight sync, destroy and wait again, rebuild for training);
* ``DESTROY_DEFERRED``: the same with the wait deferred to the next rebuild;
* ``PAUSED_LIVE``: groups kept live (NCCL memory stays held in the rollout);
* ``SUSPEND``: groups kept, NCCL memory released (ncclCommSuspend/Resume).
* ``SUSPEND_PLANNED``: one agreed plan per group (keep / suspend / destroy),
  each group taken down once per step and brought back once at wake
  (:mod:`refimpl.comm.group_plan`); no sync groups are declared here, so all
  stay up through the weight sync, as in the GPU benchmark.

On CPU the job is simulated: 8 ranks, each a member of 14 groups (the 14
Megatron group families of the Relax report over a DP x TP mesh), on the
``hgx-h200-8x`` topology preset with the communicator constants ``timeshare
sim calibrate`` fitted on the H200 records (``sim/presets/calibrated/``): one-
rank communicators as measured on one H200, communicators of two or more ranks
as measured on 2 x H200. The
same driver, :func:`run_steps`, runs on TorchRuntime for the GPU measurement
(``bench/gpu/comm_h200.py``). Ratios are against ``DESTROY`` in the same run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from refimpl.cli_errors import one_line_errors
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
             cooldown_s: float, topology: str | None) -> list[list[StepTimes]]:
    """Run the steps on a simulated ``dp * tp`` rank job; returns each rank's step times."""
    import sim

    kwargs: dict[str, Any] = {}
    if topology:
        from sim.collectives import NcclComm, TopologyCollectiveCost
        from sim.memory import TopologyMemory
        from sim.topology import Topology

        topo = Topology.from_preset(topology)
        # torch creates NCCL communicators lazily: the first collective of a (re)built group pays the init
        kwargs = dict(collective_cost=TopologyCollectiveCost(topo), memory=TopologyMemory(topo, record=False),
                      comm=NcclComm(topo, lazy_init=True, init_at_collective=True))
    world = sim.SimWorld(dp * tp, trace=False, **kwargs)
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


def format_results(results: list[PolicyResult], header: str) -> str:
    """A table with each policy's phases and total, and the ratio to DESTROY."""
    base = next((r.total for r in results if r.policy == "DESTROY"), None)
    lines = [header, f"{'policy':<18}{'sleep s':>9}{'update s':>10}{'wake s':>9}{'total s':>9}{'vs DESTROY':>12}"
                     f"{'NCCL GiB in rollout':>21}{'device GiB in rollout':>23}"]
    for r in results:
        ratio = f"{r.total / base:.3f}x" if base else "-"
        held = "unknown" if r.held_in_rollout_gib is None else f"{r.held_in_rollout_gib:.2f}"
        lines.append(f"{r.policy:<18}{r.sleep:>9.3f}{r.update_weights:>10.3f}{r.wake_up:>9.3f}{r.total:>9.3f}"
                     f"{ratio:>12}{held:>21}{r.device_used_in_rollout_gib:>23.2f}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``timeshare bench switch-window``."""
    parser.add_argument("--dp", type=int, default=4, help="data-parallel size of the simulated mesh (default 4)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2; ranks = dp * tp)")
    parser.add_argument("--steps", type=int, default=4, help="RL steps per policy (default 4)")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the means (default 2: two-phase "
                        "enabling keeps the first step on the fallback path)")
    parser.add_argument("--train-s", type=float, default=30.0, help="simulated training time per step")
    parser.add_argument("--rollout-s", type=float, default=60.0, help="simulated rollout time per step")
    parser.add_argument("--cooldown-s", type=float, default=2.0, help="port-release cooldown (Relax: 2 s)")
    parser.add_argument("--topology", default="calibrated/hgx-h200-8x",
                        help="sim topology preset (a name, or a preset file) for collective, memory and communicator "
                             "models (default: hgx-h200-8x with the constants timeshare sim calibrate fitted on the "
                             "recorded fit set; '' for the simulator's defaults)")
    parser.add_argument("--policy", action="append", metavar="POLICY",
                        help=f"policies to run, any case: {', '.join(p.value for p in PGPolicy)} (repeatable; default all)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")


@one_line_errors
def run(args: argparse.Namespace) -> int:
    """Simulate every policy and print the switch window of each, with ratios against DESTROY."""
    from refimpl.cli_errors import CliInputError, check_number, check_output_path

    for opt, v in (("--dp", args.dp), ("--tp", args.tp), ("--steps", args.steps)):
        check_number(opt, v, lo=1, integer=True)
    check_number("--warmup", args.warmup, lo=0, integer=True)
    for opt, v in (("--train-s", args.train_s), ("--rollout-s", args.rollout_s), ("--cooldown-s", args.cooldown_s)):
        check_number(opt, v, lo=0)
    if args.warmup >= args.steps:
        raise CliInputError(f"--warmup ({args.warmup}) must be smaller than --steps ({args.steps})")
    if args.topology:
        from sim.presets import PresetError, list_presets, load_preset_data

        try:
            load_preset_data(args.topology)  # a built-in name, calibrated/NAME, or a preset file
        except PresetError:
            raise CliInputError(f"--topology {args.topology!r}: not a preset; expected one of {list_presets()}, "
                                "calibrated/hgx-h200-8x, a preset file (.json) or ''") from None
    if args.json:
        check_output_path(args.json, "--json")
    try:
        policies = [PGPolicy.parse(p) for p in (args.policy or [p.value for p in PGPolicy])]
    except ValueError as exc:
        raise CliInputError(f"--policy: {exc}") from None
    results, first_use = [], {}
    for policy in policies:
        per_rank = simulate(policy, dp=args.dp, tp=args.tp, steps=args.steps, train_s=args.train_s,
                            rollout_s=args.rollout_s, cooldown_s=args.cooldown_s, topology=args.topology or None)
        results.append(summarize(policy, per_rank, args.warmup))
        first_use[policy.name] = first_use_after_wake(per_rank, args.warmup)
    groups = len([s for s in mesh_groups(args.dp, args.tp) if 0 in s.ranks])
    header = (f"switch window per RL step (simulated): {args.dp * args.tp} ranks, {groups} groups per rank, "
              f"topology {args.topology or 'defaults'}, cooldown {args.cooldown_s:g} s, rollout {args.rollout_s:g} s; "
              f"mean of steps {args.warmup + 1}-{args.steps}, slowest rank")
    print(format_results(results, header))
    print("first collective on every group after the wake (training, outside the window; lazy NCCL init of "
          "groups rebuilt at wake lands here): " + ", ".join(f"{p} {s:.3f} s" for p, s in first_use.items()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            from refimpl.output import envelope

            json.dump(envelope("bench switch-window", {"header": header, "results": [asdict(r) for r in results]}), f,
                      indent=1)
    return 0


__all__ = ["RELAX_FAMILIES", "PolicyResult", "StepTimes", "add_arguments", "first_use_after_wake", "format_results",
           "mesh_groups",
           "run", "run_steps", "simulate", "summarize"]
