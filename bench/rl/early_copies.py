"""Early copies (``--offload-in-backward``): the optimizer stepped per FSDP unit inside the backward, each unit's
state handed to the store for its device-to-host copies right after its step."""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch


class StepInBackward:
    """The optimizer stepped per FSDP unit inside the backward, each unit's state copied early.

    A post-accumulate-grad hook on every parameter (FSDP2 runs them on the sharded parameter after its
    reduce-scatter, torchtune's ``optimizer_in_bwd`` pattern) counts the unit's gradients; the last one steps
    the unit's own optimizer and drops its gradients. With ``early`` set (the step precedes a switch) the
    unit's parameters and optimizer state, final from then on, go to :meth:`OffloadStore.copy_early`: their
    device-to-host copies run under the rest of the backward and the offload takes them over ([Note: early
    copies] in the store). No global gradient clipping or accumulation across backward calls fits this step
    (each unit steps on its own gradients as they arrive). :meth:`finish` after the backward steps a unit some
    of whose parameters got no gradient. ``on_stepped(i)``, when given, runs after unit ``i``'s early copies in a
    step with ``early`` set: the weight sync in the backward (:meth:`bench.rl.weights.RolloutWeights.sync_unit`).
    """

    def __init__(self, units: list[list[torch.nn.Parameter]], optims: list[Any], store: Any,
                 on_stepped: Callable[[int], None] | None = None) -> None:
        self.units, self.optims, self.store = units, optims, store
        self.on_stepped = on_stepped
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
            if self.on_stepped is not None:
                self.on_stepped(i)

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
        order, :func:`bench.rl.trainer.fsdp_units`)."""
        def nbytes(t: torch.Tensor) -> int:
            t = getattr(t, "_local_tensor", t)
            return t.numel() * t.element_size()
        return [sum(nbytes(t) for t in self._state(i)) for i in range(len(self.units))]


__all__ = ["StepInBackward"]
