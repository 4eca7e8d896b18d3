"""The release stage (stage 7 of an offload) never loses the state.

* A weight-histogram logger (``p.detach().numpy()`` after a reload) marks the store's flat buffer not
  resizable. Before, the next offload failed in its release stage ("Trying to resize storage that is not
  resizable") and left every tensor parked with the store saying nothing was offloaded: no public call got
  the state back. Now the offload works: the buffer is left to its holders and its memory goes when the
  last of them does (at once when the array is gone); an array still alive keeps reading the bytes it had.
* Any failure while the release stage runs (a release that raises, ``empty_cache`` raising, an error at the
  point after the release) is undone: the released storages get their bytes back from the host copies,
  every tensor points where it did, the store says nothing is offloaded, and the next cycle is bitwise.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from refimpl.store import OffloadedTensorError, OffloadStore, is_parked
from refimpl.torch_runtime import TorchRuntime


def _model_and_opt(seed: int = 0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    _step(m, opt, 1)
    return m, opt


def _step(m, opt, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    m(torch.randn(5, 8, generator=g)).square().mean().backward()
    opt.step()


def _state(m, opt) -> list[torch.Tensor]:
    return [*m.parameters(), *(p.grad for p in m.parameters()), *(v for s in opt.state.values() for v in s.values())]


def _snapshot(m, opt) -> list[torch.Tensor]:
    return [t.detach().clone() for t in _state(m, opt)]


def _bitwise(m, opt, want) -> bool:
    got = _state(m, opt)
    return len(got) == len(want) and all(not is_parked(t) and torch.equal(t, w) for t, w in zip(got, want))


def _store(m, opt, rt=None) -> OffloadStore:
    store = OffloadStore(rt or TorchRuntime("cpu"))
    store.attach_module(m)
    store.attach_optimizer(opt)
    return store


# --------------------------------------------------------------------------- a numpy export after a reload


def test_a_histogram_of_the_weights_after_a_reload_does_not_stop_the_next_offload():
    m, opt = _model_and_opt()
    store = _store(m, opt)
    store.offload()
    store.reload()
    flats = {p.untyped_storage()._cdata: StorageWeakRef(p.untyped_storage()) for p in m.parameters()}
    for p in m.parameters():
        np.histogram(p.detach().numpy(), bins=8)  # torch marks the storage not resizable for good
    assert not m[0].weight.untyped_storage().resizable()
    _step(m, opt, 2)
    want = _snapshot(m, opt)
    store.offload()
    assert store.is_offloaded("params") and store.is_offloaded("optimizer")
    assert all(is_parked(t) for t in _state(m, opt))
    assert store.stats().last_offload_path == "steady"
    gc.collect()
    assert all(ref.expired() for ref in flats.values()), "the exported flat buffer's memory is freed"
    with pytest.raises(OffloadedTensorError):
        m[0].weight.sum()
    store.reload()
    assert _bitwise(m, opt, want)
    _step(m, opt, 3)  # training goes on, and the next cycles are bitwise
    want = _snapshot(m, opt)
    for _ in range(2):
        store.offload()
        store.reload()
        assert _bitwise(m, opt, want)


def test_a_numpy_array_alive_across_the_offload_keeps_reading_its_bytes():
    m, opt = _model_and_opt()
    store = _store(m, opt)
    store.offload()
    store.reload()
    w = m[0].weight
    arr = w.detach().numpy()  # kept: a logger holding on to the array
    before = arr.copy()
    ref = StorageWeakRef(w.untyped_storage())
    want = _snapshot(m, opt)
    store.offload()
    assert store.is_offloaded("params") and is_parked(w)
    assert np.array_equal(arr, before), "the array reads the bytes it had: its memory was not freed under it"
    store.reload()
    assert _bitwise(m, opt, want)
    assert not ref.expired(), "the array still holds the old buffer"
    del arr
    gc.collect()
    assert ref.expired(), "the old buffer's memory goes with the array"
    store.offload()
    store.reload()
    assert _bitwise(m, opt, want)


# --------------------------------------------------------------------------- failures in the release stage


class _FailingRelease(TorchRuntime):
    """A real CPU runtime whose ``release`` raises on its ``fail_at``-th call (counted from arming)."""

    fail_at = -1
    calls = 0

    def release(self, tensor):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected: the release failed")
        super().release(tensor)


class _FailingEmptyCache(TorchRuntime):
    """A real CPU runtime whose ``empty_cache`` raises once armed."""

    armed = False

    def empty_cache(self):
        if self.armed:
            self.armed = False
            raise RuntimeError("injected: empty_cache failed")
        super().empty_cache()


def _arm(rt, where):
    if where == "release":  # in the release stage: its first storage released, then the second release fails
        def arm():
            rt.calls, rt.fail_at = 0, 2

        return rt.on_point("store.offload.release", arm)  # the last point before the release stage
    if where == "empty_cache":
        rt.armed = True
    else:  # after every release of the stage
        def fail():
            raise RuntimeError("injected: failed after the release")

        return rt.on_point("store.offload.released", fail)
    return lambda: None


@pytest.mark.parametrize("where,path", [("release", "steady"), ("release", "full"),  # the streamed path releases
                                        *((w, p) for w in ("empty_cache", "after_release")  # every storage as
                                          for p in ("streamed", "steady", "full"))])  # copied, before stage 7
def test_a_failure_in_the_release_stage_leaves_the_state_on_the_device_readable(where, path):
    m, opt = _model_and_opt()
    rt = (_FailingEmptyCache if where == "empty_cache" else _FailingRelease)("cpu")
    store = _store(m, opt, rt)
    if path != "streamed":
        store.offload()
        store.reload()
        if path == "full":
            m[2].bias.data = m[2].bias.data.clone()  # a tensor re-pointed: the layout is laid out afresh
    _step(m, opt, 2)
    want = _snapshot(m, opt)
    drop = _arm(rt, where)
    with pytest.raises(RuntimeError, match="injected"):
        store.offload()
    drop()
    assert not any(store.is_offloaded(c) for c in ("params", "grads", "optimizer", "buffers"))
    assert _bitwise(m, opt, want), "every tensor is back on its storage with its bytes"
    assert torch.isfinite(m(torch.ones(2, 8))).all()
    store.reload()  # nothing offloaded: nothing to do
    _step(m, opt, 3)
    want = _snapshot(m, opt)
    store.offload()
    assert store.is_offloaded("params") and all(is_parked(t) for t in _state(m, opt))
    store.reload()
    assert _bitwise(m, opt, want)


def test_gradients_dropped_before_a_failure_in_the_release_stage_come_back_as_zeros():
    """``offload(drop_grads=True)`` releases the gradients without a copy; undone, they are zeros (what a reload
    would have given), the rest bitwise."""
    m, opt = _model_and_opt()
    rt = TorchRuntime("cpu")
    store = _store(m, opt, rt)
    store.offload()
    store.reload()
    _step(m, opt, 2)
    want = _snapshot(m, opt)
    grads = range(4, 8)  # _state: 4 parameters, then their 4 gradients
    want = [torch.zeros_like(w) if i in grads else w for i, w in enumerate(want)]
    drop = _arm(rt, "after_release")
    with pytest.raises(RuntimeError, match="injected"):
        store.offload(drop_grads=True)
    drop()
    assert not store.is_offloaded("grads") and not store.is_offloaded("params")
    assert _bitwise(m, opt, want)
