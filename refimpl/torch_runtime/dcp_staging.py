"""All-or-nothing DCP loads, and torch's checkpoint errors as the project's.

A DCP load copies each item into its target tensor as it reads it; when a later
item (or another rank) fails, the targets already written hold the checkpoint's
values and the rest the old ones: a half-loaded model that trains on. Here the
load goes into :class:`Staged`, a copy of the target ``state_dict``'s
structure with fresh tensors of the same shapes, dtypes, devices and DTensor
placements, and :meth:`Staged.commit` copies it in only after the load
succeeded on every rank (DCP fails the load on all ranks when one fails).
Memory: one more copy of the loaded tensors, on their devices, while loading.

torch raises ``CheckpointException``, a ``BaseException`` that ``except
Exception`` lets through; :func:`failed` turns it into
:class:`~refimpl.store.CheckpointIntegrityError` when a rank's failure was a
checksum mismatch and into :class:`~refimpl.store.CheckpointFailedError`
otherwise (the caller chains torch's exception as the cause).
"""
from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful

from refimpl.store.errors import CheckpointError, CheckpointFailedError, CheckpointIntegrityError


def _mirror(value: Any) -> Any:
    """Fresh tensors where ``value`` has tensors, new dicts and lists around them, other leaves as they are."""
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value)  # a DTensor stays a DTensor with the same mesh and placements
    if isinstance(value, dict):
        return {k: _mirror(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mirror(v) for v in value]
    return value


def _copy_in(target: Any, staged: Any) -> None:
    """Copy ``staged`` into ``target``: tensors in place, loaded non-tensor values by assignment."""
    keys = target.keys() if isinstance(target, dict) else range(len(target))
    for k in keys:
        t, s = target[k], staged[k]
        if isinstance(t, torch.Tensor):
            t.copy_(s)
        elif (isinstance(t, dict) and isinstance(s, dict)) or (isinstance(t, list) and isinstance(s, list)):
            _copy_in(t, s)  # a model's OrderedDict is mirrored as a dict
        else:
            target[k] = s


class Staged:
    """A load target that stands in for ``target`` until :meth:`commit` (see the module docstring).

    Top-level :class:`Stateful` values (a module, an optimizer) are staged as their ``state_dict()`` and
    get it back through ``load_state_dict`` at commit, as DCP itself does.
    """

    def __init__(self, target: dict[str, Any]) -> None:
        self.target = target
        self.stateful = {k: v for k, v in target.items() if isinstance(v, Stateful)}
        self.state_dict: dict[str, Any] = {
            k: _mirror(v.state_dict() if k in self.stateful else v) for k, v in target.items()}

    def commit(self) -> None:
        """Copy the loaded values into the target (after a load that succeeded everywhere)."""
        with torch.no_grad():
            plain = {k: v for k, v in self.target.items() if k not in self.stateful}
            _copy_in(plain, self.state_dict)
            for k, v in plain.items():
                self.target[k] = v
            for k, obj in self.stateful.items():
                obj.load_state_dict(self.state_dict[k])


class CarriedError(BaseException):
    """One of the project's errors carried through a DCP step that catches ``Exception``: DCP's load catches
    any ``Exception`` from ``read_metadata`` to try rank-local metadata instead, and then reports only
    "metadata is None". A ``BaseException`` passes that handler; DCP's step wrapper still catches it as this
    rank's failure and sends it to every rank, and :func:`failed` unwraps ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error

    def __str__(self) -> str:
        return str(self.error)


def _failures(exc: BaseException) -> dict[int, BaseException]:
    out: dict[int, BaseException] = {}
    for rank, item in (getattr(exc, "failures", None) or {}).items():
        e = item[0] if isinstance(item, tuple) else item
        out[rank] = e.error if isinstance(e, CarriedError) else e
    return out


def failed(what: str, checkpoint_id: Any, exc: BaseException) -> CheckpointError:
    """The project's error for torch's ``CheckpointException`` ``exc`` of a ``what`` (``"save"``/``"load"``)."""
    failures = _failures(exc)
    ranks = tuple(sorted(failures))
    unchanged = "; the target was not changed" if what == "load" else ""
    for rank, e in sorted(failures.items()):
        if isinstance(e, CheckpointIntegrityError):
            return CheckpointIntegrityError(f"{e} (rank {rank}{unchanged})", e.tensor, e.file)
    if failures:
        rank, first = min(failures.items())
        cause = f"rank {rank}: {type(first).__name__}: {(str(first).splitlines() or [''])[0][:300]}"
    else:
        cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    return CheckpointFailedError(
        f"DCP {what} of {checkpoint_id!r} failed on rank(s) {list(ranks) or '?'} ({cause}){unchanged}; "
        f"check the path and that every rank made the same call", ranks)


__all__ = ["CarriedError", "Staged", "failed"]
