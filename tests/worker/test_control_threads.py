"""WorkerStateControl across threads (a threaded Ray actor serves calls from several threads): an explicit
offload requested while a call runs waits for it, never pulls the state from under it; auto_offload's
declared interface."""
import threading

import pytest
import torch

from refimpl.store import OffloadStore
from refimpl.torch_runtime.runtime import TorchRuntime
from refimpl.worker import StateInUseError, WorkerStateControl, auto_offload, state_offload_manager


def _control():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(model)
    return model, WorkerStateControl(store)


def test_offload_from_another_thread_waits_for_the_running_call():
    model, control = _control()
    want = model(torch.ones(2, 8))
    inside, asked, seen = threading.Event(), threading.Event(), {}
    offloader = threading.Thread(target=control.offload_states)

    def call():
        with state_offload_manager(control, {}, "forward", is_offload_states=False):
            inside.set()
            assert asked.wait(10)
            offloader.join(timeout=0.5)  # the offload was asked for while this call runs
            seen["offloader_done_inside"] = not offloader.is_alive()
            seen["resident"] = not control.offloaded
            seen["out"] = model(torch.ones(2, 8))

    worker = threading.Thread(target=call)
    worker.start()
    assert inside.wait(10)
    offloader.start()
    asked.set()
    worker.join(10)
    offloader.join(10)
    assert seen["offloader_done_inside"] is False, "the offload ran while a call was using the state"
    assert seen["resident"] and torch.equal(seen["out"], want)
    assert control.offloaded and control.moves == {"reload": 0, "offload": 1}, "the offload happens after the call"


def test_offload_from_inside_a_call_on_the_same_thread_is_refused_not_deadlocked():
    _, control = _control()
    with state_offload_manager(control, {}, "x", is_offload_states=False):
        with pytest.raises(StateInUseError, match="same thread"):
            control.offload_states()
        assert not control.offloaded
    control.offload_states()  # after the call it goes through
    assert control.offloaded


def test_offload_wait_is_bounded_by_timeout():
    _, control = _control()
    inside, leave = threading.Event(), threading.Event()

    def call():
        with state_offload_manager(control, {}, "x", is_offload_states=False):
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=call)
    t.start()
    assert inside.wait(10)
    with pytest.raises(StateInUseError, match="still use the state after 0.2 s"):
        control.offload_states(timeout_s=0.2)
    assert not control.offloaded, "a refused offload moved nothing"
    leave.set()
    t.join(10)


def test_concurrent_calls_move_state_once():
    """Two threads inside at once: the first in reloads, the last out offloads, nothing in between."""
    _, control = _control()
    control.offload_states()
    both_inside = threading.Barrier(2, timeout=10)

    def call():
        with state_offload_manager(control, {}, "x"):
            both_inside.wait()
            assert not control.offloaded

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert control.offloaded and control.moves == {"reload": 1, "offload": 2}  # 1 explicit + 1 by the last call


def test_auto_offload_names_the_missing_control_attribute():
    class NoState:
        @auto_offload
        def f(self):
            return 1

    with pytest.raises(TypeError, match=r"NoState\.f needs self\.state to be a WorkerStateControl"):
        NoState().f()

    class Named:
        def __init__(self):
            self.model, self.ctl = _control()

        @auto_offload(control="ctl")
        def f(self):
            return self.ctl.offloaded

    w = Named()
    assert w.f() is False and w.ctl.offloaded


def test_worker_state_control_rejects_a_model():
    with pytest.raises(TypeError, match="needs an OffloadStore"):
        WorkerStateControl(torch.nn.Linear(2, 2))
