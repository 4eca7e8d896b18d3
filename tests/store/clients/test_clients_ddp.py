"""torch ``DistributedDataParallel`` (2 Gloo processes) as a client of the offload store: offload and
reload between steps give bitwise the same parameters, gradients and optimizer state as training
without offload, on every rank, with ``gradient_as_bucket_view`` off and on (grads zeroed or set to
None), and with it on the reducer's bucket storages are really released while offloaded."""
from tests._dist import run_distributed

STEPS = 4


def _train(rank, bucket_view, set_to_none, offload, device="cpu"):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore
    from refimpl.store.clients import attach_ddp
    from refimpl.store.state.guard import is_guarded
    from refimpl.store.state.parking import is_parked

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                              torch.nn.LayerNorm(16), torch.nn.Linear(16, 3)).to(device)
    # a tiny bucket cap: once the reducer rebuilt its buckets (after the first step) there are several
    ddp = DDP(net, gradient_as_bucket_view=bucket_view, bucket_cap_mb=0.0001)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.01)
    client = attach_ddp(OffloadStore(TorchRuntime(device)), ddp, opt) if offload else None
    g = torch.Generator().manual_seed(100 + rank)
    facts = []
    for _ in range(STEPS):
        ddp(torch.randn(6, 8, generator=g).to(device)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        if client is not None:
            client.offload()
            grads = [p.grad for p in net.parameters() if p.grad is not None]
            facts.append((all(is_parked(p) and is_guarded(p) for p in net.parameters()),
                          all(is_parked(x) and is_guarded(x) for x in grads), client.buckets_offloaded))
            client.reload()
    ddp(torch.randn(6, 8, generator=g).to(device)).square().mean().backward()  # grads of one more step, not zeroed
    state = [p.detach().clone() for p in net.parameters()] + [p.grad.clone() for p in net.parameters()]
    state += [v.clone() for s in opt.state.values() for v in s.values()]
    return [t.cpu().numpy().tobytes() for t in state], facts


def _ddp_rank(rank, world_size, device="cpu"):
    out = {}
    for bucket_view in (False, True):
        for set_to_none in (True, False):
            ref, _ = _train(rank, bucket_view, set_to_none, offload=False, device=device)
            got, facts = _train(rank, bucket_view, set_to_none, offload=True, device=device)
            out[(bucket_view, set_to_none)] = {
                "diffs": [i for i, (a, b) in enumerate(zip(ref, got)) if a != b], "n": len(ref), "facts": facts,
                "params": got[:8]}
    return out


def check_ddp(results):
    """Every case on every rank bitwise equal to the run without offload; buckets released as they should."""
    for (bucket_view, set_to_none), res in results[0].items():
        case = f"gradient_as_bucket_view={bucket_view}, set_to_none={set_to_none}"
        for rank, r in enumerate(results):
            got = r[(bucket_view, set_to_none)]
            assert got["n"] == 8 + 8 + 3 * 8, case  # params, grads, AdamW step/exp_avg/exp_avg_sq
            assert got["diffs"] == [], f"rank {rank}, {case}: tensors {got['diffs']} differ from the run without offload"
            assert got["params"] == results[0][(bucket_view, set_to_none)]["params"], \
                f"{case}: the ranks' parameters differ (gradients were not all-reduced)"
            buckets = [b for *_, b in got["facts"]]
            assert all(p and g for p, g, _ in got["facts"]), f"{case}: not everything parked and guarded while offloaded"
            if bucket_view and not set_to_none:  # grads are the reducer's buckets: released in place
                assert buckets[0] >= 1 and min(buckets[1:]) >= 3, f"{case}: bucket storages released {buckets}"
            else:
                assert buckets == [0] * STEPS, case


def test_ddp_offload_reload_is_bitwise_on_every_rank_both_bucket_modes():
    check_ddp(run_distributed(_ddp_rank, 2, timeout=180))
