"""Worker control: auto reload/offload around calls, the is_offload_states switch, metrics."""
import time
import types

import pytest
import torch

import sim
from refimpl.store import Category, OffloadStore
from refimpl.torch_runtime.runtime import TorchRuntime
from refimpl.worker import WorkerStateControl, auto_offload, log_gpu_memory_usage, state_offload_manager, wants_offload


class RefWorker:
    """A reference-policy worker: its state lives on the host between calls."""

    def __init__(self):
        torch.manual_seed(0)
        self.rt = TorchRuntime("cpu")
        self.model = torch.nn.Linear(8, 4)
        store = OffloadStore(self.rt)
        store.attach_module(self.model)
        self.state = WorkerStateControl(store)
        self.calls_saw_resident = []

    @auto_offload
    def compute_log_probs(self, batch):
        self.calls_saw_resident.append(not self.state.offloaded)
        return self.model(batch.x).sum()


def _batch(meta=None):
    b = types.SimpleNamespace(x=torch.ones(2, 8))
    if meta is not None:
        b.meta_info = meta
    return b


def test_call_reloads_before_and_offloads_after_with_same_result():
    w = RefWorker()
    expected = w.model(torch.ones(2, 8)).sum()
    w.state.offload_states()
    assert w.state.offloaded
    out = w.compute_log_probs(_batch())
    assert w.calls_saw_resident == [True]
    assert torch.equal(out, expected)
    assert w.state.offloaded  # offloaded again after the call
    m = w.state.metrics
    assert {"time/onload/compute_log_probs", "time/execute/compute_log_probs", "time/offload/compute_log_probs"} <= m.keys()


def test_is_offload_states_false_keeps_state_resident():
    w = RefWorker()
    w.state.offload_states()
    w.compute_log_probs(_batch({"is_offload_states": False}))
    assert not w.state.offloaded
    assert "time/offload/compute_log_probs" not in w.state.metrics
    w.compute_log_probs(_batch({"is_offload_states": True}))
    assert w.state.offloaded


def test_non_bool_switch_is_rejected():
    with pytest.raises(TypeError, match="must be a bool"):
        wants_offload({"is_offload_states": "false"})
    assert wants_offload(None) is True
    assert wants_offload({}, default=False) is False


def test_body_error_still_offloads_and_propagates():
    w = RefWorker()
    before = w.model.weight.detach().clone()
    with pytest.raises(ValueError, match="boom"):
        with state_offload_manager(w.state, {}, "x"):
            assert not w.state.offloaded
            raise ValueError("boom")
    assert w.state.offloaded
    w.state.reload_states()
    assert torch.equal(w.model.weight, before)


def test_log_gpu_memory_usage_reports_the_driver_figures_on_the_chosen_rank(caplog):
    """On simulated ranks the driver's figures are the memory ledger's: exact, and only the chosen rank logs."""
    world = sim.SimWorld(2, payload="meta")

    async def job(rt):
        rt.alloc_device(3 << 20, torch.uint8, tag="weights")  # 3 MiB more in use than the world group holds
        return rt.memory_info(), log_gpu_memory_usage("model_loading", rt, rank=1)

    with caplog.at_level("INFO", logger="refimpl.worker.control"):
        results = world.run(job)
    for info, figures in results:
        assert figures == {"model_loading/used_gib": info.used / 2**30, "model_loading/free_gib": info.free / 2**30}
        assert info.used >= 3 << 20
    lines = [r.getMessage() for r in caplog.records if "model_loading" in r.getMessage()]
    assert lines == [f"model_loading: device memory used {results[1][1]['model_loading/used_gib']:.2f} GiB, "
                     f"free {results[1][1]['model_loading/free_gib']:.2f} GiB (rank 1)"]


def test_metrics_time_each_phase_and_record_memory_after_it(monkeypatch):
    """The body's time is in time/execute, not in onload or offload: the runtime's clock jumps 1000 s
    inside the body, so a phase that included it would read >= 1000 s (no wall-clock bound to flake)."""
    w = RefWorker()

    class Clock:
        skipped = 0.0

    w.rt.now = lambda: time.monotonic() + Clock.skipped  # the clock the manager reads
    metrics = {}
    w.state.offload_states()
    with state_offload_manager(w.state, metrics, "gen"):
        Clock.skipped += 1000.0
    assert 1000.0 <= metrics["time/execute/gen"] < 1010.0
    assert 0 < metrics["time/onload/gen"] < 1000.0 and 0 < metrics["time/offload/gen"] < 1000.0
    assert set(metrics) == {"time/onload/gen", "time/execute/gen", "time/offload/gen",
                            "memory/after_onload/gen/used_gib", "memory/after_onload/gen/free_gib",
                            "memory/after_offload/gen/used_gib", "memory/after_offload/gen/free_gib"}


def test_worker_state_on_simulated_ranks_returns_exactly_the_state_bytes():
    """The same control on the simulator: the ledger gets every state byte back at offload and pays it again at
    reload, the values come back bit-exact, and ``include`` limits what moves."""
    world = sim.SimWorld(2, payload="real")

    async def job(rt):
        w = rt.alloc_device(1000, torch.float32, tag="weight")
        m = rt.alloc_device(500, torch.float32, tag="adam")
        w.copy_(torch.arange(1000, dtype=torch.float32) * (rt.rank + 1))
        m.fill_(0.5)
        want = (w.clone(), m.clone())
        store = OffloadStore(rt)
        store.attach_tensors(Category.PARAMS, {"w": w}, name="w")
        store.attach_tensors(Category.OPTIMIZER, {"m": m}, name="m")
        only_params = WorkerStateControl(store, include=["params"])
        everything = WorkerStateControl(store)
        used = [rt.memory_info().used]
        await only_params.offload_states_async()
        used.append(rt.memory_info().used)
        flags = [only_params.offloaded, store.is_offloaded("optimizer")]
        await everything.offload_states_async()
        used.append(rt.memory_info().used)
        await everything.reload_states_async()
        used.append(rt.memory_info().used)
        flags += [everything.offloaded]
        return used, flags, torch.equal(w, want[0]) and torch.equal(m, want[1])

    for used, flags, exact in world.run(job):
        assert flags == [True, False, False]
        assert used[0] - used[1] >= 4000 and used[1] - used[2] >= 2000, used  # params, then the optimizer
        assert used[0] - used[2] < 6000 + 2 * 512, "no more than the state (plus alignment) is returned"
        assert used[3] - used[2] >= 6000 and exact
