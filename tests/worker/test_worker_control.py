"""Worker control: auto reload/offload around calls, the is_offload_states switch, metrics."""
import types

import pytest
import torch

from refimpl.torch_runtime.runtime import TorchRuntime
from refimpl.store import OffloadStore
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


def test_log_gpu_memory_usage_reports_driver_figures(caplog):
    w = RefWorker()
    with caplog.at_level("INFO"):
        figures = log_gpu_memory_usage("model_loading", w.rt)
    assert figures["model_loading/used_gb"] >= 0 and figures["model_loading/free_gb"] > 0
    assert "model_loading: device memory used" in caplog.text
