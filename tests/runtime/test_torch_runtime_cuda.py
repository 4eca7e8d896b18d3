"""TorchRuntime on a real GPU: exact-size pinning, copy ordering, memory returned, NCCL groups.

Run on the GPU machine with ``python -m pytest -q -m cuda tests/runtime/test_torch_runtime_cuda.py``.
The suspend/resume test also needs an NCCL >= 2.29.7 in the process (LD_PRELOAD the
``nvidia-nccl-cu13`` libnccl.so.2, see docs/runtime.md); without it that one test skips and says why.
"""
import ctypes

import pytest
import torch

from refimpl.runtime import CopyKind, GroupSpec, GroupSuspendedError, ReduceOp
from refimpl.torch_runtime import TorchRuntime
from tests.runtime import contract

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GIB = 1 << 30


def test_pinned_alloc_really_registers_at_exact_size():
    rt = TorchRuntime()
    sizes = [1, 3, 100, 4097, (64 << 20) + 3]  # small buffers would share heap pages if not mapped apart
    bufs = [rt.alloc_host(n, torch.bfloat16, pinned=True) for n in sizes for _ in range(8)]
    assert all(b.is_pinned() for b in bufs), "cudaHostRegister did not page-lock every buffer"
    assert rt.pinned_bytes == 8 * 2 * sum(sizes)
    assert all(b.numel() == n for b, n in zip(bufs, [n for n in sizes for _ in range(8)]))
    plain = rt.alloc_host(1000, torch.float32, pinned=False)
    assert not plain.is_pinned()
    for b in bufs:
        rt.free_host(b)
    assert rt.pinned_bytes == 0
    assert not any(b.is_pinned() for b in bufs), "free_host did not unregister"


def test_copy_is_ordered_after_queued_compute():
    rt = TorchRuntime()
    a = torch.randn(4096, 4096, device=rt.device) / 64
    src = torch.zeros(4096, 4096, device=rt.device)
    for _ in range(20):  # tens of milliseconds of matmuls queued ahead of the copy
        torch.matmul(a, a, out=src)
        src.add_(1.0)
    host = rt.alloc_host(src.numel(), src.dtype, pinned=True)

    async def go():
        done = rt.copy_async(host, src, CopyKind.D2H)
        await done
        assert done.done()

    rt.run(go())
    torch.cuda.synchronize()
    assert torch.equal(host.view_as(src), src.cpu()), "the D2H copy read values before the compute finished"
    rt.free_host(host)


def test_reload_then_compute_sees_copied_bytes_and_released_source_is_not_reused():
    rt = TorchRuntime()
    n = 64 << 20
    host = rt.alloc_host(n, torch.float32, pinned=True)
    host.copy_(torch.arange(n, dtype=torch.float32))
    dev = rt.alloc_device(n, torch.float32)

    async def go():
        await rt.copy_async(dev, host, CopyKind.H2D)
        first = dev[:10].clone()  # compute on the current stream after the await
        # offload a device source and release it at once; record_stream keeps its block from reuse
        src = torch.full((n,), 3.0, device=rt.device)
        out = rt.alloc_host(n, torch.float32, pinned=True)
        pending = rt.copy_async(out, src, CopyKind.D2H)
        rt.release(src)  # the block goes back to the allocator while the copy may still read it
        scratch = torch.empty(n, device=rt.device)
        scratch.fill_(7.0)
        await pending
        return first, out

    first, out = rt.run(go())
    assert first.tolist() == list(range(10))
    assert bool((out == 3.0).all()), "the released source's block was reused while the copy read it"
    rt.free_host(out)
    rt.free_host(host)


def test_release_and_empty_cache_return_memory_to_the_driver():
    rt = TorchRuntime()
    rt.empty_cache()
    before = rt.memory_info().free
    dev = rt.alloc_device(GIB // 2, torch.bfloat16)  # 1 GiB
    dev.fill_(1)
    held = rt.memory_info().free
    assert before - held >= GIB - (32 << 20), f"allocation not seen by the driver: {before - held} bytes"
    view = dev[:100]
    rt.release(dev)
    rt.empty_cache()
    after = rt.memory_info().free
    assert after >= before - (64 << 20), f"release + empty_cache left {before - after} bytes held"
    assert view.untyped_storage().nbytes() == 0


def test_contract_on_one_gpu_without_distributed():
    rt = TorchRuntime()
    out = rt.run(contract.run_all(rt))
    for name in contract.CHECKS:
        contract.verify_agreement(name, [out[name]], 1)


@pytest.fixture
def nccl_world():
    import torch.distributed as dist

    # every test that initialises torch.distributed in this process destroys it again: one left is a bug
    assert not dist.is_initialized(), "an earlier test left torch.distributed initialised in this process"
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_contract_on_a_one_rank_nccl_world(nccl_world):
    rt = TorchRuntime()
    assert rt.default_backend == "nccl" and rt.group_spec("world").backend == "nccl"
    out = rt.run(contract.run_all(rt))
    for name in contract.CHECKS:
        contract.verify_agreement(name, [out[name]], 1)


def _loaded_nccl_has_suspend() -> bool:
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libnccl" in line}
    for path in paths:
        lib = ctypes.CDLL(path)
        if hasattr(lib, "ncclCommSuspend") and hasattr(lib, "ncclCommResume"):
            return True
    return False


def test_suspend_frees_comm_memory_and_blocks_collectives(nccl_world):
    rt = TorchRuntime()

    async def go():
        await rt.new_group(GroupSpec("sub", (0,), backend="nccl"))
        t = torch.ones(8, device=rt.device)
        await rt.all_reduce(t, ReduceOp.SUM, "sub")  # creates the communicator
        if not _loaded_nccl_has_suspend():
            pytest.skip("the NCCL loaded in this process lacks ncclCommSuspend (needs >= 2.29.7)")
        held = rt.comm_memory("sub")
        rt.empty_cache()
        free_before = rt.memory_info().free
        await rt.suspend_group("sub")
        assert rt.group_suspended("sub")
        freed = rt.memory_info().free - free_before
        with pytest.raises(GroupSuspendedError):
            await rt.all_reduce(t, ReduceOp.SUM, "sub")
        await rt.resume_group("sub")
        t.fill_(2.0)
        await rt.all_reduce(t, ReduceOp.MAX, "sub")
        await rt.destroy_group("sub")
        return held, freed, t.cpu().tolist()

    held, freed, values = rt.run(go())
    assert held.suspendable > 0, f"comm_memory reported {held}"
    assert freed >= held.suspendable * 0.9, f"suspend freed {freed} bytes of {held.suspendable} suspendable"
    assert values == [2.0] * 8


def test_a_span_ends_when_its_device_work_ends_and_an_error_does_not_wait():
    """docs/runtime.md, "How spans are timed": the span waits for the kernels it queued; on an error it does not."""
    rt = TorchRuntime()
    a = torch.randn(8192, 8192, device=rt.device, dtype=torch.bfloat16)

    def work():  # about 0.1-0.2 s of matmuls on an H200, timed on the device by events
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            torch.mm(a, a)
        end.record()
        return start, end

    torch.cuda.synchronize()
    with rt.span("work"):
        start, end = work()
    name, t0, t1 = rt.spans[-1]
    device_s = start.elapsed_time(end) / 1e3
    assert name == "work" and t1 - t0 >= 0.95 * device_s, f"span {t1 - t0:.4f} s, device work {device_s:.4f} s"
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="boom"):
        with rt.span("failed"):
            start, end = work()
            raise RuntimeError("boom")
    name, t0, t1 = rt.spans[-1]
    torch.cuda.synchronize()
    assert name == "failed" and t1 - t0 < 0.5 * start.elapsed_time(end) / 1e3, "a failing span must not wait"
    del a
    torch.cuda.empty_cache()  # leave no cached 128 MiB blocks for later tests' allocations to fragment
