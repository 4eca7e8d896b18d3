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


def test_the_runtime_refuses_a_bad_switch_interval():
    from refimpl.torch_runtime.copy_stream import PACED_SWITCH_INTERVAL_S

    rt = TorchRuntime("cpu")
    assert rt.pacer_switch_interval_s == PACED_SWITCH_INTERVAL_S
    rt.pacer_switch_interval_s = None
    assert rt.pacer_switch_interval_s is None
    for bad in (0, -1, 2.0, "x"):
        with pytest.raises(ValueError, match="pacer_switch_interval_s"):
            rt.pacer_switch_interval_s = bad


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("interval", [0.0002, None])
def test_paced_copies_lower_the_switch_interval_while_held(interval):
    """While the pacer holds copies the interpreter's switch interval is the runtime's (none: left as it was); once
    every copy is issued the interval is back."""
    import sys

    from refimpl.torch_runtime import copy_stream

    before = sys.getswitchinterval()
    rt = TorchRuntime("cuda")
    rt.pacer_switch_interval_s = interval
    piece = 64 << 20
    n = 24
    host = torch.empty(n * piece, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n * piece, dtype=torch.uint8, device="cuda")
    with rt.paced_copies(piece):
        done = [rt.copy_async(dev[i * piece:(i + 1) * piece], host[i * piece:(i + 1) * piece], CopyKind.H2D)
                for i in range(n)]
    held = sys.getswitchinterval()
    for d in done:
        _run(d)
    deadline = time.monotonic() + 5
    while copy_stream.SWITCH_INTERVAL.users and time.monotonic() < deadline:
        time.sleep(0.001)
    assert held == pytest.approx(interval if interval else before, abs=2e-6)
    assert sys.getswitchinterval() == pytest.approx(before) and copy_stream.SWITCH_INTERVAL.users == 0
