"""A ``DeviceMesh`` whose groups the runtime owns, so a :class:`~refimpl.comm.PGLifecycle` can take them down.

Theory of operation
-------------------
``init_device_mesh`` makes a mesh's groups itself, and a dimension that spans
every rank (a 1-D mesh, or FSDP's shard dimension on a node) reuses the
default group: a group the runtime may never destroy, whose NCCL communicator
then holds device memory through every rollout. :func:`build_mesh_groups`
makes the groups instead: one runtime group per subgroup of each dimension
(``<prefix>.<dim>`` when the dimension has one, ``<prefix>.<dim><i>`` in order
of their lowest rank otherwise), every rank creating every group in the same
order as ``new_group`` requires, and builds the mesh on this rank's group of
each dimension with ``DeviceMesh.from_group``. The default group carries no
collective of the mesh, so its communicator never exists. The names go to the
lifecycle, which destroys and rebuilds (or suspends) them like any role group;
FSDP2 and DTensor built on the mesh follow each rebuild:

[Note: a mesh rebuilt in place] A rebuild makes a new ``ProcessGroup`` with a
new torch name. Two kinds of reference must follow it:

* *Objects.* FSDP2 keeps the groups themselves (each unit's mesh info: the
  shard, replicate and reduce-scatter groups), and the mesh its registry of
  them. Each mesh group is rebuilt in place (:meth:`TorchRuntime.rebuild_in_place`,
  [Note: rebuilt in place] in :mod:`refimpl.torch_runtime.foreign_groups`): every
  Python reference to the old object is pointed at the new one.
* *Names.* A ``DeviceMesh`` resolves its groups by their torch names
  (``_dim_group_names``, looked up by ``_resolve_process_group``; DTensor's
  redistributions and functional collectives pass ``(mesh, dim)`` and reach the
  name the same way). Re-pointing objects leaves those names naming a destroyed
  group, so after each rebuild of one of its groups (the runtime's rebuilt hook,
  :meth:`TorchRuntime.on_rebuilt`) the old name is replaced by the new one, by
  value, in the mesh, in its flattened meshes and in every sub-mesh sliced from
  it that is still alive (found by one ``gc.get_referrers`` of the mesh per
  rebuild walk), and the mesh's registry is keyed by the new name.

Torch names are short digit strings (``"1"``, ``"2"``: the same interned object
as every other such string in the process), so the names are rewritten by value
in the meshes only, never looked for by identity in the whole heap.

:meth:`MeshGroups.problems` says what, if anything, still resolves to a group
that is not the runtime's live one (the mesh, its registry, FSDP2's states): the
tests' check that the mesh resolves to the rebuilt groups.
"""
from __future__ import annotations

import gc
import logging
import math
from typing import Any, Iterable, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh

from refimpl.runtime.base import GroupError, GroupSpec

log = logging.getLogger(__name__)


def mesh_group_names(shape: Sequence[int], dim_names: Sequence[str], prefix: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(dim, group name, ranks)`` of every subgroup of every dimension of a mesh of ``shape`` over ranks
    ``0 .. prod(shape) - 1`` laid out in row-major order, dimension by dimension, each dimension's subgroups in
    order of their lowest rank."""
    if len(shape) != len(dim_names) or not shape:
        raise ValueError(f"a mesh needs one name per dimension: shape {tuple(shape)}, names {tuple(dim_names)}")
    if len(set(dim_names)) != len(dim_names):
        raise ValueError(f"mesh dimension names must differ, got {tuple(dim_names)}")
    if any(int(n) < 1 for n in shape):
        raise ValueError(f"every mesh dimension needs at least one rank, got shape {tuple(shape)}")
    ranks = torch.arange(math.prod(shape)).view(*shape)
    out = []
    for d, dim in enumerate(dim_names):
        rows = ranks.movedim(d, -1).reshape(-1, shape[d]).tolist()
        rows.sort(key=min)
        for i, row in enumerate(rows):
            name = f"{prefix}.{dim}" if len(rows) == 1 else f"{prefix}.{dim}{i}"
            out.append((dim, name, tuple(sorted(row))))
    return out


class MeshGroups:
    """A ``DeviceMesh`` on groups the runtime made (:func:`build_mesh_groups`), rebuilt in place with them.

    ``names``: every group of every dimension (give them all to the lifecycle: every rank walks every group);
    ``by_dim``: dimension -> its groups' names; ``mine``: dimension -> this rank's group of it; ``mesh``: the ``DeviceMesh``. :meth:`close` removes the
    runtime hook."""

    def __init__(self, rt: Any, shape: Sequence[int], dim_names: Sequence[str], *, prefix: str,
                 timeout_s: float = 600.0) -> None:
        groups = mesh_group_names(shape, dim_names, prefix)
        if math.prod(shape) != rt.world_size:
            raise ValueError(f"a mesh of shape {tuple(shape)} needs {math.prod(shape)} ranks; the world has "
                             f"{rt.world_size}")
        self.rt, self.shape, self.dim_names = rt, tuple(int(n) for n in shape), tuple(dim_names)
        self.names: tuple[str, ...] = tuple(name for _, name, _ in groups)
        self.by_dim: dict[str, tuple[str, ...]] = {d: tuple(n for dim, n, _ in groups if dim == d) for d in dim_names}
        self.mine: dict[str, str] = {}
        for dim, name, ranks in groups:
            rt.run(rt.new_group(GroupSpec(name, ranks, timeout_s=timeout_s)))
            rt.rebuild_in_place(name)
            if rt.rank in ranks:
                self.mine[dim] = name
        pgs = [rt.process_group(self.mine[dim]) for dim in self.dim_names]
        if any(pg is None for pg in pgs):
            raise GroupError(f"rank {rt.rank}: the mesh's groups {[self.mine[d] for d in self.dim_names]} have no "
                             "process group here; build_mesh_groups needs torch.distributed initialised")
        device_type = rt.device.type
        layout = torch.arange(math.prod(self.shape), dtype=torch.int).view(*self.shape)
        self.mesh: DeviceMesh = DeviceMesh.from_group(pgs, device_type, mesh=layout, mesh_dim_names=self.dim_names)
        self._round: set[str] = set()
        self._meshes: list[Any] = []
        #: names rewritten so far, over every rebuild (each of this rank's groups once per rebuild walk)
        self.renamed = 0
        self._remove = rt.on_rebuilt(self._rebuilt)

    def _rebuilt(self, name: str, old_torch_name: str, pg: Any) -> None:
        """The runtime's rebuilt hook: the mesh's name of group ``name`` follows the rebuild."""
        if pg is None or name not in self.mine.values():
            return
        if name in self._round or not self._meshes:  # a new rebuild walk: find the meshes alive now, once
            self._round.clear()
            self._meshes = self._find_meshes()
        self._round.add(name)
        new = str(pg.group_name)
        for attrs in self._meshes:
            names = attrs.get("_dim_group_names")
            if isinstance(names, list):
                for i, n in enumerate(names):
                    if n == old_torch_name:
                        names[i] = new
                        self.renamed += 1
        registry = self.mesh._pg_registry
        registry.pop(old_torch_name, None)
        registry[new] = pg
        log.debug("rank %d: mesh group %r renamed %s -> %s", self.rt.rank, name, old_torch_name, new)

    def _find_meshes(self) -> list[dict[str, Any]]:
        """The attribute dicts of the mesh, its flattened meshes and every live sub-mesh sliced from it."""
        root = self.mesh
        found = {id(root): vars(root)}
        for flat in root._flatten_mapping.values():
            found[id(flat)] = vars(flat)
        for holder in gc.get_referrers(root):
            attrs = vars(holder) if isinstance(holder, DeviceMesh) else holder if isinstance(holder, dict) else None
            if attrs is not None and attrs.get("_root_mesh") is root and "_dim_group_names" in attrs:
                found[id(attrs)] = attrs
        return list(found.values())

    def group_of(self, dim: str) -> Any:
        """The live process group of this rank's group of mesh dimension ``dim``."""
        return self.rt.process_group(self.mine[dim])

    def problems(self, module: Any = None) -> list[str]:
        """What resolves to a process group other than the runtime's live one of the same mesh group: the mesh
        (by name and by its registry) and, given a module, every FSDP2 state in it. Empty when all follow."""
        out = []
        live = {}
        for d, dim in enumerate(self.dim_names):
            name = self.mine[dim]
            if not self.rt.group_live(name):
                out.append(f"group {name!r} is down")
                continue
            pg = live[dim] = self.group_of(dim)
            if self.mesh._dim_group_names[d] != str(pg.group_name):
                out.append(f"mesh dimension {dim!r} names {self.mesh._dim_group_names[d]!r}, the live group "
                           f"{name!r} is {pg.group_name!r}")
            elif self.mesh.get_group(dim) is not pg:
                out.append(f"mesh dimension {dim!r} resolves to another object than the live group {name!r}")
        if module is not None:
            out += _fsdp_problems(module, set(map(id, live.values())))
        return out

    def close(self) -> None:
        """Stop following rebuilds (the runtime hook removed)."""
        self._remove()


def _fsdp_problems(module: Any, live: set[int]) -> list[str]:
    """FSDP2 states in ``module`` whose groups are not among the live ones (by object)."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for fqn, m in module.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        group = m._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        info = group.mesh_info
        for attr in ("shard_process_group", "replicate_process_group", "reduce_scatter_process_group"):
            pg = getattr(info, attr, None)
            if pg is not None and id(pg) not in live:
                out.append(f"FSDP unit {fqn or '<root>'}: {attr} is not a live mesh group")
    return out


def build_mesh_groups(rt: Any, shape: Sequence[int], dim_names: Iterable[str], *, prefix: str = "mesh",
                      timeout_s: float = 600.0) -> MeshGroups:
    """Make the groups of a mesh of ``shape`` (``dim_names``) with the runtime and the ``DeviceMesh`` on them;
    every rank calls it, with the same arguments (module docstring). Give ``MeshGroups.names`` to the
    lifecycle and ``MeshGroups.mesh`` to ``fully_shard``."""
    return MeshGroups(rt, tuple(shape), tuple(dim_names), prefix=prefix, timeout_s=timeout_s)


__all__ = ["MeshGroups", "build_mesh_groups", "mesh_group_names"]
