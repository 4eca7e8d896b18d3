"""Argument checks of the store's entry points: what the common mistakes look like, and what to say.

The generic checks are :mod:`refimpl.arguments`; this module knows the store's
own objects, so a model passed where the runtime goes or a list among the tensors
of ``attach_tensors`` fails at the call with what to do instead (a client passed
where the store goes: :func:`refimpl.store.store.check_store`). Called at
construction and attach time only.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from refimpl.arguments import ArgumentTypeError, describe, expect
from refimpl.runtime.base import Runtime

RUNTIME = "a Runtime (TorchRuntime(device) or SimRuntime)"


def check_runtime(runtime: Any, call: str, param: str = "rt") -> Runtime:
    """``runtime`` if it is a :class:`Runtime`; else an :class:`ArgumentTypeError` saying what was probably meant."""
    hint = ""
    if isinstance(runtime, torch.nn.Module):
        hint = "did you mean store.attach_module(model)?"
    elif isinstance(runtime, (torch.device, str)):
        hint = f"wrap the device in a runtime: TorchRuntime({str(runtime)!r})"
    return expect(runtime, Runtime, call, param, RUNTIME, hint=hint)


def check_module(module: Any, call: str) -> torch.nn.Module:
    """``module`` if it is an ``nn.Module`` (an optimizer is pointed to ``attach_optimizer``)."""
    hint = "use store.attach_optimizer(optimizer) for an optimizer" if _is_optimizer(module) else ""
    return expect(module, torch.nn.Module, call, "module", "a torch.nn.Module", hint=hint)


def check_optimizer(optimizer: Any, call: str, param: str = "optimizer", optional: bool = False) -> Any:
    """``optimizer`` if it looks like a ``torch.optim.Optimizer`` (``state`` and ``param_groups``)."""
    if (optional and optimizer is None) or _is_optimizer(optimizer):
        return optimizer
    hint = "use store.attach_module(model) for a model" if isinstance(optimizer, torch.nn.Module) else ""
    expected = "a torch.optim.Optimizer" + (" or None" if optional else "")
    raise ArgumentTypeError(f"{call}: {param} must be {expected}, got {describe(optimizer)}"
                            + (f"; {hint}" if hint else ""))


def check_tensors(tensors: Any, call: str) -> Mapping[str, Any]:
    """``tensors`` if it is a mapping of str to tensors; the values of a plain dict are checked now, a
    live mapping (a client's view, read at every offload) is checked by the offload that reads it."""
    expect(tensors, Mapping, call, "tensors", "a mapping of names to tensors (e.g. {'w': tensor})")
    if isinstance(tensors, dict):
        for key, t in tensors.items():
            expect(key, str, call, "every key of tensors", "a str")
            if not isinstance(getattr(t, "_local_tensor", t), torch.Tensor):
                raise ArgumentTypeError(f"{call}: tensors[{key!r}] must be a torch.Tensor (or DTensor), got "
                                        f"{describe(t)}; convert it first, e.g. torch.tensor(value, device=...)")
    return tensors


def check_early_tensors(tensors: Any, device: torch.device, call: str) -> list[Any]:
    """``tensors`` (one tensor, or an iterable of tensors or DTensors) as a list, each on ``device`` or the host;
    anything else is refused naming its position."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    try:
        items = list(tensors)
    except TypeError:
        raise ArgumentTypeError(f"{call}: tensors must be an iterable of tensors, got {describe(tensors)}") from None
    for i, t in enumerate(items):
        local = getattr(t, "_local_tensor", t)
        if not isinstance(local, torch.Tensor):
            raise ArgumentTypeError(f"{call}: tensors[{i}] must be a torch.Tensor (or DTensor), got {describe(t)}")
        if local.device != device and local.device.type != "cpu":
            raise ValueError(f"{call}: tensors[{i}] is on {local.device}, this store's device is {device}")
    return items


def _is_optimizer(obj: Any) -> bool:
    return hasattr(obj, "state") and hasattr(obj, "param_groups")


__all__ = ["RUNTIME", "check_early_tensors", "check_module", "check_optimizer", "check_runtime", "check_tensors"]
