"""refimpl.torch_runtime.nccl on a real GPU: the library really loaded, communicator handles, suspend through the lifecycle.

Run on the GPU machine: ``python -m pytest -q -m cuda tests/comm/test_nccl_cuda.py`` (stock NCCL), and
again with ``LD_PRELOAD=<libnccl.so.2 of NCCL >= 2.29.7>`` for the suspend tests (they skip, saying why,
when the loaded NCCL cannot suspend). See bench/gpu/comm_h200.md.
"""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture
def nccl_world():
    import torch.distributed as dist

    # every test that initialises torch.distributed in this process destroys it again: one left is a bug
    assert not dist.is_initialized(), "an earlier test left torch.distributed initialised in this process"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _lib():
    from refimpl.torch_runtime import nccl

    return nccl.NcclLibrary.load()


def _needs_suspend():
    lib = _lib()
    if not lib.has_suspend_resume:
        pytest.skip(f"the loaded NCCL {lib.version_string} ({lib.path}) has no ncclCommSuspend; preload NCCL >= 2.29.7")


def test_the_library_found_is_the_one_mapped_and_preloaded():
    from refimpl.torch_runtime.nccl_loader import _read_maps, mapped_libraries

    lib = _lib()
    assert lib.path in mapped_libraries(_read_maps()) or lib.path.startswith("<")
    preload = os.environ.get("LD_PRELOAD", "")
    if "libnccl" in preload:
        first = next(p for p in preload.split(":") if "libnccl" in p)
        assert os.path.realpath(lib.path) == os.path.realpath(first), "the preloaded NCCL is the one in use"
    else:
        assert lib.version == tuple(torch.cuda.nccl.version()), "without a preload, the wheel's NCCL is loaded"


def test_validation_agrees_with_the_library():
    from refimpl.torch_runtime.nccl_validation import NcclOffloadUnavailableError, require_offload_nccl

    lib = _lib()
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_CUMEM_ENABLE", "NCCL_DISABLE_MEM_MANAGER")}
    if lib.has_suspend_resume and lib.version >= (2, 29, 7):
        assert require_offload_nccl(env=env).version == lib.version
    else:
        with pytest.raises(NcclOffloadUnavailableError, match=lib.version_string):
            require_offload_nccl(env=env)


def test_handles_skip_lazy_communicators_create_them_on_request_and_dedupe(nccl_world):
    import torch.distributed as dist

    from refimpl.torch_runtime import nccl

    a, b = dist.new_group([0], backend="nccl"), dist.new_group([0], backend="nccl")
    assert nccl.pg_comm_handles(a, create_lazy=False) == []
    (ha,) = nccl.pg_comm_handles(a)
    (hb,) = nccl.pg_comm_handles(b)
    assert ha and hb and ha != hb
    assert nccl.pg_comm_handles(a, create_lazy=False) == [ha]
    assert nccl.unique_comm_handles([a, b, a]) == [ha, hb]
    gloo = dist.new_group([0], backend="gloo")
    assert nccl.pg_comm_handles(gloo) == []
    for g in (a, b, gloo):
        dist.destroy_process_group(g)


def test_suspend_through_the_lifecycle_frees_comm_memory_and_resume_restores_it(nccl_world):
    _needs_suspend()
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
    from refimpl.runtime import GroupSpec, GroupSuspendedError, ReduceOp
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    groups = [GroupSpec("cuda.tp", (0,), backend="nccl"), GroupSpec("cuda.dp", (0,), backend="nccl")]
    lc = PGLifecycle(rt, groups, config=LifecycleConfig(policy=PGPolicy.SUSPEND, two_phase=False))

    async def go():
        await lc.start()
        for g in lc.groups:
            t = torch.ones(1, device=rt.device)
            await rt.all_reduce(t, ReduceOp.SUM, g)
        held = lc.comm_memory()
        torch.cuda.synchronize()
        rt.empty_cache()
        free0 = rt.memory_info().free
        state = await lc.pause()
        freed = rt.memory_info().free - free0
        with pytest.raises(GroupSuspendedError):
            await rt.all_reduce(torch.ones(1, device=rt.device), ReduceOp.SUM, "cuda.tp")
        synced = await lc.weight_sync(lambda: "ok")
        await lc.resume()
        x = torch.randn(1 << 20, device=rt.device)
        want = x.clone()
        await rt.all_reduce(x, ReduceOp.SUM, "cuda.dp")
        return held, freed, state, synced, torch.equal(x, want), lc.state

    held, freed, state, synced, right, end = rt.run(go())
    assert state is PGState.SUSPENDED and synced == "ok" and end is PGState.ACTIVE
    assert held.suspendable > 0
    assert freed >= 0.99 * held.suspendable, f"suspend freed {freed:,} of {held.suspendable:,} suspendable bytes"
    assert right, "collectives after resume are right"
