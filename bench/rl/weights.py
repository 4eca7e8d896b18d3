"""The weight sync's copy and its bitwise check: the rollout role's weights against the trainer's.

:meth:`RolloutWeights.sync` gathers each full parameter of the sharded trainer (``DTensor.full_tensor``: an
all-gather over the FSDP mesh) and copies it into the rollout's unsharded copy. :meth:`RolloutWeights.check`,
run outside the timed phases, compares the rollout's weights with the trainer's digests taken when they were
synced, as integers (:func:`bitwise_equal`'s rule: ``-0.0`` differs from ``0.0``, a NaN equals itself), and
every rank's rollout copy must have the same digest (``all_reduce`` MIN and MAX over the world group).
"""
from __future__ import annotations

from typing import Any

import torch

from refimpl.runtime import ReduceOp


def int_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of the same width (bitwise comparison, -0 != +0, NaN == NaN)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}[t.element_size()])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True iff ``a`` and ``b`` have the same shape, dtype and bits (``-0.0`` differs from ``0.0``; a NaN equals itself)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(int_view(a), int_view(b))


def digest_tensor(t: torch.Tensor) -> torch.Tensor:
    """A position-weighted integer digest of the tensor's bits as a 0-d int64 tensor on its device (same bits ->
    same digest; no host round trip)."""
    bits = int_view(t).reshape(-1).to(torch.int64)
    w = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 1021 + 1
    return (bits * w).sum()


def digest(t: torch.Tensor) -> int:
    """:func:`digest_tensor` read back as a Python int."""
    return int(digest_tensor(t).item())


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """The whole parameter: a sharded ``DTensor`` gathered over its mesh, a plain tensor detached."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


class RolloutWeights:
    """The rollout role's unsharded copy of the trainer's weights (in ``dtype``): the sync into it and its check.

    ``rt``: the runtime whose world group the digests are compared over (the lifecycle's ``trainer.dp`` may be
    down when the check runs)."""

    def __init__(self, rt: Any, device: torch.device, trainer: torch.nn.Module, rollout: torch.nn.Module,
                 dtype: torch.dtype) -> None:
        self.rt, self.device, self.trainer, self.dtype = rt, device, trainer, dtype
        self.params = dict(rollout.named_parameters())

    def sync(self) -> None:
        """Copy the trainer's full weights (``full_tensor``: an all-gather over the mesh) into the rollout's."""
        for name, p in self.trainer.named_parameters():
            self.params[name].copy_(full_tensor(p).to(self.dtype))

    @staticmethod
    def digests(tensors: list[torch.Tensor]) -> list[int]:
        """Each tensor's bit digest (:func:`digest`), computed on the device, read back at once."""
        return torch.stack([digest_tensor(t) for t in tensors]).tolist() if tensors else []

    def trainer_digests(self) -> dict[str, int]:
        """Digests of the trainer's full weights as the rollout holds them (its dtype)."""
        names = [n for n, _ in self.trainer.named_parameters()]
        return dict(zip(names, self.digests([full_tensor(p).to(self.dtype) for _, p in self.trainer.named_parameters()])))

    def check(self, want: dict[str, int]) -> dict[str, Any]:
        """Bitwise: each rollout weight's digest against ``want`` (the trainer's weights when they were synced,
        digested before their offload); digests compared over ranks.

        Run it outside the timed phases at a quiet point (after a training step's device synchronisation, before
        the next offload: no copy in flight for it to hide under, and the rollout copy unchanged since its sync).
        """
        got = dict(zip(self.params, self.digests(list(self.params.values()))))
        mismatched = [n for n in want if got.get(n) != want[n]]
        total = sum(got.values()) % (1 << 61)
        agree, worst = self._agree(total, len(mismatched))
        return {"tensors": len(want), "mismatched": mismatched, "digest": total, "ranks_agree": agree,
                "max_mismatched_any_rank": worst, "bitwise_equal": not mismatched and worst == 0 and agree}

    def _agree(self, mine: int, mismatched: int) -> tuple[bool, int]:
        """Over the world group: do the digests agree on every rank; the largest mismatch count of any rank."""
        lo = torch.tensor([mine, mismatched], dtype=torch.int64, device=self.device)
        hi = lo.clone()
        self.rt.run(self.rt.all_reduce(lo, ReduceOp.MIN, group="world", timeout_s=120))
        self.rt.run(self.rt.all_reduce(hi, ReduceOp.MAX, group="world", timeout_s=120))
        return bool(lo[0].item() == hi[0].item()), int(hi[1].item())


__all__ = ["RolloutWeights", "bitwise_equal", "digest", "digest_tensor", "full_tensor", "int_view"]
