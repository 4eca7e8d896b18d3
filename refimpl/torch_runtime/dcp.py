"""DCP checkpoints of an offload store's state: the ``torch.distributed.checkpoint`` calls.

The store-side logic (which path, which tensors, the host-buffer readers) is
:mod:`refimpl.store.checkpoint`; this runtime adapter only wraps tensors as
DTensors and calls DCP, because nothing else under ``refimpl/`` may import
``torch.distributed``.

    from refimpl.torch_runtime import dcp
    result = dcp.save(store, "/ckpt/step100")              # sync
    result = dcp.async_save(store, "/ckpt/step100")        # result.future
    dcp.load_into({"model": model.state_dict()}, "/ckpt/step100")

Paths (see :class:`refimpl.store.checkpoint.SavePath`): ``local`` offloaded
state is read straight from the pinned host buffers (no reload, no staging
copy: the async save uses a stager that hands DCP the buffers themselves and
the store's next offload waits for the write); ``local_dedup`` offloaded state
is reloaded (all-gather), saved from the device and offloaded again.

Async saves run DCP's upload in a thread. Its collectives must not share a
process group with the training thread's, so by default a dedicated Gloo group
is created once per process (every rank must make the same async saves in the
same order, as DCP requires anyway).
"""
from __future__ import annotations

import inspect
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import AsyncStager

from refimpl.store.checkpoint import (
    DEFAULT_INCLUDE,
    SavedTensor,
    SavePath,
    hold_host_buffers,
    save_path,
    tensors_for_save,
)

log = logging.getLogger(__name__)

_DCP_GROUP: Any = None


@dataclass
class SaveResult:
    """What a save did: its path, the DCP metadata (sync) or future (async), and what it read.

    ``tensors``: how many tensors were saved; ``host_buffer_bytes``: bytes read
    straight from the store's pinned buffers (0 off the host path);
    ``staged_ptrs``: data pointers DCP was handed, for checks that no staging
    copy was made.
    """

    path: SavePath
    tensors: int
    host_buffer_bytes: int
    seconds: float
    metadata: Any = None
    future: Future | None = None
    staged_ptrs: list[int] = field(default_factory=list)


class _InPlaceStager(AsyncStager):
    """Stages nothing: the store's host buffers *are* the staged copy (they change only at the next
    offload, which waits for the write). Records the pointers it handed over."""

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self.ptrs: list[int] = []

    def stage(self, state_dict: dict) -> dict:
        """Note the data pointer of every tensor leaf (a DTensor's local tensor) in :attr:`ptrs`; return
        ``state_dict`` itself, uncopied."""
        for v in _leaves(state_dict):
            local = getattr(v, "_local_tensor", v)
            if isinstance(local, torch.Tensor):
                self.ptrs.append(local.untyped_storage().data_ptr() + local.storage_offset() * local.element_size())
        return state_dict

    def synchronize_staging(self) -> None:
        """Nothing to wait for."""


def _leaves(d: Any) -> Iterable[Any]:
    if isinstance(d, dict):
        for v in d.values():
            yield from _leaves(v)
    else:
        yield d


def _as_saved(t: SavedTensor) -> torch.Tensor:
    """The plain tensor, or a DTensor with the original's spec around it (no copy, no device move)."""
    dt = t.dtensor
    if dt is None:
        return t.tensor
    from torch.distributed.tensor import DTensor

    try:
        return DTensor(t.tensor, dt._spec, requires_grad=False)
    except (AttributeError, TypeError):  # pragma: no cover - builds without the private constructor
        if dt.device_mesh.device_type != t.tensor.device.type:
            raise
        return DTensor.from_local(t.tensor, dt.device_mesh, dt.placements, run_check=False,
                                  shape=dt.shape, stride=dt.stride())


def state_dict_of(saved: list[SavedTensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``{source: {rest of name: tensor}}``; DCP flattens it back to the registered names."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for t in saved:
        head, _, rest = t.name.partition(".")
        out.setdefault(head, {})[rest or head] = _as_saved(t)
    return out


def _dcp_group() -> Any:
    global _DCP_GROUP
    if _DCP_GROUP is None and dist.is_initialized():
        _DCP_GROUP = dist.new_group(backend="gloo")
    return _DCP_GROUP


def save(
    store: Any, checkpoint_id: str | None = None, *, include: Any = DEFAULT_INCLUDE, storage_writer: Any = None,
    process_group: Any = None,
) -> SaveResult:
    """Save ``include`` of ``store`` with DCP, on the path :func:`save_path` picks; blocks until written."""
    return _save(store, checkpoint_id, include, storage_writer, process_group, asynchronous=False)


def async_save(
    store: Any, checkpoint_id: str | None = None, *, include: Any = DEFAULT_INCLUDE, storage_writer: Any = None,
    process_group: Any = None,
) -> SaveResult:
    """Start a DCP save in a thread; ``result.future`` completes when it is written.

    On the host path the store's buffers are handed to DCP as they are and
    the store's next offload waits for the future. ``process_group``
    defaults to a dedicated Gloo group (see the module docstring).
    """
    return _save(store, checkpoint_id, include, storage_writer, process_group, asynchronous=True)


def _save(store, checkpoint_id, include, storage_writer, process_group, *, asynchronous: bool) -> SaveResult:
    t0 = time.perf_counter()
    path = save_path(store, include)
    reloaded = path is SavePath.RELOAD
    if reloaded:
        log.info("checkpoint: state is held as dedup slices; reloading to the device to save it")
        store.reload(include)
    saved = tensors_for_save(store, include)
    if not saved:
        raise ValueError("nothing to save: the store has no tensors of these categories (has it offloaded once?)")
    state = state_dict_of(saved)
    host_bytes = sum(t.tensor.numel() * t.tensor.element_size() for t in saved) if path is SavePath.HOST_BUFFERS else 0
    result = SaveResult(path, len(saved), host_bytes, 0.0)
    try:
        if not asynchronous:
            result.metadata = dcp.save(state, checkpoint_id=checkpoint_id, storage_writer=storage_writer,
                                       process_group=process_group)
        else:
            pg = process_group if process_group is not None else _dcp_group()
            kwargs: dict[str, Any] = dict(checkpoint_id=checkpoint_id, storage_writer=storage_writer, process_group=pg)
            stager = None
            if path is SavePath.HOST_BUFFERS:
                if "async_stager" not in inspect.signature(dcp.async_save).parameters:  # pragma: no cover
                    raise RuntimeError("this torch's dcp.async_save takes no async_stager; use save() for the "
                                       "host-buffer path")
                stager = kwargs["async_stager"] = _InPlaceStager()
            response = dcp.async_save(state, **kwargs)
            staging = getattr(response, "staging_completion", None)
            if staging is not None and reloaded:
                staging.result()  # the device tensors are released by the offload below
            fut = getattr(response, "upload_completion", response)
            result.future = fut
            if stager is not None:
                result.staged_ptrs = stager.ptrs
                hold_host_buffers(store, fut)
    finally:
        if reloaded:
            # sync save has written; async save has staged its own copy (DCP's default stager)
            store.offload(include)
    result.seconds = time.perf_counter() - t0
    log.info("checkpoint %s: %d tensors via %s in %.3f s", checkpoint_id, len(saved), path.value, result.seconds)
    return result


def load_into(state_dict: dict, checkpoint_id: str | None = None, *, storage_reader: Any = None,
              process_group: Any = None) -> None:
    """Load a checkpoint into ``state_dict`` in place (e.g. ``{"model": model.state_dict()}``)."""
    dcp.load(state_dict, checkpoint_id=checkpoint_id, storage_reader=storage_reader, process_group=process_group)


__all__ = ["SaveResult", "async_save", "load_into", "save", "state_dict_of"]
