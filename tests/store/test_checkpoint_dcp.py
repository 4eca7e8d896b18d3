"""DCP checkpoints of offloaded FSDP2 state, in Gloo processes on a 2x2 HSDP mesh.

``local``: a save while offloaded reads the pinned host buffers in place (no reload, no copies, the
state stays offloaded), and an async save keeps the next offload from overwriting those buffers until
the write has finished. ``local_dedup``: the save takes the reload path and the state is offloaded
again afterwards. Every checkpoint is loaded back into a fresh model and compared bitwise.
"""
import pytest
import torch

from tests._dist import run_distributed
from refimpl.store.state.parking import is_parked

WRITE_DELAY_S = 1.5


def _net(mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 4))
    fully_shard(net, mesh=mesh)
    return net, torch.optim.AdamW(net.parameters(), lr=0.1, foreach=False)


def _step(net, opt, rank, step):
    g = torch.Generator().manual_seed(10 * rank + step)
    loss = net(torch.randn(5, 6, generator=g)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def _locals(net):
    return {n: p._local_tensor.detach().clone() for n, p in net.named_parameters()}


def _loaded(mesh, path):
    from refimpl.torch_runtime import dcp

    fresh, _ = _net(mesh)
    with torch.no_grad():
        for p in fresh.parameters():
            p._local_tensor.zero_()
    dcp.load_into({"model": fresh.state_dict()}, path)
    return _locals(fresh)


def _same(a, b):
    return sorted(k for k in a if not torch.equal(a[k], b[k]))


def _checkpoint_job(rank, world_size, root):
    import time

    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.device_mesh import init_device_mesh

    from refimpl.torch_runtime import TorchRuntime, dcp
    from refimpl.store import OffloadStore
    from refimpl.store.checkpoint import SavePath, host_readers_pending

    class SlowWriter(FileSystemWriter):
        """A file-system writer that starts writing late, so an overlapping offload would be caught."""

        def write_data(self, plan, planner):
            time.sleep(WRITE_DELAY_S)
            return super().write_data(plan, planner)

    out = {}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ddp", "fsdp"))
    rt = TorchRuntime()

    # ---- local: sync save from the host buffers
    net, opt = _net(mesh)
    store = OffloadStore(rt, backend="local")
    store.attach_module(net, name="model")
    store.attach_optimizer(opt, name="optim")
    _step(net, opt, rank, 0)
    ref1 = _locals(net)
    store.offload()
    copies, pinned = rt.copy_stats.host_copies, store.stats().host_pinned_bytes
    res = dcp.save(store, f"{root}/sync")
    out["sync_path"] = res.path
    out["sync_no_copies"] = rt.copy_stats.host_copies == copies
    out["sync_still_offloaded"] = store.is_offloaded("params") and all(
        is_parked(p._local_tensor) for p in net.parameters())
    out["sync_pinned_same"] = store.stats().host_pinned_bytes == pinned
    out["sync_bytes"] = res.host_buffer_bytes == sum(t.numel() * t.element_size() for t in ref1.values())

    # ---- local: async save, then reload, train and offload again while the write is pending
    host_ptrs = {t.data_ptr() for t in store.host_tensors("params").values()}
    res2 = dcp.async_save(store, storage_writer=SlowWriter(f"{root}/async"))
    out["async_in_place"] = res2.path is SavePath.HOST_BUFFERS and set(res2.staged_ptrs) <= host_ptrs \
        and len(res2.staged_ptrs) == len(ref1)
    out["async_pending"] = host_readers_pending(store) == 1
    store.reload()
    _step(net, opt, rank, 1)
    ref2 = _locals(net)
    t0 = time.perf_counter()
    store.offload()  # must wait for the write: it would overwrite the buffers being written
    out["offload_waited"] = res2.future.done() and time.perf_counter() - t0 > 0.2
    res2.future.result()
    out["sync_diff"] = _same(_loaded(mesh, f"{root}/sync"), ref1)
    out["async_diff"] = _same(_loaded(mesh, f"{root}/async"), ref1)
    out["changed"] = bool(_same(ref1, ref2))
    store.reload()
    out["after_diff"] = _same(_locals(net), ref2)

    # ---- local_dedup: the reload path, then offloaded again at 1/N
    net3, opt3 = _net(mesh)
    store3 = OffloadStore(rt, backend="local_dedup")
    store3.attach_module(net3, name="model")
    store3.attach_optimizer(opt3, name="optim")
    _step(net3, opt3, rank, 0)
    ref3 = _locals(net3)
    store3.offload()
    kept = store3.backend.host_bytes()
    res3 = dcp.save(store3, f"{root}/dedup")
    out["dedup_path"] = res3.path
    out["dedup_offloaded_again"] = store3.is_offloaded("params") and store3.backend.host_bytes() == kept
    out["dedup_diff"] = _same(_loaded(mesh, f"{root}/dedup"), ref3)
    store3.reload()
    out["dedup_back"] = _same(_locals(net3), ref3)
    return out


@pytest.mark.slow
def test_dcp_save_reads_host_buffers_and_dedup_reloads(tmp_path):
    from refimpl.store.checkpoint import SavePath

    results = run_distributed(_checkpoint_job, 4, args=(str(tmp_path),), timeout=240)
    for rank, r in enumerate(results):
        assert r["sync_path"] is SavePath.HOST_BUFFERS, r
        assert r["sync_no_copies"] and r["sync_still_offloaded"] and r["sync_pinned_same"] and r["sync_bytes"], r
        assert r["async_in_place"] and r["async_pending"], r
        assert r["offload_waited"], f"rank {rank}: offload did not wait for the async write"
        assert r["changed"], "the second step must change the parameters, or the async check proves nothing"
        assert r["sync_diff"] == [] and r["async_diff"] == [], r
        assert r["after_diff"] == [], r
        assert r["dedup_path"] is SavePath.RELOAD and r["dedup_offloaded_again"], r
        assert r["dedup_diff"] == [] and r["dedup_back"] == [], r
