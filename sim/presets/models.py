"""Model-state presets: the tensors one rank holds for a named model and parallel layout.

A scenario's ``model`` section names a preset (``"dense-7b"``, ``"qwen3-4b"``,
``"moe-30b-a3b"``) or lists tensors explicitly. :func:`build_state` returns
:class:`TensorSpec` s (name, shape, dtype, store category) for one rank:

* ``params`` in bf16 and, if asked, ``grads`` in bf16 and the optimizer
  state (fp32 master weights, Adam ``exp_avg`` and ``exp_avg_sq``) under the
  store's ``optimizer`` category;
* sharded as the scenario says: ``fsdp`` splits every tensor's first dim over
  that many ranks (FSDP2 per-parameter sharding), ``tp`` splits attention and
  MLP matrices Megatron-style (column-parallel q/k/v/gate/up, row-parallel
  o/down, vocab-parallel embeddings; norms stay whole), ``ep`` gives each rank
  its share of the experts;
* ``scale`` (< 1) shrinks every tensor to ``ceil(numel * scale)`` elements
  (flattened), so that real-payload runs stay small; timings then describe
  the shrunk model and the result says so.

Shapes are the published Hugging Face configs of the named models.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
}

CATEGORIES = ("params", "grads", "optimizer", "buffers")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a rank's state."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    category: str

    @property
    def numel(self) -> int:
        """Elements of the tensor."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor."""
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class Architecture:
    """The shapes that matter for memory: a decoder-only transformer, optionally MoE."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool = False
    experts: int = 0
    expert_intermediate: int = 0
    qk_norm: bool = False


ARCHITECTURES: dict[str, tuple[Architecture, str]] = {
    "dense-7b": (
        Architecture(layers=32, hidden=4096, intermediate=11008, vocab=32000, heads=32, kv_heads=32, head_dim=128),
        "Llama-2-7B shapes (meta-llama/Llama-2-7b-hf config.json), 6.74B parameters",
    ),
    "qwen3-4b": (
        Architecture(layers=36, hidden=2560, intermediate=9728, vocab=151936, heads=32, kv_heads=8, head_dim=128,
                     tied_embeddings=True, qk_norm=True),
        "Qwen3-4B shapes (Qwen/Qwen3-4B config.json), 4.0B parameters, tied embeddings",
    ),
    "moe-30b-a3b": (
        Architecture(layers=48, hidden=2048, intermediate=6144, vocab=151936, heads=32, kv_heads=4, head_dim=128,
                     experts=128, expert_intermediate=768, qk_norm=True),
        "Qwen3-30B-A3B shapes (Qwen/Qwen3-30B-A3B config.json): 48 layers x 128 experts, 18,867 parameter tensors",
    ),
}


def _split(n: int, parts: int) -> int:
    return -(-n // parts)


def _weights(a: Architecture, tp: int, ep: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of one rank under tensor parallel ``tp`` and expert parallel ``ep``."""
    h, d = a.hidden, a.head_dim
    yield "embed_tokens.weight", (_split(a.vocab, tp), h)
    for i in range(a.layers):
        p = f"layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (_split(a.heads * d, tp), h)
        yield p + "self_attn.k_proj.weight", (_split(a.kv_heads * d, tp), h)
        yield p + "self_attn.v_proj.weight", (_split(a.kv_heads * d, tp), h)
        yield p + "self_attn.o_proj.weight", (h, _split(a.heads * d, tp))
        if a.qk_norm:
            yield p + "self_attn.q_norm.weight", (d,)
            yield p + "self_attn.k_norm.weight", (d,)
        yield p + "post_attention_layernorm.weight", (h,)
        if a.experts:
            yield p + "mlp.gate.weight", (a.experts, h)
            for e in range(_split(a.experts, ep)):  # local expert indices
                q = f"{p}mlp.experts.{e}."
                yield q + "gate_proj.weight", (_split(a.expert_intermediate, tp), h)
                yield q + "up_proj.weight", (_split(a.expert_intermediate, tp), h)
                yield q + "down_proj.weight", (h, _split(a.expert_intermediate, tp))
        else:
            yield p + "mlp.gate_proj.weight", (_split(a.intermediate, tp), h)
            yield p + "mlp.up_proj.weight", (_split(a.intermediate, tp), h)
            yield p + "mlp.down_proj.weight", (h, _split(a.intermediate, tp))
    yield "norm.weight", (h,)
    if not a.tied_embeddings:
        yield "lm_head.weight", (_split(a.vocab, tp), h)


@dataclass(frozen=True)
class ModelConfig:
    """A scenario's ``model`` section, validated by :mod:`sim.scenarios.scenario`."""

    preset: str | None = None
    tensors: tuple[TensorSpec, ...] = ()
    state: tuple[str, ...] = ("params", "grads", "optimizer")
    fsdp: int = 1
    tp: int = 1
    ep: int = 1
    scale: float = 1.0


def _shrink(shape: tuple[int, ...], scale: float) -> tuple[int, ...]:
    if scale >= 1.0:
        return shape
    return (max(1, math.ceil(math.prod(shape) * scale)),)


def build_state(cfg: ModelConfig) -> list[TensorSpec]:
    """The tensors one rank holds (see the module docstring)."""
    if cfg.preset is None:
        return [TensorSpec(t.name, _shrink(t.shape, cfg.scale), t.dtype, t.category) for t in cfg.tensors]
    arch, _ = ARCHITECTURES[cfg.preset]
    out: list[TensorSpec] = []
    for name, shape in _weights(arch, cfg.tp, cfg.ep):
        if cfg.fsdp > 1:
            shape = (_split(shape[0], cfg.fsdp), *shape[1:])
        shape = _shrink(shape, cfg.scale)
        if "params" in cfg.state:
            out.append(TensorSpec(name, shape, torch.bfloat16, "params"))
        if "grads" in cfg.state:
            out.append(TensorSpec(name + ".grad", shape, torch.bfloat16, "grads"))
        if "optimizer" in cfg.state:
            for suffix in ("master", "exp_avg", "exp_avg_sq"):
                out.append(TensorSpec(f"{name}.{suffix}", shape, torch.float32, "optimizer"))
    return out


def describe(cfg: ModelConfig) -> dict[str, Any]:
    """A JSON-ready summary: preset, shapes source, tensor count and bytes per category."""
    state = build_state(cfg)
    by_cat: dict[str, int] = {}
    for t in state:
        by_cat[t.category] = by_cat.get(t.category, 0) + t.nbytes
    return {
        "preset": cfg.preset,
        "source": ARCHITECTURES[cfg.preset][1] if cfg.preset else "explicit tensors",
        "tensors": len(state),
        "bytes_by_category": by_cat,
        "scale": cfg.scale,
        "fsdp": cfg.fsdp,
        "tp": cfg.tp,
        "ep": cfg.ep,
    }


__all__ = ["ARCHITECTURES", "Architecture", "CATEGORIES", "DTYPES", "ModelConfig", "TensorSpec", "build_state", "describe"]
