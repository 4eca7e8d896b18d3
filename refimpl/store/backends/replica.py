"""Replica groups: which ranks hold bitwise-identical copies of a tensor.

Theory of operation
-------------------
``local_dedup`` stores state that a group of ranks holds identically only once
per group, 1/N per member. Everything rests on knowing that group, so it is
derived from the layout the training framework already declared, never guessed:

* A DTensor's ``placements`` say, per dim of its ``device_mesh``, whether the
  tensor is ``Shard``-ed, ``Partial`` or ``Replicate``-d. The ranks that differ
  from this rank *only* in the coordinates of the ``Replicate`` dims hold the
  same local shard: that set is the replica group. FSDP2 HSDP puts dense
  params on a (``ddp``, ``fsdp``) mesh as ``(Replicate(), Shard(0))``, so the
  group is this rank's ``ddp`` line. MoE experts, sharded over ``ep`` and fully
  sharded over ``efsdp``, live on the *expert* mesh as ``(Replicate(),
  Shard(0))`` over (``eddp``, ``efsdp``), so their group is the ``eddp`` line
  and never the dense ``ddp`` line; this follows from reading the tensor's own
  mesh, not from a rule about names.
* Plain tensors carry no layout. DDP-style flat param/grad buffers and the
  fp32 master weights of a non-distributed optimizer are identical over data
  parallel by construction of those schemes, so the categories that hold them
  (:attr:`ReplicaPolicy.dp_categories`) resolve to the configured data-parallel
  ranks. Every other plain tensor is ``local``.
* An explicit override, by entry-name pattern, wins over both: a
  :class:`ReplicaGroup`, a :class:`MeshReplica` (replicate over named dims of a
  mesh), or :data:`LOCAL`.

A rank only knows its own groups (a DeviceMesh slice holds only the slice
through this rank), but creating a process group is a collective over every
rank. :mod:`refimpl.store.backends.replica_sync` therefore exchanges each rank's groups once
(see ``agree_on_groups`` there) and creates the union in one global order.
Group names depend only on the member ranks, so every rank derives the same
name for the same group.

Meshes are read by duck typing (``mesh.mesh`` the rank tensor,
``mesh.mesh_dim_names``), so a real ``torch.distributed`` DeviceMesh and a
:class:`MeshTopology` (a mesh as plain data, for the simulator) both work.
"""
from __future__ import annotations

import fnmatch
import functools
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Sequence, Union

import torch

from refimpl.runtime.base import GroupSpec

log = logging.getLogger(__name__)


class ReplicaResolutionError(ValueError):
    """A replica group could not be derived (rank not in mesh, unknown dim name, bad override)."""


@dataclass(frozen=True, order=True)
class ReplicaGroup:
    """A set of global ranks that hold identical bytes for some state.

    ``label`` says where the group came from (``"ddp"``, ``"eddp"``, ``"dp"``,
    ``"override"``); it is informational and not part of the group's identity,
    so the same ranks found via two meshes are one group and one communicator.
    """

    ranks: tuple[int, ...]
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        ranks = tuple(int(r) for r in self.ranks)
        if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0:
            raise ReplicaResolutionError(f"a replica group needs distinct non-negative ranks, got {self.ranks}")
        object.__setattr__(self, "ranks", tuple(sorted(ranks)))

    @property
    def size(self) -> int:
        """Number of member ranks."""
        return len(self.ranks)

    @property
    def trivial(self) -> bool:
        """A group of one rank: nothing to deduplicate, behaves as ``local``."""
        return len(self.ranks) == 1

    @property
    def name(self) -> str:
        """Runtime group name; a function of the ranks only, so every rank derives the same one."""
        digest = hashlib.sha1(",".join(map(str, self.ranks)).encode()).hexdigest()[:12]
        return f"replica:{self.size}:{digest}"

    def index_of(self, rank: int) -> int:
        """Position of global ``rank`` in the group (its slice number)."""
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise ReplicaResolutionError(f"rank {rank} is not in replica group {self.ranks}") from None

    def spec(self, *, backend: str | None = None, timeout_s: float = 600.0) -> GroupSpec:
        """The :class:`GroupSpec` under which the runtime creates this group."""
        return GroupSpec(name=self.name, ranks=self.ranks, backend=backend, timeout_s=timeout_s)

    def __repr__(self) -> str:
        # rank-order only: layout keys sort by repr, which must be identical on every rank
        return f"ReplicaGroup{self.ranks}"

    def __str__(self) -> str:
        return f"{self.label or 'replica'}{list(self.ranks)}"

    def hosts(self, local_world_size: int) -> tuple[int, ...]:
        """Hosts the members run on, with host = rank // local_world_size."""
        if local_world_size <= 0:
            raise ReplicaResolutionError(f"local_world_size must be > 0, got {local_world_size}")
        return tuple(sorted({r // local_world_size for r in self.ranks}))


class _Local:
    """The ``local`` path: no replica group (a singleton, see :data:`LOCAL`)."""

    def __repr__(self) -> str:
        return "LOCAL"


LOCAL = _Local()
"""Override value that forces an entry onto the ``local`` path."""


# --------------------------------------------------------------------------- meshes


@dataclass(frozen=True)
class MeshTopology:
    """A device mesh as plain data: dim names and the global rank at each coordinate.

    Duck-types as a DeviceMesh for resolution (``.mesh``, ``.mesh_dim_names``),
    with no process groups behind it, so the simulator and pure tests can
    describe meshes. ``ranks`` is row-major over ``shape``.
    """

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    ranks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        if not shape or min(shape) < 1:
            raise ReplicaResolutionError(f"mesh shape must be non-empty with sizes >= 1, got {self.shape}")
        if len(self.dim_names) != len(shape) or len(set(self.dim_names)) != len(shape):
            raise ReplicaResolutionError(f"mesh needs one distinct name per dim: shape {shape}, names {self.dim_names}")
        n = 1
        for s in shape:
            n *= s
        ranks = tuple(int(r) for r in self.ranks) if self.ranks else tuple(range(n))
        if len(ranks) != n or len(set(ranks)) != n:
            raise ReplicaResolutionError(f"mesh of shape {shape} needs {n} distinct ranks, got {len(ranks)}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dim_names", tuple(self.dim_names))
        object.__setattr__(self, "ranks", ranks)

    @functools.cached_property
    def mesh(self) -> torch.Tensor:
        """The rank tensor, as ``DeviceMesh.mesh`` (built once)."""
        return torch.tensor(self.ranks, dtype=torch.int64).reshape(self.shape)

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """Dim names, as ``DeviceMesh.mesh_dim_names``."""
        return self.dim_names

    def slice(self, rank: int, dims: Sequence[str]) -> "MeshTopology":
        """The sub-mesh over ``dims`` through ``rank`` (as ``device_mesh[dims]`` on that rank)."""
        idx = _dim_indices(self, dims)
        coord = mesh_coordinate(self, rank)
        sel: list[Any] = [slice(None) if d in idx else coord[d] for d in range(len(self.shape))]
        sub = self.mesh[tuple(sel)]
        # order the kept dims as asked
        kept = [d for d in range(len(self.shape)) if d in idx]
        sub = sub.permute([kept.index(d) for d in idx])
        return MeshTopology(tuple(sub.shape), tuple(dims), tuple(sub.reshape(-1).tolist()))

    def groups_over(self, dims: Sequence[str]) -> list[ReplicaGroup]:
        """Every replica group of this mesh over ``dims`` (one per coordinate of the other dims), sorted.

        Declaring these up front (``DedupConfig.groups``) spares the group exchange,
        and is required where collectives move no data (meta-payload simulation).
        """
        seen = {group_over_dims(self, r, dims, label="+".join(dims)) for r in self.ranks}
        return sorted(seen)

    @classmethod
    def of(cls, mesh: Any) -> "MeshTopology":
        """Copy any DeviceMesh-like object into plain data."""
        t = mesh.mesh
        names = tuple(mesh.mesh_dim_names or (f"dim{i}" for i in range(t.dim())))
        return cls(tuple(t.shape), names, tuple(int(r) for r in t.reshape(-1).tolist()))


def _dim_indices(mesh: Any, dims: Sequence[str | int]) -> list[int]:
    names = tuple(mesh.mesh_dim_names or ())
    ndim = mesh.mesh.dim()
    out = []
    for d in dims:
        if isinstance(d, int):
            if not 0 <= d < ndim:
                raise ReplicaResolutionError(f"mesh dim {d} out of range for a {ndim}-d mesh")
            out.append(d)
        elif d in names:
            out.append(names.index(d))
        else:
            raise ReplicaResolutionError(f"mesh has no dim named {d!r}; its dims are {names}")
    return out


def mesh_coordinate(mesh: Any, rank: int) -> tuple[int, ...]:
    """Coordinate of global ``rank`` in ``mesh.mesh``; raises if the rank is not in it."""
    hits = (mesh.mesh == rank).nonzero()
    if hits.shape[0] != 1:
        raise ReplicaResolutionError(
            f"rank {rank} is not in mesh {mesh.mesh.tolist()}; pass the mesh slice this rank belongs to"
        )
    return tuple(int(c) for c in hits[0].tolist())


def group_over_dims(mesh: Any, rank: int, dims: Sequence[str | int], *, label: str = "") -> ReplicaGroup:
    """Ranks that share ``rank``'s coordinate on every mesh dim except ``dims``."""
    idx = set(_dim_indices(mesh, dims))
    coord = mesh_coordinate(mesh, rank)
    t = mesh.mesh
    sel = tuple(slice(None) if d in idx else coord[d] for d in range(t.dim()))
    ranks = tuple(int(r) for r in t[sel].reshape(-1).tolist())
    return ReplicaGroup(ranks, label=label)


# --------------------------------------------------------------------------- placements


def is_dtensor(t: Any) -> bool:
    """True for a DTensor, recognised by duck typing (no torch.distributed import)."""
    return hasattr(t, "_local_tensor") and hasattr(t, "placements") and hasattr(t, "device_mesh")


def replicate_dims(placements: Iterable[Any]) -> tuple[int, ...]:
    """Mesh dims on which the placements are ``Replicate`` (``Shard`` and ``Partial`` are not)."""
    return tuple(i for i, p in enumerate(placements) if p.is_replicate())


def group_from_placements(mesh: Any, placements: Sequence[Any], rank: int) -> ReplicaGroup:
    """The replica group of a tensor with ``placements`` on ``mesh``, seen from ``rank``."""
    dims = replicate_dims(placements)
    if len(tuple(placements)) != mesh.mesh.dim():
        raise ReplicaResolutionError(
            f"{len(tuple(placements))} placements for a {mesh.mesh.dim()}-d mesh; they must match one to one"
        )
    return group_over_dims(mesh, rank, dims, label=_placement_label(mesh, dims))


class _CachedGroup(NamedTuple):
    """A memoised replica group and the mesh object it was built for (ids can be reused)."""

    mesh: Any
    group: ReplicaGroup


@dataclass(frozen=True)
class MeshReplica:
    """Override value: replicate over the named ``dims`` of ``mesh`` (resolved per rank)."""

    mesh: Any
    dims: tuple[str, ...]

    def resolve(self, rank: int) -> ReplicaGroup:
        """The group through ``rank``."""
        return group_over_dims(self.mesh, rank, self.dims, label="+".join(self.dims))


OverrideValue = Union[ReplicaGroup, MeshReplica, _Local]


@dataclass(frozen=True)
class ReplicaPolicy:
    """How entries map to replica groups. Validated, frozen; one per store.

    ``dp_ranks`` is this rank's data-parallel group (global ranks), used for
    plain tensors in ``dp_categories`` (DDP-style flat buffers, master weights
    of a non-distributed optimizer). ``overrides`` maps entry-name glob
    patterns to a :class:`ReplicaGroup`, a :class:`MeshReplica` or
    :data:`LOCAL`; the first matching pattern (in insertion order) wins.
    """

    dp_ranks: tuple[int, ...] | None = None
    dp_categories: frozenset[str] = frozenset({"ddp_buffer", "master_weights"})
    overrides: tuple[tuple[str, OverrideValue], ...] = ()
    #: (mesh id, rank, replicate dims) -> (mesh, group): a store resolves tens of thousands of tensors
    #: on a handful of meshes, and reading a mesh costs far more than a lookup
    _cache: dict[tuple, _CachedGroup] = field(default_factory=dict, compare=False, repr=False, init=False)

    def __post_init__(self) -> None:
        if self.dp_ranks is not None:
            object.__setattr__(self, "dp_ranks", ReplicaGroup(tuple(self.dp_ranks)).ranks)
        object.__setattr__(self, "dp_categories", frozenset(self.dp_categories))
        ov = self.overrides.items() if isinstance(self.overrides, Mapping) else self.overrides
        ov = tuple((str(k), v) for k, v in ov)
        for pattern, value in ov:
            if not isinstance(value, (ReplicaGroup, MeshReplica, _Local)):
                raise ReplicaResolutionError(
                    f"override for {pattern!r} must be a ReplicaGroup, MeshReplica or LOCAL, got {value!r}"
                )
        object.__setattr__(self, "overrides", ov)

    def resolve(self, tensor: Any, rank: int, *, name: str = "", category: str = "") -> ReplicaGroup | None:
        """The replica group of ``tensor`` on ``rank``; ``None`` means the ``local`` path.

        Order: an override matching ``name``; DTensor placements; the data-parallel
        group for ``category`` in :attr:`dp_categories`; otherwise local. A
        group that does not contain ``rank`` is an error (the layout was
        described from another rank's point of view).
        """
        group: ReplicaGroup | None = None
        for pattern, value in self.overrides:
            if fnmatch.fnmatchcase(name, pattern):
                if isinstance(value, _Local):
                    return None
                if isinstance(value, MeshReplica):
                    group = self._over_dims(value.mesh, rank, value.dims, "+".join(value.dims))
                else:
                    group = value
                break
        else:
            if is_dtensor(tensor):
                mesh, placements = tensor.device_mesh, tuple(tensor.placements)
                if len(placements) != mesh.mesh.dim():
                    group_from_placements(mesh, placements, rank)  # raises with the explanation
                group = self._over_dims(mesh, rank, replicate_dims(placements), None)
            elif category in self.dp_categories and self.dp_ranks is not None:
                group = ReplicaGroup(self.dp_ranks, label="dp")
        if group is None:
            return None
        if rank not in group.ranks:
            raise ReplicaResolutionError(
                f"{name or 'tensor'}: resolved replica group {group.ranks} does not contain rank {rank}; "
                "an override must list the group of the rank that uses it (or use MeshReplica)"
            )
        return group

    def _over_dims(self, mesh: Any, rank: int, dims: Sequence[str | int], label: str | None) -> ReplicaGroup:
        """:func:`group_over_dims`, memoised per (mesh object, rank, dims)."""
        key = (id(mesh), rank, tuple(dims))
        hit = self._cache.get(key)
        if hit is not None and hit.mesh is mesh:
            return hit.group
        if label is None:
            label = _placement_label(mesh, [d for d in dims if isinstance(d, int)])
        group = group_over_dims(mesh, rank, dims, label=label)
        self._cache[key] = _CachedGroup(mesh, group)
        return group


def _placement_label(mesh: Any, dims: Sequence[int]) -> str:
    names = tuple(mesh.mesh_dim_names or ())
    return "+".join(names[d] if d < len(names) else f"dim{d}" for d in dims)


def warn_if_multi_host(group: ReplicaGroup, local_world_size: int) -> bool:
    """Log a warning if ``group`` spans several hosts; return whether it does.

    A reload then all-gathers across the network instead of NVLink/PCIe inside
    a node, which is typically an order of magnitude slower.
    """
    hosts = group.hosts(local_world_size)
    if len(hosts) <= 1:
        return False
    log.warning(
        "replica group %s (%s) spans hosts %s (local_world_size=%d): every local_dedup reload "
        "all-gathers across the network. Keep replica dims inside a node, or use the 'local' backend "
        "for this state if reload time matters more than host memory.",
        group.ranks, group.label or "replica", hosts, local_world_size,
    )
    return True


__all__ = [
    "LOCAL",
    "MeshReplica",
    "MeshTopology",
    "ReplicaGroup",
    "ReplicaPolicy",
    "ReplicaResolutionError",
    "group_from_placements",
    "group_over_dims",
    "is_dtensor",
    "mesh_coordinate",
    "replicate_dims",
    "warn_if_multi_host",
]
