"""ROLL's ``offload_states`` / ``load_states`` through the store, on an FSDP2 model on 2 Gloo ranks.

ROLL is not installable from the package registry (the ``roll`` there is another project), so the
strategy here is ROLL's FSDP2 strategy's two methods as written in ``roll/distributed/strategy/
fsdp2_strategy.py`` (alibaba/ROLL, 2026-08-18; the branch without FSDP2's CPUOffloadPolicy, with
``current_platform`` the CPU), and the calls are ROLL's worker order (``roll/utils/context_managers.py:
state_offload_manger``): load ``[model_params, other_params]``, offload the excluded types, train, offload
everything unless ``meta_info["is_offload_states"]`` is False. The same training runs through ROLL's
methods, through the store (``patch_strategy_class``) and without offload; losses and the final state
must be bitwise equal.
"""
from __future__ import annotations

from enum import Enum

import pytest
import torch

from tests._dist import run_distributed


class RollOffloadStateType(str, Enum):
    """ROLL's own enum (``roll/utils/offload_states.py``), as ROLL's callers pass it."""

    model_params = "model_params"
    optimizer_states = "optimizer_states"
    other_params = "other_params"


class RollFSDP2Strategy:
    """``FSDP2StrategyBase.load_states`` / ``offload_states`` as ROLL writes them (cpu_offload disabled)."""

    cpu_offload_enabled = False

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def _move_optimizer_states(self, device, non_blocking=False):
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value):
                    state[key] = value.to(device, non_blocking=non_blocking)

    def load_states(self, include=None, non_blocking=False):
        if include is None or RollOffloadStateType.model_params in include:
            self.model.to("cpu", non_blocking=non_blocking)  # current_platform.current_device() on the CPU
        self._move_optimizer_states("cpu", non_blocking=non_blocking)

    def offload_states(self, include=None, non_blocking=False):
        if include is None or RollOffloadStateType.model_params in include:
            self.model.to("cpu", non_blocking=non_blocking)


def _train(rank, family):
    from refimpl.integrations import roll
    from refimpl.store import is_parked
    from tests.integrations.test_verl_fsdp import _model_and_optimizer, _state, train_step

    model, opt = _model_and_optimizer()
    cls = type("Strategy", (RollFSDP2Strategy,), {})
    if family == "store":
        roll.patch_strategy_class(cls)
    strategy = cls(model, opt)
    gen = torch.Generator().manual_seed(rank)
    losses, seen, metrics = [], [], {}
    load = {"include": [RollOffloadStateType.model_params, RollOffloadStateType.other_params]}
    for step in range(4):
        keep = step == 1  # the next call finds the state on the device
        with roll.state_offload_manager(strategy, metrics, "train_step", is_offload_states=not keep, load_kwargs=load):
            losses.append(train_step(model, opt, gen))
        seen.append((is_parked(next(model.parameters())._local_tensor),
                     any(is_parked(v._local_tensor) for st in opt.state.values() for v in st.values()
                         if hasattr(v, "_local_tensor"))))
    with roll.state_offload_manager(strategy, metrics, "compute_log_probs", load_kwargs={
            "include": [RollOffloadStateType.model_params]}):
        with torch.no_grad():
            losses.append(model(torch.arange(6).view(1, 6)).float().sum().view(torch.int32).item())
    strategy.load_states()
    stats = None
    if family == "store":
        s = roll.StoreStates(model, opt)._model_store().stats()
        stats = dict(offloads=s.offloads, by_category=dict(s.bytes_by_category))
    return losses, _state(model, opt), seen, stats, sorted(metrics)


def _three_ways(rank, world):
    return {family: _train(rank, family) for family in ("none", "roll", "store")}


def test_roll_worker_order_through_the_store_trains_bitwise():
    for rank, runs in enumerate(run_distributed(_three_ways, 2, timeout=300)):
        (l_roll, s_roll, _, _, _), (l_store, s_store, seen, stats, keys) = runs["roll"], runs["store"]
        assert l_roll == runs["none"][0] and l_store == l_roll, f"rank {rank}: losses differ"
        assert [k for k in s_roll if s_roll[k] != s_store[k]] == [] and len(s_roll) > 8
        # between calls the parameters and the optimizer state are in host memory, except after the call
        # whose batch said is_offload_states=False
        assert seen == [(True, True), (False, False), (True, True), (True, True)], seen
        assert stats["by_category"]["params"] > 0, stats
        assert "time/train_step/onload" in keys and "time/compute_log_probs/offload" in keys


def test_include_is_read_as_roll_passes_it():
    from refimpl.integrations import roll
    from refimpl.integrations.errors import UnknownStateTypeError

    T = roll.OffloadStateType
    assert roll.state_types(None) == roll.ALL_TYPES
    assert roll.state_types(RollOffloadStateType.other_params) == (T.other_params,)  # one member, not a list
    assert roll.state_types(["model_params", RollOffloadStateType.optimizer_states]) == (T.model_params,
                                                                                         T.optimizer_states)
    assert roll.load_exclude([T.model_params, T.other_params]) == [T.optimizer_states]
    with pytest.raises(UnknownStateTypeError, match="'model_param' is not an OffloadStateType"):
        roll.state_types(["model_param"])
    assert roll.offload_after({}) and not roll.offload_after({"is_offload_states": False})
    with pytest.raises(TypeError, match="True or False"):
        roll.offload_after({"is_offload_states": "no"})
    with pytest.raises(ValueError, match="optimizer_policy"):
        roll.StoreStates(None, None, "sometimes")


def test_by_include_policy_moves_exactly_what_include_names():
    from refimpl.integrations import roll
    from refimpl.integrations.stores import store_of

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    before = [t.clone() for t in (model.weight, model.bias, *opt.state[model.weight].values())]
    states = roll.StoreStates(model, opt, optimizer_policy="by_include")
    states.offload_states(include=[roll.OffloadStateType.model_params])
    assert store_of(model).is_offloaded("params") and not store_of(model).is_offloaded("grads")
    assert store_of(opt) is None, "the optimizer was not named"
    states.offload_states(include=RollOffloadStateType.optimizer_states)
    states.offload_states(include=RollOffloadStateType.other_params)
    assert store_of(opt).is_offloaded("optimizer") and store_of(model).is_offloaded("grads")
    states.load_states(include=[roll.OffloadStateType.optimizer_states])
    assert not store_of(opt).is_offloaded("optimizer") and store_of(model).is_offloaded("params")
    states.load_states()
    after = [model.weight, model.bias, *opt.state[model.weight].values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_patching_a_strategy_object_or_class_and_undoing_it():
    from refimpl.integrations import roll
    from refimpl.store import is_parked

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    sub = type("Sub", (RollFSDP2Strategy,), {})
    undo = roll.patch_strategy_class(sub)
    assert sub.offload_states is not RollFSDP2Strategy.offload_states
    undo.undo()
    assert "offload_states" not in sub.__dict__ and sub.load_states is RollFSDP2Strategy.load_states
    strategy = RollFSDP2Strategy(model, torch.optim.AdamW(model.parameters()))
    roll.patch_strategy(strategy, optimizer_policy="by_include")
    strategy.offload_states()
    assert is_parked(model.weight)
    strategy.load_states(include=RollOffloadStateType.model_params)
    assert not is_parked(model.weight)
    from refimpl.integrations.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="defines no offload_states"):
        roll.patch_strategy_class(int)
