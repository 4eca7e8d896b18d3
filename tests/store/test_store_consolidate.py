"""store.consolidate(): separately allocated tensors end up as views of one flat buffer per layout, bit-exact."""
import torch

from refimpl.torch_runtime.runtime import TorchRuntime
from refimpl.store import Category, OffloadStore


def test_consolidate_moves_scattered_tensors_into_flat_buffers_bit_exact():
    torch.manual_seed(0)
    tensors = {f"e{i}": torch.randn(17 + i) for i in range(300)}  # separately allocated, as MoE experts are
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors.values()}) == 300
    store.consolidate()
    assert not store.is_offloaded(Category.PARAMS)
    assert len({t.untyped_storage().data_ptr() for t in tensors.values()}) == 1, "one flat buffer"
    assert all(torch.equal(tensors[k], want[k]) for k in want)
    # a later cycle copies the flat buffer as it is: one copy per host segment, still bit-exact
    store.offload()
    store.reload()
    assert all(torch.equal(tensors[k], want[k]) for k in want)
    assert store.stats().copies.get("flat", 0) >= 1
