"""The store's side of checkpointing (DCP) while state is offloaded.

Theory of operation
-------------------
A ``torch.distributed.checkpoint`` (DCP) save needs each rank's tensors, and
for DTensors their mesh and placements. While the state is offloaded the
device storages are empty, so a naive save would first reload everything to
the device (time, device memory) or stage a second host copy (host memory).
:func:`save_path` picks one of three paths:

* :attr:`SavePath.HOST_BUFFERS` (``local`` backend, state offloaded): every
  tensor is held whole in this rank's pinned host buffers, so the checkpoint
  reads them in place (:func:`tensors_for_save` returns host *views*, no copy,
  no reload). With an async save, the buffers must not be overwritten until
  the write has finished: :func:`hold_host_buffers` registers the save's
  future, and the store's next offload calls :func:`wait_for_host_readers`
  before it copies anything into them. Reload only reads host buffers and
  does not wait.
* :attr:`SavePath.RELOAD` (``local_dedup`` with a replicated layout
  offloaded): each rank holds only its 1/N slice, which is not a tensor DCP
  can describe (a slice cuts across tensors and rows). The state is rebuilt
  on the device with the normal reload (one all-gather per layout), saved
  from there, and offloaded again. Why not rebuild on the host instead: that
  needs a full host copy per rank for the duration of the save, the very
  memory dedup exists to save, plus a CPU all-gather at a fraction of
  NVLink speed. The device path uses memory the role owns whenever it runs.
* :attr:`SavePath.DEVICE` (the state is on the device): save the live tensors.

The DCP calls themselves live in :mod:`refimpl.torch_runtime.dcp` (only runtime
adapters may import ``torch.distributed``), with the checksums every save
writes and every load verifies; this module only finds tensors, names and
layouts, so it also runs on the simulator. Its errors are the store's
(:class:`~refimpl.store.CheckpointError` and its subclasses).

Names: a tensor is saved under its registered name (``model.inp.weight``,
``optim.state.0.exp_avg``). DCP flattens nested dicts with dots, so
``{"model": model.state_dict()}`` loads a checkpoint saved from
``attach_module(model, name="model")``. FSDP2's padded ``_sharded_param_data``
(registered as ``...#_sharded_param_data``) shares storage with the local shard
and is not saved separately.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from refimpl.store.backends.host_readers import hold_host_buffers, host_readers_pending, wait_for_host_readers
from refimpl.store.config import Category
from refimpl.store.errors import CheckpointPathError
from refimpl.store.state.layout import LayoutState
from refimpl.store.store import check_store

DEFAULT_INCLUDE = (Category.PARAMS,)


class SavePath(enum.Enum):
    """How a checkpoint reads the state; see the module docstring."""

    HOST_BUFFERS = "host_buffers"
    RELOAD = "reload"
    DEVICE = "device"


@dataclass(frozen=True)
class SavedTensor:
    """One tensor to checkpoint: its registered name, the plain tensor to read, and its DTensor if any.

    ``tensor`` is a host view of the store's buffer on the host path and the
    live device tensor on the device path; ``dtensor`` (the DTensor whose
    local part it is) carries mesh, placements and global shape.
    """

    name: str
    tensor: torch.Tensor
    dtensor: Any = None


def _layouts(store: Any, cats: frozenset[Category]) -> list[Any]:
    return [lay for lay in store.layouts.values() if lay.category in cats]


def save_path(store: Any, include: Iterable[Category | str] | Category | str | None = DEFAULT_INCLUDE) -> SavePath:
    """Which path a save of ``include`` takes now (raises if some of it is offloaded and some not)."""
    check_store(store, "save_path(store, include)")
    cats = Category.select(include)
    offloaded = {c for c in cats if store.is_offloaded(c)}
    if not offloaded:
        return SavePath.DEVICE
    if offloaded != cats:
        raise CheckpointPathError(
            f"{sorted(c.value for c in offloaded)} are offloaded but {sorted(c.value for c in cats - offloaded)} "
            "are not; offload or reload them together before saving"
        )
    for lay in _layouts(store, cats):
        if lay.state is LayoutState.OFFLOADED and not lay.dropped and lay.entries:
            e = lay.entries[0]
            if store.backend.host_view(lay, e.offset, e.offset + e.numel) is None:
                return SavePath.RELOAD
    return SavePath.HOST_BUFFERS


def tensors_for_save(
    store: Any, include: Iterable[Category | str] | Category | str | None = DEFAULT_INCLUDE
) -> list[SavedTensor]:
    """The tensors of ``include`` as a checkpoint reads them on the current path (no copies).

    Host path: views into the pinned buffers (each shares its buffer's
    storage). Device path: the live registered tensors. Raises
    :class:`CheckpointPathError` on the reload path (reload first).
    """
    check_store(store, "tensors_for_save(store, include)")
    cats = Category.select(include)
    path = save_path(store, cats)
    if path is SavePath.RELOAD:
        raise CheckpointPathError(
            "this state is held as 1/N slices per rank (local_dedup); rebuild it on the device first "
            "(store.reload), as refimpl.runtime.dcp does on the reload path"
        )
    host = store.host_tensors(cats) if path is SavePath.HOST_BUFFERS else {}
    out: list[SavedTensor] = []
    seen: set[str] = set()
    for lay in sorted(_layouts(store, cats), key=lambda x: x.key.sort_key()):
        if path is SavePath.HOST_BUFFERS and lay.dropped:
            continue
        for e in lay.entries:
            for r in e.refs:
                if "#" in r.name or r.name in seen:
                    continue
                seen.add(r.name)
                if path is SavePath.HOST_BUFFERS:
                    t = host.get(r.name)
                    if t is None:
                        raise CheckpointPathError(f"{r.name}: the backend holds no whole host copy of it")
                    dt = r.dtensor
                else:
                    t = r.live()
                    if t is None:
                        continue  # the framework dropped it (e.g. grads set to None)
                    dt = r.live_dtensor()
                out.append(SavedTensor(r.name, t, dt))
    return out


__all__ = [
    "CheckpointPathError",
    "SavePath",
    "SavedTensor",
    "hold_host_buffers",
    "host_readers_pending",
    "save_path",
    "tensors_for_save",
    "wait_for_host_readers",
]
