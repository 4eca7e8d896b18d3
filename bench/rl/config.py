"""What one run of the colocated RL step does (:class:`StepConfig`) and the model both roles hold."""
from __future__ import annotations

from dataclasses import dataclass

from bench.rl.modes import MODES


#: the reload's pieces queued at once with ``overlap_reload`` (MiB), unless ``stream_window_mib`` is given: one H100
#: at batch 16, 0.35-0.44 x the copies in six switches against 0.45-0.46 x without the overlap, and 0.74-1.37 x
#: with every piece queued (bench/results/2026-12-05-h100-logprob-overlap/)
OVERLAP_WINDOW_MIB = 128


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
    free: str = "allocator"  # or "driver": how the roles hand memory over (docs/store.md measures both)
    shard: int = 2
    out: str = "."
    seed: int = 0
    lifecycle_policy: str = "auto"  # auto: refimpl.torch_runtime.switch_policy.default_switch_policy
    mode: str = "sequential"  # bench.rl.modes.MODES
    cooldown_s: float = 0.2
    line_mib: int = 1024
    mixed_precision: bool | None = None  # FSDP2 bf16 params / fp32 reduce; None: on CUDA only
    stream_window_mib: int | None = None  # a streamed reload's copies queued at once (None, 0: all, the default)
    stream_sm_ctas: int | None = None  # a streamed reload's copies made by a kernel of this many programs (None: engine)
    profile: bool = False  # torch.profiler traces: the last switch's tail with the step after it, a plain step
    batch_ahead: bool = True  # the next training batch copied to the device at the rollout's end, before the reloads
    offload_in_backward: bool = False  # the optimizer stepped per FSDP unit in the backward, its state copied early
    sync_first: bool = False  # the weight sync before the offload, from the trainer's resident params (verl's order)
    # the switch on several GPUs (bench/rl/mesh.py, bench/rl/modes.py; docs/comm.md, "The switch on N GPUs"):
    managed_mesh: bool = True  # the FSDP mesh on groups the lifecycle takes down; no collective on the world group
    flat_mesh: bool = True  # a replicate dimension of one rank left out of the mesh (1-D FSDP instead of (1, N) HSDP)
    rebuild_ahead: bool = True  # off the sequential mode: the resume on a thread from the rollout's end, joined in
    #                             the next training step (before its backward with forward_from_rollout, else in
    #                             its forward's pre-hook)
    sync_in_backward: bool | None = None  # with sync_first and early copies: each unit gathered into the rollout
    #                                       copy right after its step; None: on exactly then
    gather_in_rollout_dtype: bool = True  # the weight sync gathers params already cast to the rollout's dtype
    forward_from_rollout: bool | None = None  # with the sync in the backward: the first training step after a switch
    #                                          all-gathers from the rollout's copy (bench/rl/rollout_gather.py);
    #                                          None: on exactly then
    overlap_reload: bool = False  # streamed: the reload issued in the order the next step uses the state and never
    #                               finished on the host before it (its optimizer steps and early copies wait on the
    #                               device for their own pieces), at most OVERLAP_WINDOW_MIB of it queued unless
    #                               stream_window_mib says otherwise (0: all at once); docs/comm.md, "The flags"
    pacer_switch_interval_us: int | None = None  # the interpreter's switch interval while a paced reload holds
    #                                            copies (None: the runtime's, 200 us; 0: the interpreter's own);
    #                                            [Note: the feeder's GIL] in refimpl/torch_runtime/copy_stream.py
    thread_switch_interval_us: int | None = None  # the interpreter's switch interval while the switch's
    #                                             background moves run (the offload beside the pause's walk, the
    #                                             resume ahead beside the next step; None: the switch's, 200 us; 0:
    #                                             the interpreter's own); [Note: the GIL's switch interval] in
    #                                             refimpl/runtime/switch_interval.py
    gc_freeze: bool = True  # the collector's survivors of the setup frozen before the first step (gc.freeze): a full
    #                         collection then walks only what the steps made; [Note: the collector in the switch] in
    #                         bench/rl/gc_watch.py
    nccl_max_ctas: int | None = None  # the mesh's NCCL communicators made with at most this many channels (NCCL's
    #                                   maxCTAs; None: NCCL's choice): a creation connects each channel's buffers,
    #                                   so fewer channels create faster, each collective at less bandwidth
    logprob_pass: bool = False  # every training step starts with a no-grad forward of its batch that computes the
    #                             old policy's per-token log-probs (a PPO/GRPO step's first pass; verl's
    #                             compute_log_prob); after a switch it is served from the rollout's copy too

    def __post_init__(self) -> None:
        if self.free not in ("driver", "allocator"):
            raise ValueError(f"free must be 'driver' or 'allocator', got {self.free!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.sync_in_backward is None:
            self.sync_in_backward = self.sync_first and self.offload_in_backward
        if self.sync_in_backward and not (self.sync_first and self.offload_in_backward):
            raise ValueError("sync_in_backward gathers each unit right after its optimizer step in the backward: it "
                             "needs sync_first and offload_in_backward (--sync-first --offload-in-backward)")
        if self.forward_from_rollout is None:
            self.forward_from_rollout = bool(self.sync_in_backward)
        if self.forward_from_rollout and not self.sync_in_backward:
            raise ValueError("forward_from_rollout fills the next forward's all-gathers from the rollout's copy, which "
                             "holds the trainer's weights only with the sync in the backward (--sync-first "
                             "--offload-in-backward)")
        if self.overlap_reload and self.mode != "streamed":
            raise ValueError("overlap_reload leaves the streamed reload running into the next step: it needs "
                             "--mode streamed")
        if self.overlap_reload and self.stream_window_mib is None:
            # [Note: a pinned copy behind the queued reload] in sim/calibrate/switch_modes.py: unpaced, FSDP2's
            # first reduce in the backward waits for the whole reload on the copy engine
            self.stream_window_mib = OVERLAP_WINDOW_MIB
        if self.stream_window_mib is not None and self.stream_window_mib < 0:
            raise ValueError(f"stream_window_mib must be >= 0 (0: every piece queued at once), got "
                             f"{self.stream_window_mib}")
        if self.pacer_switch_interval_us is not None and not 0 <= self.pacer_switch_interval_us <= 1_000_000:
            raise ValueError(f"pacer_switch_interval_us must be in [0, 1000000] (0: the interpreter's own), got "
                             f"{self.pacer_switch_interval_us}")
        if self.thread_switch_interval_us is not None and not 0 <= self.thread_switch_interval_us <= 1_000_000:
            raise ValueError(f"thread_switch_interval_us must be in [0, 1000000] (0: the interpreter's own), got "
                             f"{self.thread_switch_interval_us}")
        if self.nccl_max_ctas is not None:
            if self.nccl_max_ctas < 1:
                raise ValueError(f"nccl_max_ctas must be >= 1 (NCCL's maxCTAs: the most channels a communicator "
                                 f"uses), got {self.nccl_max_ctas}")
            if self.device == "cpu":
                raise ValueError("nccl_max_ctas sets the mesh's NCCL communicators' channels; on the CPU the mesh "
                                 "is on Gloo, which has none: leave --nccl-max-ctas out")
            if not self.managed_mesh:
                raise ValueError("nccl_max_ctas applies to the groups the runtime makes for the mesh "
                                 "(--managed-mesh); init_device_mesh's groups are not made with options")
        for name in ("steps", "batch", "seq", "rollout_batch", "prompt_len", "new_tokens", "shard", "line_mib"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def thread_switch_interval_s(self) -> float | None:
        """The switch interval the switch's background moves run at, in seconds (None: the interpreter's own):
        ``thread_switch_interval_us``, or the switch's default when it is None."""
        from refimpl.runtime.switch_interval import RESPONSIVE_SWITCH_INTERVAL_S

        if self.thread_switch_interval_us is None:
            return RESPONSIVE_SWITCH_INTERVAL_S
        return self.thread_switch_interval_us * 1e-6 or None


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


__all__ = ["OVERLAP_WINDOW_MIB", "StepConfig", "model_config"]
