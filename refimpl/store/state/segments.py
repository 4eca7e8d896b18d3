"""Host segments: the one rule that cuts a layout's host buffer into pinned segments at entry boundaries, for the
layouts built at once (:meth:`~refimpl.store.state.layout.FlatLayout.build`) and those built while streaming
(:class:`refimpl.store.moves.streaming.LayoutStream`)."""
from __future__ import annotations

import torch


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


class SegmentCutter:
    """The segment-cut rule, written once for the eager (:meth:`FlatLayout.build`) and the streaming
    (:class:`~refimpl.store.moves.streaming.LayoutStream`) layouts.

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


__all__ = ["SegmentCutter", "round_up"]
