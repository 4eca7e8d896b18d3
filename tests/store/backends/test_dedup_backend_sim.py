"""``local_dedup`` through the store on simulated ranks: meta payloads at scale, trivial groups,
categories, dropped gradients, destroyed groups, multi-host warnings and declared groups."""
import logging

import pytest
import torch

import sim
from refimpl.store import OffloadStore, StoreConfig
from refimpl.store.backends.dedup_config import DedupConfig, DedupError
from refimpl.store.backends.replica import MeshReplica, MeshTopology, ReplicaGroup, ReplicaPolicy


def _policy(mesh, dims, pattern="*"):
    return ReplicaPolicy(overrides={pattern: MeshReplica(mesh, dims)})


def test_meta_payload_needs_declared_groups_and_then_scales():
    mesh = MeshTopology((8, 8), ("ddp", "fsdp"))
    numel = 3_000_000

    def run(declare):
        async def proto(rt):
            t = rt.alloc_device(numel, torch.bfloat16)
            groups = tuple(mesh.groups_over(["ddp"])) if declare else None
            store = OffloadStore(rt, backend="local_dedup",
                                 dedup=DedupConfig(policy=_policy(mesh, ("ddp",)), groups=groups))
            store.attach_tensors("params", {"w": t}, name="p")
            await store.offload_async()
            kept = store.backend.host_bytes()
            await store.reload_async()
            return kept, t.untyped_storage().nbytes()
        return proto

    with pytest.raises(sim.RankFailedError) as err:
        sim.SimWorld(64, payload="meta").run(run(False))
    assert isinstance(err.value.__cause__, DedupError) and "DedupConfig(groups=" in str(err.value.__cause__)
    world = sim.SimWorld(64, payload="meta")
    results = world.run(run(True))
    state = numel * 2
    for rank, (kept, restored) in enumerate(results):
        assert kept <= -(-state // 8) + 64, (rank, kept)
        assert state <= restored <= state + 8 * 64  # a full flat buffer again (padded to 8 equal chunks)
        assert world.report().ranks[rank].host_pinned_peak <= -(-state // 8) + 64


def test_group_of_one_behaves_as_local():
    mesh = MeshTopology((2,), ("fsdp",))

    async def proto(rt):
        t = rt.alloc_device(100, torch.float32)
        t.copy_(torch.arange(100.0) + rt.rank)
        store = OffloadStore(rt, backend="local_dedup", dedup=DedupConfig(policy=_policy(mesh, ())))
        store.attach_tensors("params", {"w": t}, name="p")
        await store.offload_async()
        out = (store.backend.shares(), store.backend.host_bytes(), [k.placement for k in store.layouts])
        await store.reload_async()
        return out + (torch.equal(t, torch.arange(100.0) + rt.rank),)

    for shares, host, keys, ok in sim.SimWorld(2).run(proto):
        assert shares == [] and keys == [None] and host >= 400 and ok


def test_categories_dropped_grads_and_destroyed_groups():
    """Dense state over ddp and expert state over eddp in one worker, offloaded by category."""
    dense = MeshTopology((2, 2), ("ddp", "fsdp"))
    experts = MeshTopology((2, 2), ("eddp", "ep"), (0, 2, 1, 3))
    policy = ReplicaPolicy(overrides={"*.dense*": MeshReplica(dense, ("ddp",)),
                                      "*.expert*": MeshReplica(experts, ("eddp",))})

    def values(rank, mesh, dims, salt):
        coord = [c for d, c in enumerate(_coord(mesh, rank)) if mesh.dim_names[d] not in dims]
        return torch.arange(64, dtype=torch.float32) * (1 + sum(coord)) + salt

    async def proto(rt):
        p = {"dense": rt.alloc_device(64, torch.float32), "expert": rt.alloc_device(64, torch.float32)}
        g = {"dense_g": rt.alloc_device(64, torch.float32)}
        p["dense"].copy_(values(rt.rank, dense, ("ddp",), 0))
        p["expert"].copy_(values(rt.rank, experts, ("eddp",), 1))
        g["dense_g"].copy_(values(rt.rank, dense, ("ddp",), 2))
        store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(alignment_bytes=16),
                             dedup=DedupConfig(policy=policy, verify_replicas=True))
        store.attach_tensors("params", p, name="m")
        store.attach_tensors("grads", g, name="g")
        await store.offload_async("params")
        groups = sorted({s.group.ranks for s in store.backend.shares()})
        await store.offload_async("grads", drop_grads=True)
        for name in sorted(n for n in rt.group_names() if n.startswith("replica:")):
            await rt.destroy_group(name)  # e.g. torn down by a lifecycle policy meanwhile
        await store.reload_async()
        return (groups, torch.equal(p["dense"], values(rt.rank, dense, ("ddp",), 0)),
                torch.equal(p["expert"], values(rt.rank, experts, ("eddp",), 1)),
                bool((g["dense_g"] == 0).all()), all(rt.group_live(n) for n in rt.group_names()))

    for rank, (groups, dense_ok, expert_ok, grads_zero, live) in enumerate(sim.SimWorld(4).run(proto)):
        assert groups == sorted({(rank % 2, rank % 2 + 2), (2 * (rank // 2), 2 * (rank // 2) + 1)})
        assert dense_ok and expert_ok and grads_zero and live


def _coord(mesh, rank):
    from refimpl.store.backends.replica import mesh_coordinate

    return mesh_coordinate(mesh, rank)


def test_multi_host_warning_and_undeclared_group(caplog):
    mesh = MeshTopology((2, 2), ("ddp", "fsdp"))

    def proto(declared):
        async def run(rt):
            t = rt.alloc_device(32, torch.float32)
            t.fill_(1.0)
            store = OffloadStore(rt, backend="local_dedup", dedup=DedupConfig(
                policy=_policy(mesh, ("ddp",)), local_world_size=2, groups=declared))
            store.attach_tensors("params", {"w": t}, name="p")
            await store.offload_async()
            await store.reload_async()
        return run

    caplog.set_level(logging.WARNING, logger="refimpl.store.backends.replica")
    sim.SimWorld(4).run(proto(None))
    # ddp lines {0, 2} and {1, 3} cross the two 2-rank hosts; each member warns once
    assert sum("spans hosts (0, 1)" in r.getMessage() for r in caplog.records) == 4
    with pytest.raises(sim.RankFailedError) as err:
        sim.SimWorld(4).run(proto((ReplicaGroup((0, 1)), ReplicaGroup((2, 3)))))
    assert "not among DedupConfig.groups" in str(err.value.__cause__)


def test_pin_ahead_reserves_only_this_ranks_slice():
    mesh = MeshTopology((4,), ("ddp",))

    async def proto(rt):
        t = rt.alloc_device(4096, torch.float32)
        t.fill_(3.0)
        store = OffloadStore(rt, backend="local_dedup", dedup=DedupConfig(policy=_policy(mesh, ("ddp",))))
        store.attach_tensors("params", {"w": t}, name="p")
        store.pin_ahead()
        reserved, regs = store.backend.host_bytes(), store.pool.stats().registrations
        await store.offload_async()
        same = store.pool.stats().registrations == regs  # the offload found its buffer pinned
        await store.reload_async()
        return reserved, same, bool((t == 3.0).all())

    for reserved, same, ok in sim.SimWorld(4).run(proto):
        assert reserved == 4096 * 4 // 4 and same and ok
