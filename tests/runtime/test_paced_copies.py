"""Paced copies (``Runtime.paced_copies``; [Note: paced copies] in refimpl/torch_runtime/copy_stream.py): copies
asked for inside the block are fed to the device a window at a time, in order, bitwise; another stream's copy
then waits behind one window, not behind everything queued. CUDA only (without CUDA copies are synchronous and
the block changes nothing, checked on CPU)."""
from __future__ import annotations

import time

import pytest
import torch

from refimpl.runtime.types import CopyKind
from refimpl.torch_runtime import TorchRuntime
from tests.runtime._copies import cuda, run_completion as _run


def test_paced_copies_change_nothing_on_cpu():
    rt = TorchRuntime("cpu")
    src = torch.arange(1000, dtype=torch.float32)
    dst = torch.empty_like(src)
    with rt.paced_copies(64):
        done = rt.copy_async(dst, src, CopyKind.H2D)
    _run(done)
    assert torch.equal(dst, src)


@pytest.mark.cuda
@cuda
def test_paced_copies_arrive_bitwise_and_in_order():
    rt = TorchRuntime("cuda")
    piece = 4 << 20
    n = 32
    host = torch.randint(0, 255, (n * piece,), dtype=torch.uint8).pin_memory()
    dev = torch.empty(n * piece, dtype=torch.uint8, device="cuda")
    with rt.paced_copies(2 * piece):
        done = [rt.copy_async(dev[i * piece:(i + 1) * piece], host[i * piece:(i + 1) * piece], CopyKind.H2D)
                for i in range(n)]
    # a use ordered on the device after the last piece, asked for while most pieces are still held on the host
    assert done[-1].order_on_device()
    total = dev.sum(dtype=torch.int64)
    assert int(total) == int(host.sum(dtype=torch.int64))
    for d in done:
        _run(d)
    assert torch.equal(dev.cpu(), host)


@pytest.mark.cuda
@cuda
def test_another_streams_copy_waits_behind_one_window_not_the_whole_queue():
    rt = TorchRuntime("cuda")
    piece = 64 << 20
    n = 48  # 3 GiB: ~55 ms at the H200's line, against a window of 2 pieces (~2.4 ms)
    host = torch.empty(n * piece, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n * piece, dtype=torch.uint8, device="cuda")
    small = torch.ones(1 << 18, dtype=torch.float32).pin_memory()
    torch.cuda.synchronize()
    with rt.paced_copies(2 * piece):
        done = [rt.copy_async(dev[i * piece:(i + 1) * piece], host[i * piece:(i + 1) * piece], CopyKind.H2D)
                for i in range(n)]
    time.sleep(0.002)
    small.to("cuda", non_blocking=True)
    torch.cuda.current_stream().synchronize()
    last_done = done[-1].done()
    for d in done:
        _run(d)
    assert not last_done, "the small copy should have run before the bulk ended (unpaced it waits for all of it)"
