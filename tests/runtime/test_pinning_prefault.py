"""HostPinner's prefault modes (issue 16) on CPU: the mapping, its alignment, the touch, the accounting.

Registration itself needs CUDA (bench/gpu/pin_probe.py measures it); here the
same mapping and touching code runs, and the pinner's bookkeeping is checked.
"""
from __future__ import annotations

import pytest
import torch

from refimpl.torch_runtime.pinning import PREFAULT_MODES, HostPinner, mapped_buffer, thp_mode, touch_pages


def _resident_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("mode", PREFAULT_MODES)
def test_mapped_buffer_has_exact_size_and_holds_data(mode):
    t = mapped_buffer(1000, torch.float32, 4000, mode)
    assert t.numel() == 1000 and t.dtype == torch.float32
    t.copy_(torch.arange(1000, dtype=torch.float32))
    assert torch.equal(t, torch.arange(1000, dtype=torch.float32))
    if mode == "thp":
        assert t.data_ptr() % (2 << 20) == 0


@pytest.mark.parametrize("mode", ["touch", "thp", "populate"])
def test_prefault_makes_the_pages_resident(mode):
    nbytes = 64 << 20
    before = _resident_kb()
    t = mapped_buffer(nbytes, torch.uint8, nbytes, mode)
    grown = _resident_kb() - before
    assert grown >= 0.9 * nbytes / 1024, f"{mode}: only {grown} KiB became resident of {nbytes >> 10}"
    del t


def test_untouched_mapping_is_not_resident():
    nbytes = 64 << 20
    before = _resident_kb()
    t = mapped_buffer(nbytes, torch.uint8, nbytes, "none")
    assert _resident_kb() - before < 0.5 * nbytes / 1024
    touch_pages(t)
    assert _resident_kb() - before >= 0.9 * nbytes / 1024


def test_bad_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="prefault must be one of"):
        HostPinner(use_cuda=False, prefault="huge")
    with pytest.raises(ValueError, match="prefault must be one of"):
        mapped_buffer(10, torch.uint8, 10, "huge")


def test_pinner_counts_prefaulted_buffers_and_frees_them():
    p = HostPinner(use_cuda=False, prefault="thp")
    a = p.alloc(3 << 20, torch.uint8, pinned=True, tag="a")
    b = p.alloc(10, torch.float64, pinned=True, tag="b")
    assert p.pinned_bytes == (3 << 20) + 80 and p.registrations == 2
    assert p.is_tracked(a[5:]) and p.is_tracked(b)
    p.free(a)
    assert p.pinned_bytes == 80 and not p.is_tracked(a)
    p.free(b)
    assert p.pinned_bytes == 0


def test_thp_mode_reads_the_kernel_setting():
    assert thp_mode() in ("always", "madvise", "never", "unknown")


def test_torch_runtime_default_prefault_on_cpu(monkeypatch):
    from refimpl.torch_runtime import TorchRuntime

    monkeypatch.delenv("TIMESHARE_PIN_PREFAULT", raising=False)
    assert TorchRuntime("cpu").pinner.prefault == ("touch" if torch.cuda.is_available() else "none")
    monkeypatch.setenv("TIMESHARE_PIN_PREFAULT", "thp")
    assert TorchRuntime("cpu").pinner.prefault == "thp"
    assert TorchRuntime("cpu", pin_prefault="populate").pinner.prefault == "populate"
    monkeypatch.setenv("TIMESHARE_PIN_PREFAULT", "huge")
    with pytest.raises(ValueError, match="TIMESHARE_PIN_PREFAULT='huge' is not a prefault mode"):
        TorchRuntime("cpu")


def test_pin_touch_bench_measures_every_mode():
    from bench.pin_touch import measure

    res = measure(4 << 20, repeat=1)
    assert set(res["gbps"]) == {"torch_empty_touch", "touch", "thp", "populate"}
    assert all(v > 0 for v in res["gbps"].values())
    assert res["thp_mode"] == thp_mode()


@pytest.mark.parametrize("mode", ["touch", "thp", "populate"])
def test_store_round_trip_through_prefaulted_host_buffers(mode):
    """The store's offload/reload through host buffers mapped and faulted in per ``mode``: bit-exact."""
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime("cpu", pin_prefault=mode)
    g = torch.Generator().manual_seed(3)
    state = {f"w{i}": torch.randn(1000 + 37 * i, generator=g) for i in range(5)}
    want = {k: v.clone() for k, v in state.items()}
    store = OffloadStore(rt, config=StoreConfig(segment_bytes=8 << 10))
    store.attach_tensors("params", state, name="w")
    store.offload()
    assert rt.pinner.pinned_bytes >= sum(v.numel() * 4 for v in want.values())
    if mode == "thp":  # every host segment is its own 2 MiB-aligned mapping
        assert all(reg.buffer.data_ptr() % (2 << 20) == 0 for reg in rt.pinner._live.values())
    store.reload()
    for k, v in state.items():
        assert torch.equal(v.view(torch.int32), want[k].view(torch.int32)), k
    store.close()
    assert rt.pinner.pinned_bytes == 0
