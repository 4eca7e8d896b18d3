"""Inputs of ``timeshare plan``: model shapes, the cluster, the parallel layout and the RL step's workload.

:class:`ModelShape` is what the planner needs to know about a model: parameter
counts (dense and expert), the parameters one token activates, the number of
parameter tensors and the KV-cache bytes per token. It comes from a preset
(:data:`MODEL_PRESETS`, the published Hugging Face configs), from a
``transformers`` ``config.json`` read as plain JSON (:func:`shape_from_hf_config`),
or from explicit sizes (:func:`shape_from_sizes`).

:class:`Layout` is the parallelism (``tp``, ``pp``, ``dp``, ``ep``, ``eddp``,
``fsdp``) and :func:`role_state` the bytes one rank holds per store category
for a role. :class:`Workload` is the RL step (tokens, sequences, lengths, which
roles exist) and :class:`GpuSpec` the compute figures the simulator's
topology presets do not carry (peak bf16 FLOP/s, sources in :data:`GPU_FLOPS`).

Every number here that is not read from a config or a preset is an
assumption, named as such in docs/plan.md, and can be overridden on the
command line.
"""
from __future__ import annotations

from refimpl.cli_errors import CliInputError  # bad input: the CLI answers it with one line and exit 2

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from sim.presets.models import ARCHITECTURES, Architecture

GiB = 2**30


class PlanInputError(CliInputError):
    """A plan input is invalid; the message names the option or field and says what to give instead."""


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelShape:
    """The sizes of one model that decide its memory, copy and compute costs."""

    name: str
    source: str
    params: int  # every parameter
    expert_params: int  # of which in routed experts (0 for dense models)
    active_params: int  # parameters one token passes through (for FLOPs)
    tensors: int  # parameter tensors (the store pays a per-copy latency per tensor)
    kv_bytes_per_token: int  # bf16 K and V over all layers
    layers: int = 0
    hidden: int = 4096
    vocab: int = 32000
    experts_per_token: int = 0  # routed experts one token visits (MoE top-k; 0 for dense models)
    heads: int = 0  # attention heads (0: unknown); CP / Ulysses sizes must divide them

    @property
    def dense_params(self) -> int:
        """Parameters outside the routed experts."""
        return self.params - self.expert_params


def _count(a: Architecture, top_k: int) -> tuple[int, int, int, int]:
    """(params, expert params, active params, tensors) of an architecture."""
    h, d = a.hidden, a.head_dim
    attn = h * a.heads * d * 2 + h * a.kv_heads * d * 2
    norms = 2 * h + (2 * d if a.qk_norm else 0)
    layer_tensors = 2 + 4 + (2 if a.qk_norm else 0)
    if a.experts:
        expert = 3 * h * a.expert_intermediate
        per_layer_dense = attn + norms + a.experts * h  # router
        per_layer_expert = a.experts * expert
        per_layer_active = attn + norms + a.experts * h + top_k * expert
        layer_tensors += 1 + 3 * a.experts
    else:
        per_layer_dense = attn + norms + 3 * h * a.intermediate
        per_layer_expert = 0
        per_layer_active = per_layer_dense
        layer_tensors += 3
    embed = a.vocab * h * (1 if a.tied_embeddings else 2)
    params = a.layers * (per_layer_dense + per_layer_expert) + embed + h
    expert_params = a.layers * per_layer_expert
    active = a.layers * per_layer_active + embed + h
    tensors = a.layers * layer_tensors + 2 + (0 if a.tied_embeddings else 1)
    return params, expert_params, active, tensors


def shape_from_architecture(name: str, a: Architecture, source: str, top_k: int = 0) -> ModelShape:
    """A :class:`ModelShape` from :class:`sim.presets.models.Architecture` shapes (biases are left out)."""
    params, expert, active, tensors = _count(a, top_k)
    kv = 2 * a.layers * a.kv_heads * a.head_dim * 2
    return ModelShape(name, source, params, expert, active, tensors, kv, a.layers, a.hidden, a.vocab,
                      top_k if a.experts else 0, a.heads)


_EXTRA = {
    "Qwen2.5-7B": (Architecture(layers=28, hidden=3584, intermediate=18944, vocab=152064, heads=28, kv_heads=4,
                                head_dim=128), "Qwen/Qwen2.5-7B config.json (q/k/v biases left out)", 0),
    "Llama-2-13B": (Architecture(layers=40, hidden=5120, intermediate=13824, vocab=32000, heads=40, kv_heads=40,
                                 head_dim=128), "meta-llama/Llama-2-13b-hf config.json", 0),
    "Llama-3-70B": (Architecture(layers=80, hidden=8192, intermediate=28672, vocab=128256, heads=64, kv_heads=8,
                                 head_dim=128), "meta-llama/Meta-Llama-3-70B config.json", 0),
    # verl's default model (ppo_trainer.yaml's actor_rollout_ref.model.path) and its GRPO examples' model
    "DeepSeek-LLM-7B": (Architecture(layers=30, hidden=4096, intermediate=11008, vocab=102400, heads=32, kv_heads=32,
                                     head_dim=128), "deepseek-ai/deepseek-llm-7b-base config.json", 0),
}

#: model presets of ``timeshare plan --model``: name -> (architecture, source, experts per token)
MODEL_PRESETS: dict[str, tuple[Architecture, str, int]] = {
    "Qwen2.5-7B": _EXTRA["Qwen2.5-7B"],
    "Qwen2-7B": (_EXTRA["Qwen2.5-7B"][0], "Qwen/Qwen2-7B config.json (the shapes of Qwen2.5-7B; biases left out)", 0),
    "Qwen3-4B": (ARCHITECTURES["qwen3-4b"][0], "Qwen/Qwen3-4B config.json", 0),
    "Qwen3-30B-A3B": (ARCHITECTURES["moe-30b-a3b"][0], "Qwen/Qwen3-30B-A3B config.json (8 of 128 experts per token)", 8),
    "Llama-2-7B": (ARCHITECTURES["dense-7b"][0], "meta-llama/Llama-2-7b-hf config.json", 0),
    "Llama-2-13B": _EXTRA["Llama-2-13B"],
    "Llama-3-70B": _EXTRA["Llama-3-70B"],
    "DeepSeek-LLM-7B": _EXTRA["DeepSeek-LLM-7B"],
}


def model_preset(name: str) -> ModelShape:
    """A preset by name, case-insensitive; :class:`PlanInputError` lists the presets for an unknown one."""
    for key, (arch, source, top_k) in MODEL_PRESETS.items():
        if key.lower() == name.lower():
            return shape_from_architecture(key, arch, source, top_k)
    raise PlanInputError(f"--model: unknown model {name!r}; presets: {', '.join(MODEL_PRESETS)}, "
                         "or give a transformers config.json path, or --params-b")


def shape_from_hf_config(path: str | Path) -> ModelShape:
    """Read a ``transformers`` ``config.json`` as JSON (no ``transformers`` import; no network)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanInputError(f"--model {path}: cannot read the file ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanInputError(f"--model {path}: not a JSON config.json ({exc})") from None
    if not isinstance(cfg, Mapping):
        raise PlanInputError(f"--model {path}: expected a JSON object (a transformers config.json)")

    def need(*keys: str, default: Any = None) -> Any:
        for k in keys:
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        if default is not None:
            return default
        raise PlanInputError(f"--model {path}: the config has none of {list(keys)}; is it a decoder-only transformer config?")

    try:
        hidden = int(need("hidden_size", "d_model"))
        heads = int(need("num_attention_heads"))
        experts = int(need("num_experts", "num_local_experts", "n_routed_experts", default=0))
        arch = Architecture(
            layers=int(need("num_hidden_layers", "n_layer")),
            hidden=hidden,
            intermediate=int(need("intermediate_size", default=4 * hidden)),
            vocab=int(need("vocab_size")),
            heads=heads,
            kv_heads=int(need("num_key_value_heads", default=heads)),
            head_dim=int(need("head_dim", default=hidden // heads)),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            experts=experts,
            expert_intermediate=int(need("moe_intermediate_size", default=0)) if experts else 0,
            qk_norm=str(cfg.get("model_type", "")).startswith("qwen3"),
        )
        top_k = int(need("num_experts_per_tok", default=1)) if experts else 0
    except (TypeError, ValueError) as exc:
        raise PlanInputError(f"--model {path}: a size is not a number ({exc})") from None
    name = str(cfg.get("_name_or_path") or (cfg.get("architectures") or [path.stem])[0])
    return shape_from_architecture(name, arch, f"{path} (read as JSON)", top_k)


def shape_from_sizes(params_b: float, *, active_b: float | None = None, expert_b: float = 0.0,
                     layers: int = 32, kv_bytes_per_token: int | None = None, hidden: int = 4096) -> ModelShape:
    """A model from explicit sizes (billions of parameters); the tensor count and KV size are estimated."""
    if not params_b > 0:
        raise PlanInputError(f"--params-b: expected a positive number of billions of parameters, got {params_b}")
    if expert_b < 0 or expert_b >= params_b:
        raise PlanInputError(f"--expert-params-b: expected 0 <= value < --params-b ({params_b}), got {expert_b}")
    params = int(params_b * 1e9)
    kv = kv_bytes_per_token if kv_bytes_per_token is not None else 2 * layers * hidden * 2 // 4  # GQA 4:1 assumed
    return ModelShape(f"{params_b:g}B (explicit)", "explicit sizes from the command line", params, int(expert_b * 1e9),
                      int((active_b or params_b) * 1e9), layers * 9 + 3, kv, layers, hidden)


# --------------------------------------------------------------------------- GPUs


#: peak dense bf16 tensor-core FLOP/s per GPU, by topology preset (datasheets)
GPU_FLOPS: dict[str, tuple[float, str]] = {
    "hgx-h200-8x": (989e12, "NVIDIA H200 SXM datasheet: 989 TFLOPS dense BF16"),
    "hgx-h200-8x-ib": (989e12, "NVIDIA H200 SXM datasheet: 989 TFLOPS dense BF16"),
    "h200-1x": (989e12, "NVIDIA H200 SXM datasheet: 989 TFLOPS dense BF16"),
    "hgx-h20-8x": (148e12, "NVIDIA H20 datasheet: 148 TFLOPS dense BF16"),
    "a6000-4x-nvlink": (154.8e12, "NVIDIA RTX A6000 datasheet: 309.7 TFLOPS BF16 with sparsity, 154.8 dense"),
    "hgx-a100-80g-8x": (312e12, "NVIDIA A100 datasheet: 312 TFLOPS dense BF16"),
}


def gpu_flops(cluster: str) -> tuple[float, str]:
    """(peak dense bf16 FLOP/s, source) of a topology preset's GPU: by name, a calibrated preset by its base
    preset's name, a preset file by the name inside it; :class:`PlanInputError` when none is known."""
    names = [cluster, cluster.split("/", 1)[-1]]
    try:
        from sim.presets import load_preset_data

        inner = str(load_preset_data(cluster).get("name", ""))
        names += [inner, inner.removesuffix("-calibrated")]
    except Exception:  # noqa: BLE001 - an unknown preset: the caller's Machine says so with the preset's own error
        pass
    for name in names:
        if name in GPU_FLOPS:
            return GPU_FLOPS[name]
    raise PlanInputError(f"--gpu-tflops: no peak FLOP/s known for cluster {cluster!r}; give --gpu-tflops")


@dataclass(frozen=True)
class GpuSpec:
    """Compute figures of one GPU that the topology preset does not hold."""

    flops: float
    flops_source: str
    mfu: float = 0.35  # assumption: model FLOPs utilisation of training and scoring passes
    # torch AdamW on CPU tensors per rank (FSDP2 CPUOffloadPolicy steps the optimizer on the CPU). Measured here:
    # 0.028 G params/s with torch 2.13 AdamW(foreach=True), 20M fp32 params, 2 threads of a shared 2-core machine
    # (docs/plan.md has the command); assumed 0.1 G params/s for a rank with about 8 cores.
    cpu_adam_params_per_s: float = 0.1e9


class Machine:
    """The figures of a topology preset that the planner's analytic parts use (all SI); ``PlanInputError`` for a bad preset."""

    def __init__(self, cluster: "str | dict[str, Any]", nodes: int):
        from refimpl.runtime.base import CopyKind
        from sim.presets import PresetError
        from sim.machine.topology import Topology

        try:
            if isinstance(cluster, dict):  # preset data (e.g. cut to fewer GPUs by sim.presets.first_gpus)
                self.topo = Topology(dict(cluster, nodes=nodes) if nodes > 1 else cluster, where="--cluster")
            else:
                self.topo = Topology.from_preset(cluster, nodes=nodes if nodes > 1 else None)
        except PresetError as exc:
            raise PlanInputError(f"--cluster: {exc}") from None
        if nodes > 1 and self.topo.nodes != nodes:
            raise PlanInputError(f"--nodes {nodes}: preset {cluster!r} is one node; pick a multi-node preset such as hgx-h200-8x-ib")
        t = self.topo
        self.gpus = t.num_gpus
        self.per_node = t.gpus_per_node
        self.gpu_bytes = t.hbm_bytes(0)
        caps = t.capacities()
        path = t.copy_path(0, CopyKind.H2D)
        self.pcie = min(caps[r] for r in path if r.startswith("link:"))
        duplex = [caps[r] for r in path if r.startswith("duplex:")]
        self.duplex = min(duplex) if duplex else 2 * self.pcie
        self.nvlink = t.p2p(0, 1)[0] if self.per_node > 1 else math.inf
        eff = t.collective.efficiency.get(t.p2p(0, 1)[1].value, 1.0) if self.per_node > 1 else 1.0
        self.nvlink_eff = self.nvlink * eff
        # per GPU across nodes: the node's NICs shared by its GPUs, at the network's NCCL efficiency
        self.net_per_gpu = math.inf
        if t.nodes > 1:
            bw, kind = t.p2p(0, self.per_node)
            self.net_per_gpu = bw / self.per_node * t.collective.efficiency.get(kind.value, 1.0)
        self.hbm_bw = 2 * t.element(t.gpu(0))["copy_bandwidth"]
        self.copy_latency = t.copy.latency_s
        numas = {t.numa_of(r) for r in range(self.per_node)}
        self.host_per_node = sum(t.host_capacity(n) for n in numas)


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """Parallelism of the training roles: world = tp x pp x cp x dp; experts over ep x eddp = dp x cp x tp.

    ``shard="all"`` (FSDP2 / ZeRO-3): ``fsdp`` ranks of each dp group (times the
    cp ranks) shard the dense state (1 = replicated like DDP; default: all of
    dp). ``shard="optimizer"`` (Megatron's distributed optimizer): parameters and
    gradients are whole on every dp rank, the fp32 master weights and Adam
    moments are sharded over dp x cp. Experts are split over ``ep`` and, when the
    state is sharded, over ``eddp`` as well; otherwise replicated over it.
    ``cp`` is context parallelism (Megatron CP, verl's Ulysses sequence parallel).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 8
    ep: int = 1
    eddp: int = 0  # 0: dp * cp * tp // ep
    fsdp: int = 0  # 0: dp
    rollout_tp: int = 0  # 0: the smallest power of two whose share of the weights fits half a GPU
    cp: int = 1
    shard: str = "all"  # "all" (FSDP / ZeRO-3) or "optimizer" (Megatron's distributed optimizer)

    @property
    def world(self) -> int:
        """Ranks of the training job (every GPU, colocated roles)."""
        return self.tp * self.pp * self.cp * self.dp

    def resolved(self, model: ModelShape, gpus: int, gpu_bytes: float) -> "Layout":
        """Defaults filled in and checked against the model and the cluster."""
        for name in ("tp", "pp", "dp", "ep", "cp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise PlanInputError(f"--{name}: expected an integer >= 1, got {v!r}")
        if self.shard not in ("all", "optimizer"):
            raise PlanInputError(f"layout shard: expected 'all' or 'optimizer', got {self.shard!r}")
        if self.world != gpus:
            raise PlanInputError(f"--tp {self.tp} x --pp {self.pp} x --cp {self.cp} x --dp {self.dp} = {self.world:,} ranks, "
                                 f"but the cluster has {gpus} GPUs; change --dp (or --nodes / --cluster)")
        if model.layers and model.layers % self.pp:
            raise PlanInputError(f"--pp {self.pp}: the model's {model.layers} layers do not split into {self.pp} stages")
        if model.heads and (model.heads % self.tp or model.heads % self.cp):
            raise PlanInputError(f"--tp {self.tp} / --cp {self.cp}: must divide the model's {model.heads} attention heads")
        fsdp = self.fsdp or self.dp
        if fsdp < 1 or self.dp % fsdp:
            raise PlanInputError(f"--fsdp: expected a divisor of --dp {self.dp}, got {fsdp}")
        expert_ranks = self.dp * self.cp * self.tp
        if expert_ranks % self.ep:
            raise PlanInputError(f"--ep {self.ep}: expected a divisor of dp x cp x tp = {expert_ranks} (the ranks the "
                                 "experts are spread over)")
        eddp = self.eddp or expert_ranks // self.ep
        if model.expert_params and self.ep * eddp != expert_ranks:
            raise PlanInputError(f"--ep {self.ep} x --eddp {eddp} must equal dp x cp x tp = {self.dp * self.cp * self.tp}")
        rtp = self.rollout_tp
        if not rtp:
            rtp = 1
            while model.params * 2 / rtp > 0.5 * gpu_bytes and rtp < gpus:
                rtp *= 2
        if rtp < 1 or gpus % rtp:
            raise PlanInputError(f"--rollout-tp: expected a divisor of the {gpus} GPUs, got {rtp}")
        return replace(self, fsdp=fsdp, eddp=eddp, rollout_tp=rtp)

    def describe(self) -> str:
        """One line, e.g. ``tp 1, pp 1, dp 8 (fsdp 8), ep 1, rollout tp 1``."""
        shard = f"fsdp {self.fsdp}" if self.shard == "all" else "distributed optimizer"
        return (f"tp {self.tp}, pp {self.pp}, cp {self.cp}, dp {self.dp} ({shard}), ep {self.ep}, eddp {self.eddp}, "
                f"rollout tp {self.rollout_tp}")


#: bytes per parameter of each store category for a trained role (bf16 params and grads; fp32 master + Adam moments)
TRAIN_BYTES = {"params": 2, "grads": 2, "optimizer": 12}


@dataclass(frozen=True)
class RoleState:
    """One rank's state of a role: bytes per category and how much of it is replicated (and over how many ranks)."""

    bytes: dict[str, int]
    replicated: dict[str, int]  # bytes of each category that have replicas on other ranks
    replicas: int  # ranks holding each replicated byte (1: nothing replicated)
    tensors: int  # parameter tensors on this rank (the store copies one per tensor and category)

    @property
    def total(self) -> int:
        """All bytes of the role on this rank."""
        return sum(self.bytes.values())


def role_state(model: ModelShape, lay: Layout, *, trained: bool) -> RoleState:
    """Per-rank state of a role: trained roles hold params, grads and optimizer; scoring roles only params."""
    cats = TRAIN_BYTES if trained else {"params": 2}
    out, rep = {}, {}
    reps = []
    for cat, b in cats.items():
        # Megatron's distributed optimizer shards only the fp32 master weights and moments (over dp x cp)
        sharded = lay.shard == "all" or cat == "optimizer"
        f = (lay.fsdp * lay.cp if lay.shard == "all" else lay.dp * lay.cp) if sharded else 1
        dense = model.dense_params / (lay.tp * lay.pp * f)
        eddp_shard = lay.eddp if sharded and f > 1 else 1
        expert = model.expert_params / (lay.ep * lay.pp * eddp_shard)
        rep_dense = lay.dp * lay.cp // f
        rep_expert = 1 if eddp_shard > 1 else lay.eddp
        out[cat] = int((dense + expert) * b)
        rep[cat] = int((dense * b if rep_dense > 1 else 0) + (expert * b if rep_expert > 1 else 0))
        reps.append(max(rep_dense, rep_expert if model.expert_params else 1))
    replicas = max(reps)
    tensors = max(1, math.ceil(model.tensors / lay.pp / (lay.ep if model.expert_params else 1)))
    return RoleState(out, rep, replicas, tensors)


# --------------------------------------------------------------------------- workload


ROLES = ("actor_train", "critic", "reference", "reward", "rollout")


@dataclass(frozen=True)
class Workload:
    """One RL step: what is generated and scored, and which roles exist (they share every GPU)."""

    prompts: int = 256
    samples_per_prompt: int = 8
    prompt_len: int = 512
    response_len: int = 1024
    micro_batch_tokens: int = 16384  # tokens per rank per forward/backward (gradient accumulation below)
    reference: bool = True
    critic: bool = False
    reward_model: ModelShape | None = None
    kv_gib: float | None = None  # KV cache per GPU the rollout needs to run its batch at once (None: derived)
    tokens_per_s_per_gib: float | None = None  # rollout speed per GiB of KV per GPU (None: derived from HBM)
    rollout_s: float | None = None  # rollout time with all the KV it needs (None: derived)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def sequences(self) -> int:
        """Sequences generated per step."""
        return self.prompts * self.samples_per_prompt

    @property
    def tokens(self) -> int:
        """Tokens trained on per step (prompt + response of every sequence)."""
        return self.sequences * (self.prompt_len + self.response_len)

    def roles(self) -> list[str]:
        """The roles this step runs, rollout first."""
        out = ["rollout"]
        if self.reference:
            out.append("reference")
        if self.reward_model is not None:
            out.append("reward")
        if self.critic:
            out.append("critic")
        out.append("actor_train")
        return out


__all__ = [
    "GPU_FLOPS",
    "GiB",
    "GpuSpec",
    "Layout",
    "MODEL_PRESETS",
    "Machine",
    "ModelShape",
    "PlanInputError",
    "ROLES",
    "RoleState",
    "TRAIN_BYTES",
    "Workload",
    "gpu_flops",
    "model_preset",
    "role_state",
    "shape_from_architecture",
    "shape_from_hf_config",
    "shape_from_sizes",
]
