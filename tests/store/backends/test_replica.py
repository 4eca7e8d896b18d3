"""Replica-group resolution on meshes described as data (the simulator's view) and its error paths.

Resolution on real ``init_device_mesh`` meshes and FSDP2 DTensors runs in Gloo processes in
``test_replica_mesh.py``; here the same functions run on :class:`MeshTopology`.
"""
import logging

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from refimpl.store.backends.replica import (
    LOCAL,
    MeshReplica,
    MeshTopology,
    ReplicaGroup,
    ReplicaPolicy,
    ReplicaResolutionError,
    group_from_placements,
    group_over_dims,
    warn_if_multi_host,
)


def _P(kind):
    """A real DTensor placement: R(eplicate), S(hard(0)) or P(artial)."""
    return {"R": Replicate(), "S": Shard(0), "P": Partial()}[kind]


class _Placed:
    """A local tensor with a layout on a mesh described as data (a DTensor needs live process groups)."""

    def __init__(self, mesh, kinds):
        self._local_tensor = torch.zeros(2)
        self.device_mesh = mesh
        self.placements = tuple(_P(k) for k in kinds)


def test_hsdp_dense_groups_are_ddp_lines():
    mesh = MeshTopology((2, 4), ("ddp", "fsdp"))
    groups = {r: group_from_placements(mesh, [_P("R"), _P("S")], r).ranks for r in range(8)}
    assert groups == {0: (0, 4), 1: (1, 5), 2: (2, 6), 3: (3, 7), 4: (0, 4), 5: (1, 5), 6: (2, 6), 7: (3, 7)}


def test_experts_replicate_over_eddp_not_ddp():
    # dense (ddp=2, fsdp=4); experts (eddp=4, ep=2): eddp lines differ from ddp lines
    dense = MeshTopology((2, 4), ("ddp", "fsdp"))
    experts = MeshTopology((4, 2), ("eddp", "ep"))
    for r in range(8):
        d = group_from_placements(dense, [_P("R"), _P("S")], r)
        e = group_from_placements(experts.slice(r, ["eddp"]), [_P("R")], r)
        assert e.ranks == tuple(x for x in range(8) if x % 2 == r % 2)
        assert d.ranks == (r % 4, r % 4 + 4)
        assert e.label == "eddp" and d.label == "ddp"


def test_three_d_expert_mesh_slice_matches_full_placements():
    mesh = MeshTopology((2, 2, 2), ("eddp", "ep", "efsdp"))
    for r in range(8):
        via_slice = group_from_placements(mesh.slice(r, ["eddp", "efsdp"]), [_P("R"), _P("S")], r)
        via_full = group_from_placements(mesh, [_P("R"), _P("S"), _P("S")], r)
        assert via_slice == via_full
        assert via_full.ranks == (r % 4, r % 4 + 4)


def test_partial_and_shard_do_not_replicate():
    mesh = MeshTopology((2, 2), ("a", "b"))
    assert group_from_placements(mesh, [_P("P"), _P("S")], 3).ranks == (3,)
    assert group_from_placements(mesh, [_P("R"), _P("R")], 3).ranks == (0, 1, 2, 3)


def test_group_identity_and_name_depend_on_ranks_only():
    a, b = ReplicaGroup((4, 0), label="ddp"), ReplicaGroup((0, 4), label="eddp")
    assert a == b and a.name == b.name and a.ranks == (0, 4)
    assert ReplicaGroup((0, 5)).name != a.name
    assert a.spec().ranks == (0, 4) and a.index_of(4) == 1
    with pytest.raises(ReplicaResolutionError, match="not in replica group"):
        a.index_of(2)
    with pytest.raises(ReplicaResolutionError, match="distinct"):
        ReplicaGroup((1, 1))


def test_policy_order_override_dtensor_dp_local():
    mesh = MeshTopology((2, 2), ("ddp", "fsdp"))
    pol = ReplicaPolicy(
        dp_ranks=(1, 3),
        overrides={"experts.*": MeshReplica(MeshTopology((4,), ("eddp",)), ("eddp",)), "rng": LOCAL},
    )
    dt = _Placed(mesh, "RS")
    assert pol.resolve(dt, 3, name="layers.0.w").ranks == (1, 3)
    assert pol.resolve(dt, 3, name="experts.0.w").ranks == (0, 1, 2, 3)
    assert pol.resolve(dt, 3, name="rng") is None
    plain = torch.zeros(3)
    assert pol.resolve(plain, 3, name="buf", category="ddp_buffer").ranks == (1, 3)
    assert pol.resolve(plain, 3, name="m", category="master_weights").label == "dp"
    assert pol.resolve(plain, 3, name="x", category="param") is None
    assert ReplicaPolicy().resolve(plain, 3, category="ddp_buffer") is None  # no dp group configured


def test_policy_rejects_group_without_this_rank_and_bad_values():
    pol = ReplicaPolicy(overrides={"*": ReplicaGroup((0, 1))})
    with pytest.raises(ReplicaResolutionError, match="does not contain rank 2"):
        pol.resolve(torch.zeros(1), 2, name="w")
    with pytest.raises(ReplicaResolutionError, match="must be a ReplicaGroup"):
        ReplicaPolicy(overrides={"*": (0, 1)})


def test_mesh_errors_name_the_problem():
    mesh = MeshTopology((2, 2), ("ddp", "fsdp"))
    with pytest.raises(ReplicaResolutionError, match="no dim named 'eddp'"):
        group_over_dims(mesh, 0, ["eddp"])
    with pytest.raises(ReplicaResolutionError, match="rank 9 is not in mesh"):
        group_over_dims(mesh, 9, ["ddp"])
    with pytest.raises(ReplicaResolutionError, match="placements for a 2-d mesh"):
        group_from_placements(mesh, [_P("R")], 0)
    with pytest.raises(ReplicaResolutionError, match="distinct ranks"):
        MeshTopology((2,), ("a",), (0, 0))


def test_custom_rank_order_mesh():
    mesh = MeshTopology((2, 2), ("eddp", "ep"), (0, 2, 1, 3))
    assert group_over_dims(mesh, 0, ["eddp"]).ranks == (0, 1)
    assert mesh.slice(3, ["ep"]).ranks == (1, 3)
    assert MeshTopology.of(mesh) == mesh


def test_multi_host_warning(caplog):
    caplog.set_level(logging.WARNING, logger="refimpl.store.backends.replica")
    assert not warn_if_multi_host(ReplicaGroup((0, 1, 2, 3)), 4)
    assert not caplog.records
    assert warn_if_multi_host(ReplicaGroup((1, 5), label="ddp"), 4)
    assert "spans hosts (0, 1)" in caplog.text and "across the network" in caplog.text
