"""Megatron-core (GPTModel in Megatron's DDP, ``get_megatron_optimizer``) as a client of the offload
store, on Gloo in CPU processes through the test-only device shim of tests/_megatron.py: offload and
reload between steps give bitwise the same losses, parameters, ``main_grad``, master weights and Adam
state as training without offload, with the distributed optimizer and without, dense (DP=2) and MoE
(EP=2 x EDP=2), on ``local`` and on ``local_dedup`` (replicated state once per replica group)."""
import pytest

from tests._dist import run_distributed
from tests._megatron import needs_megatron

pytestmark = [needs_megatron, pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

STEPS = 3


def _train(rank, dist_opt, experts, backend, device="cpu"):
    import torch

    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.clients.megatron import attach_megatron, megatron_dedup_config
    from refimpl.store.state.guard import is_guarded
    from refimpl.store.state.parking import is_parked
    from tests._megatron import build, state_bytes, step

    model, opt = build(dist_opt, experts)
    client = store = None
    if backend:
        rt = TorchRuntime(device)
        dedup = {"dedup": megatron_dedup_config(rt, model, opt, verify_replicas=True)} if backend == "local_dedup" else {}
        # small alignment: many small parameters, so the gaps between them do not hide the 1/N
        store = OffloadStore(rt, backend=backend, config=StoreConfig(alignment_bytes=16), **dedup)
        client = attach_megatron(store, model, opt)
    g = torch.Generator().manual_seed(rank)
    losses, out = [], {}
    for _ in range(STEPS):
        losses.append(step(model, opt, g, device).numpy().tobytes())
        if client is not None:
            client.offload()
            out["parked"] = all(is_parked(p) and is_guarded(p) for p in model.parameters()) and all(
                is_parked(p.main_grad) and is_guarded(p.main_grad) for p in model.parameters())
            if backend == "local_dedup":
                out["shares"] = [(s.group.ranks, s.layout, s.host_bytes, s.layout_bytes) for s in store.backend.shares()]
            client.reload()
    out.update(losses=losses, state=state_bytes(model, opt), optimizers=type(opt).__name__)
    return out


def _compare(rank, world_size, configs, experts):
    from tests._megatron import cpu_shim, init_parallel

    with cpu_shim():
        ps = init_parallel(ep=2 if experts else 1)
        groups = {"dp": ps.get_data_parallel_world_size(), "edp": ps.get_expert_data_parallel_world_size()
                  if experts else None}
        refs, out = {}, {}
        for dist_opt, backend in configs:
            if dist_opt not in refs:
                refs[dist_opt] = _train(rank, dist_opt, experts, None)
            ref, got = refs[dist_opt], _train(rank, dist_opt, experts, backend)
            out[(dist_opt, backend)] = {
                "losses": ref["losses"] == got["losses"], "n": len(ref["state"]), "parked": got["parked"],
                "diffs": [k for k in ref["state"] if ref["state"][k] != got["state"].get(k)][:5],
                "optimizers": got["optimizers"], "shares": got.get("shares")}
        ps.destroy_model_parallel()
    return groups, out


def _check(results, configs):
    for rank, (groups, out) in enumerate(results):
        for cfg in configs:
            r, case = out[cfg], f"rank {rank}, distributed optimizer={cfg[0]}, {cfg[1]}"
            assert r["optimizers"] == "ChainedOptimizer", case
            assert r["n"] > 20 and r["parked"], case
            assert r["losses"], f"{case}: losses differ from the run without offload"
            assert r["diffs"] == [], f"{case}: {r['diffs']} differ from the run without offload"
    return results


def _dedup_shares(shares, dist_opt):
    """Replica groups of the deduplicated layouts, and that each member keeps about 1/N of them."""
    seen = {}
    for ranks, layout, host, layout_bytes in shares:
        assert host <= -(-layout_bytes // len(ranks)) + 64 * 32, shares  # + alignment of up to 32 gaps
        seen.setdefault(layout.split(":")[0].split("/")[0], set()).add(tuple(ranks))
    return seen


DENSE = [(True, "local"), (True, "local_dedup"), (False, "local"), (False, "local_dedup")]


def test_megatron_dense_dp2_bitwise_local_and_dedup():
    results = _check(run_distributed(_compare, 2, args=(DENSE, 0), timeout=400), DENSE)
    for rank, (groups, out) in enumerate(results):
        assert groups["dp"] == 2
        # the distributed optimizer: only the bf16 param buffer is replicated over data parallel
        dist = out[(True, "local_dedup")]["shares"]
        assert dist and {tuple(r) for r, *_ in dist} == {(0, 1)}, dist
        assert all("params" in label for _, label, *_ in dist), dist
        _dedup_shares(dist, True)
        # non-distributed: params, the all-reduced grads, master weights and Adam state, once per replica group
        plain = out[(False, "local_dedup")]["shares"]
        labels = " ".join(label for _, label, *_ in plain)
        for cat in ("params", "grads", "optimizer"):
            assert cat in labels, (cat, labels)
        _dedup_shares(plain, False)


MOE = [(True, "local"), (False, "local_dedup")]


def test_megatron_moe_ep2_edp2_bitwise_local_and_dedup():
    results = _check(run_distributed(_compare, 4, args=(MOE, 4), timeout=500), MOE)
    for rank, (groups, out) in enumerate(results):
        assert groups == {"dp": 4, "edp": 2}
        shares = out[(False, "local_dedup")]["shares"]
        groups_seen = {tuple(r) for r, *_ in shares}
        # dense state over the 4 data-parallel ranks, experts over this rank's expert-data-parallel pair
        # (Megatron's order tp-cp-ep-dp puts ep innermost: ranks 0,1 hold different experts)
        assert groups_seen == {(0, 1, 2, 3), (rank % 2, rank % 2 + 2)}, groups_seen
        _dedup_shares(shares, False)


def _pin_ahead_at_attach(rank, world_size):
    import logging

    import torch

    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.clients.megatron import attach_megatron
    from tests._megatron import build, cpu_shim, init_parallel, step

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("refimpl").addHandler(handler)
    with cpu_shim():
        ps = init_parallel()
        model, opt = build(True)
        step(model, opt, torch.Generator().manual_seed(rank), "cpu")  # Adam's state (and its step) exists
        store = OffloadStore(TorchRuntime("cpu"), config=StoreConfig(alignment_bytes=16, pin_ahead="background"))
        client = attach_megatron(store, model, opt)
        client.offload()
        client.reload()
        ps.destroy_model_parallel()
    return [r.getMessage()[:120] for r in records if r.levelno >= logging.WARNING and "pinning ahead" in r.getMessage()]


def test_megatron_pin_ahead_at_attach_sees_the_client_views():
    """Pinning ahead at attach runs with the client's bucket and shard views parked: no UnattachedAliasError."""
    for warnings in run_distributed(_pin_ahead_at_attach, 2, timeout=200):
        assert warnings == [], warnings
