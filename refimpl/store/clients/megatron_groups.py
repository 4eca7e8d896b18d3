"""Megatron-core's process groups handed to a :class:`refimpl.comm.PGLifecycle`.

Theory of operation
-------------------
``parallel_state.initialize_model_parallel`` makes Megatron's group families
itself and keeps each rank's group of each family in a module global
(``_DATA_PARALLEL_GROUP``, ``_EXPERT_MODEL_PARALLEL_GROUP``, ...); the model's
layers, Megatron's DDP wrapper, buffers and bucket groups, the optimizers and
the MoE token dispatchers keep references of their own. :func:`adopt_megatron_groups`
registers every group of every family with the runtime
(:meth:`Runtime.adopt_group <refimpl.runtime.base.Runtime.adopt_group>`) under
a name all ranks agree on, and returns the names to give the lifecycle:

* Names: ``megatron.<family>`` (the simulator's family names, ``tp``, ``dp``,
  ``dp_cp``, ``ep``, ``edp``, ...; :data:`MEGATRON_GROUP_FAMILIES`), with the
  group's index when a family has several (``megatron.edp0``, ``megatron.edp1``),
  in order of their lowest rank. A rank knows only its own group of each
  family, so the ranks agree on the rest with one all-gather over the world of
  (lowest member, timeout) per family: the groups of a family are disjoint, so
  the ranks that name the same lowest member are one group. Each member checks
  that the group found is its own.
* A global that is the same object as an earlier family's (Megatron's
  ``_INTRA_PARTIAL_*`` groups with one optimizer instance) is that group, not a
  family of its own; the ``*_GLOO`` copies are not adopted (Gloo holds no
  device memory and cannot be suspended): they stay as they are.
* The runtime rebuilds an adopted group in place: after the lifecycle destroyed
  and re-created it, every reference Megatron holds to the old object names the
  new one ([Note: rebuilt in place] in :mod:`refimpl.torch_runtime.foreign_groups`),
  so the next training step runs on the rebuilt groups without any call to Megatron.

Megatron itself is imported only when no ``parallel_state`` module is passed.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from refimpl.runtime.base import WORLD, GroupError, GroupSpec

logger = logging.getLogger(__name__)

#: family name -> the ``parallel_state`` global holding this rank's group of it (the first fourteen are the
#: simulator's Megatron families, in its order; then Megatron's expert and optimizer-instance variants)
MEGATRON_GROUP_FAMILIES: tuple[tuple[str, str], ...] = (
    ("tp", "_TENSOR_MODEL_PARALLEL_GROUP"),
    ("dp", "_DATA_PARALLEL_GROUP"),
    ("dp_cp", "_DATA_PARALLEL_GROUP_WITH_CP"),
    ("mp", "_MODEL_PARALLEL_GROUP"),
    ("tp_dp", "_TENSOR_AND_DATA_PARALLEL_GROUP"),
    ("tp_dp_cp", "_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP"),
    ("tp_cp", "_TENSOR_AND_CONTEXT_PARALLEL_GROUP"),
    ("pp", "_PIPELINE_MODEL_PARALLEL_GROUP"),
    ("cp", "_CONTEXT_PARALLEL_GROUP"),
    ("embd", "_EMBEDDING_GROUP"),
    ("pos_embd", "_POSITION_EMBEDDING_GROUP"),
    ("ep", "_EXPERT_MODEL_PARALLEL_GROUP"),
    ("etp", "_EXPERT_TENSOR_PARALLEL_GROUP"),
    ("edp", "_EXPERT_DATA_PARALLEL_GROUP"),
    ("tp_ep", "_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP"),
    ("tp_ep_pp", "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP"),
    ("intra_dist_opt", "_INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"),
    ("intra_dp_cp", "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP"),
    ("intra_edp", "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP"),
    ("inter_edp", "_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP"),
    ("dp_cp_ag", "_DATA_PARALLEL_GROUP_WITH_CP_AG"),
)

_NONE, _ALIAS = -1, -2  # what a rank reports for a family: no group here, or an earlier family's object


class MegatronGroupsError(GroupError):
    """Megatron's groups could not be adopted: ranks disagree on a family, or its groups overlap."""


def _parallel_state(module: Any) -> Any:
    if module is None:
        from megatron.core import parallel_state as module  # optional dependency: only when asked to read it
    if not module.model_parallel_is_initialized():
        raise MegatronGroupsError("Megatron's parallel state is not initialised; call "
                                  "parallel_state.initialize_model_parallel(...) before adopting its groups")
    return module


def _local_families(rt: Any, ps: Any, prefix: str) -> list[tuple[str, Any, int, int]]:
    """``(family, this rank's group object or None, lowest member or code, timeout s)`` per family, in order."""
    out: list[tuple[str, Any, int, int]] = []
    seen: dict[int, str] = {}
    for family, attr in MEGATRON_GROUP_FAMILIES:
        handle = getattr(ps, attr, None)
        if handle is None:
            out.append((family, None, _NONE, 0))
        elif id(handle) in seen:
            out.append((family, None, _ALIAS, 0))
        else:
            seen[id(handle)] = family
            spec = rt.foreign_group_spec(f"{prefix}.{family}", handle)
            out.append((family, handle, spec.ranks[0], int(-(-spec.timeout_s // 1))))
    return out


async def adopt_megatron_groups_async(rt: Any, parallel_state: Any = None, prefix: str = "megatron") -> list[str]:
    """Async :func:`adopt_megatron_groups`."""
    ps = _parallel_state(parallel_state)
    local = _local_families(rt, ps, prefix)
    width = 2 * len(local)
    mine = rt.alloc_device(width, torch.int64, tag="megatron.groups")
    mine.copy_(torch.tensor([v for _, _, low, t in local for v in (low, t)], dtype=torch.int64))
    every = rt.alloc_device(width * rt.world_size, torch.int64, tag="megatron.groups")
    await rt.all_gather_into_tensor(every, mine, WORLD)
    table = every.cpu().view(rt.world_size, len(local), 2).tolist()
    names: list[str] = []
    for f, (family, handle, _, _) in enumerate(local):
        lows = [row[f][0] for row in table]
        if _ALIAS in lows:
            if any(low >= 0 for low in lows):
                raise MegatronGroupsError(f"family {family!r}: some ranks hold an earlier family's group object, "
                                          f"others a group of its own ({lows}); Megatron's parallel state differs")
            continue
        groups = sorted({low for low in lows if low >= 0})
        timeout = max([row[f][1] for row in table if row[f][0] >= 0], default=0)
        for i, low in enumerate(groups):
            ranks = tuple(r for r, x in enumerate(lows) if x == low)
            name = f"{prefix}.{family}" if len(groups) == 1 else f"{prefix}.{family}{i}"
            mine_here = handle if rt.rank in ranks else None
            if mine_here is not None and rt.foreign_group_ranks(mine_here) != ranks:
                raise MegatronGroupsError(
                    f"family {family!r}: rank {rt.rank}'s group has ranks {rt.foreign_group_ranks(mine_here)}, but "
                    f"the ranks naming its lowest member are {ranks}; the family's groups overlap")
            await rt.adopt_group(GroupSpec(name, ranks, timeout_s=float(timeout or 600)), mine_here)
            names.append(name)
    logger.info("rank %d: adopted %d of Megatron's process groups: %s", rt.rank, len(names), ", ".join(names))
    return names


def adopt_megatron_groups(rt: Any, parallel_state: Any = None, prefix: str = "megatron") -> list[str]:
    """Register Megatron-core's process groups with ``rt`` (every rank calls it, after
    ``initialize_model_parallel``; see the module docstring) and return their names for
    ``PGLifecycle(rt, names, ...)``. After the lifecycle rebuilt a group, Megatron's own references
    (``parallel_state``, the model, its DDP buffers, the optimizers) name the rebuilt group.

    ``parallel_state``: the module to read (default: ``megatron.core.parallel_state``)."""
    return rt.run(adopt_megatron_groups_async(rt, parallel_state, prefix))


__all__ = ["MEGATRON_GROUP_FAMILIES", "MegatronGroupsError", "adopt_megatron_groups", "adopt_megatron_groups_async"]
