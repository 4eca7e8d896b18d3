"""The three paths an offload can take, as small strategies of :class:`refimpl.store.moves.offload.Offload`.

Which path an offload takes depends on where the state is:

* :class:`StreamedPath`: the first offload of scattered state with a backend
  that streams (:class:`~refimpl.store.backends.base.StreamingBackend`,
  :mod:`refimpl.store.moves.streaming`): collection, layout and the copies overlap.
* :class:`SteadyPath`: every tensor is still where the last reload put it
  (see [Note: steady offload check] in :mod:`refimpl.store.state.steady_check`): the
  resident layouts leave as they are, in the copies issued ahead of collection.
* :class:`FullPath`: anything else: collect everything, lay out afresh (layouts
  still unchanged keep their copies issued ahead), copy.

A path answers the offload's stage methods that differ between paths:
:meth:`~OffloadPath.collect`, :meth:`~OffloadPath.lay_out`,
:meth:`~OffloadPath.issue`; what it was given it gets at construction (nothing
travels between stages but return values), and :meth:`~OffloadPath.abort`
undoes what only the path holds.
"""
from __future__ import annotations

import abc
from typing import Callable, ClassVar, Iterator

import torch

from refimpl.runtime.base import Runtime, gather
from refimpl.store.backends.base import StoreBackend
from refimpl.store.config import Category, StoreConfig
from refimpl.store.moves.assign import assign_layouts, gc_paused
from refimpl.store.moves.copies import OffloadCopies, sort_key
from refimpl.store.moves.source import StagingArea
from refimpl.store.moves.streaming import LayoutStream
from refimpl.store.state.collect import Item
from refimpl.store.state.grouping import CollectReport, StorageGrouper, ViewCount, group_by_storage
from refimpl.store.state.layout import FlatLayout, LayoutKey
from refimpl.store.state.residency import adopt_resident
from refimpl.store.state.steady_check import ItemSignature

ItemSource = Callable[[], Iterator[Item]]
"""Yields the registered items of the offload's categories, from every collector, each call afresh."""


class OffloadPath(abc.ABC):
    """One path of an offload, from the collected state to the issued copies.

    :meth:`collect` (phase ``collect``), :meth:`lay_out` (phase ``plan``; returns
    the layouts by key and sets :attr:`report` and :attr:`signature`),
    :meth:`issue` (phase ``issue``).
    """

    #: the path's name (``streamed``, ``steady``, ``full``), for logs and ``StoreStats.last_offload_path``
    name: ClassVar[str]

    def __init__(self) -> None:
        #: what the collection left out (zero-size, host-resident) and views it found
        self.report: CollectReport | None = None
        #: what this collection saw, for the next offload's steady check (None: keep the last one)
        self.signature: ItemSignature | None = None

    async def collect(self) -> None:
        """Collection that belongs to the ``collect`` phase (default: none)."""

    @abc.abstractmethod
    async def lay_out(self) -> dict[LayoutKey, FlatLayout]:
        """The offload's layouts by key; sets :attr:`report` and :attr:`signature`."""

    async def issue(self, copies: OffloadCopies, layouts: dict[LayoutKey, FlatLayout],
                    ordered: list[FlatLayout]) -> None:
        """Discard copies issued ahead for changed layouts; copy every layout in ``ordered`` that has none."""
        await copies.discard_changed(layouts)
        await copies.issue(ordered)

    def ordered(self, layouts: dict[LayoutKey, FlatLayout]) -> list[FlatLayout]:
        """``layouts`` in processing order (the same on every rank)."""
        return sorted(layouts.values(), key=sort_key)

    def park_flats(self, copies: OffloadCopies) -> dict[LayoutKey, torch.Tensor]:
        """The flat buffer of each layout whose refs are parked from it (default: none)."""
        return {}

    def stray_views(self) -> dict[int, set[int]]:
        """Views of the store's flat buffers that the collection found kept by the user (parked at release)."""
        return self.report.stray_views if self.report is not None else {}

    async def abort(self) -> None:
        """After a failure before the release: undo what only this path holds (default: nothing)."""

    def building(self) -> list[FlatLayout]:
        """Layouts this path started that :meth:`lay_out` has not returned yet (default: none)."""
        return []


class StreamedPath(OffloadPath):
    """The first offload of scattered state: copies start while collection goes on.

    Only for a backend implementing ``StreamingBackend`` and no layout resident in a
    flat buffer; see [Note: why stream] in :mod:`refimpl.store.moves.streaming`.
    """

    name = "streamed"

    def __init__(self, rt: Runtime, backend: StoreBackend, config: StoreConfig, cats: frozenset[Category],
                 items: ItemSource, staging: StagingArea, *, drop_grads: bool, lookahead: int) -> None:
        super().__init__()
        self.rt, self.cats, self.items = rt, cats, items
        self.stream = LayoutStream(rt, backend, config, staging, drop_grads=drop_grads, lookahead=lookahead)
        self.grouper = StorageGrouper(rt.device)
        self.seen: list[Item] = []  # recorded as they stream past, for the next offload's fast check
        self.finished = False

    async def collect(self) -> None:
        """Collect and group every item; each storage found is placed and its segment streamed at once."""
        stream = self.stream
        with gc_paused():  # tens of thousands of small objects: no collector passes meanwhile
            for group in self.grouper.feed(_recorded(self.items(), self.seen)):
                await stream.add(group)

    async def lay_out(self) -> dict[LayoutKey, FlatLayout]:
        """Finish validation and the layouts (the last segments' copies are issued now)."""
        _, self.report = self.grouper.finish()
        layouts = await self.stream.finish()
        self.signature = ItemSignature(self.cats, self.seen, layouts, self.report)
        self.finished = True
        return layouts

    async def issue(self, copies: OffloadCopies, layouts: dict[LayoutKey, FlatLayout],
                    ordered: list[FlatLayout]) -> None:
        """Every copy is issued already: hand the stream's sources and completions to ``copies``."""
        stream = self.stream
        copies.adopt_stream(stream.sources, [gather(*stream.completions(lay.key)) for lay in ordered])

    async def abort(self) -> None:
        """Nothing is released yet: wait for the copies issued and drop the partial host buffers."""
        if not self.finished:
            await self.stream.abort()

    def building(self) -> list[FlatLayout]:
        """The layouts still being built."""
        return [] if self.finished else self.stream.layouts()


class SteadyPath(OffloadPath):
    """Every tensor is still where the last reload put it: the resident layouts leave as they are.

    Chosen by :func:`refimpl.store.state.steady_check.steady_unchanged` (the per-tensor
    check runs before this path exists, in the ``collect`` phase); laying out
    only holds the tensors strongly again, and the copies are the ones issued
    ahead of collection.
    """

    name = "steady"

    def __init__(self, resident: list[FlatLayout], signature: ItemSignature,
                 flats: dict[LayoutKey, torch.Tensor]) -> None:
        super().__init__()
        self.resident, self.last, self.flats = resident, signature, flats

    async def lay_out(self) -> dict[LayoutKey, FlatLayout]:
        """The resident layouts, unchanged and adopted; the last collection's report."""
        self.report = self.last.report
        for lay in self.resident:
            adopt_resident(lay, self.flats[lay.key])
        return {lay.key: lay for lay in self.resident}

    def park_flats(self, copies: OffloadCopies) -> dict[LayoutKey, torch.Tensor]:
        """Every layout is parked from its flat buffer."""
        return self.flats

    def stray_views(self) -> dict[int, set[int]]:
        """None: nothing but the reload's views can view an unchanged flat buffer's tensors."""
        return {}


class FullPath(OffloadPath):
    """Collect everything, lay the storages out afresh, copy.

    Resident layouts whose flat buffer still holds exactly their tensors are
    reused as they are (their copies issued ahead stand); the others' copies
    issued ahead are discarded.
    """

    name = "full"

    def __init__(self, rt: Runtime, backend: StoreBackend, config: StoreConfig, cats: frozenset[Category],
                 items: ItemSource, resident: list[FlatLayout], viewers: dict[int, ViewCount]) -> None:
        super().__init__()
        self.rt, self.backend, self.config = rt, backend, config
        self.cats, self.items, self.resident, self.viewers = cats, items, resident, viewers

    async def lay_out(self) -> dict[LayoutKey, FlatLayout]:
        """Collect, validate and group every item, then assign the storages to layouts."""
        items = list(self.items())
        own = frozenset(lay.flat_storage for lay in self.resident)
        groups, self.report = group_by_storage(items, self.rt.device, self.viewers, own)
        layouts = assign_layouts(groups, self.resident, self.backend, self.config)
        self.signature = ItemSignature(self.cats, items, layouts, self.report)
        return layouts


def _recorded(items: Iterator[Item], into: list[Item]) -> Iterator[Item]:
    """Pass ``items`` through, appending each to ``into``."""
    for it in items:
        into.append(it)
        yield it


__all__ = ["FullPath", "ItemSource", "OffloadPath", "SteadyPath", "StreamedPath"]
