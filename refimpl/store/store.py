"""OffloadStore: move a worker's training state between the device and host memory, bit-exact.

Theory of operation
-------------------
Attach what holds the state (modules, optimizers, explicit tensors). Each
``offload`` collects the registered tensors of the requested categories
(:mod:`refimpl.store.collect`), groups them by storage, lays the storages out
in flat layouts (:mod:`refimpl.store.layout`) and hands each layout to the
backend (:mod:`refimpl.store.backend`), which copies it to host memory. A
storage's device memory is released only after the copies carrying its bytes
have completed and all host memory of the offload is allocated (for a backend
with ``early_release``, storage by storage while later copies run; otherwise
once every finisher completed): ``Runtime.release`` shrinks the storage to 0
bytes and the tensor objects stay.
``reload`` allocates one flat device buffer per layout, has the backend fill
it, and re-points every registered tensor into it with ``set_``.

Invariants:

* Every byte of attached state is, at every moment, in exactly one valid
  place: its device storage or the host copy. Nothing is released before
  validation (a bad tensor raises a :class:`StoreError` with the state where
  it was); a failure after a storage was released early restores it from its
  host copy before the error propagates. A failed reload leaves the state
  offloaded (the host copy is kept).
* While offloaded every registered tensor is parked on a placeholder (see
  :mod:`refimpl.store.parking`): touching it never crashes the process.
* One operation at a time: other threads wait; the same thread gets a
  :class:`StoreStateError`.
* Every finisher a backend returned is awaited, also on the error path, in
  sorted layout order, so ranks running collectives inside backends agree.
* ``offload`` of categories already offloaded does nothing; ``reload`` of
  categories not offloaded does nothing.
* State moves only in ``offload``/``reload``: the store installs no hooks, so
  training phases (e.g. gradient accumulation over micro-batches) do no host
  traffic.
* After a reload the store holds registered tensors only weakly.

[Note: the steady-state fast path]
After a reload every tensor of a layout is a view into one flat buffer. At the
next offload, if every tensor is still where the reload put it (and no new
tensor joined the layout), the layout is unchanged and leaves in one copy per
host segment. A backend with ``speculative_offload`` gets that copy issued
*before* collection, so collecting tens of thousands of tensors overlaps the
DMA; if collection then finds the layout changed, the speculative copy is
awaited and discarded and the layout is planned afresh.

[Note: the first offload]
The state is scattered over the framework's storages. For a backend with
``streaming_offload`` the offload is streamed (:mod:`refimpl.store.streaming`):
host segments are pinned and copied while collection goes on. Small storages
are packed on the device and leave in large copies (:mod:`refimpl.store.source`),
segments are pinned on the pool's threads (:mod:`refimpl.store.pool`), and
storages are released as their copies complete. By default on CUDA
(``StoreConfig.pin_ahead``) the host memory is pinned ahead, at attach, on
background threads (:meth:`OffloadStore.pin_ahead`), so the first offload finds
it ready. ``StoreStats.phases`` times each phase.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Awaitable, Iterable, Iterator, Mapping

import torch

from refimpl.runtime.base import CopyKind, Runtime, gather
from refimpl.store.backend import create_backend
from refimpl.store.collect import (
    Collector,
    Item,
    ModuleCollector,
    OptimizerCollector,
    StorageGroup,
    StorageGrouper,
    TensorsCollector,
    group_by_storage,
    storage_view,
)
from refimpl.store.config import Category, StoreConfig
from refimpl.store.errors import StoreError, StoreStateError, TensorChangedError
from refimpl.store.layout import FlatLayout, LayoutKey, LayoutState, storage_id
from refimpl.store.parking import own_view, own_view_mark, park_strays, storage_use_count
from refimpl.store.planner import gc_paused, plan_layouts
from refimpl.store.release import prepare_release, release_as_copied, release_layouts
from refimpl.store.pool import PinnedHostPool
from refimpl.store.residency import (
    ItemSignature, ParkRecord, adopt_resident, changed_tensors, force_repoint_prepare, park, repoint,
    restore_released, steady_unchanged, unpark,
)
from refimpl.store.source import DeviceLayoutSource, StagingArea, describe_copies
from refimpl.store.stats import PhaseClock, StoreStats
from refimpl.store.streaming import StreamingPlan

logger = logging.getLogger(__name__)


def _sort_key(layout: FlatLayout) -> tuple[int, str, str]:
    return layout.key.sort_key()


class OffloadStore:
    """Offload/reload of training state through a backend; see the module docstring.

    ``backend``: a registered backend name (``"local"``, ``"local_dedup"``);
    ``backend_options`` are passed to its factory. ``config``: a
    :class:`StoreConfig`.
    """

    def __init__(
        self,
        runtime: Runtime,
        backend: str = "local",
        config: StoreConfig | None = None,
        **backend_options: Any,
    ) -> None:
        self.rt = runtime
        self.config = config or StoreConfig()
        threads = self.config.pin_threads
        if threads is None:
            threads = min(8, max(1, (os.cpu_count() or 2) // 2)) if runtime.device.type == "cuda" else 1
        self.pool = PinnedHostPool(runtime, fallback=self.config.pin_fallback, pin_threads=threads)
        self.backend = create_backend(backend, runtime, self.pool, self.config, **backend_options)
        self._collectors: list[Collector] = []
        self._layouts: dict[LayoutKey, FlatLayout] = {}
        self._offloaded: set[Category] = set()
        self._signature: ItemSignature | None = None  # what the last full collection saw
        self._lock = threading.Lock()  # one operation at a time (see _exclusive)
        self._owner: int | None = None
        self._busy: str | None = None
        self._counters: dict[str, Any] = {
            "offloads": 0, "reloads": 0, "steady_fast_offloads": 0, "last_offload_s": 0.0, "last_reload_s": 0.0, "last_offload_bytes": 0,
            "last_reload_bytes": 0, "last_device_bytes_freed": 0, "last_early_releases": 0, "skipped_zero_size": 0,
            "skipped_host_resident": 0, "copies": {}, "phases": {},
        }

    # ------------------------------------------------------------------ attach

    def attach_module(self, module: torch.nn.Module, name: str = "model") -> None:
        """Register a module's parameters (plain, DTensor, FSDP2), gradients and buffers."""
        self._attach(ModuleCollector(module, name))

    def attach_optimizer(self, optimizer: Any, name: str = "optim") -> None:
        """Register a ``torch.optim`` optimizer's state (AdamW ``exp_avg``, ``exp_avg_sq``, ``step`` ...)."""
        self._attach(OptimizerCollector(optimizer, name))

    def attach_tensors(
        self, category: Category | str, tensors: Mapping[str, torch.Tensor], name: str = "tensors",
        *, kind: str | None = None,
    ) -> None:
        """Register explicit tensors under ``category``: master weights, DDP-style flat buffers, payloads.

        The mapping is read at every offload (add or replace tensors in it
        between cycles). Register every tensor object you keep that views a
        storage (e.g. a flat buffer *and* its parameter views): unregistered
        views keep pointing at the released storage. ``kind`` labels the
        entries for backends (``"master_weights"``, ``"ddp_buffer"``; default:
        the category's value).
        """
        self._attach(TensorsCollector(Category.parse(category), tensors, name, kind))

    def _attach(self, collector: Collector) -> None:
        with self._exclusive(f"attach of {collector.name!r}"):
            self._attach_locked(collector)

    def _attach_locked(self, collector: Collector) -> None:
        if self._offloaded:
            raise StoreStateError(
                f"cannot attach {collector.name!r} while {sorted(c.value for c in self._offloaded)} are offloaded; "
                f"reload() first"
            )
        if any(c.name == collector.name for c in self._collectors):
            raise ValueError(f"a source named {collector.name!r} is already attached; pick another name")
        self._collectors.append(collector)
        if self.config.pin_ahead_mode(self.rt.device.type) == "background":  # see StoreConfig.pin_ahead
            try:
                self._pin_ahead(None, False)
            except (StoreError, RuntimeError, ValueError) as e:  # the offload reports it, where nothing moves
                logger.warning("pinning ahead at attach of %r skipped (%s: %s)", collector.name, type(e).__name__, e)

    @contextlib.contextmanager
    def _exclusive(self, op: str) -> Iterator[None]:
        """Serialise store operations: another thread waits; the same thread (a second coroutine on its
        event loop, a callback inside an operation) gets a :class:`StoreStateError` instead of a deadlock."""
        me = threading.get_ident()
        if self._owner == me:
            raise StoreStateError(
                f"{op} while {self._busy} is in progress on this store in the same thread; await the first "
                f"operation before starting another (one store serves one operation at a time)"
            )
        self._lock.acquire()
        self._owner, self._busy = me, op
        try:
            yield
        finally:
            self._owner = self._busy = None
            self._lock.release()

    @property
    def in_progress(self) -> str | None:
        """The operation running now (``"offload"``, ``"reload"``, ...), or None."""
        return self._busy

    # ------------------------------------------------------------------ queries

    def is_offloaded(self, category: Category | str) -> bool:
        """True while ``category`` is offloaded."""
        return Category.parse(category) in self._offloaded

    @property
    def layouts(self) -> dict[LayoutKey, FlatLayout]:
        """The current flat layouts by key (resident or offloaded)."""
        return dict(self._layouts)

    def stats(self) -> StoreStats:
        """Counters and sizes; see :class:`StoreStats`."""
        pool = self.pool.stats()
        by_cat: dict[str, int] = {}
        for layout in self._layouts.values():
            by_cat[layout.category.value] = by_cat.get(layout.category.value, 0) + layout.data_nbytes
        c = self._counters
        return StoreStats(
            backend=self.backend.name,
            host_pinned_bytes=pool.host_pinned_bytes,
            host_pageable_bytes=pool.host_pageable_bytes,
            backend_host_bytes=self.backend.host_bytes(),
            registrations=pool.registrations,
            reuses=pool.reuses,
            pageable_fallbacks=pool.pageable_fallbacks,
            bytes_by_category=by_cat,
            offloaded=tuple(sorted(cat.value for cat in self._offloaded)),
            layouts=len(self._layouts),
            storages=sum(len(layout.entries) for layout in self._layouts.values()),
            tensors=sum(len(e.refs) for layout in self._layouts.values() for e in layout.entries),
            skipped_zero_size=c["skipped_zero_size"],
            skipped_host_resident=c["skipped_host_resident"],
            offloads=c["offloads"],
            reloads=c["reloads"],
            last_offload_s=c["last_offload_s"],
            last_reload_s=c["last_reload_s"],
            last_offload_bytes=c["last_offload_bytes"],
            last_reload_bytes=c["last_reload_bytes"],
            last_device_bytes_freed=c["last_device_bytes_freed"],
            last_early_releases=c["last_early_releases"],
            steady_fast_offloads=c["steady_fast_offloads"],
            copies=dict(c["copies"]),
            phases=dict(c["phases"]),
        )

    def host_tensors(self, include: Iterable[Category | str] | Category | str | None = None) -> dict[str, torch.Tensor]:
        """Host views (no copy) of every offloaded tensor the backend holds whole, by registered name.

        Valid until the next offload/reload; a checkpoint can read them
        without reloading to the device. DTensors appear as their local tensors.
        """
        cats = Category.select(include)
        out: dict[str, torch.Tensor] = {}
        for layout in sorted(self._layouts.values(), key=_sort_key):
            if layout.state is not LayoutState.OFFLOADED or layout.dropped or layout.category not in cats:
                continue
            for e in layout.entries:
                host = self.backend.host_view(layout, e.offset, e.offset + e.numel)
                if host is None:
                    continue
                st = host.untyped_storage()
                for r in e.refs:
                    out[r.name] = torch.empty(0, dtype=layout.dtype).set_(
                        st, host.storage_offset() + r.offset, r.size, r.stride)
        return out

    def close(self) -> None:
        """Free the host memory (state still offloaded is lost: reload first)."""
        if self._offloaded:
            logger.warning("closing an offload store while %s are offloaded: that state is dropped",
                           sorted(c.value for c in self._offloaded))
        self.backend.close()
        self.pool.close()

    def pin_ahead(self, include: Iterable[Category | str] | Category | str | None = None, *, wait: bool = False) -> int:
        """Plan the layouts the next offload will use and start pinning their host memory now.

        With ``StoreConfig.pin_ahead="background"`` (the default on CUDA) every
        ``attach_*`` call does this. Nothing is copied or released. Pinning runs on the pool's threads (or
        inline with one thread) while the caller goes on, e.g. training its
        first step, so the first offload finds its buffers pinned. If the state
        changes shape before that offload, the buffers of changed layouts are
        re-pinned then. ``wait``: return only once everything is pinned. Returns
        the host bytes reserved.
        """
        with self._exclusive("pin_ahead"):
            return self._pin_ahead(include, wait)

    def _pin_ahead(self, include: Iterable[Category | str] | Category | str | None, wait: bool) -> int:
        cats = Category.select(include) - self._offloaded
        groups, _ = group_by_storage(self._items(cats), self.rt.device)
        try:
            plan = self._plan(groups, cats)
        finally:
            self._unadopt(cats)
        for layout in sorted(plan.values(), key=_sort_key):
            self.backend.reserve(layout)
            for e in layout.entries:
                e.base = None
        if wait:
            self.pool.wait_all()
        return sum(layout.nbytes for layout in plan.values())

    def consolidate(self) -> None:
        """Lay the attached state out in the store's flat device buffers now: one offload and reload.

        Separately allocated tensors (25k MoE expert tensors, say) make the first
        offload pay for collecting them and for returning thousands of allocator
        blocks to the driver; afterwards each layout is one flat buffer. Call this at
        setup (after the optimizer's first step, so its state exists) to pay that
        once, off the switch window. Bit-exact, like every cycle.
        """
        self.offload()
        self.reload()

    # ------------------------------------------------------------------ sync API

    def offload(self, include: Iterable[Category | str] | Category | str | None = None, drop_grads: bool = False) -> None:
        """Move the state of ``include`` (default: all categories) to host memory; see :meth:`offload_async`."""
        self.rt.run(self.offload_async(include, drop_grads=drop_grads))

    def reload(self, include: Iterable[Category | str] | Category | str | None = None) -> None:
        """Bring the state of ``include`` (default: all) back to the device; see :meth:`reload_async`."""
        self.rt.run(self.reload_async(include))

    # ------------------------------------------------------------------ offload

    async def offload_async(
        self, include: Iterable[Category | str] | Category | str | None = None, drop_grads: bool = False
    ) -> None:
        """Copy the state to host memory, then release its device memory.

        ``drop_grads``: gradients are released without a copy and come back as
        zeros. Categories already offloaded are skipped. Every registered tensor
        is parked while offloaded (safe to hold, not to use; see
        :mod:`refimpl.store.parking`). Anything that fails before the device
        memory is released leaves the state on the device; a copy failing after
        some storages were released brings them back first (restored from the
        host copies their completed copies made).
        """
        with self._exclusive("offload"):
            await self._offload(include, drop_grads)

    async def _offload(self, include: Iterable[Category | str] | Category | str | None, drop_grads: bool) -> None:
        cats = Category.select(include) - self._offloaded
        if not cats:
            logger.debug("offload: %s already offloaded, nothing to do", sorted(c.value for c in Category.select(include)))
            return
        from refimpl.store.checkpoint import wait_for_host_readers

        wait_for_host_readers(self)  # an async checkpoint may still be reading the host buffers (Task F)
        rt = self.rt
        with rt.span("offload"), gc_paused():  # no collector pass in the switch window
            await rt.point("store.offload.begin")
            t0, free_before = rt.now(), rt.memory_info().free
            speculative: dict[LayoutKey, tuple[FlatLayout, Awaitable[None]]] = {}
            flats: dict[LayoutKey, torch.Tensor] = {}
            pending: list[Awaitable[None]] = []
            staging = StagingArea(rt, self.config)
            sources: list[DeviceLayoutSource] = []
            clock = PhaseClock(rt, "offload")
            stream: StreamingPlan | None = None
            fast = False
            streamed = False
            viewers: dict[int, tuple[int, int]] = {}  # tensor objects viewing each resident flat buffer, before ours
            parked = ParkRecord()
            early: list = []  # storages released while later copies ran
            plan: dict[LayoutKey, FlatLayout] = {}
            release_plan = None
            try:
                if getattr(self.backend, "speculative_offload", False):
                    for layout in sorted(self._resident(cats), key=_sort_key):
                        if drop_grads and layout.category is Category.GRADS:
                            continue
                        flat = self._resident_flat(layout, viewers)
                        if flat is not None:
                            flats[layout.key] = flat
                            src = DeviceLayoutSource(rt, layout, self.config, flat=flat)
                            sources.append(src)
                            speculative[layout.key] = (layout, await self.backend.offload(layout, src))
                clock.lap("speculate")
                for c in self._collectors:
                    c.check_phase()
                if self.backend.streaming_offload and not speculative and not self._resident(cats):
                    # the first offload: copies start while collection goes on (see refimpl.store.streaming)
                    stream = StreamingPlan(rt, self.backend, self.config, staging, drop_grads=drop_grads,
                                           lookahead=self.pool.pin_threads)
                    grouper = StorageGrouper(rt.device)
                    items: list = []  # recorded as they stream past, for the next offload's fast check
                    with gc_paused():  # tens of thousands of small objects: no collector passes meanwhile
                        for group in grouper.feed(_recorded(self._items(cats), items)):
                            await stream.add(group)
                        clock.lap("collect")
                        groups, report = grouper.finish()
                        plan = await stream.finish()
                        self._signature = ItemSignature(cats, items, plan, report)
                    streamed = True
                    clock.lap("plan")
                    ordered = sorted(plan.values(), key=_sort_key)
                    sources.extend(stream.sources)
                    pending = [gather(*stream.completions(lay.key)) for lay in ordered]
                else:
                    sig, resident = self._signature, self._resident(cats)
                    fast = (sig is not None and sig.cats == cats and not drop_grads
                            and all(viewers.get(lay.flat_storage, (-1,))[0] == lay.resident_views for lay in resident)
                            and steady_unchanged(self._items(cats), sig, resident, flats, rt.device))
                    clock.lap("collect")
                    if fast:  # see [Note: steady offload check] in refimpl.store.residency
                        self._counters["steady_fast_offloads"] += 1
                        plan, report = {lay.key: lay for lay in resident}, sig.report
                        for lay in plan.values():
                            adopt_resident(lay, flats[lay.key])
                    else:
                        items = list(self._items(cats))
                        own = frozenset(lay.flat_storage for lay in resident)
                        groups, report = group_by_storage(items, rt.device, viewers, own)
                        plan = self._plan(groups, cats)
                        self._signature = ItemSignature(cats, items, plan, report)
                    clock.lap("plan")
                    for key in list(speculative):
                        layout, finisher = speculative[key]
                        if plan.get(key) is not layout:  # changed since the reload: discard the copy
                            del speculative[key]
                            await finisher
                    ordered = sorted(plan.values(), key=_sort_key)
                    to_copy = [lay for lay in ordered if not (drop_grads and lay.category is Category.GRADS)]
                    await self.backend.prepare(to_copy)
                    for layout in to_copy:
                        if layout.key in speculative:
                            pending.append(speculative.pop(layout.key)[1])
                            continue
                        src = DeviceLayoutSource(rt, layout, self.config, staging=staging)
                        sources.append(src)
                        pending.append(await self.backend.offload(layout, src))
                clock.lap("issue")
                park(ordered, flats if fast else {}, parked)  # per-tensor work while the copies run
                release_plan = prepare_release(ordered, drop_grads)
                self._counters["copies"] = describe_copies(sources)  # before the wait, not after the copies
                clock.lap("record")
                await rt.point("store.offload.wait")
                self._counters["last_early_releases"] = 0
                if self.backend.early_release:
                    self._counters["last_early_releases"] = await release_as_copied(rt, sources, early)
                while pending:
                    await pending.pop(0)
                clock.lap("wait")
                await rt.point("store.offload.release")  # the last point where a failure rolls back
            except BaseException:
                await _drain([*pending, *(f for _, f in speculative.values())])
                if early:
                    await self._restore_released_early(early)
                unpark(parked)
                if stream is not None and not streamed:
                    await stream.abort()  # nothing released yet: drop the partial host buffers
                await staging.close()
                self._unadopt(cats)
                # the traceback keeps this frame: drop every view of the state made here, so the next
                # offload's count of the tensors viewing a storage sees none of ours
                for lay in [*plan.values(), *(stream.layouts() if stream is not None else ())]:
                    for e in lay.entries:
                        e.base = None
                flats.clear(), sources.clear(), speculative.clear(), early.clear()
                flat = src = release_plan = parked = None  # noqa: F841
                raise
            await staging.close()
            strays = {} if fast else report.stray_views
            if strays:  # nothing can fail from here on; the store's own views are not strays
                ours = {id(t) for t in flats.values()} | {id(t) for t in release_plan.flat_bases.values()}
                ours |= {id(e.base) for lay in ordered for e in lay.entries if e.base is not None}
            for sid, known in strays.items():
                found = park_strays(sid, known | ours)
                logger.warning("views of an attached tensor kept across the offload (%s) are parked: they read "
                               "NaN/0 and do not come back on reload; take views after reload() instead",
                               "; ".join(found[:3]) or "none reachable from Python")
            moved = release_layouts(self.rt, ordered, drop_grads, release_plan)
            for key in [k for k in self._layouts if k.category in cats]:
                del self._layouts[key]
            self._layouts.update(plan)
            self._offloaded |= cats
            clock.lap("release")
            if self.config.empty_cache:
                rt.empty_cache()
            clock.lap("empty_cache")
            c = self._counters
            c["offloads"] += 1
            c["last_offload_s"] = rt.now() - t0
            c["last_offload_bytes"] = moved
            c["last_device_bytes_freed"] = rt.memory_info().free - free_before
            c["skipped_zero_size"] = len(report.skipped_zero_size)
            c["skipped_host_resident"] = len(report.skipped_host_resident)
            c["phases"] = {k: v for k, v in c["phases"].items() if not k.startswith("offload.")} | clock.laps
            if logger.isEnabledFor(logging.INFO):
                logger.info("offloaded %s: %d layouts, %.3f GB in %.3f s (%s)", sorted(x.value for x in cats),
                            len(ordered), moved / 1e9, c["last_offload_s"], c["copies"])

    def _items(self, cats: frozenset[Category]) -> Iterator[Item]:
        for c in self._collectors:
            yield from c.items(cats)

    def _resident(self, cats: Iterable[Category]) -> list[FlatLayout]:
        return [lay for lay in self._layouts.values()
                if lay.state is LayoutState.ON_DEVICE and lay.flat_storage is not None and lay.category in cats]

    def _resident_flat(self, layout: FlatLayout, viewers: dict[int, tuple[int, int]]) -> torch.Tensor | None:
        """A 1-D view of ``layout``'s flat device buffer, found through a live registered tensor.

        Records in ``viewers`` how many tensor objects view the buffer before the store adds its own.
        """
        for e in layout.entries:
            for r in e.refs:
                t = r.live()
                if t is None:
                    continue
                st = t.untyped_storage()
                if st._cdata == layout.flat_storage and st.nbytes() == layout.nbytes:
                    if storage_use_count is not None:
                        viewers[st._cdata] = (storage_use_count(st._cdata) - 1, own_view_mark())  # minus st
                    return storage_view(st, layout.dtype, t.device, layout.numel)
        return None

    async def _restore_released_early(self, early: list) -> None:
        """After a failed offload: give storages released early their bytes back from the host copies."""
        for layout, entry, storage, nbytes in early:
            host = self.backend.host_view(layout, entry.offset, entry.offset + entry.numel)
            if host is None:
                logger.error("cannot restore %s after a failed offload: the backend holds no host copy of it",
                             entry.name)
                continue
            storage.resize_(nbytes)
            device = storage_view(storage, layout.dtype, self.rt.device, entry.numel)
            await self.rt.copy_async(device, host, CopyKind.H2D)
        logger.warning("offload failed after %d storage(s) were released early; their bytes were copied back",
                       len(early))

    def _plan(self, groups: list[StorageGroup], cats: frozenset[Category]) -> dict[LayoutKey, FlatLayout]:
        """Layouts for the collected storages: unchanged resident layouts are reused as they are."""
        return plan_layouts(groups, self._resident(cats), self.backend, self.config)

    def _unadopt(self, cats: frozenset[Category]) -> None:
        """After a failed offload (nothing released): resident layouts go back to weak references."""
        for layout in self._resident(cats):
            for e in layout.entries:
                e.base = None
                for r in e.refs:
                    r.weaken()

    # ------------------------------------------------------------------ reload

    async def reload_async(self, include: Iterable[Category | str] | Category | str | None = None) -> None:
        """Allocate one flat device buffer per offloaded layout, fill it, re-point every tensor into it.

        Raises :class:`TensorChangedError` (state stays offloaded, nothing
        lost) if a registered tensor was re-assigned or re-pointed meanwhile;
        :meth:`recover` then brings every byte back. Any other failure (a
        backend's collective, a copy) leaves the state offloaded too; call
        reload again (on every rank, for a backend with collectives).
        """
        with self._exclusive("reload"):
            await self._reload(include, force=False)

    def recover(self, include: Iterable[Category | str] | Category | str | None = None) -> list[str]:
        """Reload whatever a registered tensor was changed to meanwhile: every offloaded byte comes back.

        The way out of a :class:`TensorChangedError`: each registered tensor is
        re-pointed into the reloaded flat buffer with the geometry and dtype it
        had when offloaded, overwriting the change (a log warning names the
        tensors). Returns the names of the tensors whose change was
        overwritten. Like :meth:`reload`, a collective operation for backends
        with collectives (call it on every rank).
        """
        return self.rt.run(self.recover_async(include))

    async def recover_async(self, include: Iterable[Category | str] | Category | str | None = None) -> list[str]:
        """Async :meth:`recover`."""
        with self._exclusive("recover"):
            return await self._reload(include, force=True)

    async def _reload(self, include: Iterable[Category | str] | Category | str | None, force: bool) -> list[str]:
        cats = Category.select(include)
        todo = sorted((lay for lay in self._layouts.values()
                       if lay.state is LayoutState.OFFLOADED and lay.category in cats), key=_sort_key)
        if not todo:
            self._offloaded -= cats
            return []
        rt = self.rt
        overwritten: list[str] = []
        with rt.span("reload"), gc_paused():
            await rt.point("store.reload.begin")
            t0 = rt.now()
            flats: list[torch.Tensor] = []
            pending: list[Awaitable[None]] = []
            repointed = False
            clock = PhaseClock(rt, "reload")
            try:
                for layout in todo:
                    flat = own_view(rt.alloc_device(layout.numel, layout.dtype, tag=f"store.flat.{layout.key.label()}"))
                    flats.append(flat)
                    if layout.dropped:
                        flat.zero_()
                    else:
                        pending.append(await self.backend.reload(layout, flat))
                clock.lap("issue")
                problems = force_repoint_prepare(todo) if force else changed_tensors(todo)
                clock.lap("validate")
                if problems and force:
                    overwritten = problems
                    logger.warning("recover(): %d registered tensor(s) changed while offloaded get their offloaded "
                                   "bytes back, overwriting the change: %s", len(problems), "; ".join(problems[:5]))
                elif problems:
                    raise TensorChangedError(
                        f"{len(problems)} registered tensor(s) changed while offloaded: " + "; ".join(problems[:5])
                        + ". The offloaded copy is kept (store.host_tensors() reads it); store.recover() reloads "
                        "it into every registered tensor, overwriting the change"
                    )
                repointed = True
                repoint(todo, flats)  # while the copies run
                clock.lap("repoint")
                await rt.point("store.reload.wait")
                while pending:
                    await pending.pop(0)
                clock.lap("wait")
            except BaseException:
                await _drain(pending)
                if repointed:
                    restore_released(todo)
                for flat in flats:
                    rt.release(flat)
                raise
            moved = 0
            for layout, flat in zip(todo, flats):
                layout.state = LayoutState.ON_DEVICE
                layout.flat_storage = storage_id(flat)
                moved += 0 if layout.dropped else layout.data_nbytes
                layout.dropped = False
            self._offloaded -= cats
            c = self._counters
            c["reloads"] += 1
            c["last_reload_s"] = rt.now() - t0
            c["last_reload_bytes"] = moved
            c["phases"] = {k: v for k, v in c["phases"].items() if not k.startswith("reload.")} | clock.laps
            logger.info("reloaded %s: %d layouts, %.3f GB in %.3f s", sorted(x.value for x in cats), len(todo),
                        moved / 1e9, c["last_reload_s"])
            return overwritten


def _recorded(items: Iterator[Item], into: list) -> Iterator[Item]:
    """Pass ``items`` through, appending each to ``into``."""
    for it in items:
        into.append(it)
        yield it


async def _drain(finishers: Iterable[Awaitable[None]]) -> None:
    """Await every finisher, keeping the first error only for logging (the caller re-raises its own)."""
    for f in finishers:
        try:
            await f
        except BaseException as e:  # noqa: BLE001 - the original error is what the caller raises
            logger.error("while unwinding a failed store operation, a backend finisher also failed: %s", e)


__all__ = ["OffloadStore", "StoreStats"]
