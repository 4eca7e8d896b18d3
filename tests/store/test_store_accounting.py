"""The store's accounting (``StoreStats``): the bytes each offload and reload moved, by category, and the time of
each phase, as a worker's logs and dashboards read them."""
from __future__ import annotations

import pytest
import torch

import sim
from refimpl.store import OffloadStore
from refimpl.store.stats import PhaseClock
from refimpl.torch_runtime.runtime import TorchRuntime


def _trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Linear(48, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    nbytes = {"params": sum(p.nbytes for p in model.parameters()),
              "grads": sum(p.grad.nbytes for p in model.parameters()),
              "optimizer": sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))}
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(model)
    store.attach_optimizer(opt)
    return store, nbytes


def test_stats_give_the_bytes_each_offload_and_reload_moved_by_category():
    store, nbytes = _trained()
    store.offload()
    s = store.stats()
    assert s.bytes_by_category == nbytes and s.state_bytes == sum(nbytes.values())
    assert s.last_offload_bytes == sum(nbytes.values()) and s.offloads == 1
    assert s.offloaded == ("buffers", "grads", "optimizer", "params")  # every category, those with no state too
    store.reload()
    s = store.stats()
    assert s.last_reload_bytes == sum(nbytes.values()) and s.reloads == 1 and s.offloaded == ()


def test_an_offload_that_drops_gradients_counts_only_the_bytes_it_copied():
    store, nbytes = _trained()
    store.offload(drop_grads=True)
    s = store.stats()
    assert s.last_offload_bytes == nbytes["params"] + nbytes["optimizer"], "dropped gradients are not moved bytes"
    assert s.bytes_by_category == nbytes  # the state the store holds is still all of it
    store.reload()
    store.offload()
    assert store.stats().last_offload_bytes == sum(nbytes.values())


def test_each_phase_is_timed_from_the_end_of_the_one_before():
    """``StoreStats.phases``: the seconds of each phase on the runtime's clock, so the phases of an offload add up
    to its time, not a running total."""
    world = sim.SimWorld(1, payload="meta", seed=0)

    async def job(rt):
        clock = PhaseClock(rt, "reload")
        for seconds, name in ((1.0, "issue"), (2.0, "validate"), (0.5, "wait")):
            await rt.sleep(seconds)
            clock.lap(name)
        return clock.laps

    (laps,) = world.run(job)
    assert laps == pytest.approx({"reload.issue": 1.0, "reload.validate": 2.0, "reload.wait": 0.5})
