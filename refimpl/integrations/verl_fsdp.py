"""verl's FSDP offload functions, backed by the offload store: same names, signatures and end states.

verl (``verl/utils/fsdp_utils.py``, 0.9.1) moves a model with ``model.to("cpu")`` and back with
``model.to(device)``, and the optimizer state tensor by tensor with ``.to(...)``. These functions do
the same moves through one :class:`~refimpl.store.OffloadStore` per module and per optimizer
(:mod:`refimpl.integrations.stores`): exact-size pinned host buffers, one flat device buffer per
dtype on reload, bit-exact. What differs, on purpose:

* While offloaded, the parameters and optimizer state keep their shape, dtype and *device* but their
  values cannot be read (``OffloadedTensorError``, "reload() first"); after verl's own offload they
  are readable CPU tensors. verl's FSDP engine reads them in that state in four methods (the FSDP2
  weight export to the rollout and the checkpoint calls); :func:`refimpl.integrations.verl.patch`
  makes those load the state first (docs/integrations.md).
* ``non_blocking`` does not exist here: every call returns with its copies complete.
* FSDP1 (``FullyShardedDataParallel``) modules are refused (:class:`UnsupportedModelError`); their
  flat parameters are views the store cannot re-point. FSDP2 (``fully_shard``) and plain modules work.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from refimpl.integrations.errors import DeviceMismatchError, ForeignOffloadError, UnsupportedModelError
from refimpl.integrations.stores import runtime, slot_for, slot_of

logger = logging.getLogger(__name__)


def _check_not_fsdp1(model: Any, call: str) -> None:
    if type(model).__name__ == "FullyShardedDataParallel" or hasattr(model, "_fsdp_wrapped_module"):
        raise UnsupportedModelError(
            f"{call}: {type(model).__name__} is FSDP1, whose flat parameters the offload store cannot move; "
            f"shard the model with fully_shard (verl: strategy=fsdp2), or call verl's own function for it")
    if not isinstance(model, torch.nn.Module):
        raise UnsupportedModelError(f"{call}: model must be a torch.nn.Module, got {type(model).__name__}")


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


def _host_tensors(tensors: Any) -> list[torch.Tensor]:
    return [t for t in tensors if isinstance(t, torch.Tensor) and _local(t).device.type == "cpu"]


def _model_store(model: Any) -> Any:
    return slot_for(model, lambda store: store.attach_module(model, name="model")).store


def _optimizer_store(optimizer: Any) -> Any:
    return slot_for(optimizer, lambda store: store.attach_optimizer(optimizer, name="optim")).store


def _optimizer_state_tensors(optimizer: Any) -> list[torch.Tensor]:
    # AdamW keeps ``step`` on the host unless capturable: not a sign of an offload
    return [v for st in optimizer.state.values() for k, v in st.items() if isinstance(v, torch.Tensor) and k != "step"]


@torch.no_grad()
def offload_fsdp_model_to_cpu(model: Any, empty_cache: bool = True) -> None:
    """Move ``model``'s parameters, gradients and buffers to host memory (verl's function of this name).

    Gradients are kept (as ``model.to("cpu")`` keeps them). ``empty_cache``: return the freed device
    blocks to the driver afterwards. Twice in a row is the same as once."""
    _check_not_fsdp1(model, "offload_fsdp_model_to_cpu(model)")
    store = _model_store(model)
    store.offload()
    if empty_cache:
        store.rt.empty_cache()


@torch.no_grad()
def offload_fsdp2_model_to_cpu(model: Any, empty_cache: bool = True) -> None:
    """verl's FSDP2 variant: the same as :func:`offload_fsdp_model_to_cpu`."""
    _check_not_fsdp1(model, "offload_fsdp2_model_to_cpu(model)")
    offload_fsdp_model_to_cpu(model, empty_cache)


@torch.no_grad()
def load_fsdp_model_to_gpu(model: Any) -> None:
    """Bring ``model``'s state back to the device (verl's function of this name); nothing to do if it
    is resident. Raises :class:`ForeignOffloadError` if its parameters were moved to the host by
    something else (verl's own offload), which this function would not bring back."""
    _check_not_fsdp1(model, "load_fsdp_model_to_gpu(model)")
    slot = slot_of(model)
    if slot is None or not slot.store.is_offloaded("params"):
        rt = runtime() if slot is None else slot.store.rt
        moved = _host_tensors(model.parameters()) if rt.device.type != "cpu" else []
        if moved:
            raise ForeignOffloadError(
                f"load_fsdp_model_to_gpu(model): {len(moved)} parameters are on the host but were not offloaded "
                f"by this function's store (moved by verl's own offload?); offload and load with the same "
                f"family of functions")
        return
    slot.store.reload()


@torch.no_grad()
def load_fsdp2_model_to_gpu(model: Any) -> None:
    """verl's FSDP2 variant: the same as :func:`load_fsdp_model_to_gpu`."""
    load_fsdp_model_to_gpu(model)


@torch.no_grad()
def offload_fsdp_optimizer(optimizer: Any) -> None:
    """Move ``optimizer``'s state to host memory (verl's function of this name). Before the first
    ``step()`` there is no state and nothing happens, as in verl."""
    if not isinstance(getattr(optimizer, "state", None), dict) or not hasattr(optimizer, "param_groups"):
        raise TypeError(f"offload_fsdp_optimizer(optimizer): expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if not optimizer.state and slot_of(optimizer) is None:
        return
    _optimizer_store(optimizer).offload()


def _same_device(device_id: Any, device: torch.device) -> bool:
    if isinstance(device_id, bool):
        return False
    if isinstance(device_id, int):
        return device.type != "cpu" and device.index == device_id
    try:
        want = torch.device(device_id)
    except (TypeError, RuntimeError):
        return False
    return want.type == device.type and (want.index is None or want.index == device.index)


@torch.no_grad()
def load_fsdp_optimizer(optimizer: Any, device_id: Any) -> None:
    """Bring ``optimizer``'s state back (verl's function of this name). ``device_id`` (an index, ``"cuda"``,
    ``"cuda:0"``, a ``torch.device``) must name the device the store reloads to, the process runtime's:
    anything else raises :class:`DeviceMismatchError` (verl's function would move the state there)."""
    slot = slot_of(optimizer)
    rt = slot.store.rt if slot is not None else runtime()
    if not _same_device(device_id, rt.device):
        raise DeviceMismatchError(
            f"load_fsdp_optimizer(optimizer, device_id={device_id!r}): the store reloads to {rt.device}, the "
            f"device of this process's runtime; pass that device (or make the runtime on the device you mean: "
            f"refimpl.integrations.stores.use_runtime)")
    if slot is None or not slot.store.is_offloaded("optimizer"):
        moved = _host_tensors(_optimizer_state_tensors(optimizer)) if rt.device.type != "cpu" else []
        if moved:
            raise ForeignOffloadError(
                f"load_fsdp_optimizer(optimizer, device_id): {len(moved)} optimizer state tensors are on the host "
                f"but were not offloaded by this function's store (moved by verl's own offload?); offload and "
                f"load with the same family of functions")
        return
    slot.store.reload()


__all__ = ["load_fsdp2_model_to_gpu", "load_fsdp_model_to_gpu", "load_fsdp_optimizer", "offload_fsdp2_model_to_cpu",
           "offload_fsdp_model_to_cpu", "offload_fsdp_optimizer"]
