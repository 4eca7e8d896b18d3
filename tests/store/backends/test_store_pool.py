"""PinnedHostPool: exact-size pinning, reuse every cycle, resident high-water mark, pinning failures.

Pinning failures are injected with the simulator's fault plan (``pin_failure``), which makes the
runtime's ``alloc_host`` raise ``PinningError`` exactly as TorchRuntime does when
``cudaHostRegister`` fails.
"""
import warnings

import pytest
import torch

import sim
from refimpl.runtime import PinningError
from refimpl.torch_runtime import TorchRuntime
from refimpl.store import Category, OffloadStore, PageableFallbackWarning, PinnedHostPool, StoreConfig
from sim.machine.faults import Fault, FaultPlan, FaultType
from refimpl.store.state.parking import is_parked


def _tensors(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(1000 + 333 * i, generator=g) for i in range(n)}


def test_host_buffers_are_pinned_once_at_exact_size_and_reused_every_cycle():
    rt = TorchRuntime("cpu")
    tensors = _tensors()
    state_bytes = sum(t.numel() * 4 for t in tensors.values())
    store = OffloadStore(rt, config=StoreConfig(segment_bytes=8192, alignment_bytes=16))
    store.attach_tensors(Category.PARAMS, tensors)
    store.offload()
    first = store.stats()
    layout_bytes = sum(lay.nbytes for lay in store.layouts.values())
    assert first.host_pinned_bytes == layout_bytes == rt.pinned_bytes
    assert state_bytes <= first.host_pinned_bytes <= state_bytes + 16 * len(tensors)  # exact, not rounded up
    assert first.registrations == sum(len(lay.segments) for lay in store.layouts.values()) > 1
    assert first.reuses == 0
    store.reload()
    assert store.stats().host_pinned_bytes == first.host_pinned_bytes, "the high-water mark stays resident"
    for _ in range(3):
        store.offload()
        store.reload()
    later = store.stats()
    assert later.registrations == first.registrations, "no re-pinning after the first cycle"
    assert later.reuses == 3 * first.registrations
    assert later.host_pinned_gb == pytest.approx(first.host_pinned_bytes / 1e9)
    store.close()
    assert rt.pinned_bytes == 0


def test_pool_reuses_same_shape_and_repins_a_changed_one():
    rt = TorchRuntime("cpu")
    pool = PinnedHostPool(rt)
    a = pool.acquire("k", torch.float32, [100, 50])
    assert pool.acquire("k", torch.float32, [100, 50]) is a
    assert pool.stats().reuses == 2 and pool.stats().registrations == 2
    b = pool.acquire("k", torch.float32, [120])
    assert b is not a and pool.stats().registrations == 3
    assert pool.host_pinned_bytes == rt.pinned_bytes == 480, "the old buffer was unpinned"
    assert b.view(10, 20).numel() == 10
    c = pool.acquire("k", torch.float32, [130])  # as many segments as before, another size: pinned anew
    assert c is not b and c.segment_numels == (130,) and pool.stats().registrations == 4
    assert pool.host_pinned_bytes == rt.pinned_bytes == 520
    with pytest.raises(ValueError, match="spans segments"):
        a.view(90, 110)
    pool.close()
    assert rt.pinned_bytes == 0


def test_threaded_pinning_gives_the_same_buffers_and_counts():
    rt = TorchRuntime("cpu")
    pool = PinnedHostPool(rt, pin_threads=4)
    buf = pool.acquire("k", torch.bfloat16, [1000] * 16)
    buf.ready()
    assert [buf.segment(i).numel() for i in range(16)] == [1000] * 16
    assert pool.stats().registrations == 16 and pool.host_pinned_bytes == 32000 == rt.pinned_bytes
    pool.close()


def _sim_roundtrip(fallback, fault_min_bytes):
    plan = FaultPlan([Fault(FaultType.PIN_FAILURE, min_bytes=fault_min_bytes)])
    world = sim.SimWorld(1, payload="real", faults=plan)

    async def job(rt):
        tensors = {f"w{i}": rt.alloc_device(4096, torch.float32) for i in range(3)}
        for i, t in enumerate(tensors.values()):
            t.copy_(torch.arange(4096, dtype=torch.float32) * (i + 1))
        want = {k: v.clone() for k, v in tensors.items()}
        store = OffloadStore(rt, config=StoreConfig(pin_fallback=fallback))
        store.attach_tensors(Category.PARAMS, tensors)
        outcome = None
        try:
            await store.offload_async()
        except PinningError as e:
            outcome = e
        on_device = all(not is_parked(t) for t in tensors.values())
        intact = on_device and all(torch.equal(tensors[k], want[k]) for k in want)
        if outcome is None:
            await store.reload_async()
        else:
            await store.offload_async()  # the fault fired once; a retry works
            await store.reload_async()
        equal = all(torch.equal(tensors[k], want[k]) for k in want)
        return outcome, on_device, intact, equal, store.stats()

    return world.run(job)[0], plan


def test_pinning_failure_raises_naming_the_size_and_loses_nothing():
    (err, on_device, intact, equal, stats), plan = _sim_roundtrip("raise", 1)
    assert isinstance(err, PinningError) and "bytes" in str(err)
    assert plan.fired, "the fault plan's pin_failure fired"
    assert on_device and intact, "a refused offload leaves the state on the device, unchanged"
    assert equal and stats.host_pageable_bytes == 0


def test_pageable_fallback_warns_naming_the_size_and_still_round_trips():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (err, _, _, equal, stats), _ = _sim_roundtrip("pageable_warn", 1)
    assert err is None and equal
    msgs = [str(w.message) for w in caught if issubclass(w.category, PageableFallbackWarning)]
    assert msgs and "bytes" in msgs[0] and "PAGEABLE" in msgs[0]
    assert stats.host_pageable_bytes > 0 and stats.pageable_fallbacks == 1
