"""Plan objects: one per path an offload or a reload can take.

Theory of operation
-------------------
The store's offload is a pipeline that descends, one module per stage:

1. **collect** (:mod:`refimpl.store.collect`): collectors yield an :class:`Item`
   per registered tensor; :class:`StorageGrouper` validates them and groups
   them by storage.
2. **plan** (:mod:`refimpl.store.planner`, and this module): storages go to
   flat layouts at aligned offsets.
3. **copy** (:mod:`refimpl.store.copies`, reading the device through
   :mod:`refimpl.store.source`): each layout's bytes are copied to host memory
   by the backend.
4. **release** (:mod:`refimpl.store.release`): registered tensors are parked
   (:mod:`refimpl.store.residency`), device storages released.

A reload goes back: **plan** (which layouts, how to check their tensors) ->
**copy** (:class:`~refimpl.store.copies.ReloadCopies`) -> **restore**
(:mod:`refimpl.store.residency`: re-point every tensor into its flat buffer).

Which path an offload takes depends on where the state is, and each path is one
:class:`OffloadPlan` here; the store picks one per offload and runs its stages
(:meth:`~OffloadPlan.collect`, :meth:`~OffloadPlan.plan`, :meth:`~OffloadPlan.copy`):

* :class:`StreamedOffload`: the first offload of scattered state with a backend
  that streams (:mod:`refimpl.store.streaming`): collection, planning and the
  copies overlap.
* :class:`SteadyOffload`: every tensor is still where the last reload put it
  (see [Note: steady offload check] in :mod:`refimpl.store.residency`): the
  resident layouts leave as they are, in the copies issued ahead of collection.
* :class:`FullOffload`: anything else: collect everything, plan afresh (layouts
  still unchanged keep their copies issued ahead), copy.

A reload is a :class:`ReloadPlan`, or a :class:`RecoverPlan` for
:meth:`OffloadStore.recover`, which differ only in what a changed tensor means.
"""
from __future__ import annotations

import abc
import logging
from typing import Callable, ClassVar, Iterator

import torch

from refimpl.runtime.base import Runtime, gather
from refimpl.store.backends.base import StoreBackend
from refimpl.store.collect import Item
from refimpl.store.grouping import CollectReport, StorageGrouper, group_by_storage
from refimpl.store.config import Category, StoreConfig
from refimpl.store.copies import OffloadCopies, sort_key
from refimpl.store.errors import TensorChangedError
from refimpl.store.layout import FlatLayout, LayoutKey
from refimpl.store.planner import gc_paused, plan_layouts
from refimpl.store.residency import ItemSignature, adopt_resident, changed_tensors, force_repoint_prepare
from refimpl.store.streaming import StreamingPlan

logger = logging.getLogger(__name__)

ItemSource = Callable[[], Iterator[Item]]
"""Yields the registered items of the offload's categories, from every collector, each call afresh."""


class OffloadPlan(abc.ABC):
    """One path of an offload, from the collected state to the issued copies.

    The store calls, in order, with its phase clock lapped in between:
    :meth:`collect` (lap ``collect``), :meth:`plan` (lap ``plan``; then
    :attr:`layouts`, :attr:`report` and :attr:`signature` are set), :meth:`copy`
    (lap ``issue``). On failure :meth:`abort` undoes what only the plan knows,
    and :meth:`touched` names every layout whose device views must be dropped.
    """

    #: the path's name (``streamed``, ``steady``, ``full``), for logs
    name: ClassVar[str]

    def __init__(self) -> None:
        #: the planned layouts by key (empty until :meth:`plan` ran)
        self.layouts: dict[LayoutKey, FlatLayout] = {}
        #: what the collection left out (zero-size, host-resident) and views it found
        self.report: CollectReport | None = None
        #: what this collection saw, for the next offload's steady check (None: keep the last one)
        self.signature: ItemSignature | None = None

    async def collect(self, copies: OffloadCopies) -> None:
        """Collection that belongs to the ``collect`` phase (default: none)."""

    @abc.abstractmethod
    async def plan(self, copies: OffloadCopies) -> None:
        """Settle :attr:`layouts`, :attr:`report` and :attr:`signature`."""

    @abc.abstractmethod
    async def copy(self, copies: OffloadCopies, ordered: list[FlatLayout]) -> None:
        """Issue (or adopt) the copy of every layout in ``ordered``; their finishers go to ``copies.pending``."""

    def ordered(self) -> list[FlatLayout]:
        """:attr:`layouts` in processing order (the same on every rank)."""
        return sorted(self.layouts.values(), key=sort_key)

    def resident_flats(self, copies: OffloadCopies) -> dict[LayoutKey, torch.Tensor]:
        """The flat buffer of each layout whose tensors :func:`park` re-points from it (default: none)."""
        return {}

    def stray_views(self) -> dict[int, set[int]]:
        """Views of the store's flat buffers that the collection found kept by the user (parked at release)."""
        return self.report.stray_views if self.report is not None else {}

    async def abort(self) -> None:
        """After a failure before the release: undo what only this plan holds (default: nothing)."""

    def touched(self) -> list[FlatLayout]:
        """Every layout this plan built or adopted so far."""
        return list(self.layouts.values())


class StreamedOffload(OffloadPlan):
    """The first offload of scattered state: copies start while collection goes on.

    Only for a backend implementing ``StreamingBackend`` and no layout resident in a
    flat buffer; see [Note: why stream] in :mod:`refimpl.store.streaming`.
    """

    name = "streamed"

    def __init__(self, rt: Runtime, backend: StoreBackend, config: StoreConfig, cats: frozenset[Category],
                 items: ItemSource, *, drop_grads: bool, lookahead: int) -> None:
        super().__init__()
        self.rt, self.backend, self.config = rt, backend, config
        self.cats, self.items, self.drop_grads, self.lookahead = cats, items, drop_grads, lookahead
        self.stream: StreamingPlan | None = None
        self.grouper: StorageGrouper | None = None
        self.seen: list[Item] = []  # recorded as they stream past, for the next offload's fast check
        self.finished = False

    async def collect(self, copies: OffloadCopies) -> None:
        """Collect and group every item; each storage found is placed and its segment streamed at once."""
        stream = self.stream = StreamingPlan(self.rt, self.backend, self.config, copies.staging,
                                             drop_grads=self.drop_grads, lookahead=self.lookahead)
        grouper = self.grouper = StorageGrouper(self.rt.device)
        with gc_paused():  # tens of thousands of small objects: no collector passes meanwhile
            for group in grouper.feed(_recorded(self.items(), self.seen)):
                await stream.add(group)

    async def plan(self, copies: OffloadCopies) -> None:
        """Finish validation and the layouts (the last segments' copies are issued now)."""
        assert self.grouper is not None and self.stream is not None
        _, self.report = self.grouper.finish()
        self.layouts = await self.stream.finish()
        self.signature = ItemSignature(self.cats, self.seen, self.layouts, self.report)
        self.finished = True

    async def copy(self, copies: OffloadCopies, ordered: list[FlatLayout]) -> None:
        """Every copy is issued already: hand the stream's sources and completions to ``copies``."""
        assert self.stream is not None
        copies.sources.extend(self.stream.sources)
        copies.pending = [gather(*self.stream.completions(lay.key)) for lay in ordered]

    async def abort(self) -> None:
        """Nothing is released yet: wait for the copies issued and drop the partial host buffers."""
        if self.stream is not None and not self.finished:
            await self.stream.abort()

    def touched(self) -> list[FlatLayout]:
        """The finished layouts and the ones still being built."""
        return [*self.layouts.values(), *(self.stream.layouts() if self.stream is not None else ())]


class SteadyOffload(OffloadPlan):
    """Every tensor is still where the last reload put it: the resident layouts leave as they are.

    Chosen by :func:`refimpl.store.residency.steady_unchanged` (the per-tensor
    check runs before this plan exists, in the ``collect`` phase); per layout,
    planning only holds the tensors strongly again, and the copies are the ones
    issued ahead of collection.
    """

    name = "steady"

    def __init__(self, resident: list[FlatLayout], signature: ItemSignature) -> None:
        super().__init__()
        self.resident = resident
        self.last = signature

    async def plan(self, copies: OffloadCopies) -> None:
        """The resident layouts, unchanged; the last collection's report."""
        self.layouts, self.report = {lay.key: lay for lay in self.resident}, self.last.report
        for lay in self.layouts.values():
            adopt_resident(lay, copies.flats[lay.key])

    async def copy(self, copies: OffloadCopies, ordered: list[FlatLayout]) -> None:
        """The copies issued ahead (any other layout is copied now)."""
        await copies.discard_changed(self.layouts)
        await copies.issue(ordered)

    def resident_flats(self, copies: OffloadCopies) -> dict[LayoutKey, torch.Tensor]:
        """Every layout is parked from its flat buffer."""
        return copies.flats

    def stray_views(self) -> dict[int, set[int]]:
        """None: nothing but the reload's views can view an unchanged flat buffer's tensors."""
        return {}


class FullOffload(OffloadPlan):
    """Collect everything, plan the layouts afresh, copy.

    Resident layouts whose flat buffer still holds exactly their tensors are
    reused as they are (their copies issued ahead stand); the others' copies
    issued ahead are discarded.
    """

    name = "full"

    def __init__(self, rt: Runtime, backend: StoreBackend, config: StoreConfig, cats: frozenset[Category],
                 items: ItemSource, resident: list[FlatLayout]) -> None:
        super().__init__()
        self.rt, self.backend, self.config = rt, backend, config
        self.cats, self.items, self.resident = cats, items, resident

    async def plan(self, copies: OffloadCopies) -> None:
        """Collect, validate and group every item, then lay the storages out."""
        items = list(self.items())
        own = frozenset(lay.flat_storage for lay in self.resident)
        groups, self.report = group_by_storage(items, self.rt.device, copies.viewers, own)
        self.layouts = plan_layouts(groups, self.resident, self.backend, self.config)
        self.signature = ItemSignature(self.cats, items, self.layouts, self.report)

    async def copy(self, copies: OffloadCopies, ordered: list[FlatLayout]) -> None:
        """Discard copies issued ahead for changed layouts; copy every layout that has none."""
        await copies.discard_changed(self.layouts)
        await copies.issue(ordered)


def _recorded(items: Iterator[Item], into: list[Item]) -> Iterator[Item]:
    """Pass ``items`` through, appending each to ``into``."""
    for it in items:
        into.append(it)
        yield it


# --------------------------------------------------------------------------- reload


class ReloadPlan:
    """The offloaded layouts a reload brings back, in processing order, and the check before re-pointing.

    A registered tensor changed while offloaded (re-assigned, resized, another
    dtype) makes :meth:`settle` raise :class:`TensorChangedError` with the state
    still offloaded.
    """

    name: ClassVar[str] = "reload"

    def __init__(self, layouts: list[FlatLayout]) -> None:
        self.layouts = sorted(layouts, key=sort_key)

    def check(self) -> list[str]:
        """Descriptions of the registered tensors that are no longer parked as the offload left them."""
        return changed_tensors(self.layouts)

    def settle(self, problems: list[str]) -> list[str]:
        """Raise for changed tensors; returns the names of tensors whose change is overwritten (none)."""
        if problems:
            raise TensorChangedError(
                f"{len(problems)} registered tensor(s) changed while offloaded: " + "; ".join(problems[:5])
                + ". The offloaded copy is kept (store.host_tensors() reads it); store.recover() reloads "
                "it into every registered tensor, overwriting the change"
            )
        return []


class RecoverPlan(ReloadPlan):
    """A reload that overwrites changes: every registered tensor gets its offloaded bytes back."""

    name: ClassVar[str] = "recover"

    def check(self) -> list[str]:
        """Make every registered tensor re-pointable (see :func:`force_repoint_prepare`); what changed."""
        return force_repoint_prepare(self.layouts)

    def settle(self, problems: list[str]) -> list[str]:
        """Warn about the overwritten changes and return them."""
        if problems:
            logger.warning("recover(): %d registered tensor(s) changed while offloaded get their offloaded "
                           "bytes back, overwriting the change: %s", len(problems), "; ".join(problems[:5]))
        return problems


__all__ = ["FullOffload", "ItemSource", "OffloadPlan", "RecoverPlan", "ReloadPlan", "SteadyOffload",
           "StreamedOffload"]
