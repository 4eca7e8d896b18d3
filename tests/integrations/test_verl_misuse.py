"""The verl drop-ins' own errors, without verl installed: each names what was wrong and what to do.

FSDP1 modules refused, a device argument that is not the store's device, optimizers before their
first step, forget() while offloaded, and the store behind an object kept with the object.
"""
from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

from tests._dist import run_distributed


def _fsdp1_refused(rank, world):
    from torch.distributed.fsdp import FullyShardedDataParallel

    import refimpl.integrations.verl as tv
    from refimpl.integrations.errors import UnsupportedModelError

    model = FullyShardedDataParallel(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))
    out = []
    for fn in (tv.offload_fsdp_model_to_cpu, tv.load_fsdp_model_to_gpu, tv.offload_fsdp2_model_to_cpu):
        with pytest.raises(UnsupportedModelError) as e:
            fn(model)
        out.append(str(e.value))
    return out


def test_fsdp1_modules_are_refused_with_the_fix():
    (messages,) = run_distributed(_fsdp1_refused, 1, timeout=120)
    assert all("FSDP1" in m and "fully_shard" in m for m in messages), messages


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_load_optimizer_on_another_device_is_refused():
    import refimpl.integrations.verl as tv
    from refimpl.integrations.errors import DeviceMismatchError

    model, opt = _model_and_optimizer()
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    tv.offload_fsdp_optimizer(opt)
    for bad in (0, "cuda", "cuda:1", torch.device("meta")):
        with pytest.raises(DeviceMismatchError, match="the store reloads to cpu"):
            tv.load_fsdp_optimizer(opt, bad)
    assert tv.store_of(opt).is_offloaded("optimizer")  # nothing moved
    tv.load_fsdp_optimizer(opt, "cpu")
    assert not tv.store_of(opt).is_offloaded("optimizer")


def test_optimizer_without_state_is_left_alone_and_plain_modules_cycle_bitwise():
    import refimpl.integrations.verl as tv
    from refimpl.store import OffloadedTensorError

    model, opt = _model_and_optimizer()
    tv.offload_fsdp_optimizer(opt)
    tv.load_fsdp_optimizer(opt, torch.device("cpu"))
    assert tv.store_of(opt) is None, "no state before the first step: no store, as verl does nothing"
    model(torch.randn(2, 8)).sum().backward()  # gradients exist: verl's model.to("cpu") keeps them
    before = {n: (p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters()}
    tv.offload_fsdp_model_to_cpu(model)
    with pytest.raises(OffloadedTensorError, match="reload"):
        model[0].weight.sum()
    tv.load_fsdp_model_to_gpu(model)
    tv.load_fsdp_model_to_gpu(model)  # twice: nothing more
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n][0]) and torch.equal(p.grad, before[n][1]), n
    stats = tv.store_of(model).stats()
    assert stats.reloads == 1 and stats.bytes_by_category == {"params": 4 * (64 + 8 + 16 + 2),
                                                              "grads": 4 * (64 + 8 + 16 + 2)}


def test_forget_refuses_while_offloaded_and_the_store_goes_with_its_object():
    import refimpl.integrations.verl as tv
    from refimpl.integrations import stores
    from refimpl.integrations.errors import IntegrationError

    model, _ = _model_and_optimizer()
    tv.offload_fsdp_model_to_cpu(model)
    with pytest.raises(IntegrationError, match="load them first"):
        stores.forget(model)
    twin = copy.deepcopy(stores.slot_of(model))
    assert twin is None, "a deep copy of the slot is empty (a copied model gets its own store)"
    tv.load_fsdp_model_to_gpu(model)
    store = weakref.ref(tv.store_of(model))
    assert any(s is store() for _, s in stores.stores())
    del model
    gc.collect()
    assert store() is None, "the store was freed with its model"
