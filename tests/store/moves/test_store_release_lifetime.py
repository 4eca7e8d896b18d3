"""Nothing the offload allocated or viewed on the device outlives the ``empty_cache`` at its end.

On CUDA the caching allocator gives a segment back to the driver only when every block in it is
free, and ``empty_cache`` runs once, at the end of the offload: a device buffer the offload made
(staging, gap zeros) or an original storage still holding bytes at that moment keeps its memory
from the driver until the next offload. This checks it on the CPU, where each of those would still
be a live tensor with bytes when ``TorchRuntime.empty_cache`` is called. (What it cannot see: a
segment that the state shares with someone else's live block; tests/store/test_store_cuda.py
accounts for those.)
"""
import gc
import warnings
import weakref

import torch

from refimpl.store import Category, OffloadStore, StoreConfig
from refimpl.store.state.parking import is_placeholder
from refimpl.torch_runtime import TorchRuntime


def _live_tensors_on(ptrs: set[int]) -> list[str]:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated torch objects warns
        # type() first: a dead weakref.proxy (torch.compile leaves them) raises ReferenceError on isinstance()
        tensors = [o for o in gc.get_objects()
                   if type(o) not in (weakref.ProxyType, weakref.CallableProxyType) and isinstance(o, torch.Tensor)]
    for t in tensors:
        try:
            st = t.untyped_storage()
        except Exception:  # noqa: BLE001 - wrappers without a storage
            continue
        if is_placeholder(st._cdata):  # read-only: data_ptr() raises (it holds none of the state's bytes)
            continue
        if st.nbytes() and st.data_ptr() in ptrs:
            out.append(f"{tuple(t.shape)} {t.dtype} ({st.nbytes()} bytes)")
    return out


def test_no_device_buffer_of_the_offload_holds_bytes_when_empty_cache_runs(monkeypatch):
    rt = TorchRuntime("cpu")
    torch.manual_seed(0)
    tensors = {f"w{i}": torch.randn(1 << 16) for i in range(4)}  # copied directly
    tensors.update({f"s{i}": torch.randn(100 + i) for i in range(60)})  # packed through the staging ring
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(rt, config=StoreConfig(segment_bytes=1 << 19, pack_below_bytes=1 << 12,
                                                staging_bytes=1 << 13, staging_buffers=2, pin_ahead="off"))
    store.attach_tensors(Category.OPTIMIZER, tensors)

    made: set[int] = set()  # data pointers of the device buffers allocated inside an offload
    in_offload = [False]
    alloc = TorchRuntime.alloc_device

    def recording_alloc(self, numel, dtype, *, tag=""):
        t = alloc(self, numel, dtype, tag=tag)
        if in_offload[0] and t.numel():
            made.add(t.untyped_storage().data_ptr())
        return t

    seen = []

    def probing_empty_cache(self):
        seen.append((_live_tensors_on(made), [n for n, s in state.items() if s.nbytes()]))

    monkeypatch.setattr(TorchRuntime, "alloc_device", recording_alloc)
    monkeypatch.setattr(TorchRuntime, "empty_cache", probing_empty_cache)
    for cycle in range(3):  # scattered (streamed), then resident in one flat buffer (steady)
        state = {k: v.untyped_storage() for k, v in tensors.items()}
        in_offload[0] = True
        store.offload()
        in_offload[0] = False
        del state
        store.reload()
    assert len(seen) == 3
    assert made, "the first offload packs through staging buffers"
    for cycle, (alive, holding) in enumerate(seen):
        assert not alive, f"cycle {cycle}: device buffers the offload made still hold bytes at empty_cache: {alive}"
        assert not holding, f"cycle {cycle}: state storages still hold bytes at empty_cache: {holding[:5]}"
    assert all(torch.equal(tensors[k], want[k]) for k in want)


def test_after_a_reload_the_store_lets_go_of_tensors_the_framework_drops():
    """After a reload the store holds registered tensors only weakly: gradients set to None (``zero_grad``) are freed,
    and the next cycle goes on without them."""
    import weakref

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    model(torch.randn(2, 64)).sum().backward()
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(model)
    store.offload()
    store.reload()
    grads = [weakref.ref(p.grad) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    gc.collect()
    assert [g() for g in grads] == [None, None], "the store kept the dropped gradients alive"
    want = [p.detach().clone() for p in model.parameters()]
    store.offload()
    store.reload()
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), want))
