"""Host-to-device copies on SMs (``Runtime.copies_on_sms``; [Note: copies on SMs] in refimpl/torch_runtime/sm_copy.py):
inside the block a Triton kernel reads pinned host memory and writes the device buffer, bitwise, for both kinds of
pinned memory the project uses; what it cannot copy exactly goes to the copy engine; the caller's own pinned copy on
another stream does not wait behind copies made this way. CUDA (and Triton) only; on CPU the block changes nothing."""
from __future__ import annotations

import time

import pytest
import torch

from refimpl.runtime.types import CopyKind
from refimpl.store import StoreConfig
from refimpl.torch_runtime import TorchRuntime
from tests.runtime._copies import cuda, run_completion as _run


def test_copies_on_sms_change_nothing_on_cpu():
    rt = TorchRuntime("cpu")
    src = torch.arange(1000, dtype=torch.float32)
    dst = torch.empty_like(src)
    with rt.copies_on_sms(16):
        _run(rt.copy_async(dst, src, CopyKind.H2D))
    assert torch.equal(dst, src) and rt.sm_copies == 0


def test_the_store_checks_its_program_count():
    assert StoreConfig(stream_sm_ctas=16).stream_sm_ctas == 16
    for bad in (0, -1, 5000):
        with pytest.raises(ValueError, match="stream_sm_ctas"):
            StoreConfig(stream_sm_ctas=bad)
    with pytest.raises(TypeError, match="stream_sm_ctas"):
        StoreConfig(stream_sm_ctas="16")


@pytest.mark.cuda
@cuda
def test_copies_on_sms_are_bitwise_from_both_kinds_of_pinned_memory():
    pytest.importorskip("triton")
    from refimpl.torch_runtime.pinning import HostPinner

    rt = TorchRuntime("cuda")
    rt.prepare_copies_on_sms()  # the kernel built and run once: not counted as a copy
    assert rt.sm_copies == 0
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 255, (3 * (1 << 20) + 7,), dtype=torch.uint8, generator=g)
    pinner = HostPinner(True)
    registered = pinner.alloc(data.numel(), torch.uint8, pinned=True, tag="test")
    registered.copy_(data)
    for host in (data.pin_memory(), registered):
        # on SMs: an aligned slice of whole words (bytes, bf16, a 2-D view); on the engine: an odd size, an unaligned
        # start (the kernel is built for one shape of arguments only)
        w = 1 << 20
        cases = [(host[16:16 + w], data[16:16 + w], True),
                 (host[:w].view(torch.bfloat16), data[:w].view(torch.bfloat16), True),
                 (host[:w].view(torch.float32).view(256, 1024), data[:w].view(torch.float32).view(256, 1024), True),
                 (host, data, False), (host[4:4 + w], data[4:4 + w], False), (host[16:19], data[16:19], False)]
        for src, want, on_sms in cases:
            before = rt.sm_copies
            dst = torch.empty(src.shape, dtype=src.dtype, device="cuda")
            with rt.copies_on_sms(8):
                _run(rt.copy_async(dst, src, CopyKind.H2D))
            assert rt.sm_copies == before + int(on_sms)
            # bits, not values: random bytes seen as floats hold NaNs, which equal nothing
            assert torch.equal(dst.cpu().reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))
    # a pageable source cannot be read by the device: the copy engine makes it
    before = rt.sm_copies
    dst = torch.empty(data.shape, dtype=data.dtype, device="cuda")
    with rt.copies_on_sms(8):
        _run(rt.copy_async(dst, data, CopyKind.H2D))
    assert rt.sm_copies == before and torch.equal(dst.cpu(), data)
    pinner.free(registered)


@pytest.mark.cuda
@cuda
def test_a_pinned_copy_of_the_caller_does_not_wait_behind_copies_on_sms():
    pytest.importorskip("triton")
    rt = TorchRuntime("cuda")
    piece, n = 64 << 20, 32  # 2 GiB, about 40 ms at the line
    host = torch.randint(0, 255, (n * piece,), dtype=torch.uint8).pin_memory()
    dev = torch.empty(n * piece, dtype=torch.uint8, device="cuda")
    small = torch.ones(731816 // 4).pin_memory()
    waits = {}
    for mode in ("engine", "sms"):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with rt.copies_on_sms(16 if mode == "sms" else None):
            done = [rt.copy_async(dev[i * piece:(i + 1) * piece], host[i * piece:(i + 1) * piece], CopyKind.H2D)
                    for i in range(n)]
        t1 = time.perf_counter()
        small.to("cuda", non_blocking=True)
        torch.cuda.current_stream().synchronize()
        waits[mode] = time.perf_counter() - t1
        for d in done:
            _run(d)
        bulk = time.perf_counter() - t0
        assert torch.equal(dev[-piece:].cpu(), host[-piece:])
        if mode == "engine":  # the engine serves the queued pieces first (the behaviour the SMs avoid)
            assert waits[mode] > 0.5 * bulk
    assert waits["sms"] < 0.2 * waits["engine"]
