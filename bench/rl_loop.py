"""A colocated RL step, end to end: train -> offload -> rollout -> weight sync -> reload (issue 16).

Theory of operation
-------------------
Each rank holds two roles on one device:

* the **trainer**: a ``transformers`` causal LM built from a config (random
  weights, no downloads; ``--tiny`` for a few-thousand-parameter one, else a
  ~1.0 B-parameter Qwen2), sharded with FSDP2 (``fully_shard``; on two or more
  ranks a 2-D HSDP mesh ``(replicate, shard)``), an AdamW optimizer, its state
  registered with an :class:`~refimpl.store.OffloadStore`;
* the **rollout** role: an unsharded copy of the weights (bf16 on CUDA) that
  generates with the model's own ``generate`` into a pre-sized KV cache
  (``StaticCache`` where the installed transformers has it, sized to take the
  device memory the trainer's offload gave back; else the dynamic cache).

One step, every phase timed between device synchronisations:

``train``      forward/backward/step on the previous rollout's sequences; the
               loss is averaged over the trainer's group ``trainer.dp``.
               With ``offload_in_backward`` each FSDP unit steps its own
               AdamW inside the backward and, in a step before a switch,
               hands its params and state to ``OffloadStore.copy_early``
               (:class:`StepInBackward`): the offload's copies run here.
``offload``    :meth:`PGLifecycle.pause` with ``release_memory`` = the store's
               offload of params, grads and optimizer state.
``rollout``    the rollout role allocates its KV cache, generates, frees it,
               and hands its sequences to the trainer through the host (as
               a single-controller framework does); with ``batch_ahead``
               (the default) the next training batch goes to the device at
               the rollout's end, before the switch queues its reloads: the
               copy engine serves one stream's queued pinned copies before
               another's, and a pageable copy larger than it stages inline
               (a batch of 32 x 1024 tokens, 256 KiB, waited 128 ms on the
               H200; one of 8 x 256, 16 KiB, did not) queues behind a
               streamed reload too (docs/comm.md)
               (``--free allocator``, the default: the store runs with
               ``empty_cache=False`` and the reload reuses the blocks the KV
               cache gave back to torch's allocator, 1.005 x line on the H200;
               ``driver``: ``empty_cache`` after, 0.763 x, docs/store.md).
``weight_sync`` :meth:`PGLifecycle.weight_sync`: reload the params, gather
               each full parameter (``DTensor.full_tensor``) and copy it into
               the rollout weights. With ``sync_first`` this phase comes
               right after ``train``, before the offload (verl's order: the
               rollout generates with the weights just trained): the gather
               reads the params where training left them, nothing is
               reloaded for it, and the lifecycle's groups are still up (the
               sync uses none of them, so it is not under
               :meth:`PGLifecycle.weight_sync`; ``PAUSED_LIVE`` then never
               arms preservation).
``reload``     :meth:`PGLifecycle.resume` and the store's reload of the rest.

After every sync (outside the timed phases, with the groups active) the
weights are checked bitwise: the rollout's copy against a fresh gather of the
trainer's, compared as integers, and every rank's rollout copy has the same
digest (``all_reduce`` MIN and MAX over ``trainer.dp``).

``switch_overhead`` = offload + weight_sync + reload (everything that is not
training or generation), reported against ``copy_time_at_line`` = the bytes
offloaded at the device-to-host line rate plus the bytes reloaded at the
host-to-device line rate, both measured at start in the same run.

Rank 0 writes ``rl_step_<world>.json`` and ``rl_step_<world>.png`` (a timeline;
:mod:`bench.rl_record`). The record keeps the runtime's own spans too
(``runtime_spans``: the lifecycle's destroy / rebuild / cooldown, the store's
phases) on the phases' clock, so a phase's time can be taken apart.

Not done here: the FSDP mesh's own groups (``init_device_mesh``) are not under
the lifecycle, which manages ``trainer.dp`` (the loss, the weight check); their
NCCL memory stays held through the rollout. FSDP2 keeps the group objects it was
built with, and every policy may destroy groups (even ``PAUSED_LIVE`` at the
first pause, before a good weight sync arms preservation).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.rl_record import runtime_spans, summarize, write_outputs
from bench.switch_modes import MODES, SwitchDriver

logger = logging.getLogger(__name__)


@dataclass
class StepConfig:
    """What to run. ``tiny``: a tiny model and batch (CPU tests); else ~1.0 B parameters."""

    device: str = "cuda"
    tiny: bool = False
    steps: int = 2
    batch: int = 8
    seq: int = 256
    rollout_batch: int = 64
    prompt_len: int = 32
    new_tokens: int = 32
    kv_gb: float | None = None  # None: the bytes the trainer's offload freed
    free: str = "allocator"  # or "driver" (see the module docstring: the measurements favour "allocator")
    shard: int = 2
    out: str = "."
    seed: int = 0
    lifecycle_policy: str = "auto"  # auto: refimpl.torch_runtime.switch_policy.default_switch_policy
    mode: str = "sequential"  # bench.switch_modes.MODES
    cooldown_s: float = 0.2
    line_mib: int = 1024
    mixed_precision: bool | None = None  # FSDP2 bf16 params / fp32 reduce; None: on CUDA only
    stream_window_mib: int | None = None  # a streamed reload's copies queued at once (None, 0: all, the default)
    stream_sm_ctas: int | None = None  # a streamed reload's copies made by a kernel of this many programs (None: engine)
    profile: bool = False  # torch.profiler traces: the last switch's tail with the step after it, a plain step
    batch_ahead: bool = True  # the next training batch copied to the device at the rollout's end, before the reloads
    offload_in_backward: bool = False  # the optimizer stepped per FSDP unit in the backward, its state copied early
    sync_first: bool = False  # the weight sync before the offload, from the trainer's resident params (verl's order)

    def __post_init__(self) -> None:
        if self.free not in ("driver", "allocator"):
            raise ValueError(f"free must be 'driver' or 'allocator', got {self.free!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("steps", "batch", "seq", "rollout_batch", "prompt_len", "new_tokens", "shard", "line_mib"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def model_config(tiny: bool):
    """A Qwen2 config: ``tiny`` (~0.1 M parameters) or ~1.03 B parameters (hidden 1536, 20 layers)."""
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           tie_word_embeddings=False)
    return Qwen2Config(vocab_size=32000, hidden_size=1536, intermediate_size=8960, num_hidden_layers=20,
                       num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=8192,
                       tie_word_embeddings=False)


class _Clock:
    """Phase spans (start, end) in seconds since the clock began, each closed by a device synchronisation."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.t0 = time.perf_counter()
        self.spans: list[tuple[int, str, float, float]] = []
        #: per "step.phase": the caching allocator's counters' change inside the phase (CUDA only)
        self.allocator: dict[str, dict[str, int]] = {}

    def sync(self) -> None:
        """Wait for the device's queued work, every stream (a no-op on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def stream_sync(self) -> None:
        """Wait for the calling thread's current stream only (copies on the store's copy stream may go on)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    @contextlib.contextmanager
    def phase(self, step: int, name: str, *, start: str = "device", end: str = "device"):
        """Context manager: record ``(step, name, start, end)`` around the block, in seconds since the clock began.

        ``start`` / ``end``: what is waited for at each end: ``"device"`` (every stream: nothing the phase queued
        is left), ``"stream"`` (the current stream only: a background copy may run on into the next phase, whose
        time then holds what it costs there) or ``"none"``.
        """
        waits = {"device": self.sync, "stream": self.stream_sync, "none": lambda: None}
        waits[start]()
        before = self._allocator()
        a = time.perf_counter() - self.t0
        yield
        waits[end]()
        b = time.perf_counter() - self.t0
        self.spans.append((step, name, a, b))
        after = self._allocator()
        if after:  # what the caching allocator did inside the phase (a cudaFree synchronises the whole device)
            self.allocator[f"{step}.{name}"] = {k: after[k] - before.get(k, 0) for k in after}

    #: caching-allocator counters read around each phase (outside its timed span)
    ALLOCATOR_KEYS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")

    def _allocator(self) -> dict[str, int]:
        if self.device.type != "cuda":
            return {}
        st = torch.cuda.memory_stats(self.device)
        return {k: int(st.get(k, 0)) for k in self.ALLOCATOR_KEYS}


def _line_rates(device: torch.device, nbytes: int, rt) -> dict[str, float]:
    """H2D and D2H GB/s between registered host memory and cached device memory (best of 3)."""
    host = rt.alloc_host(nbytes, torch.uint8, pinned=True, tag="line")
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for name, (dst, src) in (("h2d_gbps", (dev, host)), ("d2h_gbps", (host, dev))):
        best = float("inf")
        for _ in range(4):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        out[name] = nbytes / best / 1e9
    rt.free_host(host)
    return out


def _int_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of the same width (bitwise comparison, -0 != +0, NaN == NaN)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}[t.element_size()])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True iff ``a`` and ``b`` have the same shape, dtype and bits (``-0.0`` differs from ``0.0``; a NaN equals itself)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_int_view(a), _int_view(b))


def _digest(t: torch.Tensor) -> int:
    """A position-weighted integer digest of the tensor's bits (same bits -> same digest)."""
    bits = _int_view(t).reshape(-1).to(torch.int64)
    w = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 1021 + 1
    return int((bits * w).sum().item())


def _digest_t(t: torch.Tensor) -> torch.Tensor:
    """:func:`_digest` as a 0-d int64 tensor on the tensor's device (no host round trip)."""
    bits = _int_view(t).reshape(-1).to(torch.int64)
    w = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 1021 + 1
    return (bits * w).sum()


def _public(s: dict[str, Any]) -> dict[str, Any]:
    """A step record without its private working fields (keys starting with ``_``)."""
    return {k: v for k, v in s.items() if not k.startswith("_")}


def nccl_held(rt, lc) -> dict[str, Any]:
    """What the lifecycle's groups hold in the rollout, measured right after the offload phase: the lifecycle's
    state, the groups still live (not destroyed, not suspended) and their NCCL memory by ``ncclCommMemStats``
    (None where the loaded NCCL has no ``ncclCommMemStats``; a live group whose communicator was never created
    holds none)."""
    live = [n for n in lc.groups if rt.group_live(n) and not rt.group_suspended(n)]
    try:
        mem = lc.comm_memory()
        held: int | None = int(mem.suspendable + mem.persistent)
    except Exception as e:  # noqa: BLE001 - NCCL < 2.29.7: no ncclCommMemStats
        logger.debug("ncclCommMemStats unavailable: %s", e)
        held = None
    return {"state": lc.state.name, "live_groups": live, "bytes": held}


def _full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


def run_step(rank: int, world_size: int, cfg: StepConfig) -> dict[str, Any]:
    """Run ``cfg.steps`` colocated steps on this rank (``torch.distributed`` already initialised); return the record."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2ForCausalLM

    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.comm.group_plan import GroupPlanRules
    from refimpl.runtime import GroupSpec, ReduceOp
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.config import FIRST_USE_ORDER
    from refimpl.torch_runtime import TorchRuntime

    cuda = cfg.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    rt = TorchRuntime(device)
    clock = _Clock(device)
    rt_t0 = rt.now() - (time.perf_counter() - clock.t0)  # the runtime's clock at the phases' zero
    rec: dict[str, Any] = {"config": asdict(cfg), "world_size": world_size, "device": str(device),
                           "torch": torch.__version__, "errors": []}
    try:
        import transformers

        rec["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    if cuda:
        rec["gpu"] = torch.cuda.get_device_name(device)

    # ---- the trainer's role group, under the lifecycle
    rt.run(rt.new_group(GroupSpec("trainer.dp", tuple(range(world_size)))))
    policy, parallel = cfg.lifecycle_policy, False
    if policy == "auto":
        from refimpl.torch_runtime.switch_policy import default_switch_policy

        chosen = default_switch_policy(device)
        policy, parallel = chosen.policy.name, chosen.parallel_destroy
        rec["policy_choice"] = {"policy": policy, "parallel_destroy": parallel, "reason": chosen.reason}
    rec["policy"] = policy
    # the weight sync gathers over the FSDP mesh, not over trainer.dp: it needs none of the lifecycle's groups, so
    # they go down at the pause and stay down through the sync (every policy); off the sequential mode the resume
    # creates the rebuilt communicators (warm_rebuilt) beside the reload's copies instead of at the first collective
    rec["wake_proxies"] = bool(getattr(rt, "wake_proxies", False))
    rec["sync_needs_no_group"] = True
    rec["warm_rebuilt"] = cfg.mode != "sequential"
    lc = PGLifecycle(rt, ["trainer.dp"], plan=GroupPlanRules(sync_groups=set()), config=LifecycleConfig(
        policy=PGPolicy[policy], cooldown_s=cfg.cooldown_s, agree_timeout_s=120,
        canary_timeout_s=60, control_group="trainer.control", parallel_destroy=parallel,
        warm_rebuilt=cfg.mode != "sequential"))
    life = lc.sync
    life.start()

    # ---- models
    torch.manual_seed(cfg.seed)
    mcfg = model_config(cfg.tiny)
    mixed = cfg.mixed_precision if cfg.mixed_precision is not None else cuda
    rollout_dtype = torch.bfloat16 if mixed else torch.float32
    with torch.device(device):
        trainer = Qwen2ForCausalLM(mcfg)
    rec["params"] = sum(p.numel() for p in trainer.parameters())
    if world_size > 1:
        shard = min(cfg.shard, world_size)
        if world_size % shard:
            raise ValueError(f"--shard {shard} must divide the world size {world_size}")
        mesh = init_device_mesh(device.type, (world_size // shard, shard), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (1,))
    rec["mesh"] = list(mesh.shape)
    mp_kwargs = {}
    if mixed:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        mp_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in trainer.model.layers:
        fully_shard(layer, mesh=mesh, **mp_kwargs)
    if cfg.offload_in_backward:  # the head its own unit (as torchtitan wraps its output layer): its gradients are
        fully_shard(trainer.lm_head, mesh=mesh, **mp_kwargs)  # reduced, stepped and copied first in the backward
    fully_shard(trainer, mesh=mesh, **mp_kwargs)
    units = _units(trainer, head=cfg.offload_in_backward)
    # one AdamW per FSDP unit when the optimizer steps inside the backward (element for element the same update)
    optims = [torch.optim.AdamW(u, lr=1e-5) for u in units] if cfg.offload_in_backward \
        else [torch.optim.AdamW(trainer.parameters(), lr=1e-5)]
    with torch.device(device):
        rollout = Qwen2ForCausalLM(mcfg).to(rollout_dtype).eval()
    for p in rollout.parameters():
        p.requires_grad_(False)
    rparams = dict(rollout.named_parameters())

    window = ((cfg.stream_window_mib or 0) << 20) or None  # None and 0: every piece queued at once (the default)
    t = time.perf_counter()
    store = OffloadStore(rt, config=StoreConfig(empty_cache=(cfg.free == "driver"), stream_window_bytes=window,
                                                stream_sm_ctas=cfg.stream_sm_ctas or None))
    rec["store_setup_s"] = time.perf_counter() - t  # with --stream-sm-ctas: the copy kernel's build (once)
    store.attach_module(trainer, name="model")
    for i, o in enumerate(optims):
        store.attach_optimizer(o, name="optim" if len(optims) == 1 else f"optim.{i}")
    stepper = StepInBackward(units, optims, store) if cfg.offload_in_backward else None
    rec["offload_in_backward"] = cfg.offload_in_backward
    rec["line"] = _line_rates(device, cfg.line_mib << 20, rt)
    # the order the store issues a reload in (sim.calibrate.switch_modes reads it): a training step's first use
    rec["reload_order"] = "first_use"
    rec["reload_categories"] = [c.value for c in sorted(FIRST_USE_ORDER, key=FIRST_USE_ORDER.get)]

    def sync_weights() -> None:
        """Copy the trainer's full weights (``full_tensor``: an all-gather over the mesh) into the rollout's."""
        for name, p in trainer.named_parameters():
            rparams[name].copy_(_full(p).to(rollout_dtype))

    def digests(tensors: list[torch.Tensor]) -> list[int]:
        """Each tensor's bit digest (:func:`_digest`), computed on the device, read back at once."""
        return torch.stack([_digest_t(t) for t in tensors]).tolist() if tensors else []

    def agree_digests(mine: int, mismatched: int) -> tuple[bool, int]:
        """Over the world group: do the digests agree on every rank; the largest mismatch count of any rank."""
        lo = torch.tensor([mine, mismatched], dtype=torch.int64, device=device)
        hi = lo.clone()
        # over the world group: the lifecycle's trainer.dp may be down
        rt.run(rt.all_reduce(lo, ReduceOp.MIN, group="world", timeout_s=120))
        rt.run(rt.all_reduce(hi, ReduceOp.MAX, group="world", timeout_s=120))
        return bool(lo[0].item() == hi[0].item()), int(hi[1].item())

    def trainer_digests() -> dict[str, int]:
        """Digests of the trainer's full weights as the rollout holds them (its dtype)."""
        names = [n for n, _ in trainer.named_parameters()]
        return dict(zip(names, digests([_full(p).to(rollout_dtype) for _, p in trainer.named_parameters()])))

    def check_weights(want: dict[str, int]) -> dict[str, Any]:
        """Bitwise: each rollout weight's digest against ``want`` (the trainer's weights when they were synced,
        digested before their offload); digests compared over ranks.

        Runs outside the timed phases at a quiet point (after a training step's device synchronisation, before the
        next offload: no copy in flight for it to hide under, and the rollout copy unchanged since its sync).
        """
        got = dict(zip(rparams, digests(list(rparams.values()))))
        mismatched = [n for n in want if got.get(n) != want[n]]
        digest = sum(got.values()) % (1 << 61)
        agree, worst = agree_digests(digest, len(mismatched))
        return {"tensors": len(want), "mismatched": mismatched, "digest": digest, "ranks_agree": agree,
                "max_mismatched_any_rank": worst, "bitwise_equal": not mismatched and worst == 0 and agree}

    # initial sync: the rollout starts from the trainer's weights
    sync_weights()
    rec["initial_sync"] = check_weights(trainer_digests())
    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 1 + rank)  # each rank its own prompts and batch
    data = torch.randint(0, mcfg.vocab_size, (cfg.batch, cfg.seq), generator=g)
    if cfg.batch_ahead:
        data = data.to(device)
    steps: list[dict[str, Any]] = []
    driver = SwitchDriver(cfg.mode, lc, store, optims, clock, sync_first=cfg.sync_first)
    profiler = _Profile(cfg.profile and rank == 0, cfg.out, cuda)

    def train(step: int, s: dict[str, Any], phase: str = "train", early: bool = True) -> None:
        """One training step (a streamed reload of the optimizer state is waited for at its optimizer step).

        With ``offload_in_backward`` the units step inside the backward; ``early``: each unit's params and
        optimizer state are copied to host memory right after its step (the step precedes a switch)."""
        driver.current = s
        with clock.phase(step, phase, start=driver.train_start):
            x = data.to(device)
            out = trainer(input_ids=x, labels=x)
            if stepper is not None:
                stepper.early = early
            out.loss.backward()
            if stepper is not None:
                stepper.finish()
            else:
                optims[0].step()
                optims[0].zero_grad(set_to_none=True)
            loss = out.loss.detach().float().reshape(1).clone()
            t = time.perf_counter()
            rt.run(rt.all_reduce(loss, ReduceOp.SUM, group="trainer.dp", timeout_s=120))
            clock.sync()
            s["first_collective_s"] = time.perf_counter() - t  # lazy init of a rebuilt group lands here
            s["loss"] = float(loss.item()) / world_size
            del out, x
        driver.train_start = "device"

    def quiet_point(synced: dict[str, Any] | None) -> dict[str, int]:
        """Untimed, after a training step: check the last sync's rollout weights (``synced``: its step record, which
        holds the trainer digests taken before that switch's offload); return the trainer's digests now."""
        driver.after_train()  # a streamed reload's untouched tensors handed over (none: the step touched them all)
        t = time.perf_counter()
        if synced is not None:
            synced["weight_check"] = check_weights(synced.pop("_trainer_digests"))
        now = trainer_digests()
        clock.sync()
        if synced is not None:
            synced["weight_check_s"] = time.perf_counter() - t
        return now

    for step in range(cfg.steps):
        s: dict[str, Any] = {"step": step}
        # ---- train
        train(step, s)
        s["_trainer_digests"] = quiet_point(steps[-1] if steps else None)
        if cfg.sync_first:  # the rollout gets the weights just trained, read where they are (no reload)
            with clock.phase(step, "weight_sync"):
                driver.sync_resident(s, sync_weights)
        before = torch.cuda.memory_allocated(device) if cuda else 0
        # ---- offload (the lifecycle pauses the trainer's groups; the release moves the state)
        with clock.phase(step, "offload"):
            s["lifecycle_after_pause"] = driver.pause(s)
        st = store.stats()
        s["offload_bytes"] = st.last_offload_bytes
        s["early_copy_bytes"], s["early_reused_bytes"] = st.last_early_copy_bytes, st.last_early_reused_bytes
        s["early_redone_bytes"], s["early_skipped"] = st.last_early_redone_bytes, st.last_early_skipped
        if stepper is not None and "early_units_bytes" not in rec:  # per unit, in the order the backward steps them
            rec["early_units_bytes"] = stepper.unit_bytes()
        s["device_bytes_freed"] = st.last_device_bytes_freed
        s["freed_measured"] = (before - torch.cuda.memory_allocated(device)) if cuda else st.last_device_bytes_freed
        s["nccl_in_rollout"] = nccl_held(rt, lc)
        # ---- rollout: KV cache into the memory the trainer gave back, generate, free
        with clock.phase(step, "rollout"):
            s.update(_rollout(rollout, mcfg, cfg, device, rollout_dtype, s["freed_measured"], g))
            data = s.pop("_sequences")[:cfg.batch, :cfg.seq].cpu()
            if data.shape[1] < cfg.seq:  # pad by repeating (the training batch has a fixed shape)
                data = data.repeat(1, -(-cfg.seq // data.shape[1]))[:, :cfg.seq]
            if data.shape[0] < cfg.batch:
                data = data.repeat(-(-cfg.batch // data.shape[0]), 1)[:cfg.batch]
            if cfg.batch_ahead:  # before the switch's reloads are queued on the copy engine
                data = data.to(device)
            if cuda and cfg.free == "driver":
                torch.cuda.empty_cache()
        if step == cfg.steps - 1:  # --profile: the last switch's weight sync and reload and the training step after
            profiler.start(f"switch_tail_{step}")
        # ---- weight sync under the lifecycle: params back first, then gather into the rollout copy (the rest's
        # reload starts beside the gather unless sequential, so the phase ends on the compute stream only)
        if not cfg.sync_first:
            with clock.phase(step, "weight_sync", end=driver.sync_end):
                driver.weight_sync(s, sync_weights)
        # ---- reload the rest; the trainer's groups come back
        with clock.phase(step, "reload", start="none", end=driver.reload_end):
            driver.resume(s)
        st = store.stats()
        s["reload_bytes_last"] = st.last_reload_bytes
        s["params_bytes"] = st.bytes_by_category.get("params", 0)
        s["lifecycle_state"] = lc.state.name
        steps.append(s)
        if rank == 0:  # a partial record after every step, in case the run is cut short
            try:
                write_outputs({**rec, "steps": [_public(x) for x in steps], "partial": True,
                               "runtime_spans": runtime_spans(rt, rt_t0),
                               "spans": [{"step": a, "phase": b, "start_s": c, "end_s": d} for a, b, c, d in clock.spans]},
                              cfg.out)
            except OSError as e:
                logger.warning("partial record not written: %s", e)
    # the training step after the last switch (its cost belongs to that switch), then steps after no switch
    # (with offload_in_backward it copies early as every step before a switch does: each switch's row holds
    # the early copies of the step after it, in the steady state the same as its own; bench/switch_modes.py)
    tail = [{"step": cfg.steps}]
    train(cfg.steps, tail[0])
    profiler.stop()
    quiet_point(steps[-1])
    for i in (1, 2):
        tail.append({"step": cfg.steps + i})
        if i == 1:
            profiler.start(f"train_plain_{cfg.steps + i}")
        train(cfg.steps + i, tail[-1], phase="train_plain", early=False)
        profiler.stop()
    driver.finish()
    rec["after_steps"] = tail
    rec["mode"] = cfg.mode
    spans = clock.spans
    rec["spans"] = [{"step": a, "phase": b, "start_s": c, "end_s": d} for a, b, c, d in spans]
    rec["steps"] = [_public(x) for x in steps]
    rec["runtime_spans"] = runtime_spans(rt, rt_t0)
    rec["lifecycle_stats"] = asdict(lc.stats)
    rec["store_phases"] = dict(store.stats().phases)
    rec["allocator_by_phase"] = clock.allocator
    rec["sm_copies"] = int(getattr(rt, "sm_copies", 0))  # host-to-device copies made on SMs (--stream-sm-ctas)
    rec["summary"] = summarize(rec)
    store.close()
    return rec


def _units(trainer, head: bool = False) -> list[list[torch.nn.Parameter]]:
    """The trainer's FSDP units' parameters in the order a backward reduces them: ``head`` (the head wrapped on
    its own), the decoder layers last to first, then the root's (embeddings, final norm; the head too unless
    ``head``)."""
    units = ([list(trainer.lm_head.parameters())] if head else []) + \
        [list(layer.parameters()) for layer in reversed(trainer.model.layers)]
    seen = {id(p) for u in units for p in u}
    units.append([p for p in trainer.parameters() if id(p) not in seen])
    return units


class StepInBackward:
    """The optimizer stepped per FSDP unit inside the backward, each unit's state copied early.

    A post-accumulate-grad hook on every parameter (FSDP2 runs them on the sharded parameter after its
    reduce-scatter, torchtune's ``optimizer_in_bwd`` pattern) counts the unit's gradients; the last one steps
    the unit's own optimizer and drops its gradients. With ``early`` set (the step precedes a switch) the
    unit's parameters and optimizer state, final from then on, go to :meth:`OffloadStore.copy_early`: their
    device-to-host copies run under the rest of the backward and the offload takes them over ([Note: early
    copies] in :mod:`refimpl.store.moves.early`). No global gradient clipping or accumulation across backward calls
    fits this step (each unit steps on its own gradients as they arrive). :meth:`finish` after the backward
    steps a unit some of whose parameters got no gradient.
    """

    def __init__(self, units: list[list[torch.nn.Parameter]], optims: list[Any], store: Any) -> None:
        self.units, self.optims, self.store = units, optims, store
        self.early = False
        self._count = [0] * len(units)
        self._stepped = [False] * len(units)
        self.hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._ready, i))
                      for i, u in enumerate(units) for p in u]

    def _ready(self, i: int, _p: Any) -> None:
        self._count[i] += 1
        if self._count[i] == len(self.units[i]):
            self._step(i)

    def _step(self, i: int) -> None:
        opt = self.optims[i]
        opt.step()
        opt.zero_grad(set_to_none=True)
        self._stepped[i] = True
        if self.early:
            self.store.copy_early(self._state(i))

    def _state(self, i: int) -> list[torch.Tensor]:
        """Unit ``i``'s parameters and their optimizer state on the parameters' device (AdamW's step counters, on
        the host beside device parameters, left out)."""
        out = list(self.units[i])
        for p in self.units[i]:
            where = getattr(p, "_local_tensor", p).device
            for v in self.optims[i].state.get(p, {}).values():
                if isinstance(v, torch.Tensor) and getattr(v, "_local_tensor", v).device == where:
                    out.append(v)
        return out

    def finish(self) -> None:
        """After the backward: step every unit whose hooks did not all fire; reset the counts."""
        for i, done in enumerate(self._stepped):
            if not done:
                self._step(i)
        self._count = [0] * len(self.units)
        self._stepped = [False] * len(self.units)

    def unit_bytes(self) -> list[int]:
        """Bytes of each unit's parameters and optimizer state, in the order a backward steps them (the units'
        order, :func:`_units`)."""
        def nbytes(t: torch.Tensor) -> int:
            t = getattr(t, "_local_tensor", t)
            return t.numel() * t.element_size()
        return [sum(nbytes(t) for t in self._state(i)) for i in range(len(self.units))]


class _Profile:
    """``--profile``: ``torch.profiler`` over a stretch of the run (rank 0), written as ``profile_<name>.json`` (a
    Chrome trace) and ``profile_<name>.txt`` (the ops by device time) into ``out``; a no-op otherwise."""

    def __init__(self, on: bool, out: str, cuda: bool) -> None:
        self.on, self.out, self.cuda = on, out, cuda
        self._prof: Any = None
        self._name = ""

    def start(self, name: str) -> None:
        """Start profiling the stretch ``name``."""
        if not self.on:
            return
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof, self._name = profile(activities=acts), name
        self._prof.__enter__()

    def stop(self) -> None:
        """Stop and write the stretch's trace and table."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        os.makedirs(self.out, exist_ok=True)
        prof.export_chrome_trace(os.path.join(self.out, f"profile_{self._name}.json"))
        with open(os.path.join(self.out, f"profile_{self._name}.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by="cuda_time_total" if self.cuda else "cpu_time_total",
                                              row_limit=40))


def _rollout(model, mcfg, cfg: StepConfig, device, dtype, freed: int, g) -> dict[str, Any]:
    """Generate ``new_tokens`` for ``rollout_batch`` random prompts into a KV cache sized to the freed memory."""
    prompts = torch.randint(0, mcfg.vocab_size, (cfg.rollout_batch, cfg.prompt_len), generator=g).to(device)
    per_token = 2 * mcfg.num_hidden_layers * mcfg.num_key_value_heads * (mcfg.hidden_size // mcfg.num_attention_heads) \
        * torch.empty((), dtype=dtype).element_size()
    kv_bytes = int(cfg.kv_gb * 1e9) if cfg.kv_gb is not None else max(freed, 0)
    need = cfg.prompt_len + cfg.new_tokens
    cache_len = max(need, kv_bytes // max(1, per_token * cfg.rollout_batch))
    if not cfg.tiny:
        cache_len = min(cache_len, mcfg.max_position_embeddings)
    out: dict[str, Any] = {"kv_cache_len": int(cache_len), "kv_cache_bytes_planned": int(cache_len * per_token * cfg.rollout_batch)}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    kwargs: dict[str, Any] = dict(max_new_tokens=cfg.new_tokens, min_new_tokens=cfg.new_tokens, do_sample=False,
                                  pad_token_id=0, eos_token_id=None, disable_compile=True)
    cache = None
    try:
        from transformers import StaticCache

        try:
            cache = StaticCache(config=mcfg, max_cache_len=int(cache_len), max_batch_size=cfg.rollout_batch,
                                device=device, dtype=dtype)
        except TypeError:
            cache = StaticCache(config=mcfg, max_cache_len=int(cache_len))
        out["kv_cache"] = "static"
    except Exception as e:  # noqa: BLE001 - older/newer transformers: the dynamic cache still generates
        logger.warning("StaticCache unavailable (%s); generating with the dynamic cache", e)
        out["kv_cache"] = f"dynamic ({type(e).__name__})"
    with torch.no_grad():
        try:
            seq = _generate(model, prompts, cache, kwargs)
        except Exception as e:  # noqa: BLE001
            if cache is None:
                raise
            logger.warning("generate with StaticCache failed (%s); retrying with the dynamic cache", e)
            out["kv_cache"] = f"dynamic (static failed: {type(e).__name__}: {str(e)[:200]})"
            cache = None
            seq = _generate(model, prompts, None, kwargs)
    out["generated_tokens"] = int((seq.shape[1] - cfg.prompt_len) * seq.shape[0])
    if cuda:
        out["rollout_peak_extra_bytes"] = int(torch.cuda.max_memory_allocated(device) - base)
    out["_sequences"] = seq
    del cache
    return out


def _generate(model, prompts: torch.Tensor, cache, kwargs: dict[str, Any]) -> torch.Tensor:
    """``model.generate`` (no automatic ``torch.compile``: it would cost more than the whole run)."""
    extra = {"past_key_values": cache} if cache is not None else {}
    try:
        return model.generate(prompts, attention_mask=torch.ones_like(prompts), **extra, **kwargs)
    except (TypeError, ValueError) as e:
        if "disable_compile" not in str(e):
            raise
        kwargs = {k: v for k, v in kwargs.items() if k != "disable_compile"}  # an older transformers
        return model.generate(prompts, attention_mask=torch.ones_like(prompts), **extra, **kwargs)


def parse_args(argv: list[str] | None = None) -> StepConfig:
    """Command line -> :class:`StepConfig`."""
    ap = argparse.ArgumentParser(description="A colocated RL step (train, offload, rollout, weight sync, reload)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch (CPU tests)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--rollout-batch", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--kv-gb", type=float, default=None, help="KV cache size (default: what the offload freed)")
    ap.add_argument("--free", choices=("driver", "allocator"), default="allocator",
                    help="how the roles hand memory over: the shared caching allocator (default) or the driver")
    ap.add_argument("--shard", type=int, default=2, help="HSDP shard-group size (mesh = (world/shard, shard))")
    ap.add_argument("--policy", default="auto", help="the lifecycle's PGPolicy name, or auto: the cheapest that holds "
                    "no NCCL memory in the rollout that the loaded NCCL allows")
    ap.add_argument("--mode", choices=MODES, default="sequential",
                    help="how the switch runs its memory moves beside the lifecycle (bench/switch_modes.py)")
    ap.add_argument("--mixed-precision", choices=("auto", "on", "off"), default="auto",
                    help="FSDP2 bf16 params and a bf16 rollout copy (auto: on CUDA only)")
    ap.add_argument("--stream-window-mib", type=int, default=None,
                    help="MiB of a streamed reload's copies queued on the device at once (StoreConfig."
                    "stream_window_bytes; default and 0: all at once)")
    ap.add_argument("--stream-sm-ctas", type=int, default=None,
                    help="a streamed reload's host-to-device copies made by a kernel of this many programs reading "
                    "the pinned host buffers, leaving the copy engine to the training step (StoreConfig."
                    "stream_sm_ctas; default and 0: the copy engine)")
    ap.add_argument("--profile", action="store_true",
                    help="write torch.profiler traces of the last switch's weight sync, reload and the training "
                    "step after it, and of a plain training step (their times then hold the profiler's overhead: "
                    "take switch costs from a run without it)")
    ap.add_argument("--batch-ahead", action=argparse.BooleanOptionalAction, default=True,
                    help="copy the next training batch to the device at the rollout's end, before the switch's "
                    "reloads (default); --no-batch-ahead: at the training step's start, behind a streamed reload")
    ap.add_argument("--offload-in-backward", action="store_true",
                    help="step the optimizer per FSDP unit inside the backward and copy each unit's params and "
                    "optimizer state to host memory right after its step (OffloadStore.copy_early), under the rest "
                    "of the backward; the offload takes the copies over")
    ap.add_argument("--sync-first", action="store_true",
                    help="the weight sync before the offload, from the trainer's params where training left them "
                    "(verl's order: the rollout generates with the weights just trained); the reload then brings "
                    "everything back, streamed off the sequential mode")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    small = dict(batch=2, seq=16, rollout_batch=2, prompt_len=4, new_tokens=4) if a.tiny else {}
    kw = {k: getattr(a, k) for k in ("batch", "seq", "rollout_batch", "prompt_len", "new_tokens")
          if getattr(a, k) is not None}
    return StepConfig(device=a.device, tiny=a.tiny, steps=a.steps, kv_gb=a.kv_gb, free=a.free, shard=a.shard,
                      out=a.out, lifecycle_policy=a.policy, mode=a.mode, line_mib=(4 if a.tiny else 1024),
                      mixed_precision={"auto": None, "on": True, "off": False}[a.mixed_precision],
                      profile=a.profile, stream_window_mib=a.stream_window_mib, stream_sm_ctas=a.stream_sm_ctas,
                      batch_ahead=a.batch_ahead, offload_in_backward=a.offload_in_backward, sync_first=a.sync_first,
                      **{**small, **kw})


def main(argv: list[str] | None = None) -> int:
    """Entry point under ``torchrun`` (or alone: a world of one)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("refimpl").setLevel(logging.WARNING)
    cfg = parse_args(argv)
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29517"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rec: dict[str, Any] = {"world_size": world}
    try:
        if cfg.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
    except Exception as e:  # noqa: BLE001 - no process group: record why and stop
        logger.exception("rank %d: could not start (%s)", rank, e)
        if rank == 0:
            rec["error"] = f"start: {type(e).__name__}: {e}"
            write_outputs(rec, cfg.out)
        return 1
    rc = 0
    try:
        rec = run_step(rank, world, cfg)
    except Exception as e:  # noqa: BLE001 - record what failed
        logger.exception("rank %d: the RL step failed", rank)
        rec["error"] = f"{type(e).__name__}: {e}"
        rc = 1
    if rank == 0:
        jpath, png = write_outputs(rec, cfg.out)
        sm = rec.get("summary")
        if sm:
            ph = " ".join(f"{k}={v:.3f}s" for k, v in sm["phase_s"].items())
            print(f"rl_step world={world} policy={rec.get('policy')} mode={rec.get('mode')}: {ph} "
                  f"switch_cost={sm.get('switch_cost_s') or 0:.3f}s switch_overhead={sm['switch_overhead_s']:.3f}s "
                  f"copies_at_line={sm['copy_time_at_line_s']:.3f}s bitwise={sm['weights_bitwise_equal_every_sync']}",
                  flush=True)
        print(f"rl_step wrote {jpath} {png}", flush=True)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
