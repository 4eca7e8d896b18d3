"""The steady-state fast check: used when nothing changed since the reload, never when something did.

See [Note: steady offload check] in refimpl/store/state/residency.py. Every case compares values after a
full cycle with what the caller expects, so a fast check that missed a change fails here.
"""
import torch

from refimpl.torch_runtime.runtime import TorchRuntime
from refimpl.store import Category, OffloadStore


def _store(tensors, category=Category.PARAMS):
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(category, tensors)
    store.consolidate()
    return store


def _cycle(store):
    store.offload()
    store.reload()


def test_unchanged_state_takes_the_fast_check_and_in_place_updates_survive():
    torch.manual_seed(0)
    tensors = {f"t{i}": torch.randn(33 + i) for i in range(200)}
    store = _store(tensors)
    fast0 = store.stats().steady_fast_offloads
    for step in range(3):
        for t in tensors.values():
            t.add_(1.0)  # training changes values in place: structure unchanged
        want = {k: v.clone() for k, v in tensors.items()}
        _cycle(store)
        assert all(torch.equal(tensors[k], want[k]) for k in want)
    assert store.stats().steady_fast_offloads - fast0 == 3


def test_a_replaced_tensor_in_the_mapping_is_noticed():
    tensors = {f"t{i}": torch.full((8,), float(i)) for i in range(10)}
    store = _store(tensors)
    fast0 = store.stats().steady_fast_offloads
    tensors["t3"] = torch.full((5,), 42.0)  # a new object under an old name
    _cycle(store)
    assert store.stats().steady_fast_offloads == fast0
    assert torch.equal(tensors["t3"], torch.full((5,), 42.0))
    assert tensors["t3"].untyped_storage().data_ptr() == tensors["t0"].untyped_storage().data_ptr()


def test_a_parameter_whose_data_was_swapped_is_noticed():
    model = torch.nn.Linear(4, 3)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(model)
    store.consolidate()
    new_w = torch.arange(12, dtype=torch.float32).view(3, 4)
    model.weight.data = new_w.clone()  # same Parameter object, different storage
    fast0 = store.stats().steady_fast_offloads
    _cycle(store)
    assert store.stats().steady_fast_offloads == fast0
    assert torch.equal(model.weight, new_w)


def test_a_zero_size_tensor_that_grew_in_place_is_noticed():
    grow = torch.empty(0)
    tensors = {"a": torch.ones(16), "grow": grow}
    store = _store(tensors)
    _cycle(store)
    grow.resize_(6).fill_(7.0)  # the same object, now with elements
    fast0 = store.stats().steady_fast_offloads
    _cycle(store)
    assert store.stats().steady_fast_offloads == fast0
    assert torch.equal(tensors["grow"], torch.full((6,), 7.0)) and torch.equal(tensors["a"], torch.ones(16))


def test_a_new_tensor_and_a_restrided_view_are_noticed():
    base = torch.arange(24, dtype=torch.float32)
    tensors = {"base": base, "view": base[:12].view(3, 4)}
    store = _store(tensors)
    tensors["view"].as_strided_((4, 3), (3, 1))  # same object, other geometry
    tensors["extra"] = torch.full((3,), 5.0)
    fast0 = store.stats().steady_fast_offloads
    _cycle(store)
    assert store.stats().steady_fast_offloads == fast0
    assert torch.equal(tensors["view"], torch.arange(12, dtype=torch.float32).view(4, 3))
    assert torch.equal(tensors["extra"], torch.full((3,), 5.0))
    assert torch.equal(tensors["base"], torch.arange(24, dtype=torch.float32))
