"""Bad input gets a clear error and loses nothing (validation happens before anything moves)."""
import pytest
import torch

from refimpl.torch_runtime import TorchRuntime
from refimpl.store import (
    Category,
    MixedDtypeError,
    OffloadedTensorError,
    OffloadStore,
    SharedStorageError,
    StoreConfig,
    StoreStateError,
    TensorChangedError,
    UnknownBackendError,
    UnsupportedTensorError,
    WrongDeviceError,
)
from refimpl.store.state.parking import is_parked


def _store(**tensors):
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, tensors, name="t")
    return store


def _untouched(tensors, want):
    return all(not is_parked(t) and torch.equal(t, w) for t, w in zip(tensors, want))


def test_two_dtypes_viewing_one_storage_are_refused_never_cast():
    base = torch.arange(8, dtype=torch.float32)
    ok = torch.ones(4)
    store = _store(ok=ok, f=base, i=base.view(torch.int32))
    with pytest.raises(MixedDtypeError, match=r"t\.i .*int32.*never casts"):
        store.offload()
    assert _untouched([ok, base], [torch.ones(4), torch.arange(8.0)])
    assert not store.is_offloaded(Category.PARAMS)


def test_non_contiguous_views_are_fine_at_storage_level():
    w = torch.arange(24.0).reshape(4, 6)
    cols = w[:, 1::2]  # non-contiguous view
    store = _store(w=w, wt=w.t(), cols=cols)
    store.offload()
    store.reload()
    assert cols.stride() == (6, 2) and torch.equal(cols, torch.arange(24.0).reshape(4, 6)[:, 1::2])
    cols.fill_(-1)  # still a view of w after the reload
    assert (w[:, 1::2] == -1).all() and w.t().untyped_storage()._cdata == w.untyped_storage()._cdata


def test_sparse_tensors_are_refused_naming_the_tensor():
    ok = torch.ones(3)
    store = _store(ok=ok, s=torch.eye(3).to_sparse())
    with pytest.raises(UnsupportedTensorError, match=r"t\.s.*sparse"):
        store.offload()
    assert _untouched([ok], [torch.ones(3)])


def test_zero_size_tensors_are_skipped_and_stay_valid():
    empty = torch.empty(0)
    full = torch.ones(5)
    also_empty = full[2:2]
    store = _store(empty=empty, full=full, view0=also_empty)
    store.offload()
    assert store.stats().skipped_zero_size == 1, "torch.empty(0) is skipped; the 0-size view rides along"
    store.reload()
    assert empty.shape == (0,) and (empty + 1).numel() == 0
    assert also_empty.numel() == 0 and torch.equal(full, torch.ones(5))
    assert also_empty.untyped_storage()._cdata == full.untyped_storage()._cdata


def test_tensor_on_another_device_is_refused():
    ok = torch.ones(3)
    store = _store(ok=ok, m=torch.empty(4, device="meta"))
    with pytest.raises(WrongDeviceError, match=r"t\.m is on meta.*cpu"):
        store.offload()
    assert _untouched([ok], [torch.ones(3)])


def test_bad_state_with_pin_ahead_is_reported_by_the_offload_not_the_attach(caplog):
    ok = torch.ones(3)
    store = OffloadStore(TorchRuntime("cpu"), config=StoreConfig(pin_ahead="background"))
    store.attach_tensors(Category.PARAMS, {"ok": ok, "m": torch.empty(4, device="meta")}, name="t")
    assert "pinning ahead at attach of 't' skipped" in caplog.text
    with pytest.raises(WrongDeviceError, match=r"t\.m is on meta.*cpu"):
        store.offload()
    assert _untouched([ok], [torch.ones(3)])


def test_tensor_resized_while_offloaded_is_refused_and_the_copy_kept():
    a = torch.arange(16.0).reshape(4, 4)
    b = torch.full((3,), 7.0)
    store = _store(a=a, b=b)
    store.offload()
    with pytest.raises(OffloadedTensorError, match=r"t\.a is offloaded.*resize_\(\)"):
        a.resize_(8)
    with pytest.raises(RuntimeError, match="not resizable"), torch._C.DisableTorchFunctionSubclass():
        a.resize_(8)  # past the guard, the parked tensor's placeholder storage cannot grow under the store's feet
    a.set_(torch.zeros(8))  # re-pointed elsewhere instead
    with pytest.raises(TensorChangedError, match=r"t\.a.*recover\(\)"):
        store.reload()
    assert store.is_offloaded(Category.PARAMS)
    assert is_parked(b), "the other tensor was not touched either"
    assert torch.equal(store.host_tensors()["t.a"], torch.arange(16.0).reshape(4, 4)), "nothing lost"
    assert store.recover() == ["t.a now has other storage (32 bytes; was it re-assigned?)"]
    assert torch.equal(a, torch.arange(16.0).reshape(4, 4)) and torch.equal(b, torch.full((3,), 7.0))
    assert not store.is_offloaded(Category.PARAMS)


def test_tensor_reassigned_while_offloaded_is_refused():
    p = torch.nn.Parameter(torch.ones(4))
    store = _store(p=p)
    store.offload()
    p.data = torch.zeros(4)
    with pytest.raises(TensorChangedError, match="other storage"):
        store.reload()
    assert store.is_offloaded("params")


def test_one_storage_under_two_categories_is_refused():
    w = torch.ones(4)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, {"w": w}, name="a")
    store.attach_tensors(Category.BUFFERS, {"w_view": w[1:]}, name="b")
    with pytest.raises(SharedStorageError, match="one category"):
        store.offload()
    assert _untouched([w], [torch.ones(4)])


def test_attach_while_offloaded_and_unknown_backend_are_refused():
    store = _store(x=torch.ones(2))
    store.offload()
    with pytest.raises(StoreStateError, match="reload"):
        store.attach_tensors("params", {"y": torch.ones(2)}, name="late")
    with pytest.raises(ValueError, match="already attached"):
        store.reload() or store.attach_tensors("params", {}, name="t")
    with pytest.raises(UnknownBackendError, match="nvme"):
        OffloadStore(TorchRuntime("cpu"), backend="nvme")


def test_every_refusal_is_a_store_error_one_except_clause_catches():
    """A worker wraps its switch in ``except StoreError``: each refusal the store raises is one, state kept."""
    from refimpl.store import StoreError

    w = torch.ones(8)
    store = _store(w=w)
    store.offload()
    w.set_(torch.zeros(4))  # the framework re-pointed a parked tensor
    with pytest.raises(StoreError) as info:
        store.reload()
    assert isinstance(info.value, TensorChangedError) and store.is_offloaded("params")
    shared = torch.zeros(6)
    other = OffloadStore(TorchRuntime("cpu"))
    other.attach_tensors(Category.PARAMS, {"a": shared[:3]}, name="p")
    other.attach_tensors(Category.OPTIMIZER, {"b": shared[3:]}, name="o")
    with pytest.raises(StoreError) as info:
        other.offload()
    assert isinstance(info.value, SharedStorageError) and not is_parked(shared)
    with pytest.raises(StoreError):
        OffloadStore(TorchRuntime("cpu"), backend="nvme")


def test_a_backend_is_found_by_its_name_and_a_registered_factory_builds_it():
    import subprocess
    import sys

    from refimpl.store import LocalBackend, register_backend
    from refimpl.store.registry import registered_backends

    class Counting(LocalBackend):
        reloads = 0

        async def reload(self, layout, device_flat):
            Counting.reloads += 1
            return await super().reload(layout, device_flat)

    register_backend("counting", Counting)
    x = torch.arange(6.0)
    store = OffloadStore(TorchRuntime("cpu"), backend="counting")
    store.attach_tensors(Category.PARAMS, {"x": x})
    store.offload()
    store.reload()
    assert Counting.reloads == 1 and torch.equal(x, torch.arange(6.0)) and "counting" in registered_backends()
    register_backend("not_a_backend", lambda *args, **kw: object())
    with pytest.raises(UnknownBackendError, match="not a StoreBackend"):
        OffloadStore(TorchRuntime("cpu"), backend="not_a_backend")
    # local_dedup lives in a module of its own, imported when a store first names it
    code = ("import sys\nfrom refimpl.store import OffloadStore\nfrom refimpl.store.registry import registered_backends\n"
            "from refimpl.torch_runtime import TorchRuntime\n"
            "assert 'refimpl.store.backends.dedup' not in sys.modules and 'local_dedup' not in registered_backends()\n"
            "store = OffloadStore(TorchRuntime('cpu'), backend='local_dedup')\n"
            "assert type(store.backend).__name__ == 'DedupBackend', type(store.backend)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
