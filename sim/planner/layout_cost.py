"""What the parallel layout costs one RL step in ``timeshare plan``: communication, pipeline bubbles, activations.

The planner's compute term is the FLOPs of a pass divided over every GPU; the layout decides what is
added to it (all computed, no simulation; docs/plan.md lists the formulas and assumptions):

* **TP** all-reduces the activations of each layer, twice per forward (attention and MLP outputs),
  twice per backward and twice more for the recomputed forward under activation checkpointing; the
  TP group is the innermost (NVLink inside a node). Megatron's TP communication is on the critical
  path, so all of it is added.
* **FSDP** (``shard="all"``: FSDP2 / ZeRO-3) all-gathers the parameters before each forward and
  backward of each micro-batch and reduce-scatters the fp32 gradients; it prefetches the next layer,
  so only what does not hide behind the pass's compute is added, plus one layer's gather.
* **Megatron's distributed optimizer** (``shard="optimizer"``) reduce-scatters the gradients and
  all-gathers the updated parameters once per step, overlapped with the last micro-batch's backward.
* **PP** runs 1F1B: the bubble adds (pp - 1) micro-batch times; the first stage holds up to pp
  micro-batches of checkpointed activations.
* **CP** (context parallel; verl's Ulysses sequence parallel) all-to-alls Q, K, V and the output of
  each layer's attention over the CP group (twice that in the backward, once more in the recompute).
* **EP** all-to-alls each MoE layer's tokens to their experts and back (dispatch and combine),
  forward, backward and recompute.

Group placement follows Megatron's order (tp innermost, then cp, then ep / dp, then pp): a group
whose span fits in a node runs at the NVLink rate times the preset's NCCL efficiency, otherwise at the
node's NIC bandwidth shared by its GPUs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.planner.plan_inputs import Layout, Machine, ModelShape, Workload

#: passes of a trained role per micro-batch that communicate activations: forward, backward, recomputed forward
TRAIN_PASSES = 3
#: bytes per element of activations and of FSDP's gathered parameters (bf16) and reduced gradients (fp32)
ACT_BYTES, PARAM_BYTES, GRAD_REDUCE_BYTES = 2, 2, 4


@dataclass(frozen=True)
class LayoutCost:
    """Seconds one role's turn adds to its compute because of the layout, per kind (slowest rank)."""

    tp: float = 0.0
    fsdp: float = 0.0
    dp: float = 0.0
    pp_bubble: float = 0.0
    cp: float = 0.0
    ep: float = 0.0

    @property
    def total(self) -> float:
        """Everything the layout adds."""
        return self.tp + self.fsdp + self.dp + self.pp_bubble + self.cp + self.ep

    def as_dict(self) -> dict[str, float]:
        """JSON-ready, with the total."""
        return {"tp": self.tp, "fsdp": self.fsdp, "dp": self.dp, "pp_bubble": self.pp_bubble, "cp": self.cp,
                "ep": self.ep, "total": self.total}


def group_bandwidth(m: Machine, size: int, inner: int) -> float:
    """Effective bytes/s per GPU of a group of ``size`` ranks placed ``inner`` ranks apart (Megatron order)."""
    if size <= 1:
        return math.inf
    if size * inner <= m.per_node:
        return m.nvlink_eff
    return m.net_per_gpu


def ring(bytes_: float, n: int, bw: float, factor: float) -> float:
    """A ring collective over ``n`` ranks moving ``factor`` x (n - 1) / n of ``bytes_`` per rank."""
    if n <= 1 or bytes_ <= 0:
        return 0.0
    return factor * (n - 1) / n * bytes_ / bw


def micro_batches(w: Workload, lay: Layout) -> int:
    """Micro-batches each data-parallel replica runs per pass over the step's tokens."""
    return max(1, math.ceil(w.tokens / (lay.dp * w.micro_batch_tokens)))


def layout_cost(model: ModelShape, lay: Layout, w: Workload, m: Machine, compute_s: float, *,
                trained: bool) -> LayoutCost:
    """What ``lay`` adds to a role's turn whose ideal compute (FLOPs over every GPU) is ``compute_s``."""
    mb = micro_batches(w, lay)
    layers = max(1, model.layers) / lay.pp
    t_rank = w.micro_batch_tokens / lay.cp  # tokens of one micro-batch on one rank of a CP group
    passes = TRAIN_PASSES if trained else 1
    act = t_rank * model.hidden * ACT_BYTES
    tp_s = mb * layers * 2 * passes * ring(act, lay.tp, group_bandwidth(m, lay.tp, 1), 2)
    cp_s = mb * layers * (2 * passes - (1 if trained else 0)) * ring(4 * act / lay.tp, lay.cp,
                                                                      group_bandwidth(m, lay.cp, lay.tp), 1)
    ep_s = 0.0
    if model.expert_params and lay.ep > 1:
        top_k = max(1, model.experts_per_token)
        ep_s = mb * layers * 2 * passes * ring(act * top_k / lay.tp, lay.ep, group_bandwidth(m, lay.ep, lay.tp * lay.cp), 1)
    fsdp_s = dp_s = 0.0
    dense_unsharded = model.dense_params / (lay.tp * lay.pp)
    replicas = lay.dp * lay.cp
    if lay.shard == "all" and lay.fsdp * lay.cp > 1:
        f = lay.fsdp * lay.cp
        bw = group_bandwidth(m, f, lay.tp)
        gather = ring(dense_unsharded * PARAM_BYTES, f, bw, 1)
        per_micro = gather * (2 if trained else 1) + (ring(dense_unsharded * GRAD_REDUCE_BYTES, f, bw, 1) if trained else 0)
        fsdp_s = max(0.0, mb * per_micro - compute_s) + gather / max(1.0, layers)
        if trained and lay.dp // lay.fsdp > 1:  # HSDP: the shards' gradients all-reduced over the replicas
            dp_s = ring(dense_unsharded / f * GRAD_REDUCE_BYTES, lay.dp // lay.fsdp, group_bandwidth(m, lay.dp // lay.fsdp, lay.tp * f), 2)
    elif trained and replicas > 1:
        bw = group_bandwidth(m, replicas, lay.tp)
        step = (ring(dense_unsharded * GRAD_REDUCE_BYTES, replicas, bw, 1)  # reduce-scatter the gradients
                + ring(dense_unsharded * PARAM_BYTES, replicas, bw, 1))  # all-gather the updated parameters
        dp_s = max(0.0, step - compute_s / mb)
    bubble = compute_s * (lay.pp - 1) / mb if lay.pp > 1 else 0.0
    return LayoutCost(tp=tp_s, fsdp=fsdp_s, dp=dp_s, pp_bubble=bubble, cp=cp_s, ep=ep_s)


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16) if d <= limit and n % d == 0]


def layout_choices(model: ModelShape, gpus: int, per_node: int, family: str, *, seq_len: int,
                   heads: int = 0) -> list[Layout]:
    """The layouts ``timeshare plan`` compares for a training backend ``family``.

    ``fsdp`` (verl's FSDP / FSDP2 workers): no TP or PP; FSDP over every GPU or over each node (HSDP),
    Ulysses sequence parallel 1, 2 or 4 (4 only for sequences of 8k tokens or more). ``megatron``
    (verl's Megatron workers, ROLL's ``megatron_train``): TP 1-8 inside a node, PP 1, 2 or 4 where the
    layers divide, CP 2 for long sequences, EP over the ranks for MoE models, the distributed optimizer.
    """
    out: list[Layout] = []
    layers = max(1, model.layers)
    heads = heads or 1 << 30
    if family == "fsdp":
        cps = [c for c in (1, 2, 4) if c == 1 or (seq_len >= 1024 * c and heads % c == 0)]
        for cp in cps:
            if gpus % cp:
                continue
            dp = gpus // cp
            shards = {dp, max(1, per_node // cp)}
            for f in sorted(shards, reverse=True):
                if dp % f == 0:
                    out.append(Layout(dp=dp, cp=cp, fsdp=f, shard="all"))
        return out
    cps = [1, 2] if seq_len >= 8192 else [1]
    for tp in _divisors(gpus, per_node):
        for pp in (1, 2, 4):
            if layers % pp or gpus % (tp * pp):
                continue
            for cp in cps:
                if gpus % (tp * pp * cp):
                    continue
                dp = gpus // (tp * pp * cp)
                if model.expert_params:
                    for ep in _divisors(dp * tp * cp, 64):
                        if ep == 1 and dp * cp > 1:
                            continue
                        out.append(Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, fsdp=1, shard="optimizer"))
                else:
                    out.append(Layout(tp=tp, pp=pp, cp=cp, dp=dp, fsdp=1, shard="optimizer"))
    return out


def describe(lay: Any) -> str:
    """A layout in a few words, e.g. ``tp 2 dp 4 dist-opt`` (Megatron's distributed optimizer) or ``dp 8 fsdp 8``."""
    parts = [f"{k} {getattr(lay, k)}" for k in ("tp", "pp", "cp", "ep") if getattr(lay, k) > 1]
    parts.append(f"dp {lay.dp}")
    if lay.shard == "all":
        parts.append(f"fsdp {lay.fsdp}" if lay.fsdp == lay.dp else f"hsdp {lay.fsdp}x{lay.dp // lay.fsdp}")
    else:
        parts.append("dist-opt")
    return " ".join(parts)


__all__ = ["LayoutCost", "describe", "group_bandwidth", "layout_choices", "layout_cost", "micro_batches", "ring"]
