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

* the bytes themselves: when a copy is issued, a digest of its device range
  ([Note: content digest] in :mod:`refimpl.store.backends.digest`) is taken on
  the calling thread's current stream, where the copy is ordered; at the
  offload (its first stage, :meth:`EarlyCopies.verify`) the range is digested
  again, and a copy whose range no longer hashes the same is copied again.

The counters alone cannot see a write that bypasses them: a fused optimizer
step (``torch.optim.AdamW(fused=True)`` bumps no counter), a BatchNorm forward
in train mode (its running statistics are updated in place by the kernel),
``p.data.add_(...)`` through the ``.data`` alias, a custom kernel writing through
a raw pointer. Before the digests, such a write after ``copy_early`` left the
host copy with the bytes of the time of the call and the reload returned them.
The digest sees every such write (a changed word always changes it; see the
Note for what else it guarantees). Its cost: two digests of every byte
copied early, one at ``copy_early`` on the caller's stream (queued: the host
does not wait) and one at the offload, plus one host synchronization per
offload that has early copies (it waits for the work queued before the
offload). On CUDA a digest is one read of the bytes (the fused row sums,
[Note: the fused row sums]; on an H200, 2 GiB in 24 ranges in 3.5 ms);
elsewhere about three (an int32 multiply and a row sum). ``copy_early``
stays a hint: a tensor the store does not hold in a resident flat buffer
(before the first reload, or a backend without ``early_copies``) is skipped
and the offload copies it as always.

Early copies write only into the layout's host buffer, which holds nothing
needed while the layout is resident; every store operation but
``copy_early`` and ``offload`` awaits and forgets them first
(:meth:`EarlyCopies.drain`).

[Note: early copies while a reload streams]
The step right after a streamed reload (``reload(stream=True)``) is the one
that makes the state final for the next offload, while the reload's pieces
are still landing. ``copy_early`` then leaves the reload streaming (finishing
it first made the host wait for its last piece at the backward's first
optimizer step) and treats each layout in flight as resident in the flat
buffer the reload fills, with two orderings on the device instead of a wait
on the host. The host buffer an early copy writes into is the one the
reload's pieces still read, and the device range it reads is the one they
fill: the calling thread's current stream is made to wait for every piece
overlapping the copy's range (``Completion.order_on_device``) before the
range is digested, and the copy, on the device-to-host stream, is ordered
after that stream. So a range leaves only after its bytes landed and after
the work that made them final, and never overwrites host bytes a piece has
yet to read; pieces of other ranges go on copying in the other direction
at the same time. When the reload finishes, its layouts become resident in
the same flat buffers, so the offload finds these copies as it finds any
other (the flat buffer's storage is the one each copy recorded). Should a
streamed reload fail after early copies of its layouts were made (a CUDA
error while waiting for its pieces), the host copies of those ranges hold
the bytes the step wrote; the failure is logged naming the layouts.
"""
from __future__ import annotations

import bisect
import logging
import weakref
from dataclasses import dataclass, field
from typing import Iterable

import torch

from refimpl.runtime.base import Completion, Runtime
from refimpl.store.backends.base import Piece, StoreBackend
from refimpl.store.backends.digest import content_digest, fused_row_sums
from refimpl.store.config import Category
from refimpl.store.state.entry import StorageEntry, storage_id
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutState
from refimpl.store.state.residency import resident_flat

logger = logging.getLogger(__name__)


@dataclass
class EarlyCopy:
    """One early copy of a run of neighbouring entries: its element range in the flat buffer, the copy's
    completions, the version counters of every tensor object viewing those entries when it was issued and the
    digest of the range's device bytes then."""

    start: int
    stop: int
    completions: list[Completion]
    #: (tensor object, its version counter at the copy, whether it is the plain tensor rather than a DTensor)
    versions: list[tuple["weakref.ref[torch.Tensor]", int, bool]]
    storage: int
    #: bytes of the entries copied (the range less the alignment padding between them)
    nbytes: int
    #: :func:`~refimpl.store.backends.digest.content_digest` of the range ``start:stop`` of the flat buffer when the
    #: copy was issued (on the device; two hashes), what :meth:`EarlyCopies.verify` digests again
    digest: torch.Tensor | None = None
    #: set by :meth:`EarlyCopies.verify`: the range's bytes no longer hash as they did when the copy was issued
    changed: bool = False

    def valid(self) -> bool:
        """Every tensor viewing the entry (and its DTensor) still alive and unchanged since the copy, every plain
        one still in the same flat buffer, and the bytes unchanged (:meth:`EarlyCopies.verify`)."""
        return not self.changed and self.counters_unchanged()

    def counters_unchanged(self) -> bool:
        """The version-counter half of :meth:`valid`."""
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


@dataclass(frozen=True)
class StreamingFlat:
    """A layout a streamed reload is filling: its flat buffer and the reload's pieces of it (ascending; none where
    the buffer was filled in one step on the compute stream). See [Note: early copies while a reload streams]."""

    flat: torch.Tensor
    pieces: tuple[Piece, ...] = ()
    #: each piece's first element (derived)
    starts: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts", tuple(p.start for p in self.pieces))

    @property
    def storage(self) -> int:
        """The flat buffer's storage id (what the layout's ``flat_storage`` becomes once resident)."""
        return storage_id(self.flat)

    def after_pieces(self, start: int, stop: int) -> list[Piece]:
        """The pieces overlapping elements ``[start, stop)``."""
        first = max(0, bisect.bisect_right(self.starts, start) - 1)
        return [p for p in self.pieces[first:] if p.start < stop and p.stop > start]


class _Index:
    """Resident flat layouts (and layouts a streamed reload is filling) by their flat buffer's storage id: their
    entries by offset and each entry's host segment."""

    def __init__(self, layouts: dict[LayoutKey, FlatLayout], streaming: dict[LayoutKey, StreamingFlat]) -> None:
        self.signature = _signature(layouts, streaming)
        self.by_storage: dict[int, tuple[FlatLayout, list[int], list[StorageEntry], list[int]]] = {}
        for lay in layouts.values():
            if lay.dropped:
                continue
            if lay.key in streaming:
                storage = streaming[lay.key].storage
            elif lay.state is LayoutState.ON_DEVICE and lay.flat_storage is not None:
                storage = lay.flat_storage
            else:
                continue
            entries = sorted(lay.entries, key=lambda e: e.offset)
            cuts = [a for a, _ in lay.segments]
            segs = [bisect.bisect_right(cuts, e.offset) - 1 for e in entries]
            self.by_storage[storage] = (lay, [e.offset for e in entries], entries, segs)

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

    def runs(self, storage: int, positions: Iterable[int]) -> list[list[StorageEntry]]:
        """The entries at ``positions`` of the layout in the flat buffer ``storage`` as runs of neighbours (nothing
        of the layout between them but alignment padding) inside one host segment: each run leaves in one copy."""
        _, _, entries, segs = self.by_storage[storage]
        out: list[list[StorageEntry]] = []
        last = -2
        for i in sorted(set(positions)):
            if i == last + 1 and segs[i] == segs[last]:
                out[-1].append(entries[i])
            else:
                out.append([entries[i]])
            last = i
        return out


def _watched(run: list[StorageEntry]) -> list[StorageEntry]:
    """The entries of a copy whose tensors' counters and bytes the offload checks again: all of them."""
    return run  # every entry of a copy, not only the first


def _signature(layouts: dict[LayoutKey, FlatLayout],
               streaming: dict[LayoutKey, StreamingFlat]) -> tuple[tuple[int, int | None, str, int | None], ...]:
    return tuple((id(lay), lay.flat_storage, lay.state.value,
                  streaming[lay.key].storage if lay.key in streaming else None) for lay in layouts.values())


class EarlyCopies:
    """The early copies of one store while its layouts are resident (see [Note: early copies])."""

    def __init__(self, rt: Runtime, backend: StoreBackend) -> None:
        self.rt, self.backend = rt, backend
        self._by_key: dict[LayoutKey, list[EarlyCopy]] = {}
        self._copied: set[tuple[LayoutKey, int]] = set()
        self._index: _Index | None = None
        #: bytes issued since the last offload, tensors skipped (not in a resident flat buffer), bytes issued while
        #: a streamed reload was filling their layout
        self.issued_bytes = 0
        self.skipped = 0
        self.streaming_bytes = 0

    @property
    def supported(self) -> bool:
        """Whether the backend can copy a resident layout's entries early (``StoreBackend.early_copies``)."""
        return self.backend.early_copies

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def keys(self) -> list[LayoutKey]:
        """The layouts that have early copies held."""
        return list(self._by_key)

    def prepare(self) -> None:
        """Before the first layouts become resident (the store's reload, on its caller's thread): build the digest's
        fused row sums for this device now ([Note: the fused row sums] in :mod:`refimpl.store.backends.digest`), so
        their one-time compile is not paid inside a training step's ``copy_early``. Nothing without early copies or
        off CUDA."""
        if self.supported and self.rt.device.type == "cuda":
            fused_row_sums(self.rt.device)

    async def issue(self, layouts: dict[LayoutKey, FlatLayout], tensors: Iterable[torch.Tensor],
                    streaming: dict[LayoutKey, StreamingFlat] | None = None) -> int:
        """Queue the copy of every entry holding one of ``tensors`` (once per entry; neighbouring entries in one
        copy); returns the bytes queued. ``streaming``: the layouts a streamed reload is still filling, each copied
        from its flat buffer once the pieces of the copy's range landed ([Note: early copies while a reload
        streams])."""
        if not self.supported:
            self.skipped += sum(1 for _ in tensors)
            return 0
        streaming = streaming or {}
        if self._index is None or self._index.signature != _signature(layouts, streaming):
            self._index = _Index(layouts, streaming)
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
            filling = streaming.get(key)
            flat = filling.flat if filling is not None else resident_flat(lay, {})
            if flat is None:
                self.skipped += len(positions)
                continue
            storage = storage_id(flat)
            runs = [r for r in ([e for e in run if (key, e.offset) not in self._copied and e.numel]
                                for run in index.runs(storage, positions)) if r]
            if not runs:
                continue
            if filling is not None:  # the digest and the copy after the pieces of their ranges, on the device
                for run in runs:
                    for piece in filling.after_pieces(run[0].offset, run[-1].offset + run[-1].numel):
                        if not piece.completion.order_on_device():
                            await piece.completion
            watched = [_watched(run) for run in runs]
            # one digest of each copy's whole range, taken where the copies are ordered (after the work queued on
            # this stream so far) and never waited for here
            digests = content_digest([flat[run[0].offset:run[-1].offset + run[-1].numel] for run in runs]).view(-1, 2)
            for j, (run, watch) in enumerate(zip(runs, watched)):
                a, b = run[0].offset, run[-1].offset + run[-1].numel
                done = await self.backend.copy_early(lay, flat, a, b)
                if done is None:  # the backend holds no host buffer of this layout yet
                    self.skipped += len(run)
                    continue
                versions = [(weakref.ref(obj), obj._version, plain) for e in watch for r in e.refs
                            for obj, plain in ((r.live(), True), (r.live_dtensor(), False)) if obj is not None]
                nbytes = sum(e.nbytes for e in run)
                self._by_key.setdefault(key, []).append(EarlyCopy(
                    a, b, done, versions, storage, nbytes, digests[j]))
                self._copied.update((key, e.offset) for e in run)
                moved += nbytes
                self.streaming_bytes += nbytes if filling is not None else 0
        flat = None  # no view of a flat buffer outlives the call but the copies' own
        self.issued_bytes += moved
        return moved

    async def verify(self, layouts: Iterable[FlatLayout]) -> int:
        """At the offload, before :meth:`take`: digest again the range of every early copy of ``layouts`` that the
        counters still call valid and mark the ones whose bytes changed since (a write the counters cannot see);
        one host synchronization for all. Returns how many were found changed."""
        checks: list[tuple[EarlyCopy, torch.Tensor]] = []
        for lay in layouts:
            copies = self._by_key.get(lay.key)
            if not copies:
                continue
            flat = resident_flat(lay, {})
            if flat is None:  # not resident in its flat buffer any more: the copies are not taken
                continue
            checks.extend((c, flat[c.start:c.stop]) for c in copies
                          if c.digest is not None and c.storage == lay.flat_storage and c.counters_unchanged())
        flat = None
        if not checks:
            return 0
        copies = [c for c, _ in checks]
        now = content_digest([view for _, view in checks]).view(-1, 2)
        checks.clear()  # no view of a flat buffer outlives the call
        then = torch.stack([c.digest for c in copies]).to(now.device)
        same = (now == then).all(dim=1).tolist()  # one row per copy; the one host synchronization
        changed = 0
        for c, ok in zip(copies, same):
            c.changed = not ok
            changed += c.changed
        if changed:
            logger.info("%d early cop%s changed after copy_early without a version counter moving (a fused optimizer "
                        "step, a BatchNorm forward, a write through .data): copied again", changed,
                        "y" if changed == 1 else "ies")
        return changed

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
            self.issued_bytes = self.skipped = self.streaming_bytes = 0
        else:
            self._copied = {x for x in self._copied if x[0].category not in cats}
        self._index = None
        for cs in copies:
            for c in cs:
                for d in c.completions:
                    await d

    def reset_counts(self) -> tuple[int, int, int]:
        """``(issued bytes, skipped tensors, bytes issued while streaming)`` since the last call; all back to 0."""
        out = (self.issued_bytes, self.skipped, self.streaming_bytes)
        self.issued_bytes = self.skipped = self.streaming_bytes = 0
        return out


__all__ = ["EarlyCopies", "EarlyCopy", "StreamingFlat", "Taken"]
