"""The worker side of call order, without Ray: calls numbered by the driver arrive on threads in any order, an
explicit move runs only after every call numbered before it has finished, a call counted twice (skipped as
cancelled, then run after all) does not break the count, and a wait that runs out names the missing calls."""
import threading
import time

import pytest

from refimpl.store import OffloadStore
from refimpl.torch_runtime.runtime import TorchRuntime
from refimpl.worker import CallOrder, CallOrderError, RoleWorker, WorkerStateControl, register


def test_a_move_waits_for_every_call_numbered_before_it_whatever_the_arrival_order():
    order = CallOrder()
    log = []

    def call(seq, after, pause):
        order.wait(after, 10, f"call {seq}")
        log.append(("start", seq))
        time.sleep(pause)
        log.append(("end", seq))
        order.finish(seq)

    move = threading.Thread(target=call, args=(2, 2, 0))  # arrives first
    move.start()
    time.sleep(0.05)
    late = [threading.Thread(target=call, args=(s, 0, 0.1)) for s in (1, 0)]
    for t in late:
        t.start()
    for t in (move, *late):
        t.join(10)
    assert log.index(("start", 2)) > max(log.index(("end", 0)), log.index(("end", 1))), log
    assert order.finished_below == 3


def test_a_call_counted_twice_is_ignored_and_a_wait_that_runs_out_names_the_missing_calls():
    order = CallOrder()
    order.finish(0)
    order.finish(0)  # skipped as cancelled, then run after all
    order.finish(2)
    assert order.finished_below == 1
    with pytest.raises(CallOrderError, match=r"call 3 offload_states\(\) waited 0.1 s .*calls \[1\]"):
        order.wait(3, 0.1, "call 3 offload_states()")
    order.finish(1)
    order.wait(3, 0.1, "call 3")
    assert order.finished_below == 3


class _Worker(RoleWorker):
    def setup(self):
        import torch

        self.model = torch.nn.Linear(4, 2)
        store = OffloadStore(TorchRuntime("cpu"))
        store.attach_module(self.model)
        self.state_control = WorkerStateControl(store)

    @register
    def interrupted(self):
        raise KeyboardInterrupt("planted")


def test_an_interrupted_call_comes_out_as_call_interrupted_error_and_counts_as_finished():
    from refimpl.worker import CallInterruptedError

    w = _Worker("r", 0, 1)
    w.setup()
    with pytest.raises(CallInterruptedError, match=r"interrupted\(\) was interrupted: KeyboardInterrupt: planted"):
        w.timeshare_call("interrupted", (), {}, (0, 0, 5.0))
    assert w.call_order.finished_below == 1, "a later move does not wait for it"
    assert w.timeshare_moves()["offloaded"] and w.timeshare_moves()["rank_local"]
