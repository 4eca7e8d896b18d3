"""The first offload, streamed: copies start while the state is still being collected.

[Note: why stream]
On the first offload the store must visit every registered tensor (tens of
thousands for a MoE) before it knows the layouts, and the host memory must be
pinned before anything can be copied into it. Done one after the other, both
costs add to the copy time. Streaming overlaps them: layouts are built
append-only as storages are found (offsets never move once assigned), so a
host segment is final as soon as the next storage no longer fits in it. At
that moment the backend starts pinning the segment (:meth:`StreamingBackend.stream_reserve`),
and once ``lookahead`` more segments are pinning, the oldest one's copies are
issued (:meth:`StreamingBackend.stream_copy`), while collection goes on.

The layouts come out identical to :meth:`FlatLayout.build` over the same
entries (same aligned offsets, same segment cuts), so later cycles reuse the
pinned buffers. Nothing is released until collection, validation and every
pinning have succeeded: an error midway waits for the copies already issued,
discards the partial host buffers and leaves the state on the device.

Only backends implementing :class:`~refimpl.store.backends.base.StreamingBackend`
(no padding, no collectives) take this path; ``prepare`` is not called for it.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field


from refimpl.runtime.base import Completion, Runtime
from refimpl.store.backends.base import StoreBackend
from refimpl.store.config import Category, StoreConfig
from refimpl.store.moves.source import DeviceLayoutSource, StagingArea
from refimpl.store.state.grouping import StorageGroup
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutKeys, StorageEntry
from refimpl.store.state.segments import SegmentCutter


@dataclass
class _OpenLayout:
    """A layout being built: where the next storage goes and where the open segment starts."""

    layout: FlatLayout
    source: DeviceLayoutSource
    cutter: SegmentCutter
    copy: bool
    completions: list[Completion] = field(default_factory=list)


class LayoutStream:
    """Builds flat layouts as storage groups arrive and streams full host segments to the backend
    (a :class:`~refimpl.store.backends.base.StreamingBackend`).

    ``drop_grads``: gradient layouts are built but not copied.
    ``lookahead``: segments that may be pinning at once before the oldest one's copies are issued.
    """

    def __init__(self, rt: Runtime, backend: StoreBackend, config: StoreConfig, staging: StagingArea,
                 *, drop_grads: bool, lookahead: int) -> None:
        self.rt, self.backend, self.config, self.staging = rt, backend, config, staging
        self.drop_grads = drop_grads
        self.lookahead = max(1, lookahead)
        self.open: dict[LayoutKey, _OpenLayout] = {}
        self.sources: list[DeviceLayoutSource] = []
        self._keys = LayoutKeys()
        self._queue: collections.deque[tuple[_OpenLayout, int, int, int]] = collections.deque()
        self._pairs: list[tuple[StorageEntry, StorageGroup]] = []

    async def add(self, g: StorageGroup) -> None:
        """Place a newly found storage; close (and maybe start copying) the segment it does not fit in."""
        entry = StorageEntry(g.category, g.kind, g.dtype, g.numel, g.refs, g.base_view(), g.source)
        self._pairs.append((entry, g))
        key = self._keys[(g.category.value, g.dtype, self.backend.placement_key(entry))]
        st = self.open.get(key)
        if st is None:
            st = self._begin(key)
        off, closed = st.cutter.place(entry.numel)
        if closed >= 0:
            await self._close_segment(st, closed, off)
        st.layout.append(entry, off)

    async def finish(self) -> dict[LayoutKey, FlatLayout]:
        """Close every layout's last segment, issue all remaining copies; return the layouts by key."""
        for st in self.open.values():
            st.layout.seal(st.cutter)
            await self._close_segment(st, st.cutter.seg_start, st.layout.numel)
        while self._queue:
            await self._issue(*self._queue.popleft())
        for st in self.open.values():
            if st.copy:
                self.backend.stream_end(st.layout)
        for entry, g in self._pairs:
            entry.kind = g.kind  # an explicit kind may have arrived after the storage was placed
        return {key: st.layout for key, st in self.open.items()}

    def layouts(self) -> list[FlatLayout]:
        """Every layout started so far (complete or not)."""
        return [st.layout for st in self.open.values()]

    def completions(self, key: LayoutKey) -> list[Completion]:
        """The copies issued for a layout."""
        return self.open[key].completions

    async def abort(self) -> None:
        """After an error: wait for every copy issued and drop the partial host buffers."""
        for st in self.open.values():
            for c in st.completions:
                if not c.done():
                    await c
            if st.copy:
                self.backend.discard(st.layout)

    # ------------------------------------------------------------------ internals

    def _begin(self, key: LayoutKey) -> _OpenLayout:
        layout = FlatLayout(key, [], 0, 0, ())
        source = DeviceLayoutSource(self.rt, layout, self.config, staging=self.staging)
        copy = not (self.drop_grads and key.category is Category.GRADS)
        cutter = SegmentCutter(key.dtype, self.config.alignment_bytes, self.config.segment_bytes)
        st = _OpenLayout(layout, source, cutter, copy)
        self.open[key] = st
        if copy:
            self.sources.append(source)
            self.backend.stream_begin(layout)
        return st

    async def _close_segment(self, st: _OpenLayout, start: int, stop: int) -> None:
        if not st.copy or stop <= start:
            return
        index = self.backend.stream_reserve(st.layout, stop - start)
        self._queue.append((st, index, start, stop))
        while len(self._queue) > self.lookahead:
            await self._issue(*self._queue.popleft())

    async def _issue(self, st: _OpenLayout, index: int, start: int, stop: int) -> None:
        st.completions.extend(await self.backend.stream_copy(st.layout, st.source, index, start, stop))


__all__ = ["LayoutStream"]
