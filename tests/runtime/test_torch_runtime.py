"""TorchRuntime behaviour beyond the shared contract: accounting, error mapping, refusals (CPU)."""
import socket
import time
from datetime import timedelta

import pytest
import torch

from refimpl.runtime import CollectiveTimeoutError, CopyKind, GroupError, GroupSpec, Ready
from refimpl.torch_runtime import TorchRuntime
from refimpl.torch_runtime.runtime import _address_in_use
from tests._dist import run_distributed


def test_pinned_accounting_counts_exact_bytes():
    rt = TorchRuntime("cpu")
    a = rt.alloc_host(1001, torch.bfloat16, pinned=True)
    b = rt.alloc_host(7, torch.float32, pinned=True)
    plain = rt.alloc_host(4096, torch.float32, pinned=False)
    assert rt.pinned_bytes == 1001 * 2 + 7 * 4, "pinned bytes must be exact, with no rounding"
    assert rt.pin_registrations == 2
    rt.free_host(a)
    assert rt.pinned_bytes == 7 * 4
    rt.free_host(a)  # a second free of the same buffer must not count twice
    rt.free_host(plain)  # pageable buffers are not in the pinned account
    assert rt.pinned_bytes == 7 * 4
    rt.free_host(b[2:5])  # a view frees the buffer it belongs to
    assert rt.pinned_bytes == 0 and rt.pinner.peak_pinned_bytes == 1001 * 2 + 7 * 4
    assert rt.pin_registrations == 2


def test_cpu_copy_is_synchronous_and_counted():
    rt = TorchRuntime("cpu")
    src = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    dst = rt.alloc_host(12, torch.int32)
    done = rt.copy_async(dst, src, CopyKind.D2H)
    assert isinstance(done, Ready) and done.done()
    assert dst.tolist() == list(range(12))
    assert rt.copy_stats.count[CopyKind.D2H] == 1 and rt.copy_stats.bytes[CopyKind.D2H] == 48
    with pytest.raises(ValueError, match="dtype mismatch"):
        rt.copy_async(dst, src.float(), CopyKind.H2D)


def test_refusals_name_the_fix():
    rt = TorchRuntime("cpu")

    async def go():
        with pytest.raises(GroupError, match="never destroyed"):
            await rt.destroy_group("world")
        with pytest.raises(GroupError, match="outside the world"):
            await rt.new_group(GroupSpec("g", (0, 1)))
        with pytest.raises(GroupError, match="unknown group"):
            await rt.barrier("nosuch")
        await rt.new_group(GroupSpec("g", (0,)))
        with pytest.raises(GroupError, match="is live"):
            await rt.recreate_group("g")
        with pytest.raises(GroupError, match="not initialised"):
            await rt.suspend_group("g")
        with pytest.raises(ValueError, match="timeout_s"):
            await rt.barrier("g", timeout_s=0)
        with pytest.raises(ValueError):
            await rt.sleep(-1)

    rt.run(go())
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            TorchRuntime("cuda")


def test_address_in_use_is_recognised_from_torch_error():
    """The classifier behind AddressInUseError recognises torch's real bind failure."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        import torch.distributed as dist

        with pytest.raises(Exception) as info:
            dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=5))
    assert _address_in_use(info.value), f"not classified as EADDRINUSE: {info.value!r}"
    assert not _address_in_use(RuntimeError("Connection reset by peer"))


def _timeout_and_gloo_suspend(rank, world_size):
    rt = TorchRuntime("cpu")
    out = {}

    async def go():
        await rt.new_group(GroupSpec("sub", (0, 1), timeout_s=30))
        try:
            await rt.suspend_group("sub")
        except GroupError as e:
            out["suspend"] = str(e)
        if rank == 0:
            start = time.monotonic()
            try:
                await rt.all_reduce(torch.ones(4), group="sub", timeout_s=0.5)
            except CollectiveTimeoutError as e:
                out["timeout"] = (time.monotonic() - start, type(e.__cause__).__name__)
        else:
            time.sleep(3.0)  # rank 1 never joins that all_reduce
        await rt.destroy_group("sub", abort=True)
        await rt.barrier()
        t = torch.tensor([float(rank)])
        await rt.all_reduce(t)  # the world group is unaffected by the failed subgroup
        out["world_sum"] = t.item()

    rt.run(go())
    return out


def test_collective_timeout_and_gloo_suspend_refused():
    r0, r1 = run_distributed(_timeout_and_gloo_suspend, 2, timeout=90)
    assert "only NCCL communicators can be suspended" in r0["suspend"] and r1["suspend"] == r0["suspend"]
    elapsed, _ = r0["timeout"]
    assert 0.45 <= elapsed < 2.5, f"timeout_s=0.5 took {elapsed:.2f}s"
    assert r0["world_sum"] == r1["world_sum"] == 1.0


def test_pinning_from_many_threads_keeps_exact_counts():
    """PinnedHostPool pins segments from worker threads; the counts must stay exact."""
    from concurrent.futures import ThreadPoolExecutor

    rt = TorchRuntime("cpu")
    sizes = [1 + (i * 37) % 5000 for i in range(400)]
    with ThreadPoolExecutor(8) as pool:
        bufs = list(pool.map(lambda n: rt.alloc_host(n, torch.float16, pinned=True), sizes))
    assert rt.pinned_bytes == 2 * sum(sizes) and rt.pin_registrations == len(sizes)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(rt.free_host, bufs))
    assert rt.pinned_bytes == 0
