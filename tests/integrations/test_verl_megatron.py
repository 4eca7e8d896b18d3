"""verl's real Megatron offload functions against the drop-ins, on Megatron-core on 2 Gloo ranks (CPU).

Megatron-core runs on the CPU through the tests' device shim (tests/_megatron.py); verl's functions
run unmodified except that ``pin_memory=True`` is dropped from their host allocations (pinned memory
needs an accelerator; a CPU-only torch refuses it). Each rank trains a tiny GPTModel with the
distributed optimizer for a few steps with verl's engine's cycle between steps (model, then optimizer;
load with gradients) through verl's functions, through the drop-ins, and without offload: losses and
the final state must be bitwise equal. The drop-ins' pairing of model and optimizer is checked too.
"""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests._dist import run_distributed
from tests._megatron import needs_megatron
from tests.integrations._verl import needs_verl

STEPS = 3


class _NoPinning(TorchFunctionMode):
    """``pin_memory=True`` dropped from factory calls (a CPU-only torch has no pinned memory)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        kwargs.pop("pin_memory", None)
        return func(*args, **kwargs)


def _train(rank, family):
    from tests._megatron import build, state_bytes, step

    model, opt = build(dist_opt=True)
    if family == "verl":
        from verl.utils import megatron_utils as f
    else:
        import refimpl.integrations.verl as f
        f.register_megatron([model], opt)  # what patch() does after verl's MegatronEngine.initialize
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(STEPS):
        losses.append(step(model, opt, gen).view(torch.int32).item())
        if family != "none":
            f.offload_megatron_model_to_cpu([model])
            f.offload_megatron_optimizer(opt)
            f.load_megatron_model_to_gpu([model], load_grad=True)
            f.load_megatron_optimizer(opt)
    stats = None
    if family == "store":
        s = f.store_of(model).stats()
        stats = dict(offloads=s.offloads, reloads=s.reloads, by_category=dict(s.bytes_by_category))
    return losses, state_bytes(model, opt), stats


def _pairing(rank):
    from tests._megatron import build

    import refimpl.integrations.verl as f
    from refimpl.integrations.errors import MegatronPairingError

    model, opt = build(dist_opt=True, seed=7)
    with pytest.raises(MegatronPairingError) as e:
        f.offload_megatron_model_to_cpu([model])  # the distributed optimizer views the buffers, unknown yet
    refused = "register_megatron" in str(e.value) and not f.store_of(model).is_offloaded("params")
    f.offload_megatron_optimizer(opt)  # finds its model through model_chunks and remakes the store with both
    f.offload_megatron_model_to_cpu([model])
    store = f.store_of(model)
    both = store.is_offloaded("optimizer") and store.is_offloaded("params") and store.is_offloaded("grads")
    f.load_megatron_model_to_gpu([model], load_grad=False)
    grads_left = store.is_offloaded("grads") and not store.is_offloaded("params")
    f.load_megatron_model_to_gpu([model])
    f.load_megatron_optimizer(opt)
    return refused, both, grads_left, not any(store.is_offloaded(c) for c in ("params", "grads", "optimizer"))


def _run(rank, world):
    from tests._megatron import cpu_shim, init_parallel
    from refimpl.integrations.verl_platform import use_cpu_platform

    use_cpu_platform()
    with cpu_shim(), _NoPinning():
        ps = init_parallel()
        out = {family: _train(rank, family) for family in ("none", "verl", "store")}
        out["pairing"] = _pairing(rank)
        ps.destroy_model_parallel()
    return out


@needs_megatron
@needs_verl
@pytest.mark.slow
def test_megatron_drop_ins_train_bitwise_like_verls_functions():
    for rank, out in enumerate(run_distributed(_run, 2, timeout=500)):
        (l_none, s_none, _), (l_verl, s_verl, _), (l_store, s_store, stats) = out["none"], out["verl"], out["store"]
        assert l_verl == l_none and l_store == l_verl, f"rank {rank}: losses differ"
        assert s_store.keys() == s_verl.keys() and len(s_verl) > 20
        diffs = [k for k in s_verl if s_verl[k] != s_store[k]]
        assert diffs == [], f"rank {rank}: {diffs[:5]} differ from verl's functions"
        assert (stats["offloads"], stats["reloads"]) == (2 * STEPS, 2 * STEPS), stats  # model, then optimizer
        assert set(stats["by_category"]) >= {"params", "optimizer"}, stats
        assert out["pairing"] == (True, True, True, True), out["pairing"]
