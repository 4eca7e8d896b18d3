"""A colocated RLVR pipeline on :class:`~refimpl.worker.cluster.Cluster` s: the shape of ROLL's ``RLVRPipeline``.

Theory of operation
-------------------
The roles are clusters on the same GPUs (one :class:`~refimpl.worker.cluster.ResourcePool`):
``actor_infer`` generates, ``reference`` scores the sequences with the frozen
initial policy (when there is no reference role, ``actor_train`` does it with its
own frozen copy, as ROLL does for LoRA with ``disable_adapter``), ``actor_train``
scores them with the current policy (old log-probs) and trains on them. One step:

1. the phases in ``order``: it starts with ``actor_infer`` and ends with
   ``actor_train``; ``reference`` and ``old_log_probs`` come between, in the order
   the user chooses (``timeshare plan`` ranks orders; with serial switches they
   move the same bytes, except that two phases of one role in a row skip a switch);
2. the weight sync: ``actor_train.gather_weights()`` (under the role's
   ``PGLifecycle``: groups up, params reloaded, gathered, put back) and
   ``actor_infer.load_weights(...)``.

Every call is an RPC with ROLL's semantics: the role reloads its state before
and offloads it after, except that a phase followed by another phase of the same
cluster is sent with ``meta_info["is_offload_states"] = False``, so the state
stays on the GPU for it. With ``offload=False`` (the baseline) every call keeps
its state and nothing moves: the results must be bitwise equal.

The workers behind the roles are the caller's (``bench/ray_pipeline.py`` has
FSDP2 ones); they must offer the registered methods named here.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Mapping, Sequence

import torch

logger = logging.getLogger(__name__)

SCORING_PHASES = ("reference", "old_log_probs")


@dataclasses.dataclass
class Batch:
    """ROLL's ``DataProto`` in small: named tensors of one rank's share and the call's ``meta_info``."""

    tensors: dict[str, torch.Tensor]
    meta_info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def with_meta(self, **meta: Any) -> "Batch":
        """The same tensors with ``meta`` added to a copy of ``meta_info``."""
        return Batch(dict(self.tensors), {**self.meta_info, **meta})


def check_order(order: Sequence[str]) -> tuple[str, ...]:
    """``order`` as a tuple if valid: ``actor_infer`` first, ``actor_train`` last, each scoring phase once between."""
    order = tuple(order)
    middle = order[1:-1]
    if len(order) < 2 or order[0] != "actor_infer" or order[-1] != "actor_train" \
            or sorted(middle) != sorted(SCORING_PHASES):
        raise ValueError(f"role order {list(order)}: expected 'actor_infer' first, 'actor_train' last and "
                         f"{list(SCORING_PHASES)} between them in any order, e.g. "
                         "actor_infer,reference,old_log_probs,actor_train")
    return order


def verifiable_reward(prompts: torch.Tensor, responses: torch.Tensor, vocab: int) -> torch.Tensor:
    """A rule-checked reward per sequence: the share of response tokens equal to the prompt's last token + 1."""
    target = (prompts[:, -1:] + 1) % vocab
    return (responses == target).float().mean(dim=1)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """What to run: ``steps``, per-rank ``batch`` of prompts of ``prompt_len`` tokens, ``new_tokens`` generated,
    the model's ``vocab``, the phase ``order``, ``offload`` (False: the no-offload baseline), ``seed``."""

    steps: int = 2
    batch: int = 4
    prompt_len: int = 4
    new_tokens: int = 4
    vocab: int = 64
    order: tuple[str, ...] = ("actor_infer", "reference", "old_log_probs", "actor_train")
    offload: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        check_order(self.order)
        for name in ("steps", "batch", "prompt_len", "new_tokens", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"PipelineConfig.{name} must be >= 1, got {getattr(self, name)}")


class RLVRPipeline:
    """Drive the roles through ``cfg.steps`` steps; ``clusters`` maps ``actor_train``, ``actor_infer`` and
    optionally ``reference`` to their clusters (already set up)."""

    def __init__(self, clusters: Mapping[str, Any], cfg: PipelineConfig) -> None:
        missing = {"actor_train", "actor_infer"} - set(clusters)
        if missing:
            raise ValueError(f"RLVRPipeline needs clusters for {sorted(missing)}")
        self.clusters, self.cfg = dict(clusters), cfg
        self.world = clusters["actor_train"].world_size
        bad = {r: c.world_size for r, c in clusters.items() if c.world_size != self.world}
        if bad:
            raise ValueError(f"colocated roles need the same ranks: actor_train has {self.world}, {bad}")
        self.phase_s: list[dict[str, float]] = []

    def _serves(self, phase: str) -> Any:
        if phase == "reference":
            return self.clusters.get("reference", self.clusters["actor_train"])
        if phase == "old_log_probs":
            return self.clusters["actor_train"]
        return self.clusters[phase]

    def _keep(self, i: int) -> bool:
        """Keep the state on the GPU after phase ``i``: the baseline always does; else iff the next phase is the same cluster's."""
        order = self.cfg.order
        if not self.cfg.offload:
            return True
        return i + 1 < len(order) and self._serves(order[i + 1]) is self._serves(order[i])

    def _prompts(self, step: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.cfg.seed * 1000 + step)
        c = self.cfg
        return [torch.randint(0, c.vocab, (c.batch, c.prompt_len), generator=g) for _ in range(self.world)]

    def start(self) -> None:
        """The first weight sync (the engine starts from the trainer's weights); then every role offloads (offload mode)."""
        self.sync_weights()
        if self.cfg.offload:
            for c in {id(c): c for c in self.clusters.values()}.values():
                c.offload_states()

    def sync_weights(self) -> None:
        """actor_train's full weights into actor_infer (through Ray's object store)."""
        ref = self.clusters["actor_train"].gather_weights()
        self.clusters["actor_infer"].load_weights(ref, meta_info={"is_offload_states": self.cfg.offload})

    def step(self, step: int) -> dict[str, Any]:
        """One step: the phases in order, then the weight sync; the step's results (losses, rewards, sequences)."""
        c = self.cfg
        prompts = self._prompts(step)
        batches = [Batch({"prompts": p}, {"step": step}) for p in prompts]
        times: dict[str, float] = {}
        out: dict[str, Any] = {"step": step}
        for i, phase in enumerate(c.order):
            meta = {"is_offload_states": not self._keep(i)}
            t0 = time.perf_counter()
            if phase == "actor_infer":
                seqs = self.clusters["actor_infer"].generate([b.with_meta(**meta) for b in batches])
                for b, s in zip(batches, seqs):
                    b.tensors["sequences"] = s
                    resp = s[:, c.prompt_len:]
                    b.tensors["rewards"] = verifiable_reward(b.tensors["prompts"], resp, c.vocab)
                    b.tensors["advantages"] = b.tensors["rewards"] - b.tensors["rewards"].mean()
            elif phase in SCORING_PHASES:
                key = "ref_log_probs" if phase == "reference" else "old_log_probs"
                use_ref = phase == "reference" and "reference" not in self.clusters
                lps = self._serves(phase).compute_log_probs(
                    [b.with_meta(**meta, use_reference=use_ref) for b in batches])
                for b, lp in zip(batches, lps):
                    b.tensors[key] = lp
            else:
                out["loss"] = self.clusters["actor_train"].train_step([b.with_meta(**meta) for b in batches])[0]
            times[phase] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.sync_weights()
        times["weight_sync"] = time.perf_counter() - t0
        self.phase_s.append(times)
        out["reward"] = float(torch.stack([b.tensors["rewards"].mean() for b in batches]).mean())
        out["sequences"] = [b.tensors["sequences"] for b in batches]
        out["ref_log_probs"] = [b.tensors["ref_log_probs"] for b in batches]
        logger.info("step %d: loss %.6f reward %.3f (%s)", step, out["loss"], out["reward"],
                    ", ".join(f"{k} {v:.3f} s" for k, v in times.items()))
        return out

    def run(self) -> list[dict[str, Any]]:
        """:meth:`start`, then ``cfg.steps`` :meth:`step` s; their results."""
        self.start()
        return [self.step(s) for s in range(self.cfg.steps)]


__all__ = ["Batch", "PipelineConfig", "RLVRPipeline", "SCORING_PHASES", "check_order", "verifiable_reward"]
