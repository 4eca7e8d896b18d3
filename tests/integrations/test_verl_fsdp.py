"""verl's real FSDP offload functions against the drop-ins, on the same FSDP2 model (2 Gloo ranks, CPU).

Each rank trains a small model sharded with ``fully_shard`` for a few AdamW steps, with an offload/load
cycle of the model and the optimizer between steps, as verl's engine does around each phase: once
through verl's own functions (``verl.utils.fsdp_utils``, unmodified; verl's device is the CPU through its
platform plugin API, refimpl/integrations/verl_platform.py), once through ``refimpl.integrations.verl``, once
with no offload. The cycles include verl's edge cases: an optimizer without state (before the first
step), offload twice and load twice. Losses and final parameters and optimizer state are compared
bitwise, and the stores' statistics say what moved.
"""
from __future__ import annotations

import pytest
import torch

from tests._dist import run_distributed
from tests.integrations._verl import needs_verl

STEPS = 3


def _model_and_optimizer():
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 48), torch.nn.GELU(),
                                torch.nn.Linear(48, 32))
    for layer in (model[0], model[1], model[3]):
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def train_step(model, opt, gen):
    """One AdamW step on a batch from ``gen``; the loss as the int32 of its bits."""
    x = torch.randint(0, 32, (4, 6), generator=gen)
    loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach().view(torch.int32).item()


def _state(model, opt):
    """Local shards of every parameter and optimizer state tensor, as int views of their bits."""
    def bits(t):
        t = getattr(t, "_local_tensor", t).detach().contiguous().reshape(-1)
        return t.view({8: torch.int64, 4: torch.int32}[t.element_size()]).tolist()
    out = {f"param.{n}": bits(p) for n, p in model.named_parameters()}
    for i, st in enumerate(opt.state.values()):
        for k, v in st.items():
            out[f"opt.{i}.{k}"] = bits(v)
    return out


def _train(rank, world, family):
    """Train STEPS steps with a cycle of ``family``'s functions before the first step and after each."""
    from refimpl.integrations.verl_platform import use_cpu_platform

    use_cpu_platform()
    if family == "verl":
        from verl.utils import fsdp_utils as f
    else:
        import refimpl.integrations.verl as f
    model, opt = _model_and_optimizer()
    gen = torch.Generator().manual_seed(rank)
    losses, stats = [], {}

    def cycle(step):
        if family == "none":
            return
        f.offload_fsdp_model_to_cpu(model)
        f.offload_fsdp_optimizer(opt)
        if step == 1:  # twice: the same as once
            f.offload_fsdp_model_to_cpu(model, empty_cache=False)
            f.offload_fsdp_optimizer(opt)
        if family == "store":
            from refimpl.integrations.stores import store_of
            from refimpl.store import is_parked

            stats[f"parked.{step}"] = all(is_parked(p._local_tensor) for p in model.parameters())
            stats[f"opt_store.{step}"] = store_of(opt) is not None
        f.load_fsdp_model_to_gpu(model)
        f.load_fsdp_optimizer(opt, "cpu")
        if step == 1:
            f.load_fsdp2_model_to_gpu(model)
            f.load_fsdp_optimizer(opt, "cpu")

    cycle(0)  # before the first step: the optimizer has no state yet
    for step in range(1, STEPS + 1):
        losses.append(train_step(model, opt, gen))
        cycle(step)
    if family == "store":
        from refimpl.integrations.stores import store_of

        for key, obj in (("model", model), ("optim", opt)):
            s = store_of(obj).stats()
            stats[key] = dict(offloads=s.offloads, reloads=s.reloads, state_bytes=s.state_bytes,
                              host_bytes=s.host_pinned_bytes + s.host_pageable_bytes, copies=sum(s.copies.values()),
                              by_category=dict(s.bytes_by_category))
        stats["param_bytes"] = sum(p._local_tensor.nbytes for p in model.parameters())
        stats["opt_bytes"] = sum(getattr(v, "_local_tensor", v).nbytes for st in opt.state.values() for v in st.values())
        stats["tensors"] = (len(list(model.parameters())), sum(len(st) for st in opt.state.values()))
    return losses, _state(model, opt), stats


def _three_ways(rank, world):
    return {family: _train(rank, world, family) for family in ("none", "verl", "store")}


@needs_verl
def test_drop_ins_train_bitwise_like_verls_functions():
    for rank, runs in enumerate(run_distributed(_three_ways, 2, timeout=300)):
        (l_none, s_none, _), (l_verl, s_verl, _), (l_store, s_store, stats) = runs["none"], runs["verl"], runs["store"]
        assert l_verl == l_none, f"rank {rank}: verl's functions changed the losses"
        assert l_store == l_verl, f"rank {rank}: losses differ from verl's functions"
        assert s_store.keys() == s_verl.keys() and len(s_verl) > 8
        diffs = [k for k in s_verl if s_verl[k] != s_store[k]]
        assert diffs == [], f"rank {rank}: {diffs} differ from verl's functions"
        # while offloaded every parameter's bytes were in the store (parked), the optimizer in its own store
        assert all(stats[f"parked.{i}"] for i in range(STEPS + 1)), stats
        assert not stats["opt_store.0"] and stats["opt_store.1"], "no optimizer store before the first step"
        model, optim = stats["model"], stats["optim"]
        # offload twice = once: STEPS + 1 cycles; the optimizer's store starts at the first step
        assert (model["offloads"], model["reloads"]) == (STEPS + 1, STEPS + 1), model
        assert (optim["offloads"], optim["reloads"]) == (STEPS, STEPS), optim
        # the host copy is the state, byte for byte: the parameters' local shards, AdamW's exp_avg, exp_avg_sq
        # and step (on a CPU store the step counters move too), each entry aligned to 512 bytes; one flat copy
        # per offload once the state lives in the store's flat buffer
        n_params, n_opt = stats["tensors"]
        assert model["by_category"] == {"params": stats["param_bytes"]}, (model, stats["param_bytes"])
        assert optim["by_category"] == {"optimizer": stats["opt_bytes"]}, (optim, stats["opt_bytes"])
        assert model["state_bytes"] <= model["host_bytes"] < model["state_bytes"] + 512 * n_params, model
        assert optim["state_bytes"] <= optim["host_bytes"] < optim["state_bytes"] + 512 * n_opt, optim
        assert model["copies"] == 1 and optim["copies"] == 1, (model, optim)
