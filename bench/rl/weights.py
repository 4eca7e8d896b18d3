"""The weight sync's copy and its bitwise check: the rollout role's weights against the trainer's.

:meth:`RolloutWeights.sync` gathers each full parameter of the sharded trainer (``DTensor.full_tensor``: an
all-gather over the FSDP mesh), cast to the rollout's dtype first (``gather_in_rollout_dtype``: the same bits in
half the bytes with bf16), and copies it into the rollout's unsharded copy. With the sync in the backward
(``sync_in_backward``) :meth:`RolloutWeights.sync_unit` does the same for one FSDP unit right after its optimizer
step (on CUDA on a side stream, beside the rest of the backward) and :meth:`RolloutWeights.finish_early` ends it
after the backward, with a record per unit. :meth:`RolloutWeights.check`, run outside the timed phases, compares
the rollout's weights with the trainer's digests taken when they were synced, as integers (:func:`bitwise_equal`'s
rule: ``-0.0`` differs from ``0.0``, a NaN equals itself), and every rank's rollout copy must have the same digest
(``all_reduce`` MIN and MAX over the check group: the lifecycle's Gloo control group with a managed mesh, which
leaves the world group without a collective, else the world group).
"""
from __future__ import annotations

import time
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

    ``rt``: the runtime whose group ``check_group`` the digests are compared over (run where no group of the
    lifecycle needs to be up); ``gather_in_rollout_dtype``: cast each sharded param before its gather;
    ``clock_t0``: the phases' clock's zero (``time.perf_counter()``), where the sync in the backward places its
    units."""

    def __init__(self, rt: Any, device: torch.device, trainer: torch.nn.Module, rollout: torch.nn.Module,
                 dtype: torch.dtype, *, check_group: str = "world", gather_in_rollout_dtype: bool = True,
                 clock_t0: float = 0.0) -> None:
        self.rt, self.device, self.trainer, self.dtype = rt, device, trainer, dtype
        self.check_group, self.cast_first, self.t0 = check_group, gather_in_rollout_dtype, clock_t0
        self.params = dict(rollout.named_parameters())
        self._trainer_params = dict(trainer.named_parameters())
        self._units: list[list[str]] = []
        self._side: Any = None
        #: the units synced in the backward since the last :meth:`finish_early`, in order
        self.early: list[dict[str, Any]] = []

    def gathered(self, p: torch.Tensor) -> torch.Tensor:
        """The whole parameter ``p`` in the rollout's dtype (cast before the gather with ``gather_in_rollout_dtype``:
        an elementwise cast gives the same bits on either side of an all-gather). Cast first, the gather's input is
        a new tensor even where the dtypes match: a collective's work may hold its input a while after the gather
        returns, and a view of the param's storage held then is an alias the store refuses at the offload that
        follows (``UnattachedAliasError``, seen on Gloo)."""
        if self.cast_first:  # a copy even where the dtypes match: the gather's input never views the param
            return full_tensor(p.detach().to(self.dtype, copy=True))
        return full_tensor(p).to(self.dtype)

    def sync(self) -> None:
        """Copy the trainer's full weights (``full_tensor``: an all-gather over the mesh) into the rollout's."""
        for name, p in self._trainer_params.items():
            self.params[name].copy_(self.gathered(p))

    def set_units(self, units: list[list[torch.nn.Parameter]]) -> None:
        """The FSDP units :meth:`sync_unit` is called with (their indices), as lists of the trainer's params."""
        names = {id(p): n for n, p in self._trainer_params.items()}
        self._units = [[names[id(p)] for p in unit] for unit in units]

    def sync_unit(self, i: int) -> None:
        """Copy unit ``i``'s full weights into the rollout's, right after its optimizer step in the backward (on
        CUDA on a side stream that waits for the step: the rest of the backward runs on; :meth:`finish_early`
        joins it). Every rank calls it for the same units in the same order (a training step's backward)."""
        t = time.perf_counter()
        names = self._units[i]
        row: dict[str, Any] = {"unit": i, "at_s": t - self.t0,
                               "bytes": sum(self.params[n].numel() * self.params[n].element_size() for n in names)}
        if self.device.type == "cuda":
            if self._side is None:
                self._side = torch.cuda.Stream(self.device)
            self._side.wait_stream(torch.cuda.current_stream(self.device))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self._side):
                start.record()
                for n in names:
                    self.params[n].copy_(self.gathered(self._trainer_params[n]))
                end.record()
            row["_events"] = (start, end)
        else:
            for n in names:
                self.params[n].copy_(self.gathered(self._trainer_params[n]))
        row["issue_s"] = time.perf_counter() - t
        self.early.append(row)

    def finish_early(self) -> dict[str, Any]:
        """After the backward: the compute stream waits for the side stream; the record of the units synced since
        the last call (per unit ``at_s``, when its sync was issued on the phases' clock, ``bytes``, ``issue_s`` on
        the host and, on CUDA, ``device_s`` between events on the side stream; the side stream is synchronised
        to read them)."""
        if self._side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._side)
            self._side.synchronize()
        units = []
        for row in self.early:
            events = row.pop("_events", None)
            row["device_s"] = events[0].elapsed_time(events[1]) / 1e3 if events else row["issue_s"]
            units.append(row)
        self.early = []
        return {"units": units, "bytes": sum(u["bytes"] for u in units), "issue_s": sum(u["issue_s"] for u in units),
                "device_s": sum(u["device_s"] for u in units)}

    @staticmethod
    def digests(tensors: list[torch.Tensor]) -> list[int]:
        """Each tensor's bit digest (:func:`digest`), computed on the device, read back at once."""
        return torch.stack([digest_tensor(t) for t in tensors]).tolist() if tensors else []

    def trainer_digests(self) -> dict[str, int]:
        """Digests of the trainer's full weights as the rollout holds them (its dtype)."""
        return dict(zip(self._trainer_params, self.digests([self.gathered(p) for p in self._trainer_params.values()])))

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
        """Over the check group: do the digests agree on every rank; the largest mismatch count of any rank."""
        gloo = self.rt.group_spec(self.check_group).backend == "gloo"
        lo = torch.tensor([mine, mismatched], dtype=torch.int64, device="cpu" if gloo else self.device)
        hi = lo.clone()
        self.rt.run(self.rt.all_reduce(lo, ReduceOp.MIN, group=self.check_group, timeout_s=120))
        self.rt.run(self.rt.all_reduce(hi, ReduceOp.MAX, group=self.check_group, timeout_s=120))
        return bool(lo[0].item() == hi[0].item()), int(hi[1].item())


__all__ = ["RolloutWeights", "bitwise_equal", "digest", "digest_tensor", "full_tensor", "int_view"]
