"""Which process groups the trainer uses, and which of them the lifecycle takes down in the rollout.

With ``managed_mesh`` (the default) the FSDP mesh is built on groups the runtime makes, one per subgroup of each
mesh dimension (:func:`refimpl.torch_runtime.mesh_groups.build_mesh_groups`); those are the lifecycle's groups,
rebuilt in place (FSDP2's states and the mesh's names follow each rebuild), the loss is summed over them, and the
weight check compares its digests over the lifecycle's Gloo control group. No collective of the step runs on
the world group, so its NCCL communicator never exists, and in the rollout no NCCL communicator of the trainer is
alive. On one rank the mesh is one group of one rank that carries no collective at all (FSDP2 issues none on a
one-rank mesh and a one-rank sum needs none): the trainer then holds no NCCL communicator at any time.

Without it (``--no-managed-mesh``, the earlier step) ``init_device_mesh`` makes the mesh's groups (a dimension
over every rank reuses the world group), the lifecycle manages one group of its own, ``trainer.dp``, for the loss,
and the weight check runs on the world group: the mesh's communicators and the world's live through the rollout.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from bench.rl.config import StepConfig
from bench.rl.trainer import fsdp_mesh, mesh_layout

#: the lifecycle's Gloo control group (never destroyed); the weight check compares digests over it
CONTROL_GROUP = "trainer.control"
#: the prefix of the mesh groups' names (``trainer.mesh.shard``, ``trainer.mesh.replicate0`` ...)
MESH_PREFIX = "trainer.mesh"


@dataclass
class TrainerGroups:
    """The trainer's mesh and groups on this rank."""

    #: the ``DeviceMesh`` FSDP2 shards over
    mesh: Any
    #: the groups the lifecycle manages (every rank names all of them)
    lifecycle: tuple[str, ...]
    #: the groups the loss is summed over, in order (none on one rank with a managed mesh)
    loss: tuple[str, ...]
    #: the group the weight check's digests are compared over
    check: str
    #: the groups the weight sync gathers over, when it runs inside ``PGLifecycle.weight_sync`` (``GroupPlanRules``'
    #: ``sync_groups``: an empty set when it needs none of the lifecycle's)
    sync: frozenset[str]
    #: the runtime-made mesh (None without ``managed_mesh``)
    managed: Any = None

    def reduce_loss(self, rt: Any, loss: torch.Tensor) -> None:
        """Sum ``loss`` over every rank in place (over :attr:`loss`, one group after another)."""
        from refimpl.runtime import ReduceOp

        for name in self.loss:
            rt.run(rt.all_reduce(loss, ReduceOp.SUM, group=name, timeout_s=120))

    def close(self) -> None:
        """Stop following rebuilds (a managed mesh's runtime hook)."""
        if self.managed is not None:
            self.managed.close()


#: environment variables by which NCCL overrides or further caps a communicator's channels
NCCL_CHANNEL_ENV = ("NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS")


def mesh_group_options(cfg: StepConfig, env: Mapping[str, str] | None = None) -> tuple[tuple[str, Any], ...]:
    """The options every mesh group is made (and each rebuild re-made) with: NCCL's ``maxCTAs`` from
    ``cfg.nccl_max_ctas`` (ProcessGroupNCCL's ``config.max_ctas``), or none. NCCL lets ``NCCL_MAX_CTAS`` in the
    environment (``env``, default ``os.environ``) replace a communicator's ``maxCTAs``: one that differs from the cap
    raises ValueError, since the run would not be what it says."""
    if cfg.nccl_max_ctas is None:
        return ()
    env = os.environ if env is None else env
    set_ = env.get("NCCL_MAX_CTAS")
    if set_ is not None and set_.strip() != str(int(cfg.nccl_max_ctas)):
        raise ValueError(f"NCCL_MAX_CTAS={set_} in the environment replaces --nccl-max-ctas {cfg.nccl_max_ctas} in "
                         "every communicator NCCL makes; unset it or give the same value")
    return (("config.max_ctas", int(cfg.nccl_max_ctas)),)


def trainer_groups(rt: Any, cfg: StepConfig, world_size: int, device: torch.device) -> TrainerGroups:
    """Make the trainer's groups (every rank, in the same order) and its mesh, as ``cfg.managed_mesh`` says."""
    from refimpl.runtime import GroupSpec

    shape, dims = mesh_layout(world_size, cfg.shard, cfg.flat_mesh)
    if not cfg.managed_mesh:
        rt.run(rt.new_group(GroupSpec("trainer.dp", tuple(range(world_size)))))
        return TrainerGroups(mesh=fsdp_mesh(device, world_size, cfg.shard, cfg.flat_mesh), lifecycle=("trainer.dp",),
                             loss=("trainer.dp",), check="world", sync=frozenset())
    from refimpl.torch_runtime.mesh_groups import build_mesh_groups

    mg = build_mesh_groups(rt, shape, dims, prefix=MESH_PREFIX, options=mesh_group_options(cfg))
    loss = tuple(mg.mine[d] for d, n in zip(dims, shape) if n > 1)
    # the sync-first gather runs before the pause; a sync after the rollout gathers over the shard groups, unless
    # they have one rank each (a gather over one rank runs no collective)
    sync = frozenset() if cfg.sync_first or shape[-1] == 1 else frozenset(mg.by_dim["shard"])
    return TrainerGroups(mesh=mg.mesh, lifecycle=mg.names, loss=loss, check=CONTROL_GROUP, sync=sync, managed=mg)


__all__ = ["CONTROL_GROUP", "MESH_PREFIX", "NCCL_CHANNEL_ENV", "TrainerGroups", "mesh_group_options", "trainer_groups"]
