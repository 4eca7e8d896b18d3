"""The phases of one colocated RL step on one rank, in order, each timed between device synchronisations.

``train``       forward/backward/step on the previous rollout's sequences (with ``--logprob-pass`` after a
                no-grad forward computing their old log-probs, as a PPO/GRPO step does before its update;
                :meth:`bench.rl.trainer.Trainer.old_logprobs`); the loss is averaged over every
                rank (over the mesh's groups, or ``trainer.dp`` without a managed mesh:
                :mod:`bench.rl.groups`). With early copies each FSDP unit steps its own AdamW inside
                the backward and, in a step before a switch, hands its params and state to
                ``OffloadStore.copy_early`` (:class:`bench.rl.early_copies.StepInBackward`): the offload's
                copies run here; with the sync in the backward each unit's params are gathered into the
                rollout copy right after too, and the ``weight_sync`` phase only ends it.
``offload``     :meth:`PGLifecycle.pause` with ``release_memory`` = the store's offload of params, grads and
                optimizer state.
``rollout``     the rollout role allocates its KV cache, generates, frees it, and hands its sequences to the
                trainer through the host (:mod:`bench.rl.rollout`); with ``batch_ahead`` (the default) the
                next training batch goes to the device at the rollout's end, before the switch queues its
                reloads (a pageable copy larger than CUDA stages inline queues behind a streamed reload's
                pinned copies: docs/comm.md). With ``--free allocator`` (the default) the store runs with
                ``empty_cache=False`` and the reload reuses the blocks the KV cache gave back to torch's
                allocator; ``driver``: ``empty_cache`` after the rollout (docs/store.md compares the two).
``weight_sync`` :meth:`PGLifecycle.weight_sync`: reload the params, gather each full parameter
                (``DTensor.full_tensor``) and copy it into the rollout weights
                (:class:`bench.rl.weights.RolloutWeights`); where the gather runs over the lifecycle's
                groups (a managed mesh of several ranks) :meth:`PGLifecycle.resume` brings them back first and
                the sync runs from ACTIVE (:meth:`bench.rl.modes.SwitchDriver.weight_sync`). With ``sync_first`` this phase comes right after
                ``train``, before the offload (verl's order: the rollout generates with the weights just
                trained): the gather reads the params where training left them, nothing is reloaded for it,
                and the lifecycle's groups are still up (the sync uses none of them, so it is not under
                :meth:`PGLifecycle.weight_sync`; ``PAUSED_LIVE`` then never arms preservation).
``reload``      :meth:`PGLifecycle.resume` (unless the weight sync ran it) and the store's reload of the rest.

How the offload, weight sync and reload run their copies beside the lifecycle is the mode's
(:class:`bench.rl.modes.SwitchDriver`). After every sync, outside the timed phases, at a quiet point after the
next training step, the rollout's weights are checked bitwise against the trainer's digests taken when they
were synced (:meth:`ColocatedStep.quiet_point`). After the last switch come the training step after it (its
cost belongs to that switch) and two training steps that follow no switch (``train_plain``).
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch

from bench.rl.clock import PhaseClock
from bench.rl.config import StepConfig
from bench.rl.groups import TrainerGroups
from bench.rl.modes import SwitchDriver
from bench.rl.profiling import StretchProfiler
from bench.rl.rollout import generate, next_batch
from bench.rl.trainer import Trainer
from bench.rl.weights import RolloutWeights

logger = logging.getLogger(__name__)


def nccl_held(rt, lc) -> dict[str, Any]:
    """What NCCL holds in the rollout, measured right after the offload phase.

    The lifecycle's view: its state, its groups still live (not destroyed, not suspended) and their NCCL memory by
    ``ncclCommMemStats`` (``bytes``; None where the loaded NCCL has no ``ncclCommMemStats``; a live group whose
    communicator was never created holds none). ``process``: every process group alive in the process, whoever
    made it (torch's registry: :meth:`TorchRuntime.live_process_groups`), how many NCCL communicators exist and
    their bytes (None without ``ncclCommMemStats``: the count is then what is known), and the live groups other
    than the default group and the lifecycle's control group (``others``)."""
    live = [n for n in lc.groups if rt.group_live(n) and not rt.group_suspended(n)]
    try:
        mem = lc.comm_memory()
        held: int | None = int(mem.suspendable + mem.persistent)
    except Exception as e:  # noqa: BLE001 - NCCL < 2.29.7: no ncclCommMemStats
        logger.debug("ncclCommMemStats unavailable: %s", e)
        held = None
    groups = rt.live_process_groups()
    comms = [g for g in groups if g["backend"] == "nccl" and g["communicator"]]
    sizes = [g["bytes"] for g in comms]
    control = lc.config.control_group
    process = {"groups": groups, "nccl_communicators": len(comms),
               "nccl_bytes": None if None in sizes else int(sum(sizes)),
               "others": [g["name"] or g["torch_name"] for g in groups if not g["default"] and g["name"] != control]}
    return {"state": lc.state.name, "live_groups": live, "bytes": held, "process": process}


class ColocatedStep:
    """One rank's colocated RL steps: :meth:`switch_step` runs the phases of one step (module docstring) and
    appends its record to :attr:`steps`; :meth:`after_steps` runs the training steps after the last switch.

    ``rec``: the run's record, into which the first offload writes ``early_units_bytes`` (with early copies).
    The first training batch is random tokens (each rank its own); every later one comes from the rollout."""

    def __init__(self, cfg: StepConfig, rank: int, world_size: int, *, rt: Any, clock: PhaseClock, lifecycle: Any,
                 store: Any, trainer: Trainer, rollout: torch.nn.Module, weights: RolloutWeights, mcfg: Any,
                 rec: dict[str, Any], groups: TrainerGroups) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.rt, self.clock, self.lc, self.store = rt, clock, lifecycle, store
        self.trainer, self.rollout, self.weights, self.mcfg, self.rec = trainer, rollout, weights, mcfg, rec
        self.groups = groups
        self.device = clock.device
        self.cuda = self.device.type == "cuda"
        self.generator = torch.Generator(device="cpu").manual_seed(cfg.seed + 1 + rank)  # each rank its own data
        data = torch.randint(0, mcfg.vocab_size, (cfg.batch, cfg.seq), generator=self.generator)
        self.data = data.to(self.device) if cfg.batch_ahead else data
        #: one record per switch step, in order
        self.steps: list[dict[str, Any]] = []
        served = None
        if cfg.forward_from_rollout:
            def served():
                from bench.rl.rollout_gather import ForwardFromRollout

                return ForwardFromRollout(trainer.model, weights.params)
        self.driver = SwitchDriver(cfg.mode, lifecycle, store, trainer.optims, clock, sync_first=cfg.sync_first,
                                   rebuild_ahead=cfg.rebuild_ahead, model=trainer.model,
                                   sync_needs_groups=bool(groups.sync), forward_from_rollout=served,
                                   use_order=trainer.use_order if cfg.overlap_reload else None,
                                   switch_interval_s=cfg.thread_switch_interval_s)
        self.profiler = StretchProfiler(cfg.profile and rank == 0, cfg.out, self.cuda)

    def train(self, step: int, s: dict[str, Any], phase: str = "train", early: bool = True) -> None:
        """One training step (a streamed reload of the optimizer state is waited for at its optimizer step).

        With early copies the units step inside the backward; ``early``: each unit's params and optimizer state
        are copied to host memory right after its step (the step precedes a switch)."""
        driver, clock, rt, stepper = self.driver, self.clock, self.rt, self.trainer.stepper
        driver.current = s
        with clock.phase(step, phase, start=driver.train_start):
            x = self.data.to(self.device)
            old = self.logprob_pass(x) if self.cfg.logprob_pass else None
            out = self.trainer.model(input_ids=x, labels=x)
            if stepper is not None:
                stepper.early = early
            driver.before_backward()
            out.loss.backward()
            served = driver.forward_served_done()
            if served is not None:
                s["forward_from_rollout"] = served
            if stepper is not None:
                stepper.finish()
            else:
                self.trainer.optims[0].step()
                self.trainer.optims[0].zero_grad(set_to_none=True)
            if self.weights.early:  # the sync in the backward: the side stream joined, its units recorded
                s["early_sync"] = self.weights.finish_early()
            loss = out.loss.detach().float().reshape(1).clone()
            s["loss_local"] = float(loss.item())  # this rank's, before the sum (compared bit for bit across runs)
            t = time.perf_counter()
            self.groups.reduce_loss(rt, loss)
            clock.sync()
            s["first_collective_s"] = time.perf_counter() - t  # without a warm-up, a rebuilt group's lazy init
            s["loss"] = float(loss.item()) / self.world_size
            if old is not None:  # read after the step's own wait for the loss: no wait of its own in the step
                s["logprob_pass"] = old.result()
            del out, x
        driver.train_start = "device"

    def logprob_pass(self, x: torch.Tensor) -> "_LogprobPass":
        """The old policy's log-probs of ``x`` (:meth:`bench.rl.trainer.Trainer.old_logprobs`), issued and timed on
        the device without waiting for them."""
        timer = _LogprobPass(self.device)
        lp = self.trainer.old_logprobs(x)
        timer.done(lp)
        return timer

    def quiet_point(self, synced: dict[str, Any] | None) -> dict[str, int]:
        """Untimed, after a training step: check the last sync's rollout weights (``synced``: its step record, which
        holds the trainer digests taken before that switch's offload, unless it was checked already); return the
        trainer's digests now. With a managed mesh, what the mesh and FSDP2 resolve their groups to is checked
        too (``mesh_problems``: empty when every reference names the live, rebuilt groups)."""
        self.driver.after_train()  # a streamed reload's untouched tensors handed over (none: the step touched them all)
        t = time.perf_counter()
        pending = synced is not None and "_trainer_digests" in synced
        if pending:
            synced["weight_check"] = self.weights.check(synced.pop("_trainer_digests"))
        now = self.weights.trainer_digests()
        self.clock.sync()
        if pending:
            synced["weight_check_s"] = time.perf_counter() - t
        mg = self.groups.managed
        if synced is not None and mg is not None:
            synced["mesh_problems"] = mg.problems(self.trainer.model)
            synced["mesh_names"] = list(mg.mesh._dim_group_names)
        return now

    def switch_step(self, step: int) -> dict[str, Any]:
        """One step: train, the quiet point, (sync first,) offload, rollout, weight sync, reload; its record."""
        cfg, clock, driver = self.cfg, self.clock, self.driver
        s: dict[str, Any] = {"step": step}
        self.train(step, s)
        s["_trainer_digests"] = self.quiet_point(self.steps[-1] if self.steps else None)
        if cfg.sync_in_backward:  # the rollout copy holds the weights just trained since the backward: check it now
            t = time.perf_counter()
            s["weight_check"] = self.weights.check(s.pop("_trainer_digests"))
            s["weight_check_s"] = time.perf_counter() - t
            with clock.phase(step, "weight_sync"):
                driver.sync_resident(s, lambda: None)
        elif cfg.sync_first:  # the rollout gets the weights just trained, read where they are (no reload)
            with clock.phase(step, "weight_sync"):
                driver.sync_resident(s, self.weights.sync)
        self.offload(step, s)
        self.roll_out(step, s)
        if step == cfg.steps - 1:  # --profile: the last switch's weight sync and reload and the training step after
            self.profiler.start(f"switch_tail_{step}")
        if not cfg.sync_first:  # params back first, then the gather (the rest's reload beside it unless sequential,
            with clock.phase(step, "weight_sync", end=driver.sync_end):  # so the phase ends on the compute stream)
                driver.weight_sync(s, self.weights.sync)
        self.reload(step, s)
        self.steps.append(s)
        return s

    def offload(self, step: int, s: dict[str, Any]) -> None:
        """The offload phase (the lifecycle pauses the trainer's groups; the release moves the state), then what it
        moved and freed and what the groups still hold, read outside the phase."""
        before = torch.cuda.memory_allocated(self.device) if self.cuda else 0
        with self.clock.phase(step, "offload"):
            s["lifecycle_after_pause"] = self.driver.pause(s)
        st = self.store.stats()
        s["offload_bytes"] = st.last_offload_bytes
        s["early_copy_bytes"], s["early_reused_bytes"] = st.last_early_copy_bytes, st.last_early_reused_bytes
        s["early_redone_bytes"], s["early_skipped"] = st.last_early_redone_bytes, st.last_early_skipped
        s["early_streaming_bytes"] = st.last_early_streaming_bytes  # copied while the reload still streamed
        stepper = self.trainer.stepper
        if stepper is not None and "early_units_bytes" not in self.rec:  # per unit, in the order the backward steps
            self.rec["early_units_bytes"] = stepper.unit_bytes()
        s["device_bytes_freed"] = st.last_device_bytes_freed
        s["freed_measured"] = ((before - torch.cuda.memory_allocated(self.device)) if self.cuda
                               else st.last_device_bytes_freed)
        s["nccl_in_rollout"] = nccl_held(self.rt, self.lc)

    def roll_out(self, step: int, s: dict[str, Any]) -> None:
        """The rollout phase: a KV cache in the memory the trainer gave back, generate, free; the next batch."""
        cfg = self.cfg
        with self.clock.phase(step, "rollout"):
            s.update(generate(self.rollout, self.mcfg, cfg, self.device, self.weights.dtype, s["freed_measured"],
                              self.generator))
            data = next_batch(s.pop("_sequences"), cfg)
            if cfg.batch_ahead:  # before the switch's reloads are queued on the copy engine
                data = data.to(self.device)
            self.data = data
            if self.cuda and cfg.free == "driver":
                torch.cuda.empty_cache()

    def reload(self, step: int, s: dict[str, Any]) -> None:
        """The reload phase: the trainer's groups come back and the rest of the state (streamed: still on its way)."""
        with self.clock.phase(step, "reload", start="none", end=self.driver.reload_end):
            self.driver.resume(s)
        st = self.store.stats()
        s["reload_bytes_last"] = st.last_reload_bytes
        s["params_bytes"] = st.bytes_by_category.get("params", 0)
        if not self.driver.ahead_pending:  # a resume ahead writes it when the next forward joins it
            s["lifecycle_state"] = self.lc.state.name

    def after_steps(self) -> list[dict[str, Any]]:
        """The training step after the last switch (its cost belongs to that switch), then two after no switch.

        With early copies the first of them copies early as every step before a switch does: each switch's row
        holds the early copies of the step after it, in the steady state the same as its own ([Note: switch
        cost] in :mod:`bench.rl.record`). Ends the driver (its optimizer hooks removed)."""
        cfg = self.cfg
        tail = [{"step": cfg.steps}]
        self.train(cfg.steps, tail[0])
        self.profiler.stop()
        self.quiet_point(self.steps[-1])
        for i in (1, 2):
            tail.append({"step": cfg.steps + i})
            if i == 1:
                self.profiler.start(f"train_plain_{cfg.steps + i}")
            self.train(cfg.steps + i, tail[-1], phase="train_plain", early=False)
            self.profiler.stop()
        self.driver.finish()
        return tail


class _LogprobPass:
    """One log-prob pass: its seconds on the device (CUDA events around it, read once the step has waited for its
    loss anyway; on a CPU the host's seconds, the pass being synchronous there) and its log-probs' sum in fp64
    (compared bit for bit across runs)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.t = time.perf_counter()
        self.events = None
        if self.cuda:
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        self.total: torch.Tensor | None = None
        self.elapsed = 0.0
        self.tokens = 0

    def done(self, lp: torch.Tensor) -> None:
        """The pass is issued: its end marked, its sum kept (on the device)."""
        self.total = lp.double().sum()
        if self.events is not None:
            self.events[1].record()
        else:
            self.elapsed = time.perf_counter() - self.t
        self.tokens = int(lp.numel())

    def result(self) -> dict[str, Any]:
        """``{"s", "sum", "tokens"}`` (the device has finished the pass: the caller waited for later work)."""
        if self.events is not None:
            self.elapsed = self.events[0].elapsed_time(self.events[1]) / 1e3
        return {"s": self.elapsed, "sum": float(self.total.item()), "tokens": self.tokens}


__all__ = ["ColocatedStep", "nccl_held"]
