"""Flat layouts: where every registered tensor's bytes sit while offloaded and after reload.

[Note: store vocabulary]
One word, one meaning, across :mod:`refimpl.store`:

* **ref** (:class:`~refimpl.store.state.entry.TensorRef`): one registered tensor object
  (a parameter, a DTensor's ``_local_tensor``, FSDP2's padded
  ``_sharded_param_data``, an optimizer state, a view into a DDP-style flat
  buffer) and its ``(offset, size, stride)`` inside its entry.
* **entry** (:class:`~refimpl.store.state.entry.StorageEntry`): one contiguous range
  of device memory to move with every ref that views it. Refs sharing a storage
  (tied embeddings, views, FSDP2's shard inside its padded buffer) are one
  entry: stored once, still sharing after reload.
* **layout** (:class:`FlatLayout`): the entries of one :class:`LayoutKey`
  (category, dtype, the backend's placement key) back to back at aligned
  offsets; the unit a backend copies, one host buffer per layout.
* **base**: an entry's 1-D device view of its ``numel`` elements (its own
  storage, or its range of the flat buffer); set only while the store works on
  the entry.
* **flat**, **flat buffer**: the ONE device buffer a reload allocates per
  layout; a "flat" is always a 1-D tensor over a layout's flat buffer (also in
  ``flats``, by key). ``flat_storage`` is its storage id while resident.
* **resident**: a layout on the device in its flat buffer after a reload.
* **steady**: an offload that finds every ref of every resident layout where
  the reload put it (see [Note: steady offload check] in
  :mod:`refimpl.store.state.steady_check`): the layout leaves in one copy of its flat.
* **placeholder**: the read-only one-element storage per store, dtype and
  device that parked tensors point at (:class:`refimpl.store.state.parking.Parking`).
* **parked**: a ref re-pointed at the placeholder with all strides 0 and
  guarded while its bytes are (or are about to be) in host memory (see [Note:
  parked tensors] in :mod:`refimpl.store.state.parking`); **unpark** undoes it,
  **repark** parks refs again after a reload re-pointed them and failed.
* **adopted**: a resident layout taken as it is into the next offload (its
  refs held strongly again, its entries given bases into the flat buffer).
* **stray view**: a tensor object the store does not know that views a flat
  buffer (the user kept a view after reload); parked at release with a warning.
* **host segment** (:attr:`FlatLayout.segments`): a piece of the layout's
  host buffer, cut at entry boundaries by
  :class:`~refimpl.store.state.segments.SegmentCutter`, so every ref lies inside
  one pinned segment and can be viewed in host memory directly.
* **copy ahead**: the copy of a resident layout's flat buffer an offload issues
  before it collects anything (its first stage and phase, ``copy_ahead``; the
  backend flag of the same name), awaited and discarded if the layout changed.
* **early copies**: copies of registered tensors the caller queues with
  ``OffloadStore.copy_early`` before the offload, which takes them over
  (:mod:`refimpl.store.moves.early`).
* **release as copied**: a storage released as soon as the copies carrying its
  bytes completed, while later copies still run (the backend flag
  ``release_as_copied``; ``StoreStats.last_early_releases`` counts them).

A layout moves through :class:`LayoutState` only by its own methods
(:data:`LAYOUT_TRANSITIONS`): ``park`` / ``unpark``, ``mark_offloaded``,
``repoint`` / ``repark``, ``mark_resident``; nothing else writes a layout's or
an entry's fields.

[Note: re-point, not one dictionary]
vLLM's ``cumem`` allocator keeps one dictionary of truth (pointer -> handle)
and two verbs (sleep, wake): tensors keep their addresses because the
allocator unmaps and remaps the same virtual range. The store cannot rely on
owning the allocator (torch's caching allocator, FSDP2's and DDP's buffers),
so it re-points the tensor objects instead: ``set_`` (``.data =`` for a tensor
that requires grad, keeping its gradient accumulator: [Note: autograd identity]
in :mod:`refimpl.store.state.repoint`) onto the placeholder when parking and into
a new flat buffer on reload. The price is this module's alias handling (entries, shared storages, stray views, the
steady check); the gain is that any tensor the frameworks hold keeps working
and a resident layout leaves in one copy. :meth:`FlatLayout.repoint` is where
the trade is made.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from refimpl.store.config import Category
from refimpl.store.errors import StoreStateError
from refimpl.store.state.entry import EntryOrigin, ReleasedStorage, StorageEntry, TensorRef, storage_id
from refimpl.store.state.guard import GUARDED_CLASSES as _GUARDED
from refimpl.store.state.guard import guard, guard_enabled
from refimpl.store.state.layout_key import LayoutKey, LayoutKeys
from refimpl.store.state.parking import Parking
from refimpl.store.state.repoint import ZERO_STRIDES as _ZEROS
from refimpl.store.state.repoint import repoint_tensor, zero_strides
from refimpl.store.state.segments import SegmentCutter
from refimpl.store.state.storage_views import own_view


class LayoutState(enum.Enum):
    """Where a layout's bytes are, and where its refs point."""

    #: bytes on the device, refs point at them (scattered storages, or the flat buffer when resident)
    ON_DEVICE = "on_device"
    #: an offload's copies are in flight: refs parked, bytes still on the device
    PARKED = "parked"
    #: bytes in host memory only, refs parked
    OFFLOADED = "offloaded"
    #: a reload's copies are in flight: refs point into the new flat buffer being filled
    REPOINTED = "repointed"


LAYOUT_TRANSITIONS: dict[tuple[str, LayoutState], LayoutState] = {
    ("park", LayoutState.ON_DEVICE): LayoutState.PARKED,
    ("unpark", LayoutState.PARKED): LayoutState.ON_DEVICE,
    ("mark_offloaded", LayoutState.PARKED): LayoutState.OFFLOADED,
    ("repoint", LayoutState.OFFLOADED): LayoutState.REPOINTED,
    ("repark", LayoutState.REPOINTED): LayoutState.OFFLOADED,
    ("mark_resident", LayoutState.REPOINTED): LayoutState.ON_DEVICE,
}
"""(transition, state before) -> state after: every move a :class:`FlatLayout` makes."""


_new = tuple.__new__  # _new(EntryOrigin, ...): no generated __new__ frame per entry (25k on a MoE's first offload)
_NO_ORIGIN = EntryOrigin(None, 0)


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
    #: while PARKED: the flat buffer the refs were parked from, or each entry's origin (see :meth:`park`)
    _parked_from: tuple[torch.Tensor | None, list[EntryOrigin] | None] | None = field(default=None, repr=False)
    #: while PARKED: the one view of the flat buffer the release frees (see :meth:`keep_one_base`)
    _release_view: torch.Tensor | None = field(default=None, repr=False)
    #: from park to the end of the next reload: the placeholder storage the refs are parked on, its
    #: storage id and the debug site for the guard (see :meth:`park`)
    _parked_on: tuple[Any, int, str | None] | None = field(default=None, repr=False)

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
        return self.numel * self.dtype.itemsize

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

    def append(self, entry: StorageEntry, offset: int) -> None:
        """While a :class:`~refimpl.store.moves.streaming.LayoutStream` builds the layout: ``entry`` goes at
        ``offset`` (from the layout's :class:`SegmentCutter`)."""
        entry.offset = offset
        self.entries.append(entry)

    def seal(self, cutter: SegmentCutter) -> None:
        """The streamed layout is complete: its size and host segments from ``cutter``."""
        self.data_numel = cutter.end
        self.numel = cutter.numel()
        self.set_segments(cutter.cuts)

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

    # ------------------------------------------------------------------ transitions (LAYOUT_TRANSITIONS)

    # The moves of refs (park, unpark, repoint, repark) run under torch.no_grad(), entered once by the
    # stage that calls them for every layout. Each transition checks its row of LAYOUT_TRANSITIONS inline (one comparison, no call: the steady
    # path's budget is counted in Python calls); tests/store/state/test_store_layout.py checks they agree.

    @property
    def placeholder_id(self) -> int | None:
        """Storage id of the placeholder the refs are parked on (None while no ref is parked)."""
        return self._parked_on[1] if self._parked_on is not None else None

    def _refuse(self, transition: str) -> None:
        raise StoreStateError(f"layout {self.key.label()}: cannot {transition} a layout that is "
                              f"{self.state.value}; this is a bug in the store's stage order")

    def park(self, flat: torch.Tensor | None, parking: Parking) -> None:
        """Point every ref at ``parking``'s placeholder and guard it (and its DTensor), see [Note: parked
        tensors]; ON_DEVICE -> PARKED.

        Runs once every copy is issued, while they run: the copies read the store's
        own views. ``flat``: the flat buffer the refs point into when the layout is
        resident in one (fast path), else None (each entry's origin is recorded).
        Where the refs were is recorded before they move, so :meth:`unpark` undoes a
        park that failed midway.
        """
        if self.state is not LayoutState.ON_DEVICE:
            self._refuse("park")
        self.state = LayoutState.PARKED
        origins: list[EntryOrigin] | None = None
        if flat is None:
            origins = []
            for e in self.entries:
                base = e.base
                origins.append(_new(EntryOrigin, (base.untyped_storage(), base.storage_offset()))
                               if base is not None else _NO_ORIGIN)
        self._parked_from = (flat, origins)
        if not self.entries:
            return
        st, sid = parking.placeholder(self.entries[0].refs[0].tensor.device, self.dtype)
        where = parking.site
        self._parked_on = (st, sid, where)
        guarding = guard_enabled()
        zs = _ZEROS
        for e in self.entries:  # the hot loop of a steady offload: one set_ and one guard per tensor
            for r in e.refs:
                t, size = r.tensor, r.size
                z = zs.get(len(size)) or zero_strides(len(size))
                if t.requires_grad:  # keep its gradient accumulator (see [Note: autograd identity])
                    repoint_tensor(t, st, 0, size, z)
                else:
                    t.set_(st, 0, size, z)
                if guarding:
                    guard(t, r.name, where=where)
                    if r.dtensor is not None:  # DTensor's dispatch unwraps below the local tensor's guard
                        guard(r.dtensor, r.name, where=where)

    def unpark(self) -> None:
        """Undo :meth:`park`: every ref back on its original storage (which must hold its bytes again);
        PARKED -> ON_DEVICE."""
        if self.state is not LayoutState.PARKED:
            self._refuse("unpark")
        self.state = LayoutState.ON_DEVICE
        flat, origins = self._parked_from or (None, None)
        self._parked_from = self._release_view = self._parked_on = None
        if flat is not None:
            st, at0 = flat.untyped_storage(), flat.storage_offset()
            for e in self.entries:
                for r in e.refs:
                    r.unguard()
                    repoint_tensor(r.tensor, st, at0 + e.offset + r.offset, r.size, r.stride)
            return
        for e, (st, at0) in zip(self.entries, origins or ()):
            for r in e.refs:
                r.unguard()
                if st is not None:
                    repoint_tensor(r.tensor, st, at0 + r.offset, r.size, r.stride)

    def mark_offloaded(self, dropped: bool) -> None:
        """The device memory is released: PARKED -> OFFLOADED. ``dropped``: no host copy was made."""
        if self.state is not LayoutState.PARKED:
            self._refuse("mark_offloaded")
        self.state = LayoutState.OFFLOADED
        self._parked_from = self._release_view = None
        self.dropped = dropped
        self.flat_storage = None

    def repoint(self, flat: torch.Tensor) -> None:
        """Point every ref into ``flat``, the layout's new flat buffer (views and sharing survive);
        OFFLOADED -> REPOINTED. See [Note: re-point, not one dictionary].

        Afterwards the store holds the refs only weakly; ``resident_views`` counts
        the tensor objects viewing the flat buffer (for the steady check).
        """
        if self.state is not LayoutState.OFFLOADED:
            self._refuse("repoint")
        self.state = LayoutState.REPOINTED
        st = flat.untyped_storage()
        base = flat.storage_offset()
        views = 0
        for e in self.entries:
            at = base + e.offset
            for r in e.refs:
                t = r.tensor
                if type(t) in _GUARDED:
                    r.unguard()
                if t.requires_grad:  # keep its gradient accumulator (see [Note: autograd identity])
                    repoint_tensor(t, st, at + r.offset, r.size, r.stride)
                else:
                    t.set_(st, at + r.offset, r.size, r.stride)
                r.weaken()
                views += 1
        self.resident_views = views

    def repark(self) -> None:
        """Undo :meth:`repoint` after a failed reload: every ref parked again, held strongly again;
        REPOINTED -> OFFLOADED."""
        if self.state is not LayoutState.REPOINTED:
            self._refuse("repark")
        self.state = LayoutState.OFFLOADED
        st, _, where = self._parked_on or (None, 0, None)
        guarding = guard_enabled()
        for e in self.entries:
            for r in e.refs:
                t = r.live()
                if t is None or st is None:
                    continue
                repoint_tensor(t, st, 0, r.size, zero_strides(len(r.size)))
                r.strengthen()
                if guarding:
                    guard(t, r.name, where=where)
                    if r.dtensor is not None:
                        guard(r.dtensor, r.name, where=where)
        self.resident_views = -1

    def mark_resident(self, flat: torch.Tensor) -> int:
        """The reload's copies completed: REPOINTED -> ON_DEVICE, resident in the flat buffer ``flat``.
        Returns the bytes brought back (a dropped layout counts nothing)."""
        if self.state is not LayoutState.REPOINTED:
            self._refuse("mark_resident")
        self.state = LayoutState.ON_DEVICE
        self.flat_storage = flat.untyped_storage()._cdata
        self._parked_on = None
        moved = 0 if self.dropped else self.data_nbytes
        self.dropped = False
        return moved

    # ------------------------------------------------------------------ entry bases

    def adopt(self, flat: torch.Tensor, every_entry: bool) -> None:
        """Take the resident layout into this offload: bases into ``flat`` (for every entry, or only
        the first: one view is all the release needs), no entry owns a storage."""
        first = True
        for e in self.entries:
            e.owns_storage = False
            e.base = own_view(flat[e.offset:e.offset + e.numel]) if first or every_entry else None
            first = False

    def drop_bases(self) -> None:
        """Forget every entry's device view (the store keeps no view of the state it does not need)."""
        for e in self.entries:
            e.base = None

    def unadopt(self) -> None:
        """After a failed offload (nothing released): back to weak refs, no bases."""
        for e in self.entries:
            e.base = None
            for r in e.refs:
                r.weaken()

    def release_bases(self, release: Callable[[torch.Tensor], None], done: set[int]) -> None:
        """Release each entry's storage not released yet (``done``: storage ids released) and drop the bases."""
        for e in self.entries:
            base = e.base
            if base is None:
                continue  # released as soon as its copy completed
            sid = base.untyped_storage()._cdata
            if sid not in done:
                release(base)
                done.add(sid)
            e.base = None

    def keep_one_base(self) -> None:
        """While the copies run: a layout resident as one flat buffer keeps one view of it for the release
        and drops its entries' views (dropping tens of thousands of view tensors costs milliseconds,
        which must not land after the last copy completes); :meth:`release_device` then does no
        per-entry work."""
        if self.flat_storage is None:
            return
        base = next((e.base for e in self.entries if e.base is not None), None)
        if base is None or base.untyped_storage()._cdata != self.flat_storage:
            return
        self._release_view = base
        for e in self.entries:
            e.base = None

    @property
    def release_view(self) -> torch.Tensor | None:
        """The view :meth:`keep_one_base` kept, or None."""
        return self._release_view

    def release_device(self, release: Callable[[torch.Tensor], None], done: set[int], dropped: bool) -> None:
        """Release what is left of the layout's device memory (its one flat view, or each entry's
        storage not in ``done``), then :meth:`mark_offloaded`."""
        flat = self._release_view
        if flat is not None:
            sid = flat.untyped_storage()._cdata
            if sid not in done:
                release(flat)
                done.add(sid)
        else:
            self.release_bases(release, done)
        self.mark_offloaded(dropped)

    def release_copied(self, entries: list[StorageEntry], remaining: dict[int, int],
                       release: Callable[[torch.Tensor], None], released: list[ReleasedStorage]) -> int:
        """One copy carrying ``entries`` completed: release each entry of its own storage whose last copy
        it was (``remaining``: copies left per ``id(entry)``), recording it in ``released``. Returns how many."""
        count = 0
        for e in entries:
            left = remaining[id(e)] - 1
            remaining[id(e)] = left
            if left == 0 and e.owns_storage and e.base is not None:
                st = e.base.untyped_storage()
                released.append(_new(ReleasedStorage, (self, e, st, st.nbytes())))  # no __new__ frame
                release(e.base)
                e.base = None
                count += 1
        return count

    def describe(self) -> str:
        """One line for logs."""
        return (f"{self.key.label()}: {len(self.entries)} storages, {len(self.refs)} tensors, "
                f"{self.nbytes / 2**20:.1f} MiB in {len(self.segments)} host segment(s), {self.state.value}")


__all__ = ["EntryOrigin", "FlatLayout", "LAYOUT_TRANSITIONS", "LayoutKey", "LayoutKeys",
           "LayoutState", "ReleasedStorage", "StorageEntry", "TensorRef", "storage_id"]
