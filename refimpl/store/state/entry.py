"""Entries and refs: the two records under a flat layout (see [Note: store vocabulary] in
:mod:`refimpl.store.state.layout`).

* :class:`TensorRef`: one registered tensor object and where it sits inside its entry.
* :class:`StorageEntry`: one contiguous range of device memory to move (a storage, or a range of a
  layout's flat buffer after a reload) with every ref that views it.

Their fields change only through the :class:`~refimpl.store.state.layout.FlatLayout` that holds them
(its transitions) and while a layout is being built.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from refimpl.store.config import Category
from refimpl.store.state.guard import unguard


def storage_id(t: torch.Tensor) -> int:
    """Identity of ``t``'s storage (the StorageImpl address; valid for meta and 0-byte storages)."""
    return t.untyped_storage()._cdata


@dataclass(eq=False, slots=True)
class TensorRef:
    """One registered tensor object and its place inside its entry.

    ``tensor`` is the plain strided tensor the store re-points (for a DTensor,
    its ``_local_tensor``; ``dtensor`` then holds the DTensor itself, whose
    ``device_mesh`` and ``placements`` a backend may read). ``offset`` is in
    elements from the start of the entry.

    While the state is on the device after a reload, the store holds the
    tensor only weakly (:meth:`weaken`): if the framework drops it (gradients
    set to ``None``), its memory goes, and the next offload sees the change.
    """

    name: str
    tensor: torch.Tensor | None
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtensor: Any = None
    _weak_tensor: Any = None
    _weak_dtensor: Any = None

    def weaken(self) -> None:
        """Keep only weak references to the tensor (and DTensor)."""
        if self.tensor is not None:
            self._weak_tensor = weakref.ref(self.tensor)
            self._weak_dtensor = weakref.ref(self.dtensor) if self.dtensor is not None else None
            self.tensor = None
            self.dtensor = None

    def unguard(self) -> None:
        """Take the access guard off the tensor and its DTensor (see :mod:`refimpl.store.state.guard`)."""
        unguard(self.tensor)
        if self.dtensor is not None:
            unguard(self.dtensor)

    def live(self) -> torch.Tensor | None:
        """The tensor, if it is still alive (strong or weak)."""
        if self.tensor is not None:
            return self.tensor
        return self._weak_tensor() if self._weak_tensor is not None else None

    def live_dtensor(self) -> Any:
        """The DTensor, if any and still alive (strong or weak)."""
        if self.dtensor is not None:
            return self.dtensor
        return self._weak_dtensor() if self._weak_dtensor is not None else None

    def hold(self, tensor: torch.Tensor, dtensor: Any) -> None:
        """Hold ``tensor`` (and ``dtensor``) strongly, replacing whatever was held."""
        self.tensor, self.dtensor = tensor, dtensor
        self._weak_tensor = self._weak_dtensor = None

    def strengthen(self) -> None:
        """Hold the tensor (and DTensor) strongly again; the tensor must be alive."""
        if self.tensor is None:
            t = self.live()
            if t is None:
                raise ValueError(f"{self.name}: the tensor is gone")
            self.tensor = t
            self.dtensor = self._weak_dtensor() if self._weak_dtensor is not None else None
            self._weak_tensor = self._weak_dtensor = None


@dataclass(eq=False, slots=True)
class StorageEntry:
    """A contiguous range of device memory to move, with every registered tensor that views it.

    ``base`` is a 1-D view of exactly the entry's ``numel`` elements on the
    device (the whole storage, or the entry's range of a flat buffer after a
    reload); it is set while the store works on the entry and ``None`` otherwise
    (only the layout's transitions set and clear it). ``kind`` is a finer label than the category for backends
    (``"param"``, ``"grad"``, ``"optimizer"``, ``"buffer"``, or what
    ``attach_tensors(kind=...)`` said, e.g. ``"master_weights"``, ``"ddp_buffer"``).
    ``source`` is the attach name.
    """

    category: Category
    kind: str
    dtype: torch.dtype
    numel: int
    refs: list[TensorRef]
    base: torch.Tensor | None
    source: str = ""
    #: element offset inside the layout's flat buffer (set by :meth:`FlatLayout.build`)
    offset: int = -1
    #: ``base`` covers a whole storage of its own (False for a range of a shared flat buffer),
    #: so the storage may be released as soon as the entry's copies completed
    owns_storage: bool = True

    @property
    def name(self) -> str:
        """Name of the first registered tensor (used in messages)."""
        return self.refs[0].name if self.refs else "<empty>"

    @property
    def dtensor(self) -> Any:
        """The first DTensor among the refs (mesh and placements for placement keys), or None."""
        for r in self.refs:
            d = r.live_dtensor()
            if d is not None:
                return d
        return None

    @property
    def nbytes(self) -> int:
        """Bytes of the entry."""
        return self.numel * self.dtype.itemsize


class EntryOrigin(NamedTuple):
    """Where a parked entry's refs pointed: its storage (None: no device data) and the entry's start in it."""

    storage: Any
    offset: int


class ReleasedStorage(NamedTuple):
    """A storage released as soon as its own copies completed, while later copies ran
    (:meth:`FlatLayout.release_copied`), and what it held: what a failed offload copies back."""

    layout: Any  # the FlatLayout
    entry: StorageEntry
    #: the released storage (0 bytes now)
    storage: Any
    #: its size before the release
    nbytes: int


__all__ = ["EntryOrigin", "ReleasedStorage", "StorageEntry", "TensorRef", "storage_id"]
