"""The colocated RL step in the simulator: per-phase prediction for a record of ``bench.rl``.

Theory of operation
-------------------
A record of ``bench/gpu/rl_step.py`` (``rl_step_<world>.json``) names the
state each rank offloads (bytes by category, the parameter count, the mesh),
the measured line rates of that run and, per step, what each phase spent.
:func:`predict_step` predicts each phase of one steady step:

* ``offload``: the **same store code** (:class:`refimpl.store.OffloadStore`)
  on one simulated rank of the preset (meta payloads), the offload of a state
  of that size (params + optimizer state, one tensor per parameter and per
  Adam moment) at the record's device-to-host line rate, plus the preset's
  measured store host time (:func:`sim.calibrate.calibration.host_overheads`);
* ``weight_sync``: the simulated reload of the params at the record's
  host-to-device line rate after a rollout of the measured length (so the
  driver's scrub of the trainer's own freed memory is long done), plus the
  scrub of the memory the rollout just freed when the roles free through the
  driver (``free == "driver"``: the simulator's scrub at the preset's
  ``h200_scrub`` rate, the KV cache's bytes given back right before the reload;
  nothing with a shared allocator), plus the gather of the full weights into
  the rollout copy: ``tensors`` x a per-tensor time (``full_tensor``, the cast
  and the copy of one parameter) and, over several ranks, the bytes each rank
  receives at the preset's NVLink rate;
* ``reload``: the simulated reload of the rest (optimizer state).

To each switching phase is added the lifecycle's own time, from the real
:class:`~refimpl.comm.PGLifecycle` run on a simulated world of the preset
(:func:`simulate_lifecycle`) as the RL step drives it: ``trainer.dp`` is an
NCCL group whose communicator a training collective initialises, the training
and the rollout last what the record measured, then pause / weight sync /
resume with the record's policy and cooldown. Beside it the result gives
``lifecycle_measured_s``: the phase's measured time minus the store / gather
time measured inside it, to see where a gap comes from.

Where the constants come from (``constants`` in the result names each):

* line rates: the record itself (measured in the same run, not a fit);
* store host time, the scrub rate, NCCL create / init costs: the preset
  (``calibrated/h200-1x``; ``calibrated/hgx-h200-8x`` for the lifecycle of more
  than one rank), each constant's ``source`` naming its record (runs 7-8, the
  comm-split and multigpu records), none of them the RL step's;
* the pause's destroy of the ``trainer.dp`` communicator the training step
  just used: no constant of its own. The preset's rule does it (NCCL's proxy
  thread polls every 500 ms and a destroy waits for its next poll timeout,
  counted from the end of the communicator's init; ``proxy_poll`` and
  ``destroy`` in the preset, fitted on the comm-split records), and it predicts
  the 0.295-0.301 s the RL records measure;
* :data:`LOOP_CONSTANTS`: what only the RL step measures, fitted by
  :func:`fit_loop_constants` on the record named in each constant's source:
  the per-tensor gather time on one rank comes from the 1-GPU driver record and
  is checked on the other records; the per-tensor gather time on two ranks has
  only one record so far (its ``weight_sync`` is then not an independent check).

What is **not** predicted but taken from the record, and named so in the
result (``inputs``): ``train`` and ``rollout`` (compute; the simulator does not
simulate it). :func:`compare` sets prediction against measurement per phase
(within ``TOLERANCE``, 15%).

    python -m sim.calibrate.colocated RECORD.json [--preset calibrated/h200-1x]
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
from typing import Any

import torch

from sim.calibrate.records import RecordError

log = logging.getLogger(__name__)

#: phases of the step (bench/rl/record.py PHASES)
PHASES = ("train", "offload", "rollout", "weight_sync", "reload")
#: the issue's tolerance for the prediction per phase
TOLERANCE = 0.15


def _steady(rec: dict[str, Any]) -> list[dict[str, Any]]:
    steps = rec.get("steps") or []
    if not steps:
        raise RecordError("the record has no 'steps'; pass an rl_step_<world>.json written by bench.rl")
    return steps[1:] if len(steps) > 1 else steps


def _mean(rows: list[dict[str, Any]], key: str, default: float = 0.0) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else default


def measured_phases(rec: dict[str, Any]) -> dict[str, float]:
    """Mean seconds per phase over the steady steps (all steps after the first, or the only one)."""
    use = {s["step"] for s in _steady(rec)}
    out = {}
    for ph in PHASES:
        vals = [sp["end_s"] - sp["start_s"] for sp in rec.get("spans", []) if sp["phase"] == ph and sp["step"] in use]
        if not vals:
            raise RecordError(f"the record has no span of phase {ph!r} in steps {sorted(use)}")
        out[ph] = statistics.fmean(vals)
    return out


#: the RL step's own constants (see the module docstring), each fitted by :func:`fit_loop_constants` on the
#: record its source names; ``tests/sim/calibrate/test_colocated.py`` refits them from the committed records
LOOP_CONSTANTS: dict[str, dict[str, Any]] = {
    "gather_per_tensor_1rank_s": {
        "value": 1.795e-4,
        "source": "fitted on bench/results/2026-11-30-h200x2-all-policies/loop/rl1/rl_step_1.json: gather_copy_s "
                  "(full_tensor, cast to bf16, copy into the rollout weights) mean of steps 1-2, 0.0436 s over "
                  "243 parameters",
    },
    "gather_per_tensor_multi_s": {
        "value": 4.753e-4,
        "source": "fitted on bench/results/2026-11-30-h200x2-all-policies/loop/rl2/rl_step_2.json (2 x H200, mesh [1, 2]): "
                  "gather_copy_s mean of steps 1-2, 0.1211 s, less the bytes received at the preset's NVLink "
                  "rate (5.6 ms), over 243 parameters. The only multi-rank record so far: the 2-rank weight sync "
                  "is fitted, not checked, until another record exists",
    },
}

#: the preset the lifecycle of more than one rank runs on (one with enough GPUs and multi-rank NCCL costs)
MULTI_PRESET = "calibrated/hgx-h200-8x"


def _shape(name: str, tensors: int, params_bytes: int, optim_bytes: int):
    """A state of ``tensors`` fp32 params (``params_bytes``) and two Adam moments per param (``optim_bytes``)."""
    from refimpl.store import Category
    from sim.presets.bench_shapes import StateShape, TensorSpec

    n = max(1, tensors)
    p_numel = max(1, params_bytes // 4 // n)
    o_numel = max(1, optim_bytes // 4 // (2 * n))
    specs = [TensorSpec(Category.PARAMS, f"p{i}", p_numel, torch.float32) for i in range(n)]
    specs += [TensorSpec(Category.OPTIMIZER, f"o{i}.{m}", o_numel, torch.float32) for i in range(n) for m in ("m", "v")]
    return StateShape(name, tuple(specs))


def _sim_times(shape, preset: str, d2h_bps: float, h2d_bps: float, *, gap_s: float = 0.0,
               other_bytes: int = 0) -> tuple[float, float]:
    """Steady offload and reload seconds of ``shape`` from the simulator (copies only), with ``gap_s`` between
    the offload and the reload at the end of which another role gives ``other_bytes`` back to the driver."""
    from sim.calibrate.calibration import _simulate, _topology

    out = _simulate(shape, _topology(preset, d2h_bps), 1, None, gap_s, other_bytes)
    back = out if h2d_bps == d2h_bps else _simulate(shape, _topology(preset, h2d_bps), 1, None, gap_s, other_bytes)
    return out[-1]["offload_s"], back[-1]["reload_s"]


@functools.lru_cache(maxsize=64)
def simulate_lifecycle(preset: str, world: int, policy: str, cooldown_s: float, train_s: float = 0.0,
                       rollout_s: float = 0.0, steps: int = 3, *, sync_needs_groups: bool = True,
                       warm_rebuilt: bool = False, proxy_wake: bool = False,
                       groups: tuple[tuple[str, tuple[int, ...]], ...] | None = None,
                       comm_rule: str = "log2",
                       init_measured: tuple[tuple[int, float], ...] = (),
                       channel_cap: int | None = None) -> dict[str, float]:
    """Seconds of the lifecycle's pause, weight sync (with an empty sync function) and resume of the NCCL group
    ``trainer.dp`` over ``world`` ranks (or of ``groups``: (name, ranks) pairs every rank makes and the lifecycle
    manages, each rank using those it is a member of, as the RL step's mesh groups) in the steady step (the last of ``steps``), and what training's first
    all-reduce after the wake takes beyond the same all-reduce in a step without a switch (``first_use_extra``:
    the lazy init of a rebuilt communicator), by the real :class:`~refimpl.comm.PGLifecycle` on a
    :class:`~sim.world.SimWorld` of the preset, driven as bench.rl drives it: a training collective on
    the group (its communicator initialised), ``train_s`` of training, the pause, ``rollout_s`` of rollout, the
    weight sync, the resume. The preset's NCCL create / init / destroy costs (a destroy waits for the proxy
    thread's next poll unless ``proxy_wake``) and the cooldown apply. ``sync_needs_groups=False``: the plan
    rules say the sync needs none of the groups (``GroupPlanRules(sync_groups=set())``, as the RL step has
    them); ``warm_rebuilt``: :class:`~refimpl.comm.LifecycleConfig`'s; ``comm_rule``: how the preset's
    communicator costs grow past two ranks (:data:`sim.presets.SIZE_RULES`; "ring" with the connection share of
    NCCL's log, :data:`sim.calibrate.nccl_init_log.CONNECT_SHARE_2X_H200`); ``init_measured``: a communicator's
    creation measured past two ranks, ``((ranks, seconds), ...)``, in place of the rule's
    (:meth:`sim.presets.CommParams.with_measured_init`); ``channel_cap``: the communicators of two or more ranks made
    with at most this many channels (NCCL's ``maxCTAs``), their connection scaled by the channels kept of the log's
    (:meth:`sim.presets.CommParams.with_channel_cap`)."""
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.comm.group_plan import GroupPlanRules
    from refimpl.runtime import GroupSpec
    from sim.machine.collectives import NcclComm, TopologyCollectiveCost
    from sim.machine.flows import FlowTransport
    from sim.machine.memory import TopologyMemory
    from sim.calibrate.switch_window import _touch
    from sim.machine.topology import Topology
    from sim.world import SimWorld

    if train_s < 0 or rollout_s < 0:
        raise ValueError(f"train_s and rollout_s must be >= 0, got {train_s} and {rollout_s}")
    topo = Topology.from_preset(preset)
    if comm_rule != "log2":
        from sim.calibrate.nccl_init_log import CONNECT_SHARE_2X_H200

        topo.comm = topo.comm.with_size_rule(comm_rule, CONNECT_SHARE_2X_H200)
    if init_measured:
        topo.comm = topo.comm.with_measured_init(init_measured)
    if channel_cap is not None:
        from sim.calibrate.nccl_init_log import (CONNECT_SHARE_2X_H200, PER_EXCHANGE_SHARE_2X_H200,
                                                 RING_CHANNELS_2X_H200)

        topo.comm = topo.comm.with_channel_cap(channel_cap, RING_CHANNELS_2X_H200, CONNECT_SHARE_2X_H200,
                                               PER_EXCHANGE_SHARE_2X_H200)
    world_ = SimWorld(world, transport=FlowTransport(topo), collective_cost=TopologyCollectiveCost(topo),
                      memory=TopologyMemory(topo, record=False),
                      comm=NcclComm(topo, init_at_collective=True, proxy_wake=proxy_wake), trace=False)

    made = groups if groups is not None else (("trainer.dp", tuple(range(world))),)
    names = [name for name, _ in made]
    if not names or any(not ranks or max(ranks) >= world or min(ranks) < 0 for _, ranks in made):
        raise ValueError(f"groups must name ranks in [0, {world}), got {groups!r}")

    async def job(rt):
        """The RL step's lifecycle calls, as bench.rl makes them."""
        for name, ranks in made:
            await rt.new_group(GroupSpec(name, tuple(ranks), backend="nccl"))
        lc = PGLifecycle(rt, names, plan=GroupPlanRules(sync_groups=None if sync_needs_groups else set()),
                         config=LifecycleConfig(policy=PGPolicy[policy], cooldown_s=cooldown_s, agree_timeout_s=120,
                                                canary_timeout_s=60, control_group="trainer.control",
                                                warm_rebuilt=warm_rebuilt))
        await lc.start()
        await _touch(rt, names)
        a = rt.now()
        await _touch(rt, names)
        steady = rt.now() - a
        out = []

        async def no_sync():
            return None

        for _ in range(steps):
            a = rt.now()
            await _touch(rt, names)  # the training step's loss all-reduce
            first = rt.now() - a
            if out:
                out[-1]["first_use_extra"] = max(0.0, first - steady)
            await rt.sleep(train_s)
            a = rt.now()
            await lc.pause()
            b = rt.now()
            await rt.sleep(rollout_s)
            c = rt.now()
            await lc.weight_sync(no_sync)
            d = rt.now()
            await lc.resume()
            out.append({"offload": b - a, "weight_sync": d - c, "reload": rt.now() - d})
        a = rt.now()
        await _touch(rt, names)
        out[-1]["first_use_extra"] = max(0.0, rt.now() - a - steady)
        return out[-1]

    per_rank = world_.run(job)
    return {ph: max(r[ph] for r in per_rank) for ph in ("offload", "weight_sync", "reload", "first_use_extra")}


def lifecycle_settings(rec: dict[str, Any]) -> dict[str, Any]:
    """What of a record decides the lifecycle's simulation besides policy and cooldown: whether the weight sync
    needs the role's groups (records before the RL step declared it: yes), whether rebuilt groups are warmed in
    the resume (off the sequential mode, since it was added) and whether destroys wake the NCCL proxy."""
    cfg = rec.get("config", {})
    return {"sync_needs_groups": not rec.get("sync_needs_no_group", False),
            "warm_rebuilt": bool(rec.get("warm_rebuilt", False)),
            "proxy_wake": bool(rec.get("wake_proxies", False)),
            "mode": cfg.get("mode", "sequential")}


def _nvlink_bps(preset: str) -> float:
    from sim.machine.topology import Topology

    nv = Topology.from_preset(preset).constants.get("nvlink_eff_h100")
    return 450e9 * (nv.value if nv is not None else 1.0)


def gather_bytes_s(params_bytes: float, world: int, preset: str = MULTI_PRESET) -> float:
    """Seconds the all-gather of the full weights takes for the bytes alone: each rank receives
    ``(world - 1) / world`` of ``params_bytes * world`` at the preset's NVLink rate (0 on one rank)."""
    if world <= 1:
        return 0.0
    return params_bytes * world * (world - 1) / world / _nvlink_bps(preset)


def fit_loop_constants(rec: dict[str, Any]) -> dict[str, float]:
    """The :data:`LOOP_CONSTANTS` one record gives: the per-tensor gather time of its world size
    (``gather_per_tensor_1rank_s`` or ``gather_per_tensor_multi_s``: ``gather_copy_s`` less the bytes at
    NVLink rate, per parameter); means over the steady steps."""
    steady = _steady(rec)
    world = int(rec.get("world_size", 1))
    tensors = int(rec.get("initial_sync", {}).get("tensors", 0))
    if tensors < 1:
        raise RecordError("the record has no 'initial_sync.tensors' (the parameter count of the model)")
    gather = _mean(steady, "gather_copy_s") - gather_bytes_s(_mean(steady, "params_bytes"), world)
    key = "gather_per_tensor_1rank_s" if world == 1 else "gather_per_tensor_multi_s"
    return {key: gather / tensors}


def _loop_constants(constants: dict[str, float] | None) -> dict[str, float]:
    """:data:`LOOP_CONSTANTS`' values, with those in ``constants`` (name -> value) in their place."""
    loop = {k: v["value"] for k, v in LOOP_CONSTANTS.items()}
    for k, v in (constants or {}).items():
        if k not in loop:
            raise ValueError(f"unknown loop constant {k!r}; known: {sorted(loop)}")
        loop[k] = float(v)
    return loop


def _lifecycle_measured(measured: dict[str, float], steady: list[dict[str, Any]]) -> dict[str, float]:
    """What of each switching phase the record measured beyond the store's own work (and the gather's)."""
    return {
        "offload": max(0.0, measured["offload"] - _mean(steady, "offload_store_s")),
        "weight_sync": max(0.0, measured["weight_sync"] - _mean(steady, "reload_params_store_s")
                           - _mean(steady, "gather_copy_s")),
        "reload": max(0.0, measured["reload"] - _mean(steady, "reload_rest_store_s")),
    }


def predict_step(rec: dict[str, Any], *, preset: str = "calibrated/h200-1x", free: str | None = None,
                 kv_bytes: float | None = None, constants: dict[str, float] | None = None,
                 gather_ranks: int | None = None) -> dict[str, Any]:
    """Predicted seconds per phase of a steady step of ``rec``; see the module docstring.

    ``free`` overrides the record's ``config.free`` (``"driver"``/``"allocator"``);
    ``kv_bytes`` the bytes the rollout freed (default: the record's KV peak or plan);
    ``constants`` overrides values of :data:`LOOP_CONSTANTS` (name -> value);
    ``gather_ranks``: the ranks a parameter is sharded over, which the weight sync's gather receives from (default:
    the record's world size; an HSDP mesh's shard dimension is smaller).
    """
    from sim.calibrate.calibration import host_overheads

    steady = _steady(rec)
    line = rec.get("line") or {}
    if "d2h_gbps" not in line or "h2d_gbps" not in line:
        raise RecordError("the record has no measured 'line' rates (d2h_gbps, h2d_gbps)")
    free = free or rec.get("config", {}).get("free", "driver")
    if free not in ("driver", "allocator"):
        raise ValueError(f"free must be 'driver' or 'allocator', got {free!r}")
    loop = _loop_constants(constants)
    world = int(rec.get("world_size", 1))
    tensors = int(rec.get("initial_sync", {}).get("tensors", 0))
    if tensors < 1:
        raise RecordError("the record has no 'initial_sync.tensors' (the parameter count of the model)")
    measured = measured_phases(rec)
    off_b = _mean(steady, "offload_bytes")
    params_b = _mean(steady, "params_bytes") or off_b / 3
    optim_b = max(0.0, off_b - params_b)
    d2h, h2d = line["d2h_gbps"] * 1e9, line["h2d_gbps"] * 1e9
    if kv_bytes is None:
        kv_bytes = _mean(steady, "rollout_peak_extra_bytes") or _mean(steady, "kv_cache_bytes_planned")
    gap = measured["rollout"]  # the trainer's own freed memory is scrubbed during the rollout
    full_p = _shape("params", tensors, int(params_b), int(optim_b))
    off_s, _ = _sim_times(full_p, preset, d2h, h2d, gap_s=gap)
    params_only = _shape("params-only", tensors, int(params_b), 0)
    params_only = type(params_only)(params_only.name, tuple(t for t in params_only.tensors if t.category.value == "params"))
    rest = type(full_p)("rest", tuple(t for t in full_p.tensors if t.category.value != "params"))
    _, reload_params_s = _sim_times(params_only, preset, d2h, h2d, gap_s=gap)
    scrub_s = 0.0
    if free == "driver" and kv_bytes:  # the KV cache goes back to the driver right before the reload
        _, with_scrub = _sim_times(params_only, preset, d2h, h2d, gap_s=gap, other_bytes=int(kv_bytes))
        scrub_s = max(0.0, with_scrub - reload_params_s)
    _, reload_rest_s = _sim_times(rest, preset, d2h, h2d, gap_s=gap)
    host_all = host_overheads(preset, len(full_p.tensors), full_p.nbytes)
    host_p = host_overheads(preset, len(params_only.tensors), params_only.nbytes)
    host_r = host_overheads(preset, len(rest.tensors), rest.nbytes)
    per_tensor = loop["gather_per_tensor_1rank_s"] if world == 1 else loop["gather_per_tensor_multi_s"]
    gather_s = tensors * per_tensor + gather_bytes_s(params_b, world if gather_ranks is None else gather_ranks)
    cfg = rec.get("config", {})
    lc_preset = preset if world == 1 else MULTI_PRESET  # a preset with enough GPUs for the world
    settings = lifecycle_settings(rec)
    lifecycle = dict(simulate_lifecycle(lc_preset, world, str(cfg.get("lifecycle_policy", "DESTROY_DEFERRED")),
                                        float(cfg.get("cooldown_s", 0.2)), round(measured["train"], 4),
                                        round(measured["rollout"], 4), sync_needs_groups=settings["sync_needs_groups"],
                                        warm_rebuilt=settings["warm_rebuilt"], proxy_wake=settings["proxy_wake"]))
    first_use_extra = lifecycle.pop("first_use_extra")
    parts = {
        "offload": {"sim_copies_s": off_s, "store_host_s": host_all["offload_host_s"]},
        "weight_sync": {"sim_copies_s": reload_params_s, "store_host_s": host_p["reload_host_s"],
                        "scrub_s": scrub_s, "gather_s": gather_s},
        "reload": {"sim_copies_s": reload_rest_s, "store_host_s": host_r["reload_host_s"]},
    }
    predicted = {ph: sum(parts[ph].values()) + lifecycle[ph] for ph in parts}
    predicted["train"] = measured["train"]
    predicted["rollout"] = measured["rollout"]
    return {
        "preset": preset, "free": free, "world_size": world, "offload_bytes": off_b, "params_bytes": params_b,
        "kv_bytes": kv_bytes, "line": dict(line),
        "phase_s": {ph: predicted[ph] for ph in PHASES},
        "parts": parts,
        "lifecycle_s": lifecycle, "lifecycle_preset": lc_preset, "first_use_extra_s": first_use_extra,
        "lifecycle_settings": settings,
        "inputs": {"train": measured["train"], "rollout": measured["rollout"]},
        "constants": {"line": "the record's own line rates", "store/scrub/NCCL": f"preset {preset!r} "
                      f"(lifecycle: {lc_preset!r}), each constant's source in the preset file",
                      **{k: {"value": loop[k], "source": LOOP_CONSTANTS[k]["source"] if loop[k] ==
                             LOOP_CONSTANTS[k]["value"] else "given by the caller"} for k in loop}},
        "lifecycle_measured_s": _lifecycle_measured(measured, steady),
        "switch_overhead_s": predicted["offload"] + predicted["weight_sync"] + predicted["reload"],
    }


def compare(rec: dict[str, Any], pred: dict[str, Any] | None = None, *, preset: str = "calibrated/h200-1x",
            tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Prediction against measurement per phase: ratio and whether it is within ``tolerance``."""
    pred = pred or predict_step(rec, preset=preset)
    meas = measured_phases(rec)
    rows = {}
    for ph in PHASES:
        m, p = meas[ph], pred["phase_s"][ph]
        ratio = p / m if m > 0 else float("inf")
        rows[ph] = {"measured_s": m, "predicted_s": p, "ratio": ratio, "within": abs(ratio - 1) <= tolerance,
                    "from_record": ph in ("train", "rollout")}
    return {"tolerance": tolerance, "phases": rows,
            "predicted_phases_within": all(r["within"] for ph, r in rows.items() if not r["from_record"])}


def main(argv: list[str] | None = None) -> int:
    """CLI: print the per-phase comparison of a record."""
    ap = argparse.ArgumentParser(description="Simulated colocated RL step against a bench.rl record")
    ap.add_argument("record")
    ap.add_argument("--preset", default="calibrated/h200-1x")
    ap.add_argument("--fit", action="store_true", help="also print the LOOP_CONSTANTS this record gives")
    ap.add_argument("--policy", default=None, help="predict with this PGPolicy instead of the record's "
                    "(prints the prediction only: the record measured another configuration)")
    ap.add_argument("--free", choices=("driver", "allocator"), default=None,
                    help="predict with this way of freeing instead of the record's (prediction only)")
    a = ap.parse_args(argv)
    try:
        with open(a.record) as f:
            rec = json.load(f)
        if a.policy or a.free:
            from refimpl.comm import PGPolicy

            if a.policy:
                rec.setdefault("config", {})["lifecycle_policy"] = PGPolicy.parse(a.policy).name
            pred = predict_step(rec, preset=a.preset, free=a.free)
            print(f"predicted with policy {rec.get('config', {}).get('lifecycle_policy')} and free {pred['free']} "
                  "(train and rollout from the record):")
            for ph in PHASES:
                print(f"{ph:12s} predicted {pred['phase_s'][ph]:.4f} s")
            print(f"switch overhead predicted {pred['switch_overhead_s']:.4f} s")
            return 0
        pred = predict_step(rec, preset=a.preset)
        cmp = compare(rec, pred)
    except (OSError, ValueError) as e:  # RecordError is a ValueError
        print(f"sim.calibrate.colocated: {a.record}: {e}", file=sys.stderr)
        return 2
    for ph, r in cmp["phases"].items():
        tag = " (from the record)" if r["from_record"] else ""
        print(f"{ph:12s} measured {r['measured_s']:.4f} s  predicted {r['predicted_s']:.4f} s  "
              f"x{r['ratio']:.3f}  {'ok' if r['within'] else 'OFF'}{tag}")
    print(json.dumps({"parts": pred["parts"], "inputs": pred["inputs"], "lifecycle_s": pred["lifecycle_s"]}, indent=1))
    if a.fit:
        print(json.dumps({"fit": fit_loop_constants(rec)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
