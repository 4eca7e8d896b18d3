"""Per-GPU training-state shapes the offload benchmark moves (``timeshare bench offload``).

They live with the presets, below both users: the benchmark (:mod:`bench.offload`)
measures them on a GPU and the calibration (:mod:`sim.calibrate.calibration`) simulates the
same tensors.

A shape is a list of tensors by category: bf16 parameters (:attr:`Category.PARAMS`)
and, per parameter, an fp32 master weight and AdamW's ``exp_avg`` /
``exp_avg_sq`` (:attr:`Category.OPTIMIZER`): 14 bytes per parameter. Every
parameter is sharded 1/``shards`` on dim 0 as FSDP2 does, so each tensor is one
rank's local shard.

* :func:`dense_shape`: a Llama-2-7B-shaped model (hidden 4096, MLP 11008, 32
  layers, vocab 32000; 6.74e9 parameters), 1/8 shard: 291 tensors per category,
  1,164 in all, 11.8 GB.
* :func:`moe_shape`: Qwen3-30B-A3B's dimensions (hidden 2048, 128 experts with
  MLP 768, GQA attention, vocab 151936) for 16 of its 48 layers, 1/8 shard:
  25,164 tensors of mixed sizes (most of them 393-786 KB expert shards), 18.5 GB.
* ``tiny=True`` variants for the CPU dry run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from refimpl.store import Category


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a shape: local shard element count and dtype."""

    category: Category
    name: str
    numel: int
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor."""
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class StateShape:
    """A named list of tensors."""

    name: str
    tensors: tuple[TensorSpec, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole state."""
        return sum(t.nbytes for t in self.tensors)

    def describe(self) -> str:
        """One line: name, tensor count, size."""
        return f"{self.name}: {len(self.tensors)} tensors, {self.nbytes / 2**30:.2f} GiB"

    def materialize(self, device: torch.device, seed: int = 0) -> dict[Category, dict[str, torch.Tensor]]:
        """Allocate the tensors on ``device`` filled with normal noise, grouped by category."""
        gen = torch.Generator(device=device) if device.type != "meta" else None
        if gen is not None:
            gen.manual_seed(seed)
        out: dict[Category, dict[str, torch.Tensor]] = {}
        for spec in self.tensors:
            t = torch.empty(spec.numel, dtype=spec.dtype, device=device)
            if gen is not None:
                t.normal_(generator=gen)
            out.setdefault(spec.category, {})[spec.name] = t
        return out


def _adam_state(params: list[tuple[str, int]]) -> tuple[TensorSpec, ...]:
    """bf16 params plus fp32 master, exp_avg, exp_avg_sq for each (name, local numel)."""
    specs = [TensorSpec(Category.PARAMS, f"param.{n}", k, torch.bfloat16) for n, k in params]
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        specs += [TensorSpec(Category.OPTIMIZER, f"{kind}.{n}", k, torch.float32) for n, k in params]
    return tuple(specs)


def _shard(rows: int, cols: int, shards: int) -> int:
    """Local numel of a (rows, cols) parameter sharded on dim 0 (FSDP2 pads the last shard)."""
    return -(-rows // shards) * cols


def dense_shape(*, shards: int = 8, tiny: bool = False) -> StateShape:
    """Llama-2-7B-shaped per-rank state (``tiny``: hidden 512, 2 layers)."""
    h, inter, layers, vocab = (512, 1376, 2, 4000) if tiny else (4096, 11008, 32, 32000)
    params = [("embed", _shard(vocab, h, shards))]
    for i in range(layers):
        for proj in ("q", "k", "v", "o"):
            params.append((f"l{i}.attn.{proj}", _shard(h, h, shards)))
        params.append((f"l{i}.mlp.gate", _shard(inter, h, shards)))
        params.append((f"l{i}.mlp.up", _shard(inter, h, shards)))
        params.append((f"l{i}.mlp.down", _shard(h, inter, shards)))
        params.append((f"l{i}.norm1", _shard(h, 1, shards)))
        params.append((f"l{i}.norm2", _shard(h, 1, shards)))
    params += [("norm", _shard(h, 1, shards)), ("lm_head", _shard(vocab, h, shards))]
    return StateShape("dense-7b-1of8" if not tiny else "dense-tiny", _adam_state(params))


def moe_shape(*, shards: int = 8, tiny: bool = False, layers: int | None = None) -> StateShape:
    """Fine-grained MoE per-rank state with >= 20,000 tensors (``tiny``: 2 layers of 32 experts)."""
    h, inter, n_layers, experts, vocab, heads, kv = (
        (256, 64, 2, 32, 4000, 4, 2) if tiny else (2048, 768, 16, 128, 151936, 32, 4))
    n_layers = layers or n_layers
    head_dim = 128 if not tiny else 32
    params = [("embed", _shard(vocab, h, shards))]
    for i in range(n_layers):
        params.append((f"l{i}.attn.q", _shard(heads * head_dim, h, shards)))
        params.append((f"l{i}.attn.k", _shard(kv * head_dim, h, shards)))
        params.append((f"l{i}.attn.v", _shard(kv * head_dim, h, shards)))
        params.append((f"l{i}.attn.o", _shard(h, heads * head_dim, shards)))
        params.append((f"l{i}.attn.q_norm", head_dim))
        params.append((f"l{i}.attn.k_norm", head_dim))
        params.append((f"l{i}.router", _shard(experts, h, shards)))
        for e in range(experts):
            params.append((f"l{i}.e{e}.gate", _shard(inter, h, shards)))
            params.append((f"l{i}.e{e}.up", _shard(inter, h, shards)))
            params.append((f"l{i}.e{e}.down", _shard(h, inter, shards)))
        params.append((f"l{i}.norm1", _shard(h, 1, shards)))
        params.append((f"l{i}.norm2", _shard(h, 1, shards)))
    params += [("norm", _shard(h, 1, shards)), ("lm_head", _shard(vocab, h, shards))]
    return StateShape("moe-1of8" if not tiny else "moe-tiny", _adam_state(params))


SHAPES = {"dense": dense_shape, "moe": moe_shape}


__all__ = ["SHAPES", "StateShape", "TensorSpec", "dense_shape", "moe_shape"]
