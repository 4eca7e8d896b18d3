"""Copies issued early: a resident layout's entries on their way to host memory before the offload is called.

[Note: early copies]
A training step makes its state final piece by piece: with the optimizer
stepped per layer inside the backward (a post-accumulate-grad hook, as
torchtune's ``optimizer_in_bwd``), layer ``k``'s parameters and optimizer state
are final while the backward still computes layers ``k-1 .. 0``. The offload
that follows the step need not wait for it to start copying:
:meth:`OffloadStore.copy_early` takes tensors the caller declares final until
the next offload and queues the device-to-host copy of the layout entries that
hold them on the runtime's copy stream, ordered after the work already queued
on the calling thread's current stream (where the hook ran the step);
neighbouring entries of one call (a layer's parameters, its moments) leave in
one copy. The copies run under the rest of the backward.

The next offload takes them over instead of copying those entries again: in
its first stage (:meth:`refimpl.store.moves.copies.OffloadCopies.copy_ahead`) a
resident layout with early copies has the backend copy only the rest
(``StoreBackend.offload_rest``) and its finisher awaits both. Whatever the
store cannot tell is still valid is copied again:

* every registered tensor object viewing a copied entry (and its DTensor) had
  its version counter read when the copy was issued; a tensor whose counter
  moved since (any in-place torch operation on it or on a view of it: an
  optimizer step, ``copy_``, ``zero_``) or that was re-pointed elsewhere has
  the entries of its copy copied again by the offload;
* the offload's own checks run as for every offload: a layout that changed
  (the steady check fails) takes the full path and its early copies are
  awaited and discarded.

What the counters cannot see is the caller's promise: a write that bypasses
torch's version counter (``p.data.add_(...)`` through the ``.data`` alias, a
custom kernel writing through a raw pointer) after ``copy_early`` leaves the
host copy with the bytes of the time of the call. ``copy_early`` is therefore
for tensors that are really final (after their optimizer step, before the
offload), and it is a hint: a tensor the store does not hold in a resident
flat buffer (before the first reload, or a backend without ``early_copies``)
is skipped and the offload copies it as always.

Early copies write only into the layout's host buffer, which holds nothing
needed while the layout is resident; every store operation but
``copy_early`` and ``offload`` awaits and forgets them first
(:meth:`EarlyCopies.drain`).
"""
from __future__ import annotations

import bisect
import logging
import weakref
from dataclasses import dataclass, field
from typing import Iterable

import torch

from refimpl.runtime.base import Completion, Runtime
from refimpl.store.backends.base import StoreBackend
from refimpl.store.config import Category
from refimpl.store.state.entry import StorageEntry, storage_id
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutState
from refimpl.store.state.residency import resident_flat

logger = logging.getLogger(__name__)


@dataclass
class EarlyCopy:
    """One early copy of a run of neighbouring entries: its element range in the flat buffer, the copy's
    completions and the version counters of every tensor object viewing those entries when it was issued."""

    start: int
    stop: int
    completions: list[Completion]
    #: (tensor object, its version counter at the copy, whether it is the plain tensor rather than a DTensor)
    versions: list[tuple["weakref.ref[torch.Tensor]", int, bool]]
    storage: int
    #: bytes of the entries copied (the range less the alignment padding between them)
    nbytes: int

    def valid(self) -> bool:
        """Every tensor viewing the entry (and its DTensor) still alive and unchanged since the copy, every plain
        one still in the same flat buffer."""
        for ref, version, plain in self.versions:
            t = ref()
            if t is None or t._version != version:
                return False
            if plain and t.untyped_storage()._cdata != self.storage:
                return False
        return True


@dataclass
class Taken:
    """What :meth:`EarlyCopies.take` hands an offload for one layout."""

    #: element ranges already on their way and still valid, ascending
    ranges: list[tuple[int, int]] = field(default_factory=list)
    #: every early copy's completion for the layout (valid or not: each must be awaited)
    completions: list[Completion] = field(default_factory=list)
    #: early copies not yet complete: each keeps one view of the flat buffer alive until awaited
    pending_views: int = 0
    reused_bytes: int = 0
    redone_bytes: int = 0


class _Index:
    """Resident flat layouts by their flat buffer's storage id: their entries by offset and each entry's host
    segment."""

    def __init__(self, layouts: dict[LayoutKey, FlatLayout]) -> None:
        self.signature = _signature(layouts)
        self.by_storage: dict[int, tuple[FlatLayout, list[int], list[StorageEntry], list[int]]] = {}
        for lay in layouts.values():
            if lay.state is LayoutState.ON_DEVICE and lay.flat_storage is not None and not lay.dropped:
                entries = sorted(lay.entries, key=lambda e: e.offset)
                cuts = [a for a, _ in lay.segments]
                segs = [bisect.bisect_right(cuts, e.offset) - 1 for e in entries]
                self.by_storage[lay.flat_storage] = (lay, [e.offset for e in entries], entries, segs)

    def find(self, t: torch.Tensor) -> tuple[FlatLayout, int] | None:
        """The resident layout and the position (in offset order) of the entry holding ``t``'s first element."""
        hit = self.by_storage.get(storage_id(t))
        if hit is None:
            return None
        lay, offsets, entries, _ = hit
        off = t.storage_offset()
        i = bisect.bisect_right(offsets, off) - 1
        if i < 0 or off >= entries[i].offset + max(entries[i].numel, 1):
            return None
        return lay, i

    def runs(self, lay: FlatLayout, positions: Iterable[int]) -> list[list[StorageEntry]]:
        """The entries at ``positions`` as runs of neighbours (nothing of the layout between them but alignment
        padding) inside one host segment: each run leaves in one copy."""
        _, _, entries, segs = self.by_storage[lay.flat_storage]
        out: list[list[StorageEntry]] = []
        last = -2
        for i in sorted(set(positions)):
            if i == last + 1 and segs[i] == segs[last]:
                out[-1].append(entries[i])
            else:
                out.append([entries[i]])
            last = i
        return out


def _signature(layouts: dict[LayoutKey, FlatLayout]) -> tuple[tuple[int, int | None, str], ...]:
    return tuple((id(lay), lay.flat_storage, lay.state.value) for lay in layouts.values())


class EarlyCopies:
    """The early copies of one store while its layouts are resident (see [Note: early copies])."""

    def __init__(self, rt: Runtime, backend: StoreBackend) -> None:
        self.rt, self.backend = rt, backend
        self._by_key: dict[LayoutKey, list[EarlyCopy]] = {}
        self._copied: set[tuple[LayoutKey, int]] = set()
        self._index: _Index | None = None
        #: bytes issued since the last offload, tensors skipped (not in a resident flat buffer)
        self.issued_bytes = 0
        self.skipped = 0

    @property
    def supported(self) -> bool:
        """Whether the backend can copy a resident layout's entries early (``StoreBackend.early_copies``)."""
        return self.backend.early_copies

    def __bool__(self) -> bool:
        return bool(self._by_key)

    async def issue(self, layouts: dict[LayoutKey, FlatLayout], tensors: Iterable[torch.Tensor]) -> int:
        """Queue the copy of every entry holding one of ``tensors`` (once per entry; neighbouring entries in one
        copy); returns the bytes queued."""
        if not self.supported:
            self.skipped += sum(1 for _ in tensors)
            return 0
        if self._index is None or self._index.signature != _signature(layouts):
            self._index = _Index(layouts)
        index, moved = self._index, 0
        wanted: dict[LayoutKey, tuple[FlatLayout, list[int]]] = {}
        for t in tensors:
            hit = index.find(getattr(t, "_local_tensor", t))
            if hit is None:
                self.skipped += 1
                continue
            lay, i = hit
            wanted.setdefault(lay.key, (lay, []))[1].append(i)
        for key, (lay, positions) in wanted.items():
            flat = resident_flat(lay, {})
            if flat is None:
                self.skipped += len(positions)
                continue
            for run in index.runs(lay, positions):
                run = [e for e in run if (key, e.offset) not in self._copied and e.numel]
                if not run:
                    continue
                a, b = run[0].offset, run[-1].offset + run[-1].numel
                done = await self.backend.copy_early(lay, flat, a, b)
                if done is None:  # the backend holds no host buffer of this layout yet
                    self.skipped += len(run)
                    continue
                versions = [(weakref.ref(obj), obj._version, plain) for e in run for r in e.refs
                            for obj, plain in ((r.live(), True), (r.live_dtensor(), False)) if obj is not None]
                nbytes = sum(e.nbytes for e in run)
                self._by_key.setdefault(key, []).append(EarlyCopy(a, b, done, versions, lay.flat_storage, nbytes))
                self._copied.update((key, e.offset) for e in run)
                moved += nbytes
        flat = None  # no view of a flat buffer outlives the call but the copies' own
        self.issued_bytes += moved
        return moved

    async def take(self, layout: FlatLayout) -> Taken | None:
        """The early copies of ``layout`` for its offload (forgotten here), or None where it has none. Those
        already complete are awaited (which drops their views of the flat buffer); the others are counted."""
        copies = self._by_key.pop(layout.key, None)
        if not copies:
            return None
        out = Taken()
        for c in sorted(copies, key=lambda c: c.start):
            out.completions.extend(c.completions)
            for d in c.completions:
                if d.done():
                    await d
                else:
                    out.pending_views += 1
            if c.storage == layout.flat_storage and c.valid():
                out.ranges.append((c.start, c.stop))
                out.reused_bytes += c.nbytes
            else:
                out.redone_bytes += c.nbytes
        return out

    async def drain(self, cats: Iterable[Category] | None = None) -> None:
        """Await the early copies still held (of layouts of ``cats``; default: all, and the counts reset) and forget
        them (their host bytes are not used)."""
        keys = [k for k in self._by_key if cats is None or k.category in cats]
        copies = [self._by_key.pop(k) for k in keys]
        if cats is None:  # everything dropped: the counts start afresh too
            self._copied.clear()
            self.issued_bytes = self.skipped = 0
        else:
            self._copied = {x for x in self._copied if x[0].category not in cats}
        self._index = None
        for cs in copies:
            for c in cs:
                for d in c.completions:
                    await d

    def reset_counts(self) -> tuple[int, int]:
        """``(issued bytes, skipped tensors)`` since the last call; both back to 0."""
        out = (self.issued_bytes, self.skipped)
        self.issued_bytes = self.skipped = 0
        return out


__all__ = ["EarlyCopies", "EarlyCopy", "Taken"]
