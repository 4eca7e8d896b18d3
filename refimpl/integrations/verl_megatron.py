"""verl's Megatron offload functions, backed by the offload store (``verl/utils/megatron_utils.py``, 0.9.1).

[Note: one store per Megatron model] Megatron's distributed optimizer keeps views of the model's
parameter buffer, so the model's buffers and the optimizer's state can only leave through one store
that knows both (:func:`refimpl.store.clients.megatron.attach_megatron`). verl passes the model
chunks and the optimizer to separate functions, and calls the model's first. The store is kept on the
first model chunk; its optimizer is found from the optimizer's own ``model_chunks`` (Megatron's
optimizers keep them) when an optimizer function runs first, and otherwise from
:func:`register_megatron`, which :func:`refimpl.integrations.verl.patch` calls after verl's Megatron
engine built its model and optimizer. Categories: the parameter buffer under ``params``, the gradient
buffer under ``grads``, master weights and Adam state under ``optimizer``; module buffers (rotary
tables) stay on the device, as in verl.

Semantics kept from verl: the model offload drops the gradients of DDP chunks (verl resizes the
gradient buffer to 0 without a copy) and its load with ``load_grad=True`` brings them back as zeros;
``load_grad=False`` leaves them released. Differences: ``load_frozen_params=False`` still loads the
frozen parameters (they share the ``params`` category); :func:`offload_megatron_copy_params` moves the
Adam state with the master weights (one category), and its load brings both back.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any

import torch

from refimpl.integrations.errors import ForeignOffloadError, MegatronPairingError
from refimpl.integrations.stores import runtime, slot_for, slot_of
from refimpl.store import UnattachedAliasError
from refimpl.store.clients.megatron import attach_megatron

logger = logging.getLogger(__name__)

#: attribute of a first model chunk naming its optimizer (a weak reference)
PAIR_ATTR = "_timeshare_megatron_optimizer"


def _chunks(models: Any) -> list[Any]:
    chunks = list(models) if isinstance(models, (list, tuple)) else [models]
    if not chunks or not all(isinstance(c, torch.nn.Module) for c in chunks):
        raise TypeError(f"expected a Megatron model chunk or a list of them, got {type(models).__name__}")
    return chunks


def _sub_optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def _models_of(optimizer: Any) -> list[Any]:
    seen: list[Any] = []
    for sub in _sub_optimizers(optimizer):
        for chunk in getattr(sub, "model_chunks", None) or []:
            if not any(chunk is s for s in seen):
                seen.append(chunk)
    if not seen:
        raise MegatronPairingError(
            f"{type(optimizer).__name__} does not say which model chunks it optimizes (no model_chunks); call "
            f"refimpl.integrations.verl.register_megatron(models, optimizer) once after building them")
    return seen


def register_megatron(models: Any, optimizer: Any) -> None:
    """Tell the drop-ins which optimizer belongs to ``models`` (a chunk or a list of chunks), before the
    first model offload. ``patch()`` does it for verl's Megatron engine; call it yourself otherwise."""
    chunks = _chunks(models)
    chunks[0].__dict__[PAIR_ATTR] = weakref.ref(optimizer) if optimizer is not None else None


def _is_ddp(chunk: Any) -> bool:
    return hasattr(chunk, "buffers") and isinstance(getattr(chunk, "buffers", None), list)


class PlainChunks:
    """Model chunks that are not Megatron DDP (a reference model): every chunk's parameters, gradients
    and buffers attached as a module, the interface of a Megatron client."""

    def __init__(self, store: Any, chunks: list[Any]) -> None:
        self.store = store
        self.optimizers: list[Any] = []
        for i, chunk in enumerate(chunks):
            store.attach_module(chunk, name=f"chunk{i}")

    @property
    def state(self) -> "PlainChunks":
        """This object (a Megatron client's ``state.optimizers`` is read through it)."""
        return self

    @property
    def rt(self) -> Any:
        """The store's runtime."""
        return self.store.rt

    def is_offloaded(self, category: str) -> bool:
        """The store's answer."""
        return self.store.is_offloaded(category)

    def offload(self, include: Any = None, drop_grads: bool = False) -> None:
        """The store's offload."""
        self.store.offload(include, drop_grads=drop_grads)

    def reload(self, include: Any = None) -> None:
        """The store's reload."""
        self.store.reload(include)


def _client(chunks: list[Any], optimizer: Any = None) -> Any:
    """The Megatron client of ``chunks`` (made now, with their optimizer if known)."""
    first = chunks[0]
    if not any(_is_ddp(c) for c in chunks):
        if optimizer is not None:
            raise MegatronPairingError("the optimizer's model chunks are not Megatron DDP chunks; the drop-ins move "
                                       "the optimizers of DistributedDataParallel models")
        return slot_for(first, lambda store: PlainChunks(store, chunks)).extra
    slot = slot_of(first)
    if slot is not None:
        client = slot.extra
        known = client.state.optimizers
        if optimizer is not None and not any(o is s for s in _sub_optimizers(optimizer) for o in known):
            busy = [c for c in ("params", "grads", "optimizer") if slot.store.is_offloaded(c)]
            if busy:
                raise MegatronPairingError(
                    f"the model was offloaded ({busy}) before its optimizer {type(optimizer).__name__} was known, "
                    f"so they are in different stores; load the model, then call register_megatron(models, "
                    f"optimizer) before the first offload")
            from refimpl.integrations.stores import forget

            forget(first)  # made without the optimizer; nothing is offloaded: make it again with both
            return _client(chunks, optimizer)
        return client
    if optimizer is None:
        ref = first.__dict__.get(PAIR_ATTR)
        optimizer = ref() if ref is not None else None
    return slot_for(first, lambda store: attach_megatron(store, chunks, optimizer)).extra


def _offload(client: Any, include: list[str], drop_grads: bool, call: str) -> None:
    try:
        client.offload(include=include, drop_grads=drop_grads)
    except UnattachedAliasError as e:
        if client.state.optimizers:
            raise
        raise MegatronPairingError(
            f"{call}: other tensors (the distributed optimizer's) view the model's buffers and the drop-in does not "
            f"know the optimizer yet; call refimpl.integrations.verl.register_megatron(models, optimizer) once "
            f"after building them ({e})") from e


def _free_megatron_scratch() -> None:
    """What verl's optimizer offload frees beside the state: Megatron's global memory buffer."""
    try:
        from megatron.core.parallel_state import get_global_memory_buffer
    except ImportError:
        return
    try:
        get_global_memory_buffer().buffer.clear()
    except AssertionError:  # parallel state not initialised: no buffer
        pass


@torch.no_grad()
def offload_megatron_model_to_cpu(models: Any) -> None:
    """Move the parameters of ``models`` (Megatron DDP chunks, or plain modules such as a reference
    model) to host memory and release their gradient buffers without a copy (verl's function)."""
    chunks = _chunks(models)
    client = _client(chunks)
    drop = any(_is_ddp(c) for c in chunks)
    _offload(client, ["params", "grads"], drop, "offload_megatron_model_to_cpu(models)")
    client.rt.empty_cache()


@torch.no_grad()
def load_megatron_model_to_gpu(models: Any, load_grad: bool = True, load_frozen_params: bool = True) -> None:
    """Bring the parameters of ``models`` back, and with ``load_grad`` their gradient buffers (zeros
    after :func:`offload_megatron_model_to_cpu`, as verl zeroes them). ``load_frozen_params`` is
    accepted; frozen parameters always come back (see the module's note)."""
    chunks = _chunks(models)
    slot = slot_of(chunks[0])
    if slot is None:
        rt = runtime()
        moved = [p for c in chunks for p in c.parameters() if p.device.type == "cpu"] if rt.device.type != "cpu" else []
        if moved:
            raise ForeignOffloadError(
                f"load_megatron_model_to_gpu(models): {len(moved)} parameters are on the host but were not offloaded "
                f"by this function's store (moved by verl's own offload?); offload and load with the same family")
        return
    include = ["params"] + (["grads"] if load_grad else [])
    include = [c for c in include if slot.store.is_offloaded(c)]
    if include:
        slot.extra.reload(include=include)


def _optimizer_client(optimizers: Any) -> Any:
    return _client(_models_of(optimizers), optimizers)


@torch.no_grad()
def offload_megatron_copy_params(optimizers: Any) -> None:
    """Move the optimizer's fp32 master weights to host memory (verl's function); with the store the
    Adam state moves with them (one category)."""
    client = _optimizer_client(optimizers)
    _offload(client, ["optimizer"], False, "offload_megatron_copy_params(optimizers)")


@torch.no_grad()
def load_megatron_copy_params(optimizers: Any) -> None:
    """Bring the master weights back (and the Adam state with them); nothing to do if resident."""
    client = _optimizer_client(optimizers)
    if client.is_offloaded("optimizer"):
        client.reload(include=["optimizer"])


@torch.no_grad()
def offload_megatron_optimizer(optimizers: Any) -> None:
    """Move master weights and Adam state to host memory and free Megatron's global memory buffer, as
    verl's function does."""
    client = _optimizer_client(optimizers)
    _offload(client, ["optimizer"], False, "offload_megatron_optimizer(optimizers)")
    _free_megatron_scratch()
    client.rt.empty_cache()


@torch.no_grad()
def load_megatron_optimizer(optimizers: Any) -> None:
    """Bring master weights and Adam state back; nothing to do if resident."""
    load_megatron_copy_params(optimizers)


__all__ = ["PAIR_ATTR", "PlainChunks", "load_megatron_copy_params", "load_megatron_model_to_gpu", "load_megatron_optimizer",
           "offload_megatron_copy_params", "offload_megatron_model_to_cpu", "offload_megatron_optimizer",
           "register_megatron"]
