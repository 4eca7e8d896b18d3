"""The switch-window lifecycle driver, pure parts: the Megatron group families over a DP x TP mesh and the
RL steps (train, pause, weight sync, rollout, resume) timed on any :class:`~refimpl.runtime.base.Runtime`.

``timeshare bench switch-window`` (:mod:`bench.switch_window`, which re-exports these names) runs it on a
simulated world and on TorchRuntime for the GPU measurement; ``timeshare plan --pg-groups megatron``
(:mod:`sim.planner.plan`) takes its PG-policy switch costs from :func:`simulate` and :func:`summarize`.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.comm.group_plan import GroupPlanRules
from refimpl.runtime.base import GroupSpec, ReduceOp, Runtime
from sim.calibrate.records import PHASES
from sim.machine.switch_cost import SwitchCost, SwitchCostError, steady_switch_cost, switch_cost

log = logging.getLogger(__name__)

#: the Megatron group families of the Relax report (14 per rank), as dims of a (dp, tp) mesh
RELAX_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tp", ("tp",)), ("dp", ("dp",)), ("dp_cp", ("dp",)), ("mp", ("tp",)), ("tp_dp", ("dp", "tp")),
    ("tp_dp_cp", ("dp", "tp")), ("tp_cp", ("tp",)), ("pp", ()), ("cp", ()), ("embd", ()), ("pos_embd", ()),
    ("ep", ()), ("etp", ("tp",)), ("edp", ("dp",)),
)


#: rows of the benchmark beside the :class:`PGPolicy` members: name -> the policy it runs
VARIANTS: dict[str, PGPolicy] = {
    # SUSPEND_PLANNED with the weight sync's group declared (the others go down at the pause) and a lazy wake:
    # nothing comes back at the wake; the training step's first use of each group brings it up (PGLifecycle.use)
    "SUSPEND_PLANNED_LAZY": PGPolicy.SUSPEND_PLANNED,
    # the same policies with each walk's destroys run together (LifecycleConfig.parallel_destroy)
    "DESTROY_DEFERRED_PARALLEL": PGPolicy.DESTROY_DEFERRED,
    "SUSPEND_PLANNED_PARALLEL": PGPolicy.SUSPEND_PLANNED,
}


def row_names() -> list[str]:
    """Every row the benchmark can run: the policies, then the variants."""
    return [p.name for p in PGPolicy] + list(VARIANTS)


def resolve(row: "PGPolicy | str") -> tuple[str, PGPolicy]:
    """``(row name, policy)`` for a policy, a policy's name in any spelling, or a variant's name.

    Raises ValueError listing the known rows.
    """
    if isinstance(row, PGPolicy):
        return row.name, row
    key = str(row).strip().upper().replace("-", "_")
    if key in VARIANTS:
        return key, VARIANTS[key]
    try:
        policy = PGPolicy.parse(row)
    except ValueError:
        raise ValueError(f"unknown switch-window row {row!r}; expected one of {row_names()} (any case)") from None
    return policy.name, policy


def row_config(row: str, **settings: Any) -> LifecycleConfig:
    """The :class:`LifecycleConfig` a row runs with: its policy, ``parallel_destroy`` for the ``*_PARALLEL`` rows,
    and ``settings`` (cooldown, control group)."""
    name, policy = resolve(row)
    return LifecycleConfig(policy=policy, parallel_destroy=name.endswith("_PARALLEL"), **settings)


def plan_rules(row: str, sync_group: str | None) -> GroupPlanRules | None:
    """The :class:`GroupPlanRules` a row runs with on a rank whose weight sync uses ``sync_group`` (None: defaults)."""
    if row == "SUSPEND_PLANNED_LAZY":
        return GroupPlanRules(sync_groups=frozenset({sync_group}) if sync_group else frozenset(),
                              wake_groups=frozenset())
    return None


def mesh_groups(dp: int, tp: int, families=RELAX_FAMILIES, *, backend: str | None = "nccl") -> list[GroupSpec]:
    """One group per family and per coordinate of the mesh dims it does not span (rank = dp_index * tp + tp_index)."""
    if families is not RELAX_FAMILIES:
        return _family_groups({"dp": dp, "tp": tp}, ("dp", "tp"), families, backend)
    return megatron_groups(tp=tp, dp=dp, backend=backend)


#: Megatron-core's 14 group families per rank (``parallel_state.initialize_model_parallel``): the dense ones over
#: the ``(pp, dp, cp, tp)`` mesh (``order="tp-cp-ep-dp-pp"``: tp fastest), the expert ones over ``(pp, edp, ep, etp)``;
#: ``embd`` and ``pos_embd`` are the first and last, and the first, stage of each pipeline
MEGATRON_DENSE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tp", ("tp",)), ("dp", ("dp",)), ("dp_cp", ("dp", "cp")), ("mp", ("pp", "tp")), ("tp_dp", ("dp", "tp")),
    ("tp_dp_cp", ("dp", "cp", "tp")), ("tp_cp", ("cp", "tp")), ("pp", ("pp",)), ("cp", ("cp",)),
)
MEGATRON_EXPERT: tuple[tuple[str, tuple[str, ...]], ...] = (("ep", ("ep",)), ("etp", ("etp",)), ("edp", ("edp",)))
#: the order the groups are made (and walked) in: the Relax report's 14
MEGATRON_ORDER = tuple(name for name, _ in RELAX_FAMILIES)


class MeshError(ValueError):
    """Parallel sizes that do not make a Megatron mesh of the world; the message says which and what to change."""


def megatron_sizes(world: int, *, tp: int = 1, cp: int = 1, pp: int = 1, ep: int = 1,
                   etp: int | None = None) -> dict[str, int]:
    """The dense and expert mesh sizes of ``world`` ranks: ``dp = world / (tp cp pp)``; ``etp`` (the expert tensor
    parallel size) defaults to ``tp`` where ``tp ep pp`` divides the world, else 1; ``edp = world / (etp ep pp)``.
    Raises MeshError naming the size that does not divide."""
    for name, v in (("tp", tp), ("cp", cp), ("pp", pp), ("ep", ep), ("world", world)):
        if not isinstance(v, int) or v < 1:
            raise MeshError(f"{name}: expected an integer >= 1, got {v!r}")
    if world % (tp * cp * pp):
        raise MeshError(f"tp {tp} x cp {cp} x pp {pp} = {tp * cp * pp} does not divide the {world} ranks")
    if etp is None:
        etp = tp if world % (tp * ep * pp) == 0 else 1
    if world % (etp * ep * pp):
        raise MeshError(f"etp {etp} x ep {ep} x pp {pp} = {etp * ep * pp} does not divide the {world} ranks; "
                        "lower ep or set etp (expert tensor parallel size)")
    return {"tp": tp, "cp": cp, "dp": world // (tp * cp * pp), "pp": pp, "etp": etp, "ep": ep,
            "edp": world // (etp * ep * pp)}


def megatron_groups(*, tp: int = 1, dp: int = 1, cp: int = 1, pp: int = 1, ep: int = 1, etp: int | None = None,
                    backend: str | None = "nccl") -> list[GroupSpec]:
    """Megatron-core's group families over ``tp * cp * dp * pp`` ranks with ``ep`` expert parallelism: one group per
    family and per coordinate of the mesh dims it does not span, named ``family`` or ``family<i>``, in the order of
    :data:`MEGATRON_ORDER` (rank = ((pp * dp + dp_i) * cp + cp_i) * tp + tp_i; experts (pp, edp, ep, etp) alike)."""
    world = tp * cp * dp * pp
    sizes = megatron_sizes(world, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
    dense = _family_groups(sizes, ("pp", "dp", "cp", "tp"), MEGATRON_DENSE, backend)
    expert = _family_groups(sizes, ("pp", "edp", "ep", "etp"), MEGATRON_EXPERT, backend)
    pipes = [s.ranks for s in dense if s.name.rstrip("0123456789") == "pp"]
    stages = [("embd", [tuple(sorted({g[0], g[-1]})) for g in pipes]), ("pos_embd", [(g[0],) for g in pipes])]
    stage_groups = [GroupSpec(name if len(gs) == 1 else f"{name}{i}", g, backend=backend)
                    for name, gs in stages for i, g in enumerate(gs)]
    by_family: dict[str, list[GroupSpec]] = {}
    for spec in (*dense, *expert, *stage_groups):
        by_family.setdefault(spec.name.rstrip("0123456789"), []).append(spec)
    return [spec for fam in MEGATRON_ORDER for spec in by_family[fam]]


def _family_groups(sizes: dict[str, int], order: tuple[str, ...], families, backend) -> list[GroupSpec]:
    """One group per family and per coordinate of the ``order`` dims it does not span (the last dim fastest)."""
    specs = []
    for fam, dims in families:
        other = [d for d in order if d not in dims]
        combos = list(itertools.product(*(range(sizes[d]) for d in other)))
        for gi, fixed in enumerate(combos):
            ranks = []
            for inner in itertools.product(*(range(sizes[d]) for d in dims)):
                c = {**dict(zip(other, fixed)), **dict(zip(dims, inner))}
                rank = 0
                for d in order:
                    rank = rank * sizes[d] + c[d]
                ranks.append(rank)
            specs.append(GroupSpec(fam if len(combos) == 1 else f"{fam}{gi}", tuple(sorted(ranks)), backend=backend))
    return specs


@dataclass
class StepTimes:
    """One RL step's switch phases on one rank, in seconds, and the memory held during the rollout.

    ``held_in_rollout``: NCCL memory of the role's groups (``ncclCommMemStats``; None where the
    loaded NCCL cannot say). ``device_used_in_rollout``: device memory in use as the driver sees it.
    ``first_use``: the training step's first collective on each group, right after the previous
    step's wake (outside the window): where a group rebuilt at wake pays torch's lazy NCCL init, and
    where a lazy wake brings its groups up (``PGLifecycle.use``). ``bitwise_after_wake``: those first
    collectives after this step's wake (the next step's, or one more after the last step) gave
    bitwise the sums computed on the host, on every group of this rank (None where buffers carry no
    data).
    """

    sleep: float
    update_weights: float
    wake_up: float
    held_in_rollout: int | None
    device_used_in_rollout: int
    state_in_rollout: str
    first_use: float = 0.0
    bitwise_after_wake: bool | None = None
    #: when this step's pause and resume began on this rank (``rt.now()``): where its phases lie in time
    paused_at: float = 0.0
    woken_at: float = 0.0
    #: phases that may end one NCCL proxy poll period later than timed (the simulator's mark; empty on hardware)
    poll_late: tuple[str, ...] = ()
    #: the first collectives on every group after this step's wake (the next step's ``first_use``, or the one
    #: after the last step), and the same collectives timed again right after them (groups live: the roles' own
    #: work); what :func:`sim.machine.switch_cost.switch_cost` takes (None until timed)
    first_use_after: float | None = None
    steady_use_after: float | None = None

    @property
    def total(self) -> float:
        """The switch window: ``sleep + update_weights + wake_up`` seconds (the first use after it is not in it)."""
        return self.sleep + self.update_weights + self.wake_up

    @property
    def cost(self) -> "SwitchCost":
        """This step's switch cost on this rank ([Note: the switch cost] in :mod:`sim.machine.switch_cost`)."""
        if self.first_use_after is None:
            raise SwitchCostError("switch cost: this step's first collectives after the wake were not timed")
        return switch_cost(self.sleep, self.update_weights, self.wake_up, self.first_use_after,
                           self.steady_use_after or 0.0)


TOUCH_NUMEL = 256


def _touch_values(rank: int) -> torch.Tensor:
    # small integers: every partial sum is exact in float32, so the reduced buffer is known bitwise
    return torch.arange(TOUCH_NUMEL, dtype=torch.float32).remainder_(61).add_(1000.0 * (rank + 1))


async def _touch(rt: Runtime, names: list[str]) -> bool | None:
    """One small all-reduce per member group: the training step uses its groups (and creates lazy comms).

    Returns whether every sum is bitwise the one computed on the host (None where device buffers are meta).
    """
    ok: bool | None = None
    for name in names:
        if rt.is_member(name):
            t = rt.alloc_device(TOUCH_NUMEL, torch.float32, tag="bench.touch")
            real = t.device.type != "meta"
            if real:
                t.copy_(_touch_values(rt.rank).to(t.device))
            else:
                t.fill_(1.0)
            await rt.all_reduce(t, ReduceOp.SUM, name, timeout_s=120)
            if real:
                want = sum(_touch_values(r) for r in rt.group_spec(name).ranks)
                good = bool(torch.equal(t.cpu(), want))
                if not good:
                    log.error("rank %d: all-reduce on %r after the wake is not bitwise right", rt.rank, name)
                ok = good if ok is None else (ok and good)
            rt.release(t)
    return ok


async def _first_use(rt: Runtime, lc: PGLifecycle) -> bool | None:
    """The training step's first use of its groups: a lazy wake's groups come up first (agreed on every rank)."""
    if lc.state is PGState.ACTIVE_LAZY:
        await lc.use(lc.groups)
    return await _touch(rt, list(lc.groups))


async def _timed_first_use(rt: Runtime, lc: PGLifecycle) -> tuple[float, float, bool | None]:
    """(first collectives on every group, the same again on the now-live groups, bitwise right), seconds."""
    t0 = rt.now()
    ok = await _first_use(rt, lc)
    t1 = rt.now()
    await _touch(rt, list(lc.groups))
    return t1 - t0, rt.now() - t1, ok


async def run_steps(
    rt: Runtime, lc: PGLifecycle, *, steps: int, train_s: float, rollout_s: float, sync_group: str | None
) -> list[StepTimes]:
    """``steps`` RL steps on one rank: train, pause, weight sync, rollout, resume; the switch phases timed, and the
    training step's first collectives after each wake (with the same collectives again, on live groups)."""
    out: list[StepTimes] = []
    await lc.start()
    for _ in range(steps):
        first_use, steady, ok = await _timed_first_use(rt, lc)
        if out:
            out[-1].bitwise_after_wake = ok
            out[-1].first_use_after, out[-1].steady_use_after = first_use, steady
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
        out.append(StepTimes(t1 - t0, t2 - t1, t4 - t3, held, used, state, first_use, paused_at=t0, woken_at=t3))
    if out:  # the last wake's first collectives
        first_use, steady, out[-1].bitwise_after_wake = await _timed_first_use(rt, lc)
        out[-1].first_use_after, out[-1].steady_use_after = first_use, steady
    return out


@dataclass
class PolicyResult:
    """Steady-state means over ranks and the measured steps for one policy.

    ``switch_cost`` is what the policy adds to a step ([Note: the switch cost] in :mod:`sim.machine.switch_cost`): the
    window's phases (``sleep``, ``update_weights``, ``wake_up``; ``total`` is their sum, the window) plus
    ``first_use_extra``, what the training step's first collectives after the wake cost beyond the same
    collectives on live groups. Policies are ranked by ``switch_cost``.
    """

    policy: str
    sleep: float
    update_weights: float
    wake_up: float
    total: float
    held_in_rollout_gib: float | None
    device_used_in_rollout_gib: float
    states: list[str] = field(default_factory=list)
    #: the training step's first collectives after the wake, slowest rank, mean of the steps
    first_use_after_wake: float | None = None
    #: the same collectives again right after them (live groups: the roles' own work), slowest rank, mean
    steady_use_after_wake: float | None = None
    #: the first use beyond that: lazy NCCL init of rebuilt groups, a lazy wake's bring-up, waits on other ranks
    first_use_extra: float | None = None
    #: the switch cost: ``total`` (the window) + ``first_use_extra``
    switch_cost: float | None = None
    #: every rank's first collectives after every wake were bitwise right (None: not checked)
    bitwise_after_wake: bool | None = None
    #: phases that may end ``poll_period_s`` later than given in some steps: a destroy of theirs waits for an NCCL
    #: proxy poll timeout closer than the poll phases move between steps (simulated results only)
    poll_late: tuple[str, ...] = ()
    #: the proxy poll period such a phase may run longer by (0 where none may)
    poll_period_s: float = 0.0
    #: the fraction of such walks that end a period late, fitted on probe records (the preset's ``poll_late_rate``)
    poll_late_rate: float = 0.0

    def expected(self, what: str) -> float:
        """The expected figure of a phase (``sleep``, ``update_weights``, ``wake_up``), of the window (``total``) or
        of the switch cost (``switch_cost``): the simulated one plus ``poll_late_rate`` poll periods for each phase
        that may end a period late. Its range is the simulated figure to a whole period more per such phase."""
        late = [ph for ph in self.poll_late if what in (ph, "total", "switch_cost")]
        base = getattr(self, what)
        if base is None:
            raise SwitchCostError(f"{self.policy}: no {what} (the first collectives after the wake were not timed)")
        return base + len(late) * self.poll_late_rate * self.poll_period_s


def summarize(policy: "PGPolicy | str", per_rank: list[list[StepTimes]], warmup: int) -> PolicyResult:
    """Mean over ranks of the steps after ``warmup`` (the slowest rank sets the window, so take the max).

    ``policy``: the row (a :class:`PGPolicy` or a :data:`VARIANTS` name).
    """
    name, _ = resolve(policy)
    steady = [steps[warmup:] for steps in per_rank]
    checks = [s.bitwise_after_wake for r in per_rank for s in r]
    timed = all(s.first_use_after is not None for r in steady for s in r)
    cost = steady_switch_cost(per_rank, warmup) if timed else None
    def window(attr: str) -> float:
        return statistics.mean(max(getattr(r[i], attr) for r in steady) for i in range(len(steady[0])))
    total = statistics.mean(max(r[i].total for r in steady) for i in range(len(steady[0])))
    return PolicyResult(
        policy=name,
        sleep=window("sleep"), update_weights=window("update_weights"), wake_up=window("wake_up"),
        total=total,
        held_in_rollout_gib=None if any(s.held_in_rollout is None for r in steady for s in r)
        else max(s.held_in_rollout for r in steady for s in r) / 2**30,
        device_used_in_rollout_gib=max(s.device_used_in_rollout for r in steady for s in r) / 2**30,
        states=[s.state_in_rollout for s in per_rank[0]],
        first_use_after_wake=first_use_after_wake(per_rank, warmup) if timed else None,
        steady_use_after_wake=window("steady_use_after") if timed else None,
        first_use_extra=None if cost is None else cost.total - total,
        switch_cost=None if cost is None else cost.total,
        bitwise_after_wake=None if any(c is None for c in checks) else all(checks),
        poll_late=tuple(ph for ph in PHASES if any(ph in s.poll_late for r in steady for s in r)),
    )


def simulate(policy: "PGPolicy | str", *, dp: int, tp: int, steps: int, train_s: float, rollout_s: float,
             cooldown_s: float, topology: "str | dict[str, Any] | None", cp: int = 1, pp: int = 1, ep: int = 1,
             etp: int | None = None, wake_proxies: bool = True) -> list[list[StepTimes]]:
    """Run the steps on a simulated ``tp * cp * dp * pp`` rank job over Megatron's group families
    (:func:`megatron_groups`, ``ep`` expert parallel); returns each rank's step times.

    ``topology``: a preset name or file, or preset data; None for the simulator's defaults.
    ``policy``: a :class:`PGPolicy` or a :data:`VARIANTS` name.
    ``wake_proxies``: the runtime wakes the NCCL proxy thread a destroy joins (TorchRuntime's default, True); False
    simulates a runtime without the waker, whose destroys wait for the proxy's poll ([Note: a destroy, with and
    without the proxy waker] in :mod:`sim.machine.collectives`).
    """
    row, pol = resolve(policy)
    from sim.world import SimWorld

    kwargs: dict[str, Any] = {}
    if topology:
        from sim.machine.collectives import NcclComm, TopologyCollectiveCost
        from sim.machine.memory import TopologyMemory
        from sim.machine.topology import Topology

        topo = Topology(topology) if isinstance(topology, dict) else Topology.from_preset(topology)
        # torch creates NCCL communicators lazily: the first collective of a (re)built group pays the init
        kwargs = dict(collective_cost=TopologyCollectiveCost(topo), memory=TopologyMemory(topo, record=False),
                      comm=NcclComm(topo, lazy_init=True, init_at_collective=True, proxy_wake=wake_proxies))
    specs = megatron_groups(tp=tp, dp=dp, cp=cp, pp=pp, ep=ep, etp=etp)
    world = SimWorld(dp * tp * cp * pp, trace=False, **kwargs)
    config = row_config(row, cooldown_s=cooldown_s)

    async def rank(rt):
        tp_group = next(s.name for s in specs if s.name.rstrip("0123456789") == "tp" and rt.rank in s.ranks)
        lc = PGLifecycle(rt, specs, config=config, plan=plan_rules(row, tp_group))
        return await run_steps(rt, lc, steps=steps, train_s=train_s, rollout_s=rollout_s, sync_group=tp_group)

    per_rank = world.run(rank)
    comm = kwargs.get("comm")
    if comm is not None:
        for steps_of_rank in per_rank:
            for st in steps_of_rank:
                spans = {"sleep": (st.paused_at, st.paused_at + st.sleep),
                         "update_weights": (st.paused_at + st.sleep, st.paused_at + st.sleep + st.update_weights),
                         "wake_up": (st.woken_at, st.woken_at + st.wake_up)}
                st.poll_late = tuple(ph for ph, (a, b) in spans.items() if comm.poll_late_between(a, b))
    return per_rank


def summarize_simulated(row: "PGPolicy | str", per_rank: list[list[StepTimes]], warmup: int,
                        topology: "str | dict[str, Any] | None") -> PolicyResult:
    """:func:`summarize` of :func:`simulate`'s steps, with the proxy poll period a marked phase may run longer by
    (``PolicyResult.poll_period_s``, where a phase is marked)."""
    res = summarize(row, per_rank, warmup)
    if not res.poll_late:
        return res
    return dataclasses.replace(res, poll_period_s=poll_period(topology), poll_late_rate=poll_late_rate(topology))


def poll_period(topology: "str | dict[str, Any] | None") -> float:
    """The NCCL proxy poll period of ``topology``'s multi-rank communicators (0 where not simulated)."""
    if not topology:
        return 0.0
    from sim.machine.topology import Topology

    topo = Topology(topology) if isinstance(topology, dict) else Topology.from_preset(topology)
    return topo.comm.for_size(2).proxy_poll_s


def poll_late_rate(topology: "str | dict[str, Any] | None") -> float:
    """The fitted fraction of walks over just-initialised groups that end a poll period late (0 where not fitted)."""
    if not topology:
        return 0.0
    from sim.machine.topology import Topology

    topo = Topology(topology) if isinstance(topology, dict) else Topology.from_preset(topology)
    return topo.comm.for_size(2).poll_late_rate


def first_use_after_wake(per_rank: list[list[StepTimes]], warmup: int) -> float:
    """Mean over the steps after ``warmup`` of the slowest rank's first collectives after the step's wake."""
    return statistics.mean(max(r[i].first_use_after for r in per_rank) for i in range(warmup, len(per_rank[0])))


def records_main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim.calibrate.switch_window RECORD.json ...``: each record's measured switch cost per policy, the window and
    the first use's extra beside it, and the ratio to DESTROY_DEFERRED's switch cost in the same record."""
    import argparse

    from sim.calibrate.records import MultiGpuRecord, load_record
    from sim.machine.switch_cost import recorded_switch_cost

    ap = argparse.ArgumentParser(prog="python -m sim.calibrate.switch_window", description=records_main.__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+")
    args = ap.parse_args(argv)
    for path in args.records:
        rec = load_record(path)
        if not isinstance(rec, MultiGpuRecord) or rec.switch_window is None:
            print(f"{path}: no switch window")
            continue
        res = rec.switch_window.results
        base = recorded_switch_cost(res, "DESTROY_DEFERRED") if "DESTROY_DEFERRED" in res else None
        print(rec.name)
        for policy in res:
            c = recorded_switch_cost(res, policy)
            if c is None:
                print(f"  {policy:<28} window {res[policy]['total']:.3f} s; first collectives after the wake not timed")
                continue
            ratio = f" = {c.total / base.total:.3f} x DESTROY_DEFERRED" if base is not None else ""
            print(f"  {policy:<28} switch cost {c.total:.3f} s (window {c.window:.3f} + first use {c.first_use_extra:.3f})"
                  + ratio)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(records_main())


__all__ = ["MEGATRON_DENSE", "MEGATRON_EXPERT", "MEGATRON_ORDER", "MeshError", "RELAX_FAMILIES", "VARIANTS",
           "megatron_groups", "megatron_sizes", "PolicyResult", "StepTimes", "first_use_after_wake", "mesh_groups",
           "plan_rules", "poll_late_rate", "records_main", "poll_period", "row_config", "summarize_simulated", "resolve", "row_names", "run_steps", "simulate", "summarize"]
