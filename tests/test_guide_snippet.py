"""docs/guide.md's snippets, run as the guide shows them: "the store in your own FSDP2 worker" and the
torch DDP section on 2 real Gloo ranks, the Megatron-core section (both its blocks) on one Gloo rank
through the test-only device shim.

The test reads each snippet from the guide (the ``python`` blocks after a ``guide-snippet`` marker),
so the guide cannot drift from the code without this failing.
"""
import re
from pathlib import Path

import pytest

from tests._dist import run_distributed
from tests._megatron import needs_megatron

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


def snippet(marker: str = "guide-snippet") -> str:
    """The guide's ``python`` blocks after ``<!-- marker -->``, in order, as one program."""
    text = GUIDE.read_text(encoding="utf-8")
    blocks = re.findall(rf"<!-- {re.escape(marker)} -->\s*```python\n(.*?)```", text, re.S)
    assert blocks, f"docs/guide.md lost its {marker} block"
    return "\n".join(blocks)


def _rank(rank, world_size, code):
    import torch

    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(code, "docs/guide.md", "exec"), scope)  # the snippet offloads and reloads once
    model, optim, control = scope["model"], scope["optim"], scope["control"]
    before = [p.detach().full_tensor().clone() for p in model.parameters()]
    control.offload_states()
    offloaded = control.offloaded
    control.reload_states()
    after = [p.detach().full_tensor() for p in model.parameters()]
    model(torch.randn(4, 64)).sum().backward()
    optim.step()  # training continues on the reloaded state
    return offloaded, all(torch.equal(a, b) for a, b in zip(before, after)), len(code.strip().splitlines())


def test_guide_snippet_round_trips_an_fsdp2_model_on_two_ranks():
    code = snippet()
    results = run_distributed(_rank, world_size=2, args=(code,))
    assert results == [(True, True, results[0][2])] * 2
    assert results[0][2] <= 14  # "in ten lines" of store code, plus imports


def _ddp_rank(rank, world_size, code):
    import torch
    import torch.distributed as dist

    from refimpl.store import OffloadStore
    from refimpl.torch_runtime import TorchRuntime

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    scope = dict(torch=torch, OffloadStore=OffloadStore, TorchRuntime=TorchRuntime, model=model)
    exec(compile(code, "docs/guide.md", "exec"), scope)  # attaches, offloads and reloads once
    ddp, optim, client = scope["ddp"], scope["optim"], scope["client"]
    g = torch.Generator().manual_seed(rank)
    ddp(torch.randn(4, 64, generator=g)).square().mean().backward()
    optim.step()
    before = [(p.detach().clone(), p.grad.clone()) for p in model.parameters()]
    client.offload()  # the gradients are defined: DDP's buckets are released in place too
    buckets = client.buckets_offloaded
    client.reload()
    bitwise = all(torch.equal(w, p) and torch.equal(g, p.grad) for (w, g), p in zip(before, model.parameters()))
    ddp(torch.randn(4, 64, generator=g)).square().mean().backward()
    optim.step()  # training goes on: the reducer still all-reduces (the ranks' parameters agree)
    flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(every, flat)
    return buckets, bitwise, all(torch.equal(every[0], x) for x in every)


def test_guide_ddp_snippet_runs_on_two_ranks():
    results = run_distributed(_ddp_rank, world_size=2, args=(snippet("guide-snippet-ddp"),))
    for buckets, bitwise, agree in results:
        assert buckets >= 1 and bitwise and agree, (buckets, bitwise, agree)


def _megatron_rank(rank, world_size, code):
    import torch

    from refimpl.store import OffloadStore
    from refimpl.torch_runtime import TorchRuntime
    from tests._megatron import cpu_shim, init_parallel, parts, state_bytes, step

    with cpu_shim():
        ps = init_parallel()
        config, ddp_config, opt_config, model = parts(dist_opt=True)
        synced = []
        scope = dict(torch=torch, OffloadStore=OffloadStore, TorchRuntime=TorchRuntime, config=config,
                     ddp_config=ddp_config, opt_config=opt_config, model=model, sync_fn=lambda: synced.append(1))
        exec(compile(code, "docs/guide.md", "exec"), scope)
        model, optim, lc = scope["model"], scope["optim"], scope["lc"]
        g = torch.Generator().manual_seed(0)
        step(model, optim, g)
        before = state_bytes(model, optim)
        # a second cycle, with Adam's state and the grads: destroyed again (Gloo cannot suspend)
        lc.pause(release_memory=scope["client"].offload, policy=scope["PGPolicy"].DESTROY_DEFERRED)
        lc.weight_sync(scope["sync_fn"])
        lc.resume()
        scope["client"].reload()
        same = state_bytes(model, optim) == before
        loss = step(model, optim, g)
        ps.destroy_model_parallel()
    return same, bool(torch.isfinite(loss)), len(synced), len(scope["names"]), lc.state.name


@needs_megatron
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_guide_megatron_snippets_run():
    (same, finite, synced, groups, state), = run_distributed(_megatron_rank, world_size=1, timeout=300,
                                                             args=(snippet("guide-snippet-megatron"),))
    assert same and finite and synced == 2 and groups >= 10 and state == "ACTIVE"
