"""The worker side of roles without a Ray cluster: the package imports without Ray, @register's arguments are
checked, a registered method moves state around a direct call as around an RPC."""
import subprocess
import sys

import pytest
import torch

from refimpl.store import OffloadStore
from refimpl.torch_runtime.runtime import TorchRuntime
from refimpl.worker import Registration, RoleWorker, WorkerStateControl, register, registration


def test_refimpl_worker_imports_without_loading_ray():
    code = "import sys, refimpl.worker, refimpl.worker.cluster, refimpl.worker.pipeline; assert 'ray' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_register_checks_its_arguments():
    with pytest.raises(ValueError, match="dispatch='each'"):
        register(dispatch="each")
    with pytest.raises(ValueError, match="collect='first'"):
        Registration(collect="first")
    with pytest.raises(TypeError, match="takes a bool"):
        register(offload="yes")


class Worker(RoleWorker):
    def setup(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 2)
        store = OffloadStore(TorchRuntime("cpu"))
        store.attach_module(self.model)
        self.state_control = WorkerStateControl(store)

    @register
    def f(self, meta_info=None):
        return not self.state_control.offloaded

    @register
    def outer(self):
        return [self.f(), self.f()]


def test_role_worker_hands_the_rendezvous_and_runs_registered_calls_with_metrics(monkeypatch, caplog):
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    w0 = Worker("ref", 0, 2)
    addr, port = w0.master_address()
    w1 = Worker("ref", 1, 2, addr, port)
    import os

    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"]) == ("1", "2", str(port))
    with pytest.raises(ValueError, match="only rank 0 may start without a master address"):
        Worker("ref", 1, 2)
    w1.setup()
    w1.state_control.offload_states()
    assert registration(Worker.f) == Registration() and registration(Worker.setup) is None
    with caplog.at_level("INFO", logger="refimpl.worker.role"):
        out, metrics = w1.timeshare_call("outer", (), {})
    heads = [r.getMessage().split(":")[0] for r in caplog.records if "device memory used" in r.getMessage()]
    assert heads == ["ref outer start", "ref outer end"], "log_gpu_memory_usage around each driver call"
    assert out == [True, True] and w1.state_control.offloaded
    assert w1.state_control.moves == {"reload": 1, "offload": 2}, "the nested calls moved nothing"
    assert {"time/onload/outer", "time/offload/outer", "bytes/onload/outer", "time/call/outer"} <= metrics.keys()
    assert "time/onload/f" not in metrics
    out, metrics = w1.timeshare_call("f", (), {"meta_info": {"is_offload_states": False}})
    assert out and not w1.state_control.offloaded and "time/offload/f" not in metrics
    with pytest.raises(AttributeError, match="no method 'setup' marked with @register"):
        w1.timeshare_call("setup", (), {})
