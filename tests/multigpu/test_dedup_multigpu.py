"""``local_dedup`` on N GPUs: FSDP2 HSDP, a MoE model and a ``transformers`` model, and DCP from host buffers.

Each job trains twice from the same seeds in the same processes, once without offload and once with a
``local_dedup`` offload and reload around every step; losses, parameters and optimizer state must be
bitwise equal (deterministic kernels on), and each rank must keep about 1/N of every replicated layout
in host memory.

* HSDP: dense layers on a (ddp=N, fsdp=1) mesh: every parameter is replicated over the N GPUs.
* MoE: dense layers as above, and one expert per ``ep`` index on an (eddp, ep, efsdp) mesh: experts
  are sharded over ``ep`` and replicated over ``eddp``. With N = 2 GPUs there is room for ep = 1 only
  (eddp = 2): the experts are replicated, not sharded; with N >= 4, ep = 2.
* transformers: a ``LlamaForCausalLM`` built from a small ``LlamaConfig`` (random weights, no
  download), each decoder layer sharded on the HSDP mesh; skipped where transformers is missing.
* DCP: with 2+ ranks, a save while offloaded reads the ``local`` store's pinned host buffers (no
  reload, no copies) and loads back bitwise; a ``local_dedup`` save takes the reload path.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

STEPS = 3
DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def _device():
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _store(net, opt, backend="local_dedup"):
    from refimpl.store import OffloadStore
    from refimpl.store.backends.dedup_config import DedupConfig
    from refimpl.torch_runtime import TorchRuntime

    kw = {"dedup": DedupConfig(verify_replicas=True)} if backend == "local_dedup" else {}
    store = OffloadStore(TorchRuntime(), backend=backend, **kw)
    store.attach_module(net, name="model")
    store.attach_optimizer(opt, name="optim")
    return store


def _local(t):
    return (t._local_tensor if hasattr(t, "_local_tensor") else t).detach().clone()


def _train(build, batch, rank, with_store):
    """STEPS AdamW steps of ``build()``'s model; with a dedup offload+reload around each step."""
    torch.use_deterministic_algorithms(True, warn_only=True)  # bitwise runs; warn, not fail, on a missing kernel
    net, opt = build()
    store = _store(net, opt) if with_store else None
    losses, shares = [], []
    for step in range(STEPS):
        if store:
            store.reload()
        opt.zero_grad(set_to_none=False)
        loss = batch(net, rank, step)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        if store:
            store.offload()
            shares = [(s.group.ranks, s.layout_bytes, s.host_bytes) for s in store.backend.shares()]
    if store:
        store.reload()
    state = {n: _local(p) for n, p in net.named_parameters()}
    for i, p in enumerate(net.parameters()):
        for k, v in opt.state[p].items():
            state[f"opt{i}.{k}"] = _local(v)
    out = {"losses": losses, "state": state}
    if store:
        out.update(shares=shares, host_bytes=store.backend.host_bytes(), verified=store.backend.verified_offloads,
                   state_bytes=sum(v.numel() * v.element_size() for v in state.values()))
        store.close()
    return out


def _compare(build, batch, rank):
    base = _train(build, batch, rank, False)
    dedup = _train(build, batch, rank, True)
    diffs = [f"loss{i}" for i, (a, b) in enumerate(zip(base["losses"], dedup["losses"])) if not torch.equal(a, b)]
    diffs += [k for k, v in base["state"].items() if not torch.equal(v, dedup["state"].get(k, v.new_empty(0)))]
    return {"diffs": diffs, "n_state": len(base["state"]), "shares": dedup["shares"], "verified": dedup["verified"],
            "host_bytes": dedup["host_bytes"], "state_bytes": dedup["state_bytes"],
            "loss": [float(x) for x in base["losses"]]}


# --------------------------------------------------------------------------- models


def _hsdp_moe_job(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dev = _device()
    ep = 2 if world_size >= 4 and world_size % 2 == 0 else 1
    dense = init_device_mesh(dev.type, (world_size, 1), mesh_dim_names=("ddp", "fsdp"))
    experts = init_device_mesh(dev.type, (world_size // ep, ep, 1), mesh_dim_names=("eddp", "ep", "efsdp"))
    ep_index = experts.get_coordinate()[1]

    class MoE(torch.nn.Module):
        def __init__(self, with_expert):
            super().__init__()
            torch.manual_seed(7)
            self.inp = torch.nn.Linear(64, 256)
            self.out = torch.nn.Linear(256, 32)
            torch.manual_seed(7 + 1000 * (ep_index + 1))  # experts differ across ep, agree across eddp
            self.expert = torch.nn.Linear(256, 256) if with_expert else None

        def forward(self, x):
            h = torch.relu(self.inp(x))
            if self.expert is not None:
                h = h + torch.tanh(self.expert(h))
            return self.out(h)

    def builder(with_expert):
        def build():
            net = MoE(with_expert).to(dev)
            if with_expert:
                fully_shard(net.expert, mesh=experts["eddp", "efsdp"])
            fully_shard(net, mesh=dense)
            return net, torch.optim.AdamW(net.parameters(), lr=0.01, foreach=False)
        return build

    def batch(net, r, step):
        g = torch.Generator(device=dev).manual_seed(100 * r + step)
        x, y = torch.randn(16, 64, generator=g, device=dev), torch.randn(16, 32, generator=g, device=dev)
        return torch.nn.functional.mse_loss(net(x), y)

    return {"hsdp": _compare(builder(False), batch, rank), "moe": _compare(builder(True), batch, rank),
            "ep": ep, "eddp": world_size // ep}


def _transformers_job(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    dev = _device()
    mesh = init_device_mesh(dev.type, (world_size, 1), mesh_dim_names=("ddp", "fsdp"))
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="eager")

    def build():
        torch.manual_seed(11)
        net = LlamaForCausalLM(config).to(dev)
        for layer in net.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net, torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=False)

    def batch(net, r, step):
        g = torch.Generator(device=dev).manual_seed(100 * r + step)
        ids = torch.randint(0, config.vocab_size, (2, 32), generator=g, device=dev)
        return net(input_ids=ids, labels=ids).loss

    return _compare(build, batch, rank)


def _check(results, group, label):
    n = len(group)
    for rank, res in enumerate(results):
        assert res["diffs"] == [], f"{label} rank {rank}: differs after dedup offload/reload: {res['diffs'][:8]}"
        assert res["verified"] == STEPS, "every offload hash-checked the replicas"
        replicated = [s for s in res["shares"] if len(s[0]) == n]
        assert replicated, f"{label} rank {rank}: no layout was replicated over {group}"
        for ranks, layout_bytes, host in replicated:
            assert tuple(ranks) == group
            # 1/N of the layout, plus the store's per-tensor alignment padding
            assert host <= layout_bytes / n * 1.05 + 4096, f"{label} rank {rank}: keeps {host} of {layout_bytes} B"
    by_layout = {}
    for res in results:  # the members' slices add up to the layout: each byte is kept once per group
        for i, (ranks, layout_bytes, host) in enumerate(res["shares"]):
            by_layout.setdefault((tuple(ranks), i), []).append((host, layout_bytes))
    for key, rows in by_layout.items():
        assert sum(h for h, _ in rows) <= rows[0][1] * 1.05 + 4096 * len(rows), (label, key, rows)


def test_local_dedup_hsdp_and_moe_train_bitwise_with_1_over_n_host_bytes(gpus):
    results = gpus.run(_hsdp_moe_job, timeout=600, env=DETERMINISTIC)
    everyone = tuple(range(gpus.world_size))
    _check([r["hsdp"] for r in results], everyone, "HSDP")
    if results[0]["ep"] == 1:  # 2 GPUs: experts replicated over eddp = all ranks
        _check([r["moe"] for r in results], everyone, "MoE")
    else:  # experts replicated over eddp lines only, dense over everyone
        for r in results:
            assert r["moe"]["diffs"] == [] and r["moe"]["verified"] == STEPS
            groups = {tuple(s[0]) for s in r["moe"]["shares"]}
            assert everyone in groups and any(len(g) == results[0]["eddp"] for g in groups), groups
    assert len({tuple(r["hsdp"]["loss"]) for r in results}) == gpus.world_size, "ranks trained on different data"


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed "
                    "(pip install '.[models]')")
def test_local_dedup_on_a_transformers_llama_trains_bitwise(gpus):
    results = gpus.run(_transformers_job, timeout=600, env=DETERMINISTIC)
    _check(results, tuple(range(gpus.world_size)), "Llama")
    assert all(r["n_state"] >= 3 * 20 for r in results), "parameters and both AdamW moments compared"


# --------------------------------------------------------------------------- DCP


def _dcp_job(rank, world_size, root):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from refimpl.store.checkpoint import SavePath
    from refimpl.torch_runtime import TorchRuntime, dcp

    dev = _device()
    out = {}

    def build(mesh):
        torch.manual_seed(3)
        net = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 16)).to(dev)
        fully_shard(net, mesh=mesh)
        return net, torch.optim.AdamW(net.parameters(), lr=0.1, foreach=False)

    def step(net, opt):
        g = torch.Generator(device=dev).manual_seed(10 * rank)
        net(torch.randn(8, 64, generator=g, device=dev)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    def loaded(mesh, path):
        fresh, _ = build(mesh)
        with torch.no_grad():
            for p in fresh.parameters():
                p._local_tensor.zero_()
        dcp.load_into({"model": fresh.state_dict()}, path)
        return {n: _local(p) for n, p in fresh.named_parameters()}

    def diff(a, b):
        return sorted(k for k in a if not torch.equal(a[k], b[k]))

    for backend, shape in (("local", (1, world_size)), ("local_dedup", (world_size, 1))):
        mesh = init_device_mesh(dev.type, shape, mesh_dim_names=("ddp", "fsdp"))
        net, opt = build(mesh)
        store = _store(net, opt, backend)
        rt = store.rt
        step(net, opt)
        ref = {n: _local(p) for n, p in net.named_parameters()}
        store.offload()
        copies = rt.copy_stats.host_copies
        res = dcp.save(store, f"{root}/{backend}")
        out[backend] = dict(
            path=res.path.name, no_copies=rt.copy_stats.host_copies == copies,
            offloaded=store.is_offloaded("params"),
            diff=diff(loaded(mesh, f"{root}/{backend}"), ref))
        store.reload()
        out[backend]["back"] = diff({n: _local(p) for n, p in net.named_parameters()}, ref)
        out[backend]["host_path"] = res.path is SavePath.HOST_BUFFERS
        store.close()
    return out


def test_dcp_save_from_host_buffers_and_load_back(gpus, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dcp"))
    results = gpus.run(_dcp_job, root, timeout=300)
    for rank, r in enumerate(results):
        loc, ded = r["local"], r["local_dedup"]
        assert loc["host_path"] and loc["no_copies"], f"rank {rank}: the local save did not read the host buffers"
        assert loc["offloaded"], "the save left the state offloaded"
        assert loc["diff"] == [] and loc["back"] == [], f"rank {rank}: checkpoint differs: {loc['diff']}"
        assert ded["offloaded"] and ded["diff"] == [] and ded["back"] == [], f"rank {rank}: dedup {ded}"
