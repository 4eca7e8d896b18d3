"""A colocated RL step, end to end, on one rank: the roles set up, the steps run, the record made.

Each rank holds two roles on one device: the trainer (:mod:`bench.rl.trainer`: a ``transformers`` causal LM
built from a config, random weights, no downloads, sharded with FSDP2, its AdamW state registered with an
:class:`~refimpl.store.OffloadStore`) and the rollout (:mod:`bench.rl.rollout`: an unsharded copy of the
weights that generates into a pre-sized KV cache). The lifecycle (:class:`~refimpl.comm.PGLifecycle`) manages
the trainer's groups: with a managed mesh (the default) the FSDP mesh's own groups, rebuilt in place so FSDP2 and
the mesh follow each rebuild, else ``trainer.dp`` beside ``init_device_mesh``'s groups (:mod:`bench.rl.groups`);
the steps' phases are :mod:`bench.rl.phases`, the record :mod:`bench.rl.record`.
"""
from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import asdict
from typing import Any

import torch

from bench.rl.clock import PhaseClock, line_rates
from bench.rl.config import StepConfig, model_config
from bench.rl.early_copies import StepInBackward
from bench.rl.gc_watch import GcWatch, freeze_setup
from bench.rl.groups import CONTROL_GROUP, NCCL_CHANNEL_ENV, TrainerGroups, trainer_groups
from bench.rl.phases import ColocatedStep
from bench.rl.record import phase_spans, public_fields, resume_ahead_spans, runtime_spans, summarize, write_outputs
from bench.rl.rollout import build_rollout
from bench.rl.trainer import Trainer, build_trainer
from bench.rl.weights import RolloutWeights

logger = logging.getLogger(__name__)


def run_step(rank: int, world_size: int, cfg: StepConfig) -> dict[str, Any]:
    """Run ``cfg.steps`` colocated steps on this rank (``torch.distributed`` already initialised); return the record."""
    from refimpl.torch_runtime import TorchRuntime

    device = _device(cfg, rank)
    rt = TorchRuntime(device)
    if cfg.pacer_switch_interval_us is not None:  # 0: the interpreter's own ([Note: the feeder's GIL])
        rt.pacer_switch_interval_s = cfg.pacer_switch_interval_us * 1e-6 or None
    clock = PhaseClock(device)
    rt_t0 = rt.now() - (time.perf_counter() - clock.t0)  # the runtime's clock at the phases' zero
    rec = _versions(cfg, world_size, device)
    world_start = _world_collectives(rt)
    groups = trainer_groups(rt, cfg, world_size, device)
    lc = start_lifecycle(rt, cfg, groups, device, rec)
    torch.manual_seed(cfg.seed)
    mcfg = model_config(cfg.tiny)
    mixed = cfg.mixed_precision if cfg.mixed_precision is not None else device.type == "cuda"
    trainer = build_trainer(cfg, mcfg, device, groups.mesh, mixed)
    if groups.managed is not None:  # FSDP2's states and the params' meshes follow each rebuild of the mesh's groups
        groups.managed.follow(trainer.model)
    rec["params"], rec["mesh"] = trainer.params, list(trainer.mesh.shape)
    rec["mesh_dims"], rec["mesh_groups"] = list(trainer.mesh.mesh_dim_names or ()), list(groups.lifecycle)
    # which groups carry what (a managed mesh of one rank carries nothing: no communicator at all)
    rec["trainer_groups"] = {"managed_mesh": groups.managed is not None, "lifecycle": list(groups.lifecycle),
                             "loss": list(groups.loss), "check": groups.check, "sync": sorted(groups.sync)}
    rollout_dtype = torch.bfloat16 if mixed else torch.float32
    rollout = build_rollout(mcfg, device, rollout_dtype)
    store = open_store(rt, device, cfg, trainer, rec)
    weights = RolloutWeights(rt, device, trainer.model, rollout, rollout_dtype, check_group=groups.check,
                             gather_in_rollout_dtype=cfg.gather_in_rollout_dtype, clock_t0=clock.t0)
    if cfg.sync_in_backward:  # each unit gathered into the rollout copy right after its step in the backward
        weights.set_units(trainer.units)
        trainer.stepper.on_stepped = weights.sync_unit
    weights.sync()  # the rollout starts from the trainer's weights
    rec["initial_sync"] = weights.check(weights.trainer_digests())
    run = ColocatedStep(cfg, rank, world_size, rt=rt, clock=clock, lifecycle=lc, store=store, trainer=trainer,
                        rollout=rollout, weights=weights, mcfg=mcfg, rec=rec, groups=groups)
    # [Note: the collector in the switch] (bench/rl/gc_watch.py): the setup's objects frozen, every collection timed
    rec["gc_freeze"] = {"on": cfg.gc_freeze, "frozen_objects": freeze_setup() if cfg.gc_freeze else 0}
    watch = GcWatch(clock.t0).start()
    try:
        for step in range(cfg.steps):
            run.switch_step(step)
            if rank == 0:  # a partial record after every step, in case the run is cut short
                _write_partial(rec, run, rt_t0)
    finally:
        watch.stop()
        if cfg.gc_freeze:
            gc.unfreeze()
    rec["gc_collections"], rec["gc"] = watch.collections(), watch.summary()
    rec["after_steps"] = run.after_steps()
    rec["mode"] = cfg.mode
    rec["spans"] = phase_spans(clock.spans)
    rec["steps"] = [public_fields(x) for x in run.steps]
    rec["runtime_spans"] = runtime_spans(rt, rt_t0)
    resume_ahead_spans(rec)
    rec["lifecycle_stats"] = asdict(lc.stats)
    rec["store_phases"] = dict(store.stats().phases)
    rec["allocator_by_phase"] = clock.allocator
    rec["sm_copies"] = int(getattr(rt, "sm_copies", 0))  # host-to-device copies made on SMs (--stream-sm-ctas)
    rec["process_groups_at_end"] = rt.live_process_groups()
    # collectives on the world group over the run (a managed mesh runs none: its NCCL communicator never exists)
    rec["world_collectives"] = {"start": world_start, "end": _world_collectives(rt)}
    rec["summary"] = summarize(rec)
    groups.close()
    store.close()
    return rec


def _world_collectives(rt) -> int | None:
    """Collectives issued on the default (world) group so far in this process (None without one)."""
    return next((g["collectives"] for g in rt.live_process_groups() if g["default"]), None)


def _device(cfg: StepConfig, rank: int) -> torch.device:
    """This rank's device: the CUDA device of ``LOCAL_RANK`` (else the rank), made current; or the CPU."""
    if cfg.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _versions(cfg: StepConfig, world_size: int, device: torch.device) -> dict[str, Any]:
    """The record's head: the configuration, the world, the device and the versions the run used."""
    rec: dict[str, Any] = {"config": asdict(cfg), "world_size": world_size, "device": str(device),
                           "torch": torch.__version__, "errors": []}
    try:
        import transformers

        rec["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    if device.type == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(device)
    return rec


def start_lifecycle(rt, cfg: StepConfig, groups: TrainerGroups, device: torch.device, rec: dict[str, Any]):
    """The trainer's groups (``groups.lifecycle``) under a started :class:`~refimpl.comm.PGLifecycle` with the
    configured policy (``auto``: :func:`~refimpl.torch_runtime.switch_policy.default_switch_policy`, its choice
    and reason recorded)."""
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.comm.group_plan import GroupPlanRules

    policy, parallel = cfg.lifecycle_policy, False
    if policy == "auto":
        from refimpl.torch_runtime.switch_policy import default_switch_policy

        chosen = default_switch_policy(device)
        policy, parallel = chosen.policy.name, chosen.parallel_destroy
        rec["policy_choice"] = {"policy": policy, "parallel_destroy": parallel, "reason": chosen.reason}
    rec["policy"] = policy
    # a weight sync that needs none of the lifecycle's groups (sync first, or a sync over a mesh the lifecycle does
    # not manage) leaves them down through it (every policy); off the sequential mode the resume creates the
    # rebuilt communicators (warm_rebuilt) beside the reload's copies instead of at the first collective, except
    # on a managed mesh of one rank, whose group carries no collective (its communicator is never created)
    warm = cfg.mode != "sequential" and bool(groups.loss or groups.managed is None or rt.world_size > 1)
    rec["wake_proxies"] = bool(getattr(rt, "wake_proxies", False))
    rec["sync_needs_no_group"] = not groups.sync
    rec["warm_rebuilt"] = warm
    lc = PGLifecycle(rt, list(groups.lifecycle), plan=GroupPlanRules(sync_groups=set(groups.sync)),
                     config=LifecycleConfig(policy=PGPolicy[policy], cooldown_s=cfg.cooldown_s, agree_timeout_s=120,
                                            canary_timeout_s=60, control_group=CONTROL_GROUP,
                                            parallel_destroy=parallel, warm_rebuilt=warm))
    lc.sync.start()
    return lc


def open_store(rt, device: torch.device, cfg: StepConfig, trainer: Trainer, rec: dict[str, Any]):
    """The offload store with the trainer's model and optimizers attached (with early copies, the trainer's
    stepper set); records its setup time, the copy line rates and the order a reload is issued in."""
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.config import FIRST_USE_ORDER

    window = ((cfg.stream_window_mib or 0) << 20) or None  # None and 0: every piece queued at once (the default)
    t = time.perf_counter()
    store = OffloadStore(rt, config=StoreConfig(empty_cache=(cfg.free == "driver"), stream_window_bytes=window,
                                                stream_sm_ctas=cfg.stream_sm_ctas or None))
    rec["store_setup_s"] = time.perf_counter() - t  # with --stream-sm-ctas: the copy kernel's build (once)
    store.attach_module(trainer.model, name="model")
    optims = trainer.optims
    for i, o in enumerate(optims):
        store.attach_optimizer(o, name="optim" if len(optims) == 1 else f"optim.{i}")
    if cfg.offload_in_backward:
        trainer.stepper = StepInBackward(trainer.units, optims, store)
    rec["offload_in_backward"] = cfg.offload_in_backward
    # the store digests every early copy at copy_early and at the offload ([Note: early copies]); the simulator's
    # predictions of this record pay the backward's digests (sim.calibrate.switch_modes.content_digests_s)
    rec["early_content_check"] = cfg.offload_in_backward
    rec["line"] = line_rates(device, cfg.line_mib << 20, rt)
    # the order the store issues a reload in (sim.calibrate.switch_modes reads it): a training step's first use
    rec["reload_order"] = "first_use"
    # with overlap_reload, the streamed reload in the step's own order (buffers, params in the forward's order, then
    # each unit's optimizer state in the backward's), finished after the step instead of before its first optimizer step
    rec["overlap_reload"] = bool(cfg.overlap_reload)
    rec["pacer_switch_interval_s"] = rt.pacer_switch_interval_s  # the feeder's GIL, while a paced reload is held
    # the switch's background moves' ([Note: the GIL's switch interval]); None: the interpreter's own
    rec["thread_switch_interval_s"] = cfg.thread_switch_interval_s if cfg.mode != "sequential" else None
    # what NCCL's environment says of a communicator's channels beside --nccl-max-ctas (config.nccl_max_ctas)
    rec["nccl_channel_env"] = {k: os.environ.get(k) for k in NCCL_CHANNEL_ENV}
    rec["reload_categories"] = [c.value for c in sorted(FIRST_USE_ORDER, key=FIRST_USE_ORDER.get)]
    return store


def _write_partial(rec: dict[str, Any], run: ColocatedStep, rt_t0: float) -> None:
    """The record so far (``"partial": True``) written to the run's output folder; a failure only logged."""
    try:
        write_outputs({**rec, "steps": [public_fields(x) for x in run.steps], "partial": True,
                       "runtime_spans": runtime_spans(run.rt, rt_t0), "spans": phase_spans(run.clock.spans)},
                      run.cfg.out)
    except OSError as e:
        logger.warning("partial record not written: %s", e)


__all__ = ["open_store", "run_step", "start_lifecycle"]
