"""The offload paths (refimpl/store/moves/offload_paths.py): which path each offload takes, and the
collectors' two views of the state (items and bare tensor objects) agreeing, which the steady path
relies on. Every case also checks the bytes that come back."""
import itertools

import pytest
import torch

from refimpl.torch_runtime import TorchRuntime
from refimpl.store import Category, OffloadStore, StoreConfig, UnsupportedTensorError
from refimpl.store.state.collect import Item, ModuleCollector, OptimizerCollector, TensorsCollector

ALL = (Category.PARAMS, Category.GRADS, Category.OPTIMIZER, Category.BUFFERS)


def _subsets():
    for n in range(len(ALL) + 1):
        for combo in itertools.combinations(ALL, n):
            yield frozenset(combo)


def _trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 3, bias=False))
    model[2].weight = torch.nn.Parameter(model[0].weight[:3, :3].detach().clone())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    model[0].bias.grad = None  # one parameter without a gradient
    return model, opt


def test_tensor_objects_are_exactly_the_items_tensors_for_every_collector_and_category_subset():
    model, opt = _trained()
    extra = {"flat": torch.zeros(8), "view": torch.zeros(8)[2:5], "again": None}
    extra["again"] = extra["flat"]  # the same object under two names
    collectors = [ModuleCollector(model, "m"), OptimizerCollector(opt, "o"),
                  TensorsCollector(Category.OPTIMIZER, extra, "x", kind="master_weights")]
    seen_any = 0
    for c in collectors:
        for cats in _subsets():
            items = list(c.items(cats))
            assert all(isinstance(it, Item) and it.category in cats for it in items)
            got = list(c.tensor_objects(cats))
            assert len(got) == len(items) and all(a is b.tensor for a, b in zip(got, items)), (c.name, cats)
            seen_any += len(items)
    assert seen_any > 0


def test_items_have_named_fields_and_the_tensors_collector_refuses_a_non_tensor_in_both_views():
    t = torch.ones(3)
    (it,) = TensorsCollector(Category.PARAMS, {"w": t}, "p", kind="ddp_buffer").items(frozenset(ALL))
    assert (it.category, it.kind, it.name, it.tensor, it.source) == (Category.PARAMS, "ddp_buffer", "p.w", t, "p")
    assert it.flags != 0  # an explicit kind
    bad = TensorsCollector(Category.PARAMS, {"w": t, "n": 3}, "p")
    with pytest.raises(UnsupportedTensorError, match="p.n: expected a tensor, got int"):
        list(bad.items(frozenset(ALL)))
    with pytest.raises(UnsupportedTensorError, match="p.n: expected a tensor, got int"):
        list(bad.tensor_objects(frozenset(ALL)))


def _cycle(store, **kw):
    store.offload(**kw)
    path = store.stats().last_offload_path
    store.reload()
    return path


def test_each_offload_takes_the_path_its_state_calls_for_and_the_bytes_come_back():
    tensors = {f"w{i}": torch.randn(64 + i) for i in range(20)}
    grads = {f"g{i}": torch.randn(16) for i in range(3)}
    want = {k: v.clone() for k, v in {**tensors, **grads}.items()}
    store = OffloadStore(TorchRuntime("cpu"), config=StoreConfig(pin_ahead="off"))
    store.attach_tensors(Category.PARAMS, tensors, name="p")
    store.attach_tensors(Category.GRADS, grads, name="g")
    assert store.stats().last_offload_path == ""
    assert _cycle(store) == "streamed"  # first offload of scattered state
    assert _cycle(store) == "steady"  # nothing moved since the reload
    assert _cycle(store) == "steady"
    tensors["w3"] = torch.full((5,), 7.0)  # a new object under an old name
    want["w3"] = tensors["w3"].clone()
    assert _cycle(store) == "full"
    assert _cycle(store) == "steady"
    assert _cycle(store, drop_grads=True) == "full"  # the steady path never drops
    for k in grads:
        want[k] = torch.zeros(16)
    assert store.stats().steady_fast_offloads == 3
    got = {**tensors, **grads}
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_backend_that_does_not_stream_plans_its_first_offload_in_full():
    tensors = {f"w{i}": torch.randn(32) for i in range(4)}
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(TorchRuntime("cpu"), backend="local_dedup", config=StoreConfig(pin_ahead="off"))
    store.attach_tensors(Category.PARAMS, tensors, name="p")
    assert _cycle(store) == "full"
    assert all(torch.equal(tensors[k], want[k]) for k in want)


def test_the_overhead_benchmark_times_and_counts_each_path_and_the_steady_one_is_cheapest():
    from bench.store_overhead import count_calls, measure

    rep = measure("dense", numel=8, cycles=1)
    assert rep["tensors"] == 1164 and rep["steady_fast_offloads"] == 1
    assert set(rep["phases_ms"]) == {"cold", "steady", "changed"}
    assert all("offload.collect" in p and "reload.repoint" in p for p in rep["phases_ms"].values())
    calls = count_calls("dense", numel=8)
    assert calls["steady"]["offload"] < calls["changed"]["offload"] < calls["cold"]["offload"]
