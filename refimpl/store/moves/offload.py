"""One offload in flight: :class:`Offload`, its stages as methods in order, its rollback as one method.

Read :meth:`Offload.run` top to bottom (as FSDP2's ``FSDPParamGroup.pre_forward``):

1. :meth:`~Offload.copy_ahead` (phase ``copy_ahead``): copies of the layouts
   resident in one flat buffer start before anything is collected
   (:mod:`refimpl.store.moves.copies`, backends with ``copy_ahead``).
2. :meth:`~Offload.collect` (phase ``collect``): choose the path
   (:mod:`refimpl.store.moves.offload_paths`: streamed, steady or full; the steady
   check of :mod:`refimpl.store.state.steady_check` runs here) and collect.
3. :meth:`~Offload.lay_out` (phase ``plan``): storages to flat layouts
   (:mod:`refimpl.store.moves.assign`, or the stream's layouts).
4. :meth:`~Offload.issue_copies` (phase ``issue``): the backend copies each
   layout to host memory, reading the device through :mod:`refimpl.store.moves.source`.
5. :meth:`~Offload.park` (phase ``record``): every ref parked while the copies
   run (:meth:`FlatLayout.park`); the release's per-entry work done.
6. :meth:`~Offload.wait` (phase ``wait``): storages released as their copies
   complete (``release_as_copied``), every finisher awaited.
7. :meth:`~Offload.release` (phase ``release``): the device memory goes
   (:mod:`refimpl.store.moves.release`), every layout marked offloaded, the
   host-resident tensors left in place guarded (:meth:`~Offload.guard_left_in_place`).

Anything failing in stages 1-6 runs :meth:`~Offload.roll_back`, which undoes
them in reverse: the state stays on the device, every byte in its place. Then
the backend settles the outcome (``settle_offload``): ``local_dedup`` votes, so
an offload that failed on one rank is rolled back on every rank (the store
then raises there too). Nothing fails in stage 7.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

import torch

from refimpl.runtime.base import Runtime
from refimpl.store.backends.base import StoreBackend
from refimpl.store.config import Category, StoreConfig
from refimpl.store.moves.copies import OffloadCopies
from refimpl.store.moves.early import EarlyCopies
from refimpl.store.moves.offload_paths import FullPath, ItemSource, OffloadPath, SteadyPath, StreamedPath
from refimpl.store.moves.release import park_kept_views, release_layouts
from refimpl.store.state.grouping import ViewCount
from refimpl.store.state.guard import guard, guard_enabled
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutState
from refimpl.store.state.parking import Parking
from refimpl.store.state.steady_check import ItemSignature, steady_unchanged
from refimpl.store.stats import OffloadFigures

logger = logging.getLogger(__name__)

_UNCOUNTED = ViewCount(-1, 0)  # a resident flat buffer whose viewers were not counted


class Offload:
    """One offload of ``cats`` in flight. Built by :meth:`OffloadStore.offload`; :meth:`run` once.

    ``items`` / ``tensor_objects``: the attached state's items and tensor objects
    of the offload's categories (each call afresh); ``check_phase``: the
    collectors' check that no training phase is mid-step; ``resident``: the
    layouts of ``cats`` resident in one flat buffer; ``signature``: what the last
    full collection saw; ``streams``: the backend implements
    :class:`~refimpl.store.backends.base.StreamingBackend`; ``parking``: the store's placeholders; ``early``:
    the copies issued early ([Note: early copies] in :mod:`refimpl.store.moves.early`), taken over in stage 1.
    The stages fill :attr:`figures`, which :meth:`run` returns.
    """

    def __init__(self, rt: Runtime, backend: StoreBackend, config: StoreConfig, *, cats: frozenset[Category],
                 drop_grads: bool, items: ItemSource, tensor_objects: Callable[[], Iterator[Any]],
                 check_phase: Callable[[], None], resident: list[FlatLayout], signature: ItemSignature | None,
                 lookahead: int, streams: bool, parking: Parking, early: EarlyCopies | None = None) -> None:
        self.rt, self.backend, self.config = rt, backend, config
        self.cats, self.drop_grads = cats, drop_grads
        self.items, self.tensor_objects, self.check_phase = items, tensor_objects, check_phase
        self.resident, self.last_signature, self.lookahead, self.streams = resident, signature, lookahead, streams
        self.parking = parking
        #: the copies ``OffloadStore.copy_early`` issued since the last reload (taken over in stage 1)
        self.early = early
        #: what this offload did, filled as the stages pass (phases on the runtime's clock)
        self.figures = OffloadFigures()
        self._last = rt.now()
        self.copies = OffloadCopies(rt, backend, config, drop_grads=drop_grads)
        self.path: OffloadPath | None = None
        #: the layouts of this offload by key (set by :meth:`lay_out`), and in processing order
        self.layouts: dict[LayoutKey, FlatLayout] = {}
        self.ordered: list[FlatLayout] = []
        #: views of the flat buffers the user kept (parked at release)
        self.strays: dict[int, set[int]] = {}
        #: ``(category, tensor)`` of the host-resident tensors guarded in place (see :meth:`guard_left_in_place`)
        self.left_in_place: list[tuple[Category, Any]] = []

    async def run(self) -> OffloadFigures:
        """Stages 1-7 in order (rolled back on failure); returns :attr:`figures`.

        Between stage 6 and 7 the backend settles the offload's outcome (``StoreBackend.settle_offload``):
        a backend whose ranks agree on it may raise there because a peer failed; this rank then rolls back
        too, so the offload is done on every rank or on none. A failure here tells the backend too.
        """
        rt = self.rt
        try:
            await rt.point("store.offload.begin")
            self._last = rt.now()
            await self.copy_ahead()
            await self.collect()
            await self.lay_out()
            await self.issue_copies()
            self.park()
            await self.wait()
        except GeneratorExit:  # the coroutine is being closed (its rank is gone): nothing may await any more
            raise
        except BaseException as error:
            await self.roll_back()
            await self.backend.settle_offload(error)
            raise
        try:
            await self.backend.settle_offload(None)
        except BaseException:
            await self.roll_back()
            raise
        return await self.release()

    # ------------------------------------------------------------------ stages, in order

    async def copy_ahead(self) -> None:
        """Stage 1: issue the copies of the resident layouts before collection."""
        await self.copies.copy_ahead(self.resident, self.early)
        self._lap("copy_ahead")

    async def collect(self) -> None:
        """Stage 2: choose the path (the steady check runs here) and collect."""
        self.check_phase()
        self.path = self._choose_path()
        self.figures.path = self.path.name
        await self.path.collect()
        self._lap("collect")

    async def lay_out(self) -> None:
        """Stage 3: the layouts of this offload, by key and in processing order."""
        self.layouts = await self.path.lay_out()
        self.ordered = self.path.ordered(self.layouts)
        report = self.path.report
        if report is not None:
            self.figures.skipped_zero_size = len(report.skipped_zero_size)
            self.figures.skipped_host_resident = len(report.skipped_host_resident)
        self._lap("plan")

    async def issue_copies(self) -> None:
        """Stage 4: every layout's copy issued (or taken over from the stream or the copies ahead)."""
        copies, figures = self.copies, self.figures
        await self.path.issue(copies, self.layouts, self.ordered)
        figures.early_reused_bytes, figures.early_redone_bytes = copies.early_reused, copies.early_redone
        self._lap("issue")

    def park(self) -> None:
        """Stage 5, while the copies run: every ref parked and guarded; the release's per-entry work done."""
        flats, self.strays = self.path.park_flats(self.copies), self.path.stray_views()
        parking = self.parking
        with torch.no_grad():
            for lay in self.ordered:
                lay.park(flats.get(lay.key), parking)
        for lay in self.ordered:
            lay.keep_one_base()
        grads_dropped = self.drop_grads
        self.figures.moved_bytes = sum(lay.data_nbytes for lay in self.ordered
                                       if not (grads_dropped and lay.category is Category.GRADS))
        self._lap("record")

    async def wait(self) -> None:
        """Stage 6: storages released as their copies complete (``release_as_copied``), every finisher awaited."""
        rt, figures = self.rt, self.figures
        figures.copies = self.copies.describe()  # before the wait, not after the copies
        await rt.point("store.offload.wait")
        figures.released_as_copied = await self.copies.release_as_copied()
        await self.copies.wait()
        self._lap("wait")
        await rt.point("store.offload.release")  # the last point where a failure rolls back

    async def release(self) -> OffloadFigures:
        """Stage 7 (nothing fails from here on): stray views parked, the device memory released, every
        layout marked offloaded. Returns :attr:`figures`."""
        await self.copies.close()
        park_kept_views(self.strays, self.ordered, self.copies.flats, self.parking)
        release_layouts(self.rt, self.ordered, self.drop_grads)
        self.guard_left_in_place()
        self._lap("release")
        if self.config.empty_cache:
            self.rt.empty_cache()
        self._lap("empty_cache")
        return self.figures

    def guard_left_in_place(self) -> None:
        """Guard the host-resident tensors the offload left in place (an optimizer's CPU ``step`` counters
        on a GPU store): they are state of an offloaded category, so ``opt.step()`` while offloaded raises
        before it changes any of them. :attr:`left_in_place` lists them for the reload to unguard."""
        report = self.path.report if self.path is not None else None
        if report is None or not report.host_resident or not guard_enabled():
            return
        site = self.parking.site
        for _, name, t in report.host_resident:
            guard(t, name, where=site)
        self.left_in_place = [(cat, t) for cat, _, t in report.host_resident]

    # ------------------------------------------------------------------ rollback

    async def roll_back(self) -> None:
        """Undo stages 6 to 1 after a failure: nothing is lost, the state stays on the device."""
        await self.copies.unwind()  # 6: every finisher awaited, storages released as copied copied back
        with torch.no_grad():
            for lay in self.ordered:  # 5: refs back where they were
                if lay.state is LayoutState.PARKED:
                    lay.unpark()
        if self.path is not None:  # 4, 2: the stream's copies awaited, its partial host buffers dropped
            await self.path.abort()
        await self.copies.close()
        for lay in self.resident:  # 3: resident layouts back to weak refs
            lay.unadopt()
        # the traceback keeps this frame: drop every view of the state made here, so the next
        # offload's count of the tensors viewing a storage sees none of ours
        for lay in [*self.layouts.values(), *(self.path.building() if self.path is not None else ())]:
            lay.drop_bases()
        self.copies.forget()  # 1: the copies issued ahead

    def _lap(self, phase: str) -> None:
        """Record the seconds since the previous lap as ``offload.<phase>`` (the driver's own clock: the
        walk of an offload leaves this module only for its stages)."""
        now = self.rt.now()
        self.figures.phases["offload." + phase] = now - self._last
        self._last = now

    # ------------------------------------------------------------------ the path

    def _choose_path(self) -> OffloadPath:
        """Streamed (first offload, streaming backend), steady (every tensor where the last reload put it;
        see [Note: steady offload check] in refimpl.store.state.steady_check) or full."""
        rt, resident, copies, cats = self.rt, self.resident, self.copies, self.cats
        if self.streams and not copies.ahead and not resident:
            return StreamedPath(rt, self.backend, self.config, cats, self.items, copies.staging,
                                drop_grads=self.drop_grads, lookahead=self.lookahead)
        sig, viewers = self.last_signature, copies.viewers
        if (sig is not None and sig.cats == cats and not self.drop_grads
                and all(viewers.get(lay.flat_storage, _UNCOUNTED).viewers == lay.resident_views for lay in resident)
                and steady_unchanged(self.tensor_objects(), sig, resident, copies.flats, rt.device)):
            return SteadyPath(resident, sig, copies.flats)
        return FullPath(rt, self.backend, self.config, cats, self.items, resident, viewers)

    @property
    def signature(self) -> ItemSignature | None:
        """What this offload's collection saw, for the next steady check (None: keep the last one)."""
        return self.path.signature if self.path is not None else None


__all__ = ["Offload"]
