"""Flat layouts: where every registered tensor's bytes sit while offloaded and after reload.

Theory of operation
-------------------
The store works at *storage* level. Every registered tensor object (a
parameter, a DTensor's ``_local_tensor``, FSDP2's padded ``_sharded_param_data``,
an optimizer state, a view into a DDP-style flat buffer) is recorded as a
:class:`TensorRef`: the tensor object plus its ``(offset, size, stride)``
inside its storage. Tensors that share a storage (tied embeddings, views,
FSDP2's local shard inside its padded buffer) become one
:class:`StorageEntry`, so their bytes are stored once and, after reload, they
still share one storage.

Entries with the same :class:`LayoutKey` (category, dtype, placement key) are
laid out back to back in a :class:`FlatLayout`, each at an offset aligned to
``alignment_bytes``. On reload the store allocates ONE device buffer per
layout, fills it with one copy per host segment, and re-points every
registered tensor into it with ``tensor.set_(flat_storage, entry.offset +
ref.offset, ref.size, ref.stride)``; non-zero storage offsets are expected.

After a reload an entry no longer owns a storage of its own: it is a range of
the layout's flat buffer (``StorageEntry.base`` is a 1-D view of that range).
If at the next offload every tensor is still where the reload put it, the
layout is *unchanged* and leaves in one large copy of the flat buffer.

Host segments (:attr:`FlatLayout.segments`) are cut at entry boundaries, so
every registered tensor lies inside one pinned segment and can be viewed in
host memory directly (a checkpoint can read it without a reload).
"""
from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from refimpl.store.config import CATEGORY_ORDER, Category


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return dtype.itemsize


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

    def geometry(self) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """``(offset, size, stride)``."""
        return self.offset, self.size, self.stride

    def weaken(self) -> None:
        """Keep only weak references to the tensor (and DTensor)."""
        if self.tensor is not None:
            self._weak_tensor = weakref.ref(self.tensor)
            self._weak_dtensor = weakref.ref(self.dtensor) if self.dtensor is not None else None
            self.tensor = None
            self.dtensor = None

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
    reload); it is set while the store works on the entry and ``None`` otherwise. ``kind`` is a finer label than the category for backends
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
        return self.numel * itemsize(self.dtype)


@dataclass(frozen=True)
class LayoutKey:
    """What makes entries share a flat buffer: category, dtype and the backend's placement key."""

    category: Category
    dtype: torch.dtype
    placement: Hashable | None = None

    def sort_key(self) -> tuple[int, str, str]:
        """A total order identical on every rank (layouts are processed in it)."""
        return CATEGORY_ORDER[self.category], str(self.dtype), repr(self.placement)

    def label(self) -> str:
        """Short human-readable name, e.g. ``params/bfloat16`` or ``params/bfloat16@<placement>``."""
        base = f"{self.category.value}/{str(self.dtype).replace('torch.', '')}"
        return base if self.placement is None else f"{base}@{self.placement}"


class LayoutState(enum.Enum):
    """Where a layout's bytes are."""

    ON_DEVICE = "on_device"
    OFFLOADED = "offloaded"


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


_CATEGORY_BY_VALUE = {c.value: c for c in Category}


class LayoutKeys(dict):
    """Layout keys interned by ``(category value, dtype, placement key)``: ``keys[raw]`` makes the key once.

    A plain dict lookup per storage on a hit (Enum hashing is slow in the per-storage loops, hence the
    category's value in the raw tuple); :meth:`__missing__` builds the :class:`LayoutKey` on a miss.
    """

    def __missing__(self, raw: tuple[str, torch.dtype, Hashable | None]) -> "LayoutKey":
        key = self[raw] = LayoutKey(_CATEGORY_BY_VALUE[raw[0]], raw[1], raw[2])
        return key


class SegmentCutter:
    """The segment-cut rule, written once for the eager (:meth:`FlatLayout.build`) and the streaming
    (:class:`refimpl.store.streaming.LayoutStream`) layouts.

    Entries are placed back to back at offsets aligned to ``alignment_bytes``. A host segment closes
    before an entry when the open segment is already ``segment_bytes`` long, or when the entry would
    overflow it and the segment is not empty: every entry lies inside one segment, and a segment is
    longer than ``segment_bytes`` only when a single entry is.
    """

    __slots__ = ("align", "seg_numel", "end", "seg_start", "cuts")

    def __init__(self, dtype: torch.dtype, alignment_bytes: int, segment_bytes: int) -> None:
        size = dtype.itemsize
        self.align = max(1, alignment_bytes // size)
        self.seg_numel = max(self.align, segment_bytes // size)
        #: element offset just past the last entry placed
        self.end = 0
        #: where the open segment starts
        self.seg_start = 0
        #: every segment start, ascending
        self.cuts: list[int] = [0]

    def place(self, numel: int) -> tuple[int, int]:
        """The offset of the next entry of ``numel`` elements, and the start of the segment this placement
        closed (-1 if none: the entry joins the open segment). One call per storage: rounding is inline."""
        a, start = self.align, self.seg_start
        off = -(-self.end // a) * a
        self.end = off + numel
        if off - start >= self.seg_numel or (off > start and off + numel - start > self.seg_numel):
            self.seg_start = off
            self.cuts.append(off)
            return off, start
        return off, -1

    def numel(self) -> int:
        """The aligned size of everything placed so far."""
        return round_up(self.end, self.align)


@dataclass(eq=False)
class FlatLayout:
    """Entries of one :class:`LayoutKey`, back to back at aligned offsets.

    ``numel`` is the size of the flat buffer (the backend may pad it, see
    :meth:`StoreBackend.padded_numel`); ``data_numel`` ends at the last
    entry. ``segments`` partition ``[0, numel)`` into host segments cut at entry
    boundaries. ``flat_storage`` identifies the flat device buffer while the
    layout is on the device after a reload (``None`` before the first reload);
    the store reaches that buffer only through the registered tensors.
    ``dropped``: offloaded without copying (gradients the caller chose to drop);
    the reload fills zeros.
    """

    key: LayoutKey
    entries: list[StorageEntry]
    numel: int
    data_numel: int
    segments: tuple[tuple[int, int], ...]
    state: LayoutState = LayoutState.ON_DEVICE
    dropped: bool = False
    #: storage id of the flat device buffer while resident after a reload, else None
    flat_storage: int | None = None
    #: registered tensor objects the reload pointed into the flat buffer (-1: not resident)
    resident_views: int = -1

    @property
    def category(self) -> Category:
        """The layout's category."""
        return self.key.category

    @property
    def dtype(self) -> torch.dtype:
        """The layout's dtype."""
        return self.key.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the flat buffer (including alignment padding)."""
        return self.numel * itemsize(self.dtype)

    @property
    def data_nbytes(self) -> int:
        """Bytes of the entries themselves (no padding)."""
        return sum(e.nbytes for e in self.entries)

    @property
    def refs(self) -> list[TensorRef]:
        """Every registered tensor of the layout."""
        return [r for e in self.entries for r in e.refs]

    def segment_numels(self) -> tuple[int, ...]:
        """Element count of each host segment."""
        return tuple(b - a for a, b in self.segments)

    @classmethod
    def build(
        cls,
        key: LayoutKey,
        entries: Sequence[StorageEntry],
        *,
        alignment_bytes: int,
        segment_bytes: int,
    ) -> "FlatLayout":
        """Assign aligned offsets to ``entries`` (in order) and cut host segments.

        Sets each entry's ``offset``. The caller may pad ``numel`` afterwards
        with :meth:`pad_to`.
        """
        cutter = SegmentCutter(key.dtype, alignment_bytes, segment_bytes)
        place = cutter.place
        for e in entries:
            if e.dtype != key.dtype or e.category != key.category:
                raise ValueError(f"entry {e.name} ({e.category.value}, {e.dtype}) does not belong in layout {key.label()}")
            e.offset = place(e.numel)[0]
        layout = cls(key, list(entries), cutter.numel(), cutter.end, ())
        layout.set_segments(cutter.cuts)
        return layout

    def pad_to(self, numel: int) -> None:
        """Grow the flat buffer to ``numel`` elements (the last segment absorbs the padding)."""
        if numel < self.data_numel:
            raise ValueError(f"layout {self.key.label()}: cannot shrink to {numel} < {self.data_numel} elements")
        self.numel = numel
        self.set_segments([a for a, _ in self.segments] or [0])

    def set_segments(self, cuts: list[int]) -> None:
        """Cut the host segments at element offsets ``cuts`` (ascending, starting at 0; cuts at or past
        ``numel`` are dropped): one segment from each cut to the next, the last one up to ``numel``."""
        cuts = [c for c in cuts if c < self.numel] or [0]
        self.segments = tuple(zip(cuts, cuts[1:] + [self.numel]))
        if self.numel == 0:
            self.segments = ((0, 0),)

    def segment_of(self, start: int, stop: int) -> int:
        """Index of the segment holding layout range ``[start, stop)``; raises if it spans two."""
        for i, (a, b) in enumerate(self.segments):
            if a <= start and stop <= b:
                return i
        raise ValueError(f"range [{start}, {stop}) of layout {self.key.label()} spans host segments {self.segments}")

    def describe(self) -> str:
        """One line for logs."""
        return (f"{self.key.label()}: {len(self.entries)} storages, {len(self.refs)} tensors, "
                f"{self.nbytes / 2**20:.1f} MiB in {len(self.segments)} host segment(s), {self.state.value}")


__all__ = [
    "FlatLayout",
    "LayoutKey",
    "LayoutKeys",
    "LayoutState",
    "SegmentCutter",
    "StorageEntry",
    "TensorRef",
    "itemsize",
    "round_up",
    "storage_id",
]
