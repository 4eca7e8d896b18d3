"""Each store parks its tensors on placeholders of its own, read-only: nothing one store parks can be
changed through another store's tensors, even by a write that gets past the guard.

Before, every store of the process parked on one shared placeholder per (device, dtype), writable:
one store's ``x.fill_(5)`` made every other store's offloaded tensors read 5.
"""
import gc

import pytest
import torch

from refimpl.store import Category, OffloadedTensorError, OffloadStore, is_parked
from refimpl.store.state.parking import is_placeholder
from refimpl.torch_runtime import TorchRuntime

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def _store(device, name, tensors):
    store = OffloadStore(TorchRuntime(device))
    store.attach_tensors(Category.PARAMS, tensors, name=name)
    return store


@pytest.mark.parametrize("device", DEVICES)
def test_a_write_through_one_stores_tensor_changes_nothing_another_store_parked(device):
    a = {"x": torch.full((1,), 1.0, device=device), "i": torch.full((1,), 3, device=device)}
    b = {"y": torch.full((1,), 2.0, device=device), "j": torch.full((1,), 4, device=device),
         "w": torch.arange(4.0, device=device)}
    want = {k: v.clone() for k, v in {**a, **b}.items()}
    sa, sb = _store(device, "a", a), _store(device, "b", b)
    sa.offload()
    sb.offload()
    assert a["x"].untyped_storage()._cdata != b["y"].untyped_storage()._cdata, "one placeholder per store"
    for t in a.values():  # one element each: no zero-stride overlap check stops a write
        with pytest.raises(OffloadedTensorError, match=r"a\.[xi] is offloaded"):
            t.fill_(5)
        with torch._C.DisableTorchFunctionSubclass(), pytest.raises(RuntimeError, match="data pointer"):
            t.fill_(5)  # past the guard (as C++ callers are): the placeholder itself is read-only
    with torch._C.DisableTorchFunctionSubclass():  # what a read past the guard sees: the placeholder's value
        assert torch.isnan(b["y"]).all() and torch.isnan(b["w"]).all() and int(b["j"]) == 0
        assert torch.isnan(a["x"]).all() and int(a["i"]) == 0
    sb.reload()
    sa.reload()
    assert all(torch.equal(t, want[k]) for k, t in {**a, **b}.items()), "every byte back in both stores"


def test_the_autograd_engine_cannot_accumulate_into_an_offloaded_gradient():
    p = torch.nn.Parameter(torch.ones(1))
    (p * 2).sum().backward()
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.GRADS, {"g": p.grad}, name="grads")
    store.offload()
    with pytest.raises(RuntimeError, match="data pointer"):  # a C++ caller: no __torch_function__ on the way
        (p * 3).sum().backward()
    store.reload()
    assert torch.equal(p.grad, torch.full((1,), 2.0)), "the accumulation raised before writing anything"


def test_a_stores_placeholders_go_with_it_unless_a_tensor_still_points_at_one():
    t, u = torch.ones(3), torch.ones(3)
    s = _store("cpu", "t", {"t": t})
    s.offload()
    s.reload()
    ids = s.parking.storage_ids()
    assert ids and all(is_placeholder(i) for i in ids)
    del s
    gc.collect()
    assert not any(is_placeholder(i) for i in ids), "nothing points at them: gone with the store"
    s = _store("cpu", "u", {"u": u})
    s.offload()
    ids = s.parking.storage_ids()
    del s  # dropped while offloaded: u's bytes are lost, u stays parked (and guarded)
    gc.collect()
    assert all(is_placeholder(i) for i in ids) and is_parked(u)
    with pytest.raises(OffloadedTensorError, match=r"u\.u is offloaded"):
        u.sum()
