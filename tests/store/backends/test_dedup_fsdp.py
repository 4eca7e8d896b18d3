"""``local_dedup`` on real FSDP2 training in Gloo processes: bitwise equality and 1/N host bytes.

Each job trains a small model with dense layers on an HSDP (ddp, fsdp) mesh and a MoE expert on its own
(eddp, ep, efsdp) mesh twice from the same seeds: once without offload, once with a dedup offload and
reload around every step. Losses, parameters and optimizer state must be bitwise equal, the replica
groups must be the ddp lines for dense state and the eddp lines for expert state, and each rank's
host bytes for a replicated layout must be at most ceil(bytes/N) plus alignment.
"""
import pytest
import torch

from tests._dist import run_distributed

STEPS = 3


def _build(dense_mesh, expert_mesh, seed):
    """Dense layers fully sharded over ``dense_mesh``, one expert per ep index over ``expert_mesh``."""
    from torch.distributed.fsdp import fully_shard

    class Net(torch.nn.Module):
        def __init__(self, ep_index):
            super().__init__()
            torch.manual_seed(seed)
            self.inp = torch.nn.Linear(8, 12)
            self.out = torch.nn.Linear(12, 5)
            torch.manual_seed(seed + 1000 * (ep_index + 1))  # experts differ across ep, agree across eddp
            self.expert = torch.nn.Linear(12, 12)

        def forward(self, x):
            h = torch.relu(self.inp(x))
            return self.out(h + torch.tanh(self.expert(h)))

    ep_index = expert_mesh.get_coordinate()[1]
    net = Net(ep_index)
    fully_shard(net.expert, mesh=expert_mesh["eddp", "efsdp"])
    fully_shard(net, mesh=dense_mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=0.05, foreach=False)
    return net, opt


def _train(rank, dense_mesh, expert_mesh, store_factory):
    net, opt = _build(dense_mesh, expert_mesh, seed=7)
    store = store_factory(net, opt) if store_factory else None
    losses, shares = [], []
    for step in range(STEPS):
        if store:
            store.reload()
        opt.zero_grad(set_to_none=False) if step else None
        g = torch.Generator().manual_seed(100 * rank + step)
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 5, generator=g)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        if store:
            store.offload()
            shares = store.backend.shares()
            layouts = {lay.key.label(): lay for lay in store.layouts.values()}
    if store:
        store.reload()
    state = {n: p._local_tensor.detach().clone() for n, p in net.named_parameters()}
    for i, p in enumerate(net.parameters()):
        for k, v in opt.state[p].items():
            state[f"opt{i}.{k}"] = (v._local_tensor if hasattr(v, "_local_tensor") else v).detach().clone()
    out = {"losses": losses, "state": state}
    if store:
        out["shares"] = [(s.group.ranks, s.layout, s.layout_bytes, s.host_bytes,
                          layouts[s.layout].data_numel * layouts[s.layout].dtype.itemsize) for s in shares]
        out["host_bytes"] = store.backend.host_bytes()
        out["verified"] = store.backend.verified_offloads
    return out


def _store_factory(net, opt):
    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.backends.dedup_config import DedupConfig

    store = OffloadStore(TorchRuntime(), backend="local_dedup", config=StoreConfig(alignment_bytes=16),
                         dedup=DedupConfig(verify_replicas=True))
    store.attach_module(net, name="model")
    store.attach_optimizer(opt, name="optim")
    return store


def _equal_training(rank, world_size, dense_shape, expert_shape, expert_order):
    """Train with and without dedup offload on the given meshes; report differences, groups and shares.

    Tensors are compared here (both runs live in this process); only plain data goes back.
    """
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    from refimpl.store.backends.replica import MeshTopology, group_from_placements

    dense = init_device_mesh("cpu", dense_shape, mesh_dim_names=("ddp", "fsdp"))
    ranks = torch.tensor(expert_order).reshape(expert_shape)
    experts = DeviceMesh("cpu", ranks, mesh_dim_names=("eddp", "ep", "efsdp"))
    base = _train(rank, dense, experts, None)
    dedup = _train(rank, dense, experts, _store_factory)
    net, _ = _build(dense, experts, seed=7)
    groups = {n: group_from_placements(p.device_mesh, p.placements, rank).ranks for n, p in net.named_parameters()}
    diffs = [f"loss{i}" for i, (a, b) in enumerate(zip(base["losses"], dedup["losses"])) if not torch.equal(a, b)]
    if base["state"].keys() != dedup["state"].keys():
        diffs.append(f"state keys {sorted(base['state'])} vs {sorted(dedup['state'])}")
    diffs += [k for k, v in base["state"].items() if k in dedup["state"] and not torch.equal(v, dedup["state"][k])]
    # a real DeviceMesh read as data: its groups and its slices match torch's own
    topo = MeshTopology.of(experts)
    mesh_ok = (topo.slice(rank, ["eddp", "efsdp"]) == MeshTopology.of(experts["eddp", "efsdp"])
               and MeshTopology.of(dense).slice(rank, ["ddp"]) == MeshTopology.of(dense["ddp"]))
    return {"diffs": diffs, "groups": groups, "shares": dedup["shares"], "verified": dedup["verified"],
            "state_keys": len(base["state"]), "mesh_ok": mesh_ok,
            "eddp_groups": [g.ranks for g in topo.groups_over(["eddp"])]}


def check_training_results(results, ddp_group, eddp_group):
    for rank, res in enumerate(results):
        assert res["diffs"] == [], f"rank {rank}: differs after dedup offload/reload: {res['diffs']}"
        assert res["state_keys"] >= 12  # 6 params + exp_avg, exp_avg_sq (and step) each
        assert res["verified"] == STEPS
        assert res["mesh_ok"], f"rank {rank}: MeshTopology disagrees with torch's DeviceMesh slicing"
        assert sorted({eddp_group(r) for r in range(len(results))}) == res["eddp_groups"]
        for name, ranks in res["groups"].items():
            want = eddp_group(rank) if name.startswith("expert.") else ddp_group(rank)
            assert ranks == want, f"rank {rank}: {name} resolved to {ranks}, expected {want}"
        seen = {tuple(r) for r, *_ in res["shares"]}
        assert seen == {ddp_group(rank), eddp_group(rank)}, seen
        assert len(res["shares"]) == 3 * len(seen)  # params, grads, optimizer per group
        for ranks, label, data_bytes, host, layout_bytes in res["shares"]:
            n = len(ranks)
            assert host <= -(-layout_bytes // n) + 64, f"rank {rank}: {label} keeps {host} of {layout_bytes} B"
            assert host <= -(-data_bytes // n) + 64 + 16 * 8, f"rank {rank}: {label} keeps {host} of {data_bytes} B"
    # the members' slices of one layout add up to the layout: each byte is kept once per group
    by_layout = {}
    for res in results:
        for ranks, label, data_bytes, host, layout_bytes in res["shares"]:
            by_layout.setdefault((tuple(ranks), label), []).append((host, layout_bytes))
    for (ranks, label), rows in by_layout.items():
        assert len(rows) == len(ranks), (ranks, label)
        assert sum(h for h, _ in rows) <= rows[0][1], (ranks, label, rows)


@pytest.mark.slow
def test_hsdp_and_moe_dedup_training_4_ranks():
    # expert mesh with ep as the OUTER rank order: eddp lines {0,1},{2,3} differ from the dense ddp lines {0,2},{1,3}
    results = run_distributed(_equal_training, 4, args=((2, 2), (2, 2, 1), [0, 2, 1, 3]), timeout=240)
    check_training_results(results, ddp_group=lambda r: (r % 2, r % 2 + 2), eddp_group=lambda r: (2 * (r // 2), 2 * (r // 2) + 1))


def _eight_rank_job(rank, world_size):
    """Dense (ddp=2, fsdp=4) + experts (eddp=2, ep=2, efsdp=2): training equality, then the safety checks."""
    import logging

    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.backends.dedup_config import DedupConfig, LayoutMismatchError, ReplicaMismatchError
    from refimpl.store.backends.replica import ReplicaGroup, ReplicaPolicy

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("refimpl.store.backends.replica").addHandler(Keep())
    out = _equal_training(rank, world_size, (2, 4), (2, 2, 2), list(range(8)))
    out["warnings"] = [m for m in records if "spans hosts" in m]

    # content check: one rank's "replicated" tensor differs -> every rank refuses, nothing moves
    rt = TorchRuntime()
    w = torch.arange(40, dtype=torch.float32) + (0.5 if rank == 3 else 0.0)
    store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(alignment_bytes=16),
                         dedup=DedupConfig(verify_replicas=True, policy=ReplicaPolicy(dp_ranks=tuple(range(8)))))
    store.attach_tensors("optimizer", {"w": w}, name="master", kind="master_weights")
    try:
        store.offload()
        out["content"] = "no error"
    except ReplicaMismatchError as e:
        out["content"] = str(e)
    out["content_kept"] = w.untyped_storage().nbytes() == 40 * 4 and bool(w[5] == 5 + (0.5 if rank == 3 else 0))
    w.sub_(0.5 if rank == 3 else 0.0)
    store.offload()  # equal now: the same store goes through
    out["kept_after_fix"] = store.backend.host_bytes()
    store.reload()
    out["back_after_fix"] = torch.equal(w, torch.arange(40, dtype=torch.float32))

    # layout check: rank 0 alone believes a tensor is replicated over (0, 4) -> every rank refuses
    pol = ReplicaPolicy(overrides={"x.v": ReplicaGroup((0, 4))} if rank == 0 else {})
    v = torch.ones(16)
    store2 = OffloadStore(rt, backend="local_dedup", dedup=DedupConfig(policy=pol))
    store2.attach_tensors("params", {"v": v}, name="x")
    try:
        store2.offload()
        out["layout"] = "no error"
    except LayoutMismatchError as e:
        out["layout"] = str(e)
    out["layout_kept"] = v.untyped_storage().nbytes() == 64
    return out


@pytest.mark.slow
def test_moe_dedup_8_ranks_and_safety_checks():
    results = run_distributed(_eight_rank_job, 8, timeout=300, env={"LOCAL_WORLD_SIZE": "4"})
    check_training_results(results, ddp_group=lambda r: (r % 4, r % 4 + 4), eddp_group=lambda r: (r % 4, r % 4 + 4))
    for rank, res in enumerate(results):
        # ddp/eddp lines {r, r+4} cross the two 4-rank hosts
        assert res["warnings"] and "spans hosts (0, 1)" in res["warnings"][0], res["warnings"]
        assert "refused to offload" in res["content"], res["content"]
        assert res["content_kept"] and res["back_after_fix"]
        assert res["kept_after_fix"] <= 40 * 4 // 8 + 64
        assert "refused to offload" in res["layout"] and res["layout_kept"], res["layout"]
    assert "'master.w'" in results[3]["content"] and "differ between members" in results[3]["content"]
    assert "laid out different tensors" in results[0]["layout"]
    assert "laid out different tensors" in results[4]["layout"]
