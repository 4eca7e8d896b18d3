"""For every mesh and layout, ``local_dedup`` round trips are bitwise and host bytes are 1/N per rank.

The same store and backend code that runs on TorchRuntime runs here on simulated ranks with real CPU
payloads. Hypothesis draws the world size, one or two meshes over it (a dense mesh and an expert-style
mesh with another factorisation and rank order), tensors with random dtypes, sizes and placements
(``Replicate``/``Shard`` per mesh dim), rank-local tensors, and the simulator's tie-breaking schedule.
Each family's replica group is either named by an explicit override (``MeshReplica``) or left to the
store to infer from the tensors' DTensor placements (the tensors are attached as duck-typed DTensors:
``_local_tensor``, ``placements``, ``device_mesh``, as FSDP2 hands them over), so a wrong inference
breaks the bitwise round trip.
A tensor's bytes depend only on its coordinates on the non-replicated dims, so ranks of one replica
group hold identical copies, as they would in training.
"""
import math

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor import Replicate, Shard

import sim
from refimpl.store import OffloadStore, StoreConfig
from refimpl.store.backends.dedup_config import DedupConfig
from refimpl.store.backends.replica import MeshReplica, MeshTopology, ReplicaPolicy, mesh_coordinate, replicate_dims
from refimpl.store.state.parking import is_parked
from tests._hypothesis import BUDGET

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.uint8]


def _factorisations(n, max_dims=3):
    out = []

    def rec(rest, dims):
        if rest == 1:
            if dims:
                out.append(tuple(dims))
            return
        if len(dims) == max_dims:
            return
        for f in range(2, rest + 1):
            if rest % f == 0:
                rec(rest // f, dims + [f])

    rec(n, [])
    return out or [(1,)]


@st.composite
def meshes(draw, n):
    shape = draw(st.sampled_from(_factorisations(n)))
    order = draw(st.permutations(range(n)))
    names = tuple(f"{draw(st.sampled_from('abcdefgh'))}{i}" for i in range(len(shape)))
    return MeshTopology(shape, names, tuple(order))


@st.composite
def scenarios(draw):
    n = draw(st.sampled_from([k for k in (1, 2, 3, 4, 6, 8, 12, 16, 32, 64) if k <= max(8, BUDGET.max_ranks)]))
    mesh_list = [draw(meshes(n)) for _ in range(draw(st.integers(1, 2)))]
    families = []
    for i in range(draw(st.integers(1, 5))):
        m = draw(st.integers(0, len(mesh_list) - 1))
        placements = tuple(draw(st.sampled_from([Replicate(), Shard(0)])) for _ in mesh_list[m].shape)
        families.append(dict(
            mesh=m, placements=placements, dtype=draw(st.sampled_from(DTYPES)),
            sizes=draw(st.lists(st.integers(0, 97), min_size=1, max_size=4)),
            uneven=draw(st.booleans()), category=draw(st.sampled_from(["params", "optimizer"])),
            infer=draw(st.booleans()),  # True: resolved from the DTensor placements, no override
        ))
    local = draw(st.lists(st.integers(1, 50), max_size=2))
    return n, mesh_list, families, local


def _values(seed, numel, dtype):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g).to(dtype)
    return torch.randint(0, 200, (numel,), generator=g, dtype=torch.int64).to(dtype)


def _tensors(rank, mesh_list, families, local, cycle):
    """name -> (category, tensor values) on ``rank``; equal across each family's replica group."""
    out = {}
    for f_i, f in enumerate(families):
        mesh = mesh_list[f["mesh"]]
        coord = mesh_coordinate(mesh, rank)
        rdims = set(replicate_dims(f["placements"]))
        key = tuple(c for d, c in enumerate(coord) if d not in rdims)
        seed_base = hash((f_i, key, cycle)) % (2**31)
        for t_i, size in enumerate(f["sizes"]):
            numel = size + (sum(key) % 3 if f["uneven"] else 0)  # uneven shards still agree within a group
            out[f"f{f_i}.t{t_i}"] = (f["category"], _values(seed_base + t_i, numel, f["dtype"]))
    for l_i, size in enumerate(local):
        out[f"local{l_i}"] = ("params", _values(10_000 * (rank + 1) + l_i + cycle, size, torch.float32))
    return out


def _policy(mesh_list, families):
    overrides = {}
    for f_i, f in enumerate(families):
        if f["infer"]:
            continue
        mesh = mesh_list[f["mesh"]]
        dims = tuple(mesh.dim_names[d] for d in replicate_dims(f["placements"]))
        overrides[f"*.f{f_i}.*"] = MeshReplica(mesh, dims)
    return ReplicaPolicy(overrides=overrides)


class _Placed:
    """A DTensor as the store sees one (duck-typed: a real DTensor needs live process groups)."""

    def __init__(self, local, mesh, placements):
        self._local_tensor, self.device_mesh, self.placements = local, mesh, placements


def _attached(name, t, mesh_list, families):
    """What the store is given for tensor ``name``: the plain tensor, or a DTensor view of it."""
    if not name.startswith("f"):
        return t
    f = families[int(name[1:].split(".")[0])]
    return _Placed(t, mesh_list[f["mesh"]], f["placements"]) if f["infer"] else t


def _protocol(mesh_list, families, local, cycles):
    async def run(rt):
        store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(alignment_bytes=16),
                             dedup=DedupConfig(policy=_policy(mesh_list, families), verify_replicas=True))
        by_cat = {}
        expected = {}
        for name, (cat, values) in _tensors(rt.rank, mesh_list, families, local, 0).items():
            t = rt.alloc_device(values.numel(), values.dtype)
            t.copy_(values)
            by_cat.setdefault(cat, {})[name] = t
            expected[name] = values
        for cat, tensors in sorted(by_cat.items()):
            store.attach_tensors(cat, {k: _attached(k, t, mesh_list, families) for k, t in tensors.items()}, name=cat)
        report = []
        for cycle in range(cycles):
            if cycle:  # the state changes between cycles (consistently within each replica group)
                for name, (cat, values) in _tensors(rt.rank, mesh_list, families, local, cycle).items():
                    by_cat[cat][name].copy_(values)
                    expected[name] = values
            await store.offload_async()
            released = all(is_parked(t) for ts in by_cat.values() for t in ts.values()
                           if t.numel())
            # data extent (entries and the store's alignment gaps), without dedup's own padding
            nbytes = {lay.key.label(): lay.data_numel * lay.dtype.itemsize for lay in store.layouts.values()}
            shares = [(s.group.ranks, s.layout, s.host_bytes, nbytes[s.layout]) for s in store.backend.shares()]
            await store.reload_async()
            wrong = sorted(n for ts in by_cat.values() for n, t in ts.items()
                           if not torch.equal(t, expected[n]))
            report.append((released, shares, wrong))
        return report
    return run


@BUDGET.settings(100)
@given(scenario=scenarios(), seed=st.integers(0, 2**16))
def test_dedup_round_trip_bitwise_and_one_nth_host_bytes(scenario, seed):
    n, mesh_list, families, local = scenario
    world = sim.SimWorld(n, payload="real", seed=seed, chooser=sim.RandomChooser(seed))
    reports = world.run(_protocol(mesh_list, families, local, cycles=2))
    slices = {}
    for rank, report in enumerate(reports):
        for released, shares, wrong in report:
            assert released, f"rank {rank}: device memory not released at offload"
            assert wrong == [], f"rank {rank}: {wrong} not bitwise equal after reload"
            for ranks, label, host, layout_bytes in shares:
                assert rank in ranks and len(ranks) > 1
                assert host <= math.ceil(layout_bytes / len(ranks)) + 64, (rank, label, host, layout_bytes)
        for ranks, label, host, layout_bytes in report[-1][1]:
            slices.setdefault((ranks, label), []).append((host, layout_bytes))
    for (ranks, label), rows in slices.items():
        # every member holds a slice; together they hold the layout once (not once per rank)
        assert len(rows) == len(ranks), (ranks, label)
        assert sum(h for h, _ in rows) <= rows[0][1], (ranks, label, rows)
