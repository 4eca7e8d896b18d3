"""The trainer role: a ``transformers`` causal LM sharded with FSDP2 on this rank, and its AdamW optimizers.

On two or more ranks the mesh is 2-D HSDP ``(replicate, shard)`` (:func:`mesh_layout`; with ``flat_mesh`` a
replicate dimension of one rank is left out: 1-D FSDP over the shard group); the mesh's groups are the runtime's,
under the lifecycle, with ``managed_mesh`` (:mod:`refimpl.torch_runtime.mesh_groups`), else
``init_device_mesh``'s (:func:`fsdp_mesh`). Every decoder layer is its own FSDP unit,
with early copies the head too (as torchtitan wraps its output layer: its gradients are reduced, stepped and
copied first in the backward), then the root. With early copies each unit has its own AdamW, stepped inside the
backward (:class:`bench.rl.early_copies.StepInBackward`), element for element the same update as one AdamW
stepped after it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.rl.config import StepConfig
from bench.rl.early_copies import StepInBackward


@dataclass
class Trainer:
    """The trainer role on this rank: the sharded model, its FSDP units and their optimizers."""

    model: Any
    #: parameters of the whole model (before sharding)
    params: int
    #: the FSDP device mesh (:func:`mesh_layout`)
    mesh: Any
    #: the FSDP units' parameters in the order a backward reduces them (:func:`fsdp_units`)
    units: list[list[torch.nn.Parameter]]
    #: one AdamW, or one per unit with early copies
    optims: list[torch.optim.Optimizer]
    #: with early copies, the stepper in the backward (set once the store is open)
    stepper: StepInBackward | None = None

    def use_order(self) -> list[torch.Tensor]:
        """The trainer's state in the order a training step first uses it (``OffloadStore.reload(use_order=...)``):
        the model's buffers (read at the forward's start: a rotary ``inv_freq``); every parameter in the order the
        forward's all-gathers read them, unit by unit (the root's first; FSDP2 copies each unit's sharded params
        into its all-gather input even where a custom all-gather, the rollout copy's, fills the output); then each
        unit's optimizer state in the order the backward steps the units (with early copies; else one optimizer's
        state in the units' order, all of it used at the one step after the backward)."""
        out: list[torch.Tensor] = list(self.model.buffers())
        out += [p for unit in reversed(self.units) for p in unit]  # the root, then the layers first to last
        for i, unit in enumerate(self.units):
            optim = self.optims[i] if len(self.optims) == len(self.units) else self.optims[0]
            for p in unit:
                out += [v for v in optim.state.get(p, {}).values() if isinstance(v, torch.Tensor) and v.dim()]
        return out


    @torch.no_grad()
    def old_logprobs(self, x: torch.Tensor) -> torch.Tensor:
        """The model's log-prob of each next token of ``x`` (``[batch, seq - 1]``, fp32), without gradients: the
        old policy's log-probs a PPO/GRPO step computes before its update (``--logprob-pass``). FSDP2 all-gathers
        each unit for it as for any forward (from the rollout's copy where that serves the step)."""
        logits = self.model(input_ids=x).logits[:, :-1].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)


def mesh_layout(world_size: int, shard: int, flat: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The FSDP mesh's shape and dimension names: ``(world / shard, shard)`` named ``(replicate, shard)`` on two
    or more ranks, ``(shard,)`` alone when ``flat`` and the replicate dimension has one rank, ``(1,)`` on one."""
    if world_size == 1:
        return (1,), ("shard",)
    shard = min(shard, world_size)
    if world_size % shard:
        raise ValueError(f"--shard {shard} must divide the world size {world_size}")
    if flat and world_size == shard:
        return (shard,), ("shard",)
    return (world_size // shard, shard), ("replicate", "shard")


def fsdp_mesh(device: torch.device, world_size: int, shard: int, flat: bool = False):
    """The FSDP mesh of :func:`mesh_layout` made by ``init_device_mesh`` (its groups outside the lifecycle; a
    dimension over every rank reuses the world group)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape, names = mesh_layout(world_size, shard, flat)
    return init_device_mesh(device.type, shape, mesh_dim_names=names)


def build_trainer(cfg: StepConfig, mcfg: Any, device: torch.device, mesh: Any, mixed: bool) -> Trainer:
    """The model built from ``mcfg`` on ``device`` (random weights), sharded with ``fully_shard`` over ``mesh``
    (bf16 params and fp32 reduction when ``mixed``), and its optimizers (:class:`Trainer`; its ``stepper`` not
    yet set)."""
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2ForCausalLM

    with torch.device(device):
        model = Qwen2ForCausalLM(mcfg)
    params = sum(p.numel() for p in model.parameters())
    mp_kwargs = {}
    if mixed:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        mp_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **mp_kwargs)
    if cfg.offload_in_backward:  # the head its own unit: its gradients are reduced, stepped and copied first
        fully_shard(model.lm_head, mesh=mesh, **mp_kwargs)
    fully_shard(model, mesh=mesh, **mp_kwargs)
    units = fsdp_units(model, head=cfg.offload_in_backward)
    optims = [torch.optim.AdamW(u, lr=1e-5) for u in units] if cfg.offload_in_backward \
        else [torch.optim.AdamW(model.parameters(), lr=1e-5)]
    return Trainer(model=model, params=params, mesh=mesh, units=units, optims=optims)


def fsdp_units(model: Any, head: bool = False) -> list[list[torch.nn.Parameter]]:
    """The model's FSDP units' parameters in the order a backward reduces them: ``head`` (the head wrapped on
    its own), the decoder layers last to first, then the root's (embeddings, final norm; the head too unless
    ``head``)."""
    units = ([list(model.lm_head.parameters())] if head else []) + \
        [list(layer.parameters()) for layer in reversed(model.model.layers)]
    seen = {id(p) for u in units for p in u}
    units.append([p for p in model.parameters() if id(p) not in seen])
    return units


__all__ = ["Trainer", "build_trainer", "fsdp_mesh", "fsdp_units", "mesh_layout"]
