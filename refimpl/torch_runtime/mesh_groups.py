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
the mesh, and FSDP2 and DTensor built on it, follow each rebuild:

[Note: a mesh rebuilt in place] A rebuild makes a new ``ProcessGroup`` with a
new torch name. Two kinds of reference must follow it, and after each rebuild
of one of this rank's mesh groups (the runtime's rebuilt hook,
:meth:`TorchRuntime.on_rebuilt`) :class:`MeshGroups` points both at it:

* *Names.* A ``DeviceMesh`` resolves its groups by their torch names
  (``_dim_group_names``, looked up by ``_resolve_process_group``; DTensor's
  redistributions and functional collectives pass ``(mesh, dim)`` and reach
  the name the same way). The old name is replaced by the new one, by value,
  in the mesh, its flattened meshes and every mesh the followed modules use
  (each FSDP2 state's mesh, each DTensor parameter's mesh: a sub-mesh sliced
  from this one, such as ``mesh["shard"]``, is rewritten where FSDP2 holds it),
  and the registries of those meshes are keyed by the new name.
* *Objects.* FSDP2 keeps the groups themselves, in each unit's mesh info (the
  shard, replicate and reduce-scatter groups; FSDP2 holds them nowhere else).
  Every attribute of those mesh infos that holds the old group is pointed at
  the new one.

The modules to follow are named with :meth:`MeshGroups.follow` (the model after
``fully_shard``); their states are read at each rebuild, so states made later
(FSDP2's lazy init at the first forward) are covered. Nothing walks the heap:
a rebuild costs a pass over the followed modules, not a scan of every Python
object (a ``gc.get_referrers`` visits every object the collector tracks and
holds the interpreter meanwhile, on the thread that runs a resume beside the
training step's start). What the followed modules and the
mesh do not reach (a sub-mesh or a group object kept elsewhere) is the
caller's to refresh; :meth:`MeshGroups.problems` says what, of the mesh and a
module's FSDP2 states, does not resolve to the runtime's live group: the
tests' check that the mesh resolves to the rebuilt groups.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh

from refimpl.runtime.base import GroupError, GroupSpec

log = logging.getLogger(__name__)

#: the attributes of FSDP2's mesh infos that hold process groups
FSDP_GROUP_ATTRS = ("shard_process_group", "replicate_process_group", "reduce_scatter_process_group")


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
    """A ``DeviceMesh`` on groups the runtime made (:func:`build_mesh_groups`), following each of their rebuilds.

    ``names``: every group of every dimension (give them all to the lifecycle: every rank walks every group);
    ``by_dim``: dimension -> its groups' names; ``mine``: dimension -> this rank's group of it; ``mesh``: the
    ``DeviceMesh``. :meth:`follow` names the modules built on it; :meth:`close` stops following."""

    def __init__(self, rt: Any, shape: Sequence[int], dim_names: Sequence[str], *, prefix: str,
                 timeout_s: float = 600.0, options: tuple[tuple[str, Any], ...] = ()) -> None:
        groups = mesh_group_names(shape, dim_names, prefix)
        if math.prod(shape) != rt.world_size:
            raise ValueError(f"a mesh of shape {tuple(shape)} needs {math.prod(shape)} ranks; the world has "
                             f"{rt.world_size}")
        self.rt, self.shape, self.dim_names = rt, tuple(int(n) for n in shape), tuple(dim_names)
        self.names: tuple[str, ...] = tuple(name for _, name, _ in groups)
        self.by_dim: dict[str, tuple[str, ...]] = {d: tuple(n for dim, n, _ in groups if dim == d) for d in dim_names}
        self.mine: dict[str, str] = {}
        for dim, name, ranks in groups:
            rt.run(rt.new_group(GroupSpec(name, ranks, timeout_s=timeout_s, options=tuple(options))))
            if rt.rank in ranks:
                self.mine[dim] = name
        #: this rank's groups' current process groups, by name (what a rebuild replaces)
        self._pgs = {self.mine[dim]: rt.process_group(self.mine[dim]) for dim in self.dim_names}
        if any(pg is None for pg in self._pgs.values()):
            raise GroupError(f"rank {rt.rank}: the mesh's groups {list(self._pgs)} have no process group here; "
                             "build_mesh_groups needs torch.distributed initialised")
        layout = torch.arange(math.prod(self.shape), dtype=torch.int).view(*self.shape)
        self.mesh: DeviceMesh = DeviceMesh.from_group([self._pgs[self.mine[d]] for d in self.dim_names],
                                                      rt.device.type, mesh=layout, mesh_dim_names=self.dim_names)
        if not isinstance(getattr(self.mesh, "_dim_group_names", None), list):
            raise GroupError(f"torch {torch.__version__}'s DeviceMesh keeps no list of group names "
                             "(_dim_group_names), so a rebuild cannot be followed; use a torch that has it (2.8 or "
                             "later) or leave the mesh's groups outside the lifecycle")
        self._modules: list[Any] = []
        #: over every rebuild: names rewritten in meshes, group attributes re-pointed in FSDP2's mesh infos
        self.renamed = 0
        self.repointed = 0
        self._remove = rt.on_rebuilt(self._rebuilt)

    def follow(self, *modules: Any) -> None:
        """Follow the rebuilds in ``modules`` too: every FSDP2 state and DTensor parameter in them (the model after
        ``fully_shard``); read again at each rebuild."""
        self._modules.extend(modules)

    def _rebuilt(self, name: str, old_torch_name: str, pg: Any) -> None:
        """The runtime's rebuilt hook: the mesh's names and FSDP2's groups follow the rebuild of group ``name``."""
        if pg is None or name not in self._pgs:
            return
        old, self._pgs[name] = self._pgs[name], pg
        new_name = str(pg.group_name)
        infos, meshes = self._targets()
        for mesh in meshes:
            names = getattr(mesh, "_dim_group_names", None)
            if isinstance(names, list):
                for i, n in enumerate(names):
                    if n == old_torch_name:
                        names[i] = new_name
                        self.renamed += 1
            registry = getattr(mesh, "_pg_registry", None)
            if isinstance(registry, dict) and old_torch_name in registry:
                del registry[old_torch_name]
                registry[new_name] = pg
        for info in infos:
            attrs = vars(info)
            for key in FSDP_GROUP_ATTRS:
                if attrs.get(key) is old:
                    attrs[key] = pg
                    self.repointed += 1
        log.debug("rank %d: mesh group %r rebuilt as %s (was %s)", self.rt.rank, name, new_name, old_torch_name)

    def _targets(self) -> tuple[list[Any], list[Any]]:
        """FSDP2's mesh infos in the followed modules, and every mesh to rewrite (each once)."""
        infos: dict[int, Any] = {}
        meshes: dict[int, Any] = {id(self.mesh): self.mesh}
        for flat in getattr(self.mesh, "_flatten_mapping", {}).values():  # (a torch without it keeps them elsewhere)
            meshes[id(flat)] = flat
        for info, mesh in _fsdp_meshes(self._modules):
            if info is not None:
                infos[id(info)] = info
            meshes[id(mesh)] = mesh
        return list(infos.values()), list(meshes.values())

    def group_of(self, dim: str) -> Any:
        """The live process group of this rank's group of mesh dimension ``dim``."""
        if dim not in self.mine:
            raise ValueError(f"the mesh has no dimension {dim!r}; its dimensions are {self.dim_names}")
        return self.rt.process_group(self.mine[dim])

    def problems(self, module: Any = None) -> list[str]:
        """What resolves to a process group other than the runtime's live one of the same mesh group: the mesh
        (by name, and by its registry) and, given a module, every FSDP2 state and DTensor parameter in it. Empty
        when all follow."""
        out = []
        live = {}
        for d, dim in enumerate(self.dim_names):
            name = self.mine[dim]
            if not self.rt.group_live(name):
                out.append(f"group {name!r} is down")
                continue
            pg = live[name] = self.group_of(dim)
            if self.mesh._dim_group_names[d] != str(pg.group_name):
                out.append(f"mesh dimension {dim!r} names {self.mesh._dim_group_names[d]!r}, the live group "
                           f"{name!r} is {pg.group_name!r}")
            elif self.mesh.get_group(dim) is not pg:
                out.append(f"mesh dimension {dim!r} resolves to another object than the live group {name!r}")
        if module is not None:
            live_ids = {id(pg) for pg in live.values()}
            live_names = {str(pg.group_name) for pg in live.values()}
            for info, mesh in _fsdp_meshes([module]):
                for key in FSDP_GROUP_ATTRS:
                    pg = getattr(info, key, None) if info is not None else None
                    if pg is not None and id(pg) not in live_ids:
                        out.append(f"an FSDP2 mesh info's {key} is not a live mesh group")
                stale = [n for n in getattr(mesh, "_dim_group_names", []) if n not in live_names]
                if stale:
                    out.append(f"a mesh of the module names {stale}, not a live mesh group")
        return sorted(set(out))

    def close(self) -> None:
        """Stop following rebuilds (the runtime hook removed)."""
        self._remove()


def _fsdp_meshes(modules: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """``(mesh info or None, mesh)`` of every FSDP2 parameter group (its mesh infos) and every DTensor parameter
    (its mesh) in ``modules``."""
    from torch.distributed.fsdp import FSDPModule

    for module in modules:
        for m in module.modules():
            if isinstance(m, FSDPModule):
                group = m._get_fsdp_state()._fsdp_param_group
                if group is not None:
                    for holder in (group, *group.fsdp_params):
                        for attr in ("mesh_info", "post_forward_mesh_info"):
                            info = getattr(holder, attr, None)
                            if info is not None:
                                yield info, info.mesh
                    for fsdp_param in group.fsdp_params:
                        spmd = getattr(fsdp_param, "_spmd_mesh", None)
                        if spmd is not None:
                            yield None, spmd
        for p in module.parameters():
            spec = getattr(p, "_spec", None)
            if spec is not None:
                yield None, spec.mesh


def build_mesh_groups(rt: Any, shape: Sequence[int], dim_names: Iterable[str], *, prefix: str = "mesh",
                      timeout_s: float = 600.0, options: Iterable[tuple[str, Any]] = ()) -> MeshGroups:
    """Make the groups of a mesh of ``shape`` (``dim_names``) with the runtime and the ``DeviceMesh`` on them;
    every rank calls it, with the same arguments (module docstring). ``options``: every group's
    :attr:`~refimpl.runtime.GroupSpec.options` (NCCL process-group options such as ``("config.max_ctas", 8)``),
    kept in its spec, so each rebuild makes the group with them again. Give ``MeshGroups.names`` to the
    lifecycle, ``MeshGroups.mesh`` to ``fully_shard``, and the sharded model to :meth:`MeshGroups.follow`."""
    return MeshGroups(rt, tuple(shape), tuple(dim_names), prefix=prefix, timeout_s=timeout_s,
                      options=tuple(options))


__all__ = ["FSDP_GROUP_ATTRS", "MeshGroups", "build_mesh_groups", "mesh_group_names"]
