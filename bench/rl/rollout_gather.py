"""FSDP2's all-gathers served from the rollout's copy of the weights, in the first training step after a switch.

[Note: the forward from the rollout copy] With the sync first and in the backward (``--sync-first
--sync-in-backward``) the rollout's unsharded copy holds, when the next training step starts, exactly the weights
the trainer's shards hold, cast to the rollout's dtype: each unit was gathered into it right after its optimizer
step, and nothing changes either side before the next forward. When that dtype is the dtype FSDP2 all-gathers in
(its ``MixedPrecisionPolicy.param_dtype``, else the parameter's), an all-gather's output is known on every rank
without a collective: rank ``r``'s part of it is, for each parameter of the unit in FSDP2's order, chunk ``r`` of
the full parameter along dimension 0 (``torch.chunk``, as FSDP2 shards), padded to FSDP2's padded shard size.

:class:`RolloutAllGather` is a unit's ``FSDPModule.set_custom_all_gather`` comm: while armed it fills the output
from the rollout's copy by device copies and returns no work; disarmed it runs FSDP2's own all-gather. Armed for
the first training step after a switch (its forward and the backward's re-gathers: a unit is re-gathered before
its own optimizer step, so its rollout copy still matches), that step's first collective on the trainer's groups
is the backward's first reduce-scatter, not the forward's first all-gather: the resume started at the reload
(the rebuilt groups' communicators' creation) is joined before the backward and runs beside the forward
(docs/comm.md, "The switch on N GPUs").

The fill is checked against FSDP2's layout where it can be: every parameter's rollout tensor must have the
parameter's full shape and the all-gather's dtype, the unit must be sharded on dimension 0 without a tensor
subclass of its own all-gather, and the bytes laid out per rank must be the output's; otherwise it raises
(:class:`RolloutGatherError`) and changes nothing.
"""
from __future__ import annotations

import time
from typing import Any

import torch


class RolloutGatherError(RuntimeError):
    """The rollout's copy cannot stand in for an all-gather of this unit; the message says why."""


def _all_gather_base():
    """FSDP2's all-gather comm interface and its default (``set_custom_all_gather`` needs a recent torch)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import AllGather, DefaultAllGather
    except ImportError as e:  # pragma: no cover - torch without custom FSDP2 comms
        raise RolloutGatherError(f"this torch ({torch.__version__}) has no FSDP2 custom all-gather: run the step "
                                 "with --no-forward-from-rollout") from e
    return AllGather, DefaultAllGather


def _param_group(module: Any):
    """The FSDP2 parameter group of ``module`` (an ``FSDPModule``), or None when it manages no parameters."""
    state = module._get_fsdp_state()
    return getattr(state, "_fsdp_param_group", None)


def _gather_dtype(fsdp_param: Any) -> torch.dtype:
    """The dtype FSDP2 all-gathers ``fsdp_param`` in: its mixed-precision param dtype, else its own."""
    return getattr(fsdp_param, "param_dtype", None) or fsdp_param.sharded_param.dtype


def _chunks(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Rank ``r``'s chunk of ``t`` along dimension 0 for every rank, as FSDP2 shards (``torch.chunk``; ranks past
    its chunks get an empty one)."""
    chunks = list(torch.chunk(t, world, dim=0))
    return chunks + [t[:0]] * (world - len(chunks))


def _param_name(fsdp_param: Any, modules: dict[int, str]) -> str | None:
    """The model's name of ``fsdp_param`` (its module's name and attribute; the same whether FSDP2 has the sharded
    or the unsharded tensor registered), or None when its module is not in ``modules``."""
    info = fsdp_param._module_info
    prefix = modules.get(id(info.module))
    if prefix is None:
        return None
    return f"{prefix}.{info.param_name}" if prefix else info.param_name


def make_rollout_all_gather():
    """The :class:`RolloutAllGather` class, built on this torch's FSDP2 all-gather interface."""
    AllGather, DefaultAllGather = _all_gather_base()

    class RolloutAllGather(AllGather):
        """One FSDP unit's all-gather: from the rollout's copy while :attr:`armed`, else FSDP2's own.

        ``fsdp_params``: the unit's FSDP2 params in its order; ``sources``: for each, the rollout's full tensor
        (same shape, the all-gather's dtype); ``param_names``: their names in the model (for the errors)."""

        def __init__(self, name: str, fsdp_params: list[Any], sources: list[torch.Tensor],
                     param_names: list[str]) -> None:
            self.name, self.fsdp_params, self.sources = name, fsdp_params, sources
            self.default = DefaultAllGather()
            #: fill from the rollout's copy (set for the first training step after a switch)
            self.armed = False
            #: all-gathers served from the rollout's copy, and their output bytes, since :meth:`take_counts`
            self.served, self.bytes, self.fill_s = 0, 0, 0.0
            for fp, src, fqn in zip(fsdp_params, sources, param_names):
                if tuple(src.shape) != tuple(fp._orig_size):
                    raise RolloutGatherError(f"{fqn}: the rollout's tensor has shape {tuple(src.shape)}, the "
                                             f"parameter {tuple(fp._orig_size)}")
                if src.dtype != _gather_dtype(fp):
                    raise RolloutGatherError(f"{fqn}: the rollout's copy is {src.dtype} but FSDP2 all-gathers in "
                                             f"{_gather_dtype(fp)}: the copy cannot stand in for the all-gather "
                                             "(run with --no-forward-from-rollout, or give the trainer a "
                                             "MixedPrecisionPolicy whose param_dtype is the rollout's)")
                if getattr(fp.fsdp_placement, "dim", 0) != 0:
                    raise RolloutGatherError(f"{fqn}: sharded on dimension {fp.fsdp_placement.dim}; the fill "
                                             "follows FSDP2's dimension-0 chunks only")
                if hasattr(fp._sharded_local_tensor, "fsdp_pre_all_gather"):
                    raise RolloutGatherError(f"{fqn}: a tensor subclass with its own all-gather inputs")
                if not src.is_contiguous():
                    raise RolloutGatherError(f"{fqn}: the rollout's tensor is not contiguous")

        def allocate(self, size, *, dtype, device):
            """The output buffer, as FSDP2's default allocates it."""
            return self.default.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                     async_op: bool = False):
            """Fill ``output_tensor`` from the rollout's copy (armed; no work returned) or all-gather it."""
            if not self.armed:
                return self.default(output_tensor, input_tensor, group, async_op)
            t = time.perf_counter()
            self._fill(output_tensor, group.size())
            self.served += 1
            self.bytes += output_tensor.numel() * output_tensor.element_size()
            self.fill_s += time.perf_counter() - t
            return None

        def _fill(self, output: torch.Tensor, world: int) -> None:
            """Rank ``r``'s part of the output, for each parameter in order: chunk ``r`` of its full tensor along
            dimension 0, zero-padded to FSDP2's padded shard size."""
            out = output.view(torch.uint8)
            per_rank = out.numel() // world
            sizes = [fp.padded_sharded_param_size.numel() * src.element_size()
                     for fp, src in zip(self.fsdp_params, self.sources)]
            if per_rank * world != out.numel() or sum(sizes) != per_rank:
                raise RolloutGatherError(
                    f"{self.name}: FSDP2's all-gather output holds {out.numel()} bytes over {world} ranks, the "
                    f"rollout's copy lays out {sum(sizes)} per rank: this torch's FSDP2 layout is not the one the "
                    "fill follows (run with --no-forward-from-rollout)")
            by_rank = out.view(world, per_rank)
            off = 0
            for fp, src, n in zip(self.fsdp_params, self.sources, sizes):
                padded = fp.padded_sharded_param_size
                if src.shape[0] == world * padded[0]:  # no padding: every rank's chunk in one strided copy
                    by_rank[:, off:off + n].view(src.dtype).view(world, *padded).copy_(src.view(world, *padded))
                else:
                    for r, chunk in enumerate(_chunks(src, world)):
                        seg = out[r * per_rank + off:r * per_rank + off + n].view(src.dtype).view(padded)
                        rows = chunk.shape[0]
                        if rows:
                            seg[:rows].copy_(chunk)
                        if rows < seg.shape[0]:
                            seg[rows:].zero_()
                off += n

        def take_counts(self) -> tuple[int, int, float]:
            """(served, bytes, fill seconds on the host) since the last call; reset."""
            out = (self.served, self.bytes, self.fill_s)
            self.served, self.bytes, self.fill_s = 0, 0, 0.0
            return out

    return RolloutAllGather


class ForwardFromRollout:
    """Every FSDP unit of ``model`` gets a :class:`RolloutAllGather` over the rollout's copy ``rollout_params``
    (its named parameters, the trainer's names); :meth:`arm` and :meth:`disarm` switch them all.

    Raises :class:`RolloutGatherError` (nothing installed) when a unit's params cannot be served (module docstring).
    """

    def __init__(self, model: torch.nn.Module, rollout_params: dict[str, torch.Tensor]) -> None:
        from torch.distributed.fsdp import FSDPModule

        cls = make_rollout_all_gather()
        modules = {id(m): n for n, m in model.named_modules()}
        self.comms: list[tuple[Any, Any]] = []
        for mod_name, mod in model.named_modules():
            if not isinstance(mod, FSDPModule):
                continue
            group = _param_group(mod)
            if group is None or not group.fsdp_params:
                continue
            sources, param_names = [], []
            for fp in group.fsdp_params:
                name = _param_name(fp, modules)
                if name is None or name not in rollout_params:
                    raise RolloutGatherError(f"unit {mod_name or '<root>'}: a parameter ({name}) has no tensor in "
                                             "the rollout's copy")
                sources.append(rollout_params[name].detach())
                param_names.append(name)
            self.comms.append((mod, cls(mod_name or "<root>", list(group.fsdp_params), sources, param_names)))
        if not self.comms:
            raise RolloutGatherError("the model has no FSDP2 unit with parameters")
        for mod, comm in self.comms:
            mod.set_custom_all_gather(comm)

    @property
    def armed(self) -> bool:
        """The units fill their all-gathers from the rollout's copy."""
        return self.comms[0][1].armed

    def arm(self) -> None:
        """From now on every unit's all-gather is a copy from the rollout's weights (they must equal the trainer's)."""
        for _, comm in self.comms:
            comm.armed = True

    def disarm(self) -> dict[str, Any]:
        """Back to FSDP2's all-gathers; returns what was served since :meth:`arm`: ``units`` (all-gathers served),
        ``bytes`` (their outputs) and ``fill_s`` (host seconds issuing the copies)."""
        served = bytes_ = 0
        fill = 0.0
        for _, comm in self.comms:
            comm.armed = False
            s, b, f = comm.take_counts()
            served, bytes_, fill = served + s, bytes_ + b, fill + f
        return {"units": served, "bytes": bytes_, "fill_s": fill}


__all__ = ["ForwardFromRollout", "RolloutGatherError", "make_rollout_all_gather"]
