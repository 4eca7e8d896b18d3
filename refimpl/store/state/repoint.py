"""Re-pointing a tensor at another storage (``set_``) without losing its autograd identity.

[Note: autograd identity]
``Tensor.set_`` resets a leaf's gradient accumulator (torch treats it like ``resize_``): after
it, ``p.expand_as(p).grad_fn.next_functions[0][0]`` is a new AccumulateGrad node and every hook
registered on the old one (torch DDP's reducer, Megatron DDP) never fires again. ``p.data = t``
swaps the storage and geometry under the same autograd metadata, keeping the node (same dtype
and device). So a tensor that requires grad is re-pointed through a carrier tensor and ``.data``;
its version counter is bumped as ``set_`` bumps it, so a backward through a graph recorded
before the re-point still raises instead of reading the placeholder.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

_ZERO_STRIDES: dict[int, tuple[int, ...]] = {}
ZERO_STRIDES: Mapping[int, tuple[int, ...]] = _ZERO_STRIDES
"""All-zero strides by dimension count, filled by :func:`zero_strides` (read it, never write it: a hot
loop's ``ZERO_STRIDES.get(ndim)`` saves a call)."""


def repoint_tensor(t: torch.Tensor, storage: Any, offset: int, size: Any, stride: Any) -> None:
    """``t.set_(storage, offset, size, stride)`` that keeps ``t``'s autograd identity (see
    [Note: autograd identity]): its gradient accumulator, hooks, ``is_leaf`` and ``requires_grad``.
    Call it under ``torch.no_grad()``."""
    if t.requires_grad:
        carrier = torch.empty(0, dtype=t.dtype, device=t.device)
        carrier.set_(storage, offset, size, stride)
        t.data = carrier
        _increment_version(t)
    else:
        t.set_(storage, offset, size, stride)


_increment_version = torch.autograd.graph.increment_version


def zero_strides(ndim: int) -> tuple[int, ...]:
    """``(0,) * ndim``, cached."""
    z = _ZERO_STRIDES.get(ndim)
    if z is None:
        z = _ZERO_STRIDES[ndim] = (0,) * ndim
    return z


__all__ = ["ZERO_STRIDES", "repoint_tensor", "zero_strides"]
