"""ROLL's worker offload/reload (``offload_states`` / ``load_states``) backed by the offload store.

ROLL is not on the package registry (the ``roll`` there is another project), so this module follows
ROLL's source as read (alibaba/ROLL, 2026-08-18): ``roll/utils/offload_states.py`` defines
``OffloadStateType`` (copied below, same values); every strategy in
``roll/distributed/strategy/*_strategy.py`` has ``offload_states(include=None, non_blocking=False)`` and
``load_states(include=None, non_blocking=False)``, ``include`` being None (everything), a list of
``OffloadStateType`` or one of them; ``roll/utils/context_managers.py:state_offload_manger`` loads
``load_kwargs["include"]``, offloads the other types, runs the call, and offloads everything unless the
batch says ``meta_info["is_offload_states"] = False`` (``roll/pipeline/base_worker.py``).

The three types map to the store's categories: ``model_params`` to the model's parameters and buffers,
``other_params`` to its gradients, ``optimizer_states`` to the optimizer's state (one store per object,
:mod:`refimpl.integrations.stores`). :class:`StoreStates` is a strategy's pair of methods;
:func:`patch_strategy` puts them on a strategy object, :func:`patch_strategy_class` on a strategy class
(ROLL's ``FSDP2StrategyBase``, whose objects have ``model`` and ``optimizer``).
"""
from __future__ import annotations

import contextlib
import logging
import time
from enum import Enum
from typing import Any, Iterable, Iterator, Mapping

import torch

from refimpl.integrations.errors import UnknownStateTypeError, UnsupportedModelError
from refimpl.integrations.rebinding import Rebinding
from refimpl.integrations.stores import slot_for, slot_of

logger = logging.getLogger(__name__)


class OffloadStateType(str, Enum):
    """ROLL's ``roll.utils.offload_states.OffloadStateType``, same names and values (ROLL's own members
    compare equal to these)."""

    model_params = "model_params"
    optimizer_states = "optimizer_states"
    other_params = "other_params"


ALL_TYPES = (OffloadStateType.model_params, OffloadStateType.other_params, OffloadStateType.optimizer_states)
#: state type -> the store categories of the model it moves
MODEL_CATEGORIES: dict[OffloadStateType, tuple[str, ...]] = {
    OffloadStateType.model_params: ("params", "buffers"),
    OffloadStateType.other_params: ("grads",),
}


def state_types(include: Any) -> tuple[OffloadStateType, ...]:
    """``include`` as ROLL passes it (None, one type, or an iterable of types or their values), checked."""
    if include is None:
        return ALL_TYPES
    items = [include] if isinstance(include, (str, Enum)) else list(include)
    out = []
    for item in items:
        value = item.value if isinstance(item, Enum) else item
        try:
            out.append(OffloadStateType(value))
        except ValueError:
            raise UnknownStateTypeError(
                f"include={include!r}: {item!r} is not an OffloadStateType; use "
                f"{[t.value for t in OffloadStateType]} (or None for all)") from None
    return tuple(dict.fromkeys(out))


#: when the optimizer state moves (:class:`StoreStates`)
OPTIMIZER_POLICIES = ("fsdp2", "by_include")


class StoreStates:
    """``offload_states`` / ``load_states`` of one model and its optimizer (either may be None) through
    their offload stores; ``non_blocking`` is accepted and changes nothing (every call returns with its
    copies complete). Offloading what is offloaded, or loading what is resident, does nothing.

    ``optimizer_policy``: ``"fsdp2"`` (default) keeps the order of ROLL's FSDP2 strategy, whose
    ``load_states`` always loads the optimizer state and whose ``offload_states`` never moves it, because its
    ``train_step`` loads ``[model_params, other_params]``, offloads the excluded ``optimizer_states`` and then
    steps the optimizer: here the state is loaded by every ``load_states`` and offloaded only by a full
    ``offload_states()`` (include None, the end of every call), so it leaves the GPU while the other roles
    run. ``"by_include"`` moves it exactly when ``include`` names ``optimizer_states`` (ROLL's Megatron
    strategy's contract)."""

    def __init__(self, model: Any, optimizer: Any = None, optimizer_policy: str = "fsdp2") -> None:
        if optimizer_policy not in OPTIMIZER_POLICIES:
            raise ValueError(f"StoreStates(optimizer_policy={optimizer_policy!r}): use one of {OPTIMIZER_POLICIES}")
        self.optimizer_policy = optimizer_policy
        if model is not None and not isinstance(model, torch.nn.Module):
            raise UnsupportedModelError(f"StoreStates(model): expected a torch.nn.Module (ROLL's FSDP2/HF "
                                        f"strategies), got {type(model).__name__}")
        if type(model).__name__ == "FullyShardedDataParallel" or hasattr(model, "_fsdp_wrapped_module"):
            raise UnsupportedModelError("StoreStates(model): FSDP1 modules cannot be moved by the store; use "
                                        "ROLL's fsdp2 strategy")
        self.model, self.optimizer = model, optimizer

    def _model_store(self) -> Any:
        return slot_for(self.model, lambda s: s.attach_module(self.model, name="model")).store

    def _optimizer_store(self) -> Any | None:
        opt = self.optimizer
        if opt is None or (not opt.state and slot_of(opt) is None):
            return None  # before the first step there is no state
        return slot_for(opt, lambda s: s.attach_optimizer(opt, name="optim")).store

    def offload_states(self, include: Any = None, non_blocking: bool = False) -> None:
        """Move the state types of ``include`` (default: all) to host memory."""
        types = state_types(include)
        cats = [c for t in types for c in MODEL_CATEGORIES.get(t, ())]
        if cats and self.model is not None:
            store = self._model_store()
            store.offload(cats)
            store.rt.empty_cache()
        moves = include is None if self.optimizer_policy == "fsdp2" else OffloadStateType.optimizer_states in types
        if moves:
            store = self._optimizer_store()
            if store is not None:
                store.offload()
                store.rt.empty_cache()

    def load_states(self, include: Any = None, non_blocking: bool = False) -> None:
        """Bring the state types of ``include`` (default: all) back to the device."""
        types = state_types(include)
        cats = [c for t in types for c in MODEL_CATEGORIES.get(t, ())]
        slot = slot_of(self.model) if self.model is not None else None
        if slot is not None:
            cats = [c for c in cats if slot.store.is_offloaded(c)]
            if cats:
                slot.store.reload(cats)
        moves = self.optimizer_policy == "fsdp2" or OffloadStateType.optimizer_states in types
        if moves and self.optimizer is not None:
            oslot = slot_of(self.optimizer)
            if oslot is not None and oslot.store.is_offloaded("optimizer"):
                oslot.store.reload()


#: attribute of a patched strategy (or class) naming its optimizer policy
POLICY_ATTR = "_timeshare_optimizer_policy"


def _states_of(strategy: Any) -> StoreStates:
    return StoreStates(getattr(strategy, "model", None), getattr(strategy, "optimizer", None),
                       getattr(strategy, POLICY_ATTR, "fsdp2"))


def _offload_states(self: Any, include: Any = None, non_blocking: bool = False, **_: Any) -> None:
    """A strategy's ``offload_states`` through the offload store (:class:`StoreStates`)."""
    _states_of(self).offload_states(include, non_blocking)


def _load_states(self: Any, include: Any = None, non_blocking: bool = False, **_: Any) -> None:
    """A strategy's ``load_states`` through the offload store (:class:`StoreStates`)."""
    _states_of(self).load_states(include, non_blocking)


def patch_strategy(strategy: Any, optimizer_policy: str = "fsdp2") -> None:
    """Make one strategy object's ``offload_states`` / ``load_states`` go through the store (its ``model`` and
    ``optimizer`` are read at each call, so they may be built later; ``optimizer_policy``: :class:`StoreStates`)."""
    StoreStates(None, None, optimizer_policy)  # checks the policy
    strategy.__dict__[POLICY_ATTR] = optimizer_policy
    strategy.offload_states = _offload_states.__get__(strategy)
    strategy.load_states = _load_states.__get__(strategy)


def patch_strategy_class(cls: type, optimizer_policy: str = "fsdp2") -> Rebinding:
    """Replace ``offload_states`` / ``load_states`` on a strategy class (e.g. ROLL's ``FSDP2StrategyBase``);
    returns the :class:`Rebinding` whose ``undo()`` restores them."""
    StoreStates(None, None, optimizer_policy)
    for name in ("offload_states", "load_states"):
        if not callable(getattr(cls, name, None)):
            raise UnsupportedModelError(f"patch_strategy_class({cls.__name__}): it defines no {name}(); pass the "
                                        f"class that does (ROLL: FSDP2StrategyBase)")
    r = Rebinding()
    r.replace(cls, "offload_states", _offload_states)
    r.replace(cls, "load_states", _load_states)
    setattr(cls, POLICY_ATTR, optimizer_policy)
    return r


def load_exclude(include: Any) -> list[OffloadStateType]:
    """The state types not in ``include`` (ROLL's ``get_load_exclude_kwargs``): what a call that loads only
    ``include`` offloads first."""
    wanted = state_types(include)
    return [t for t in ALL_TYPES if t not in wanted]


def offload_after(meta_info: Mapping[str, Any]) -> bool:
    """Whether a call offloads its state at its end: ``meta_info["is_offload_states"]``, True if absent."""
    value = meta_info.get("is_offload_states", True)
    if not isinstance(value, bool):
        raise TypeError(f"meta_info['is_offload_states'] must be True or False, got {value!r}")
    return value


@contextlib.contextmanager
def state_offload_manager(strategy: Any, metrics: dict, metric_infix: str, is_offload_states: bool = True,
                          load_kwargs: Mapping[str, Any] | None = None) -> Iterator[None]:
    """ROLL's ``state_offload_manger`` on a strategy: load ``load_kwargs`` (``include``: only those, and the
    other types offloaded), run the block, offload everything if ``is_offload_states``. Seconds go to
    ``metrics["time/<infix>/onload"]``, ``.../execute``, ``.../offload``."""
    load_kwargs = dict(load_kwargs or {})
    t0 = time.perf_counter()
    strategy.load_states(**load_kwargs)
    if load_kwargs.get("include") is not None:
        strategy.offload_states(**{**load_kwargs, "include": load_exclude(load_kwargs["include"])})
    t1 = time.perf_counter()
    try:
        yield
    finally:
        t2 = time.perf_counter()
        if is_offload_states:
            strategy.offload_states()
        t3 = time.perf_counter()
        metrics.update({f"time/{metric_infix}/onload": t1 - t0, f"time/{metric_infix}/execute": t2 - t1,
                        f"time/{metric_infix}/offload": t3 - t2})


__all__ = ["ALL_TYPES", "MODEL_CATEGORIES", "OPTIMIZER_POLICIES", "OffloadStateType", "POLICY_ATTR", "StoreStates", "load_exclude", "offload_after",
           "patch_strategy", "patch_strategy_class", "state_offload_manager", "state_types"]
