"""DCP checkpoints of an offload store's state: the ``torch.distributed.checkpoint`` calls.

The store-side logic (which path, which tensors, the host-buffer readers) is
:mod:`refimpl.store.checkpoint`; this runtime adapter only wraps tensors as
DTensors and calls DCP, because nothing else under ``refimpl/`` may import
``torch.distributed``.

    from refimpl.torch_runtime import dcp
    result = dcp.save(store, "/ckpt/step100")              # sync
    result = dcp.async_save(store, "/ckpt/step100")        # result.future
    dcp.load_into({"model": model.state_dict()}, "/ckpt/step100")   # verified, all or nothing

Paths (see :class:`refimpl.store.checkpoint.SavePath`): ``local`` offloaded
state is read straight from the pinned host buffers (no reload, no staging
copy: the async save uses a stager that hands DCP the buffers themselves and
the store's next offload waits for the write); ``local_dedup`` offloaded state
is reloaded (all-gather), saved from the device and offloaded again.

Async saves run DCP's upload in a thread. Its collectives must not share a
process group with the training thread's, so by default a dedicated Gloo group
is created once per process (every rank must make the same async saves in the
same order, as DCP requires anyway).

Integrity (docs/store.md, "Checkpoints: verified, all or nothing"): a save
writes a CRC-32 of every item beside its data file and of the metadata beside
it, and :func:`load_into` verifies what it reads against them
(:mod:`.dcp_checksums`); its plan must read every element of every target
exactly once (:mod:`.dcp_coverage`); the load goes into
a staging copy that is copied into the target only once every rank has loaded
it (:mod:`.dcp_staging`). torch's ``CheckpointException`` (a ``BaseException``)
comes out as :class:`~refimpl.store.CheckpointFailedError` or
:class:`~refimpl.store.CheckpointIntegrityError`.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager

from refimpl.arguments import ArgumentValueError, expect, expect_bool

from refimpl.store.checkpoint import (
    DEFAULT_INCLUDE,
    SavedTensor,
    SavePath,
    hold_host_buffers,
    save_path,
    tensors_for_save,
)
from refimpl.torch_runtime.dcp_checksums import checksummed, verified
from refimpl.torch_runtime.dcp_coverage import CoveringLoadPlanner
from refimpl.torch_runtime.dcp_staging import Staged, failed

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
    store: Any, checkpoint_id: str | os.PathLike | None = None, *, include: Any = DEFAULT_INCLUDE,
    storage_writer: Any = None, process_group: Any = None, checksums: bool = True,
) -> SaveResult:
    """Save ``include`` of ``store`` with DCP, on the path :func:`save_path` picks; blocks until written.

    ``checksums``: write a CRC-32 of every saved item beside its data file (:mod:`.dcp_checksums`), which
    :func:`load_into` verifies. A failed save raises :class:`~refimpl.store.CheckpointFailedError` (torch's
    ``CheckpointException`` is its cause)."""
    return _save(store, checkpoint_id, include, storage_writer, process_group, checksums, asynchronous=False)


def async_save(
    store: Any, checkpoint_id: str | os.PathLike | None = None, *, include: Any = DEFAULT_INCLUDE,
    storage_writer: Any = None, process_group: Any = None, checksums: bool = True,
) -> SaveResult:
    """Start a DCP save in a thread; ``result.future`` completes when it is written (and summed).

    On the host path the store's buffers are handed to DCP as they are and
    the store's next offload waits for the future. ``process_group``
    defaults to a dedicated Gloo group (see the module docstring). A failed
    write makes ``result.future`` raise :class:`~refimpl.store.CheckpointFailedError`.
    """
    return _save(store, checkpoint_id, include, storage_writer, process_group, checksums, asynchronous=True)


def _writer(call: str, checkpoint_id: Any, storage_writer: Any, checksums: Any) -> Any:
    expect(checkpoint_id, (str, os.PathLike), call, "checkpoint_id", "a path (str or os.PathLike) or None",
           optional=True)
    expect_bool(checksums, call, "checksums")
    if storage_writer is not None:
        return storage_writer
    if checkpoint_id is None:
        raise ArgumentValueError(f"{call}: give checkpoint_id (a directory) or storage_writer")
    return storage_for(checkpoint_id, reader=False)


def storage_for(checkpoint_id: str | os.PathLike, *, reader: bool) -> Any:
    """The writer (or reader) DCP itself would pick for ``checkpoint_id`` (a directory: the file system
    one; an fsspec URL: the fsspec one), made here so that its checksums can be written or verified."""
    try:
        from torch.distributed.checkpoint._storage_utils import _storage_setup
    except ImportError:  # pragma: no cover - a torch without it: local directories only
        return FileSystemReader(checkpoint_id) if reader else FileSystemWriter(checkpoint_id)
    try:
        return _storage_setup(None, checkpoint_id, reader=reader)
    except RuntimeError as e:
        raise ArgumentValueError(f"checkpoint_id {str(checkpoint_id)!r}: DCP has no storage for it ({e}); pass "
                                 f"storage_{'reader' if reader else 'writer'}=...") from e


def _save(store, checkpoint_id, include, storage_writer, process_group, checksums, *, asynchronous: bool) -> SaveResult:
    t0 = time.perf_counter()
    writer = _writer("async_save(store, checkpoint_id, ...)" if asynchronous else "save(store, checkpoint_id, ...)",
                     checkpoint_id, storage_writer, checksums)
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
    summing = contextlib.ExitStack()
    if checksums:
        summing.enter_context(checksummed(writer))
    try:
        if not asynchronous:
            with summing:
                result.metadata = dcp.save(state, checkpoint_id=checkpoint_id, storage_writer=writer,
                                           process_group=process_group)
        else:
            _start_async(store, state, checkpoint_id, writer, process_group, path, result, summing.pop_all())
    except CheckpointException as e:
        raise failed("save", checkpoint_id, e) from e
    finally:
        if reloaded:
            # sync save has written; async save has staged its own copy (the writer's or DCP's stager)
            store.offload(include)
    result.seconds = time.perf_counter() - t0
    log.info("checkpoint %s: %d tensors via %s in %.3f s", checkpoint_id, len(saved), path.value, result.seconds)
    return result


def _start_async(store, state, checkpoint_id, writer, process_group, path, result, summing) -> None:
    """dcp.async_save; ``result.future`` completes (or raises the project's error) once the upload and its
    checksums are written, and ``summing`` (the writer's rebinding) is undone then."""
    stager = None
    try:
        pg = process_group if process_group is not None else _dcp_group()
        kwargs: dict[str, Any] = dict(checkpoint_id=checkpoint_id, storage_writer=writer, process_group=pg)
        if path is SavePath.HOST_BUFFERS:
            if "async_stager" not in inspect.signature(dcp.async_save).parameters:  # pragma: no cover
                raise RuntimeError("this torch's dcp.async_save takes no async_stager; use save() for the "
                                   "host-buffer path")
            stager = kwargs["async_stager"] = _InPlaceStager()
        response = dcp.async_save(state, **kwargs)
    except BaseException:
        summing.close()  # no upload will run: put the writer back now
        raise
    staging = getattr(response, "staging_completion", None)
    if staging is not None and path is SavePath.RELOAD:
        staging.result()  # the device tensors are released by the offload that follows
    result.future = _translated(getattr(response, "upload_completion", response), checkpoint_id, summing)
    if stager is not None:
        result.staged_ptrs = stager.ptrs
        hold_host_buffers(store, result.future)


def _translated(fut: Any, checkpoint_id: Any, summing: contextlib.ExitStack) -> Future:
    """A future with ``fut``'s outcome, torch's ``CheckpointException`` turned into the project's error."""
    out: Future = Future()

    def done(f: Any) -> None:
        summing.close()
        try:
            out.set_result(f.result())
        except CheckpointException as e:
            err = failed("save", checkpoint_id, e)
            err.__cause__ = e
            out.set_exception(err)
        except BaseException as e:  # noqa: BLE001 - handed to whoever awaits the save
            out.set_exception(e)

    fut.add_done_callback(done)
    return out


def load_into(state_dict: dict, checkpoint_id: str | os.PathLike | None = None, *, storage_reader: Any = None,
              process_group: Any = None, verify: bool = True) -> None:
    """Load a checkpoint into ``state_dict`` in place (e.g. ``{"model": model.state_dict()}``), all or nothing.

    The checkpoint is loaded into a staging copy of ``state_dict`` (one more copy of its tensors, on their
    devices, for the length of the load) and copied in only once every rank has loaded it: a failed load
    leaves every target tensor as it was. ``verify``: check the metadata and every item read against the
    CRC-32s written at save (:mod:`.dcp_checksums`) before they are used. Whether verified or not, a load
    whose metadata does not describe every element of a target exactly once fails (:mod:`.dcp_coverage`).
    Either failure happens on every rank. Raises :class:`~refimpl.store.CheckpointIntegrityError` (a flipped
    bit, a truncated file, no checksums, metadata that leaves part of a target unread; it names the tensor
    and the file where it can) or
    :class:`~refimpl.store.CheckpointFailedError` (any other failure, torch's ``CheckpointException`` as cause).
    """
    call = "load_into(state_dict, checkpoint_id, ...)"
    expect(state_dict, dict, call, "state_dict", "a dict (e.g. {'model': model.state_dict()})",
           hint="pass model.state_dict() inside a dict" if isinstance(state_dict, torch.nn.Module) else "")
    expect(checkpoint_id, (str, os.PathLike), call, "checkpoint_id", "a path (str or os.PathLike) or None",
           optional=True)
    expect_bool(verify, call, "verify")
    if checkpoint_id is None and storage_reader is None:
        raise ArgumentValueError(f"{call}: give checkpoint_id (a directory) or storage_reader")
    reader = storage_reader if storage_reader is not None else storage_for(checkpoint_id, reader=True)
    staged = Staged(state_dict)
    try:
        with verified(reader) if verify else contextlib.nullcontext():
            dcp.load(staged.state_dict, checkpoint_id=checkpoint_id, storage_reader=reader,
                     process_group=process_group, planner=CoveringLoadPlanner())
    except CheckpointException as e:
        raise failed("load", checkpoint_id, e) from e
    staged.commit()


__all__ = ["SaveResult", "async_save", "load_into", "save", "state_dict_of"]
