"""OffloadStore: move a worker's training state between the device and host memory, bit-exact.

Theory of operation
-------------------
Attach what holds the state (modules, optimizers, explicit tensors). Each
``offload`` builds one :class:`~refimpl.store.moves.offload.Offload` and runs it; its
stages, in order, each in its own module: copy ahead of collection
(:mod:`refimpl.store.moves.copies`), collect and group by storage
(:mod:`refimpl.store.state.collect`, :mod:`refimpl.store.state.grouping`) along the path the
state calls for (:mod:`refimpl.store.moves.offload_paths`: streamed first offload,
steady, full), assign storages to flat layouts (:mod:`refimpl.store.moves.assign`,
:mod:`refimpl.store.state.layout`), have the backend (:mod:`refimpl.store.backends`)
copy each layout to host memory, park every registered tensor
(:meth:`FlatLayout.park`), wait, release (:mod:`refimpl.store.moves.release`). A
storage's device memory is released only after the copies carrying its bytes
have completed and all host memory of the offload is allocated (for a backend
with ``release_as_copied``, storage by storage while later copies run; otherwise
once every finisher completed): ``Runtime.release`` shrinks the storage to 0
bytes and the tensor objects stay. ``reload`` runs one
:class:`~refimpl.store.moves.reload.Reload`: one flat device buffer per layout, filled
by the backend, every registered tensor re-pointed into it
(:meth:`FlatLayout.repoint`). docs/store.md walks both, file by file. Between
operations the store holds its layouts and offloaded categories in a
:class:`~refimpl.store.holdings.Holdings`; each operation returns its typed
figures (:class:`~refimpl.store.stats.OffloadFigures`,
:class:`~refimpl.store.stats.ReloadFigures`), which :meth:`OffloadStore.stats` reads.

Invariants:

* Every byte of attached state is, at every moment, in exactly one valid
  place: its device storage or the host copy. Nothing is released before
  validation (a bad tensor raises a :class:`StoreError` with the state where
  it was); a failure after a storage was released as copied restores it from its
  host copy before the error propagates. A failed reload leaves the state
  offloaded (the host copy is kept).
* While offloaded every registered tensor is parked on one of the store's
  read-only placeholders and guarded (see :mod:`refimpl.store.state.parking` and
  :mod:`refimpl.store.state.guard`): using it raises ``OffloadedTensorError``, never
  crashes the process, never reads a wrong value.
* One operation at a time (:class:`~refimpl.store.exclusive.OperationLock`):
  other threads wait; the same thread gets a :class:`StoreStateError`.
* Every finisher a backend returned is awaited, also on the error path, in
  sorted layout order, so ranks running collectives inside backends agree.
* ``offload`` of categories already offloaded does nothing; ``reload`` of
  categories not offloaded does nothing.
* State moves only in ``offload``/``reload``: the store installs no hooks, so
  training phases (e.g. gradient accumulation over micro-batches) do no host
  traffic.
* After a reload the store holds registered tensors only weakly.

The paths are described where they live: [Note: steady offload check] in
:mod:`refimpl.store.state.steady_check`, [Note: why stream] in
:mod:`refimpl.store.moves.streaming`; pinning ahead at attach is :meth:`OffloadStore.pin_ahead`
(``StoreConfig.pin_ahead``, the default on CUDA). ``StoreStats.phases`` times each
phase and ``StoreStats.last_offload_path`` names the path the last offload took.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Iterable, Mapping

import torch

from refimpl.arguments import expect, expect_bool, expect_name
from refimpl.runtime.base import Runtime
from refimpl.store.arguments import check_early_tensors, check_module, check_optimizer, check_runtime, check_tensors
from refimpl.store.backends.base import streams
from refimpl.store.backends.host_readers import wait_for_host_readers
from refimpl.store.backends.pool import PinnedHostPool
from refimpl.store.config import Category, StoreConfig
from refimpl.store.debug import caller_site, debug_mode
from refimpl.store.errors import StoreError, StoreStateError
from refimpl.store.exclusive import OperationLock
from refimpl.store.holdings import Holdings
from refimpl.store.moves.assign import gc_paused, reserve_ahead
from refimpl.store.moves.early import EarlyCopies
from refimpl.store.moves.offload import Offload
from refimpl.store.moves.reload import Recover, Reload, StreamedReload
from refimpl.store.registry import create_backend
from refimpl.store.state.collect import Attached, Collector, ModuleCollector, OptimizerCollector, TensorsCollector
from refimpl.store.state.layout import FlatLayout, LayoutKey
from refimpl.store.state.parking import Parking
from refimpl.store.state.steady_check import ItemSignature
from refimpl.store.stats import OffloadFigures, StoreFigures, StoreStats

logger = logging.getLogger(__name__)


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
        call = "OffloadStore(rt, ...)"
        self.rt = check_runtime(runtime, call)
        expect_name(backend, call, "backend")
        expect(config, StoreConfig, call, "config", "a StoreConfig or None", optional=True,
               hint="build one: StoreConfig(**options)" if isinstance(config, Mapping) else "")
        self.config = config or StoreConfig()
        threads = self.config.pin_threads
        if threads is None:
            threads = min(8, max(1, (os.cpu_count() or 2) // 2)) if runtime.device.type == "cuda" else 1
        self.pool = PinnedHostPool(runtime, fallback=self.config.pin_fallback, pin_threads=threads)
        self.backend = create_backend(backend, runtime, self.pool, self.config, **backend_options)
        self._streams = streams(self.backend)  # the first offload may be streamed (StreamingBackend)
        self._attached = Attached()
        self._held = Holdings()  # the layouts, the offloaded categories, the tensors guarded in place
        self._signature: ItemSignature | None = None  # what the last full collection saw
        self._parking = Parking()  # this store's placeholders: nothing another store parks shares them
        self._exclusive = OperationLock()  # one operation at a time
        #: streamed reloads whose copies may still be in flight, oldest first (see :meth:`finish_reload`)
        self._streamed_reloads: list[StreamedReload] = []
        #: copies issued by copy_early since the last offload or reload ([Note: early copies])
        self._early = EarlyCopies(runtime, self.backend)
        if self.config.stream_sm_ctas:  # the copy kernel built now, not inside the first switch that streams
            runtime.prepare_copies_on_sms()
        #: what the operations did: counts, and the figures of the last offload and reload (``stats()`` reads them)
        self._figures = StoreFigures()

    # ------------------------------------------------------------------ attach

    def attach_module(self, module: torch.nn.Module, name: str = "model") -> None:
        """Register a module's parameters (plain, DTensor, FSDP2), gradients and buffers."""
        check_module(module, "attach_module(module, name)")
        self._attach(ModuleCollector(module, expect_name(name, "attach_module(module, name)", "name")))

    def attach_optimizer(self, optimizer: Any, name: str = "optim") -> None:
        """Register a ``torch.optim`` optimizer's state (AdamW ``exp_avg``, ``exp_avg_sq``, ``step`` ...)."""
        check_optimizer(optimizer, "attach_optimizer(optimizer, name)")
        self._attach(OptimizerCollector(optimizer, expect_name(name, "attach_optimizer(optimizer, name)", "name")))

    def attach_tensors(
        self, category: Category | str, tensors: Mapping[str, torch.Tensor], name: str = "tensors",
        *, kind: str | None = None, host_resident_ok: bool = False, pin_ahead: bool = True,
    ) -> None:
        """Register explicit tensors under ``category``: master weights, DDP-style flat buffers, payloads.

        The mapping is read at every offload (add or replace tensors in it
        between cycles). Register every tensor object you keep that views a
        storage (e.g. a flat buffer *and* its parameter views): unregistered
        views keep pointing at the released storage. ``kind`` labels the
        entries for backends (``"master_weights"``, ``"ddp_buffer"``; default:
        the category's value). ``host_resident_ok``: host tensors in the
        mapping are left in place on a device store (counted in
        ``StoreStats.skipped_host_resident``, like an optimizer's CPU ``step``)
        instead of refused. ``pin_ahead=False``: no pinning ahead at this
        attach (a client that parks views of its own calls :meth:`pin_ahead`
        once they are parked). The values of a plain dict are checked here; a live mapping's at each offload.
        """
        call = "attach_tensors(category, tensors, name)"
        check_tensors(tensors, call)
        expect_name(name, call, "name")
        expect_name(kind, call, "kind", optional=True)
        expect_bool(host_resident_ok, call, "host_resident_ok")
        expect_bool(pin_ahead, call, "pin_ahead")
        self._attach(TensorsCollector(Category.parse(category), tensors, name, kind, host_resident_ok), pin_ahead)

    def _attach(self, collector: Collector, pin_ahead: bool = True) -> None:
        with self._exclusive(f"attach of {collector.name!r}"):
            self._attach_locked(collector, pin_ahead)

    def _attach_locked(self, collector: Collector, pin_ahead: bool = True) -> None:
        if self._held.offloaded:
            raise StoreStateError(
                f"cannot attach {collector.name!r} while {sorted(c.value for c in self._held.offloaded)} are offloaded; "
                f"reload() first"
            )
        if self._early:
            self.rt.run(self._early.drain())
        self._attached.add(collector)
        if pin_ahead and self.config.pin_ahead_mode(self.rt.device.type) == "background":  # see StoreConfig.pin_ahead
            try:
                self._pin_ahead(None, False)
            except (StoreError, RuntimeError, ValueError) as e:  # the offload reports it, where nothing moves
                logger.warning("pinning ahead at attach of %r skipped (%s: %s)", collector.name, type(e).__name__, e)

    @property
    def _collectors(self) -> list[Collector]:
        # the attached collectors in attach order (tests reach FSDP2's parameters through them)
        return self._attached.collectors

    @property
    def parking(self) -> Parking:
        """The store's placeholders (a client that parks views of its own parks them here)."""
        return self._parking

    @property
    def in_progress(self) -> str | None:
        """The operation running now (``"offload"``, ``"reload"``, ...), or None."""
        return self._exclusive.busy

    # ------------------------------------------------------------------ queries

    def is_offloaded(self, category: Category | str) -> bool:
        """True while ``category`` is offloaded."""
        return Category.parse(category) in self._held.offloaded

    @property
    def layouts(self) -> dict[LayoutKey, FlatLayout]:
        """The current flat layouts by key (resident or offloaded)."""
        return dict(self._held.layouts)

    def stats(self) -> StoreStats:
        """Counters and sizes; see :class:`StoreStats`. From another thread than an operation in progress, after
        that operation (it changes what is read)."""
        with self._exclusive.reading():
            pool = self.pool.stats()
            return StoreStats.of(
                self._figures, backend=self.backend.name, backend_host_bytes=self.backend.host_bytes(),
                host_pinned_bytes=pool.host_pinned_bytes, host_pageable_bytes=pool.host_pageable_bytes,
                registrations=pool.registrations, reuses=pool.reuses, pageable_fallbacks=pool.pageable_fallbacks,
                **self._held.sizes(),
            )

    def host_tensors(self, include: Iterable[Category | str] | Category | str | None = None) -> dict[str, torch.Tensor]:
        """Host views (no copy) of every offloaded tensor the backend holds whole, by registered name.

        Valid until the next offload/reload; a checkpoint can read them
        without reloading to the device. DTensors appear as their local tensors.
        """
        with self._exclusive.reading():  # after an operation another thread runs (it moves what is read)
            return self._held.host_tensors(Category.select(include), self.backend)

    def close(self) -> None:
        """Free the host memory (state still offloaded is lost: reload first). Every later operation
        (offload, reload, attach, pin_ahead) raises :class:`StoreClosedError`; closing twice does nothing."""
        if self._exclusive.closed:
            return
        if self._streamed_reloads:  # the copies of a streamed reload must end before their host buffers are freed
            self.rt.run(self._finish_streams())
        if self._early:  # and so must early copies into them
            self.rt.run(self._early.drain())
        self._exclusive.closed = True
        if self._held.offloaded:
            logger.warning("closing an offload store while %s are offloaded: that state is dropped",
                           sorted(c.value for c in self._held.offloaded))
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
        if self._streamed_reloads:
            self.rt.run(self._finish_streams())
        if self._early:  # the host buffers may be replaced
            self.rt.run(self._early.drain())
        cats = Category.select(include) - self._held.offloaded
        reserved = reserve_ahead(self._attached.items(cats), self._held.resident(cats), self.backend, self.config,
                                 self.rt.device)
        if wait:
            self.pool.wait_all()
        return reserved

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

    def reload(self, include: Iterable[Category | str] | Category | str | None = None, *,
               local_only: bool = False, stream: bool = False, use_order: Iterable[torch.Tensor] | None = None) -> None:
        """Bring the state of ``include`` (default: all) back to the device; see :meth:`reload_async`."""
        self.rt.run(self.reload_async(include, local_only=local_only, stream=stream, use_order=use_order))

    def finish_reload(self) -> int:
        """Wait for the streamed reloads still in flight (``reload(stream=True)``) and make their layouts
        resident; returns the bytes they brought back. Every other store operation does this first."""
        with self._exclusive("finish_reload"):
            return self.rt.run(self._finish_streams())

    async def _finish_streams(self) -> int:
        """Finish every streamed reload in flight, oldest first (see :class:`StreamedReload`)."""
        moved = 0
        while self._streamed_reloads:
            reload = self._streamed_reloads[0]
            filling = set(reload.filling())  # finish() stops the streaming
            try:
                moved += await reload.finish()
            except BaseException:
                early = sorted(k.label() for k in self._early.keys() if k in filling)
                if early:
                    logger.error("a streamed reload failed after early copies of %s were made: their host copies "
                                 "hold the bytes the step wrote for the ranges copied early", ", ".join(early))
                raise
            finally:
                self._streamed_reloads.pop(0)
        if moved:
            self._figures.last_reload.moved_bytes = moved
        return moved

    # ------------------------------------------------------------------ early copies

    def copy_early(self, tensors: Iterable[torch.Tensor]) -> int:
        """Start copying ``tensors`` (registered tensors, DTensors included) to host memory now, before the offload;
        returns the bytes queued.

        The caller declares them final until the next :meth:`offload`: each copy is queued on the runtime's copy
        stream after the work already queued on the calling thread's current stream (call it right after the
        kernels that last write them, e.g. in the optimizer-in-backward hook that stepped them). A streamed reload
        still in flight is not finished: a copy of a layout it is filling waits on the device for the pieces of
        its own range ([Note: early copies while a reload streams] in :mod:`refimpl.store.moves.early`). The next
        offload takes the copies over and copies only the rest, and copies again every entry one of whose tensors
        was changed in place or re-pointed since (its version counter moved), or whose bytes changed without the
        counter seeing it (a fused optimizer step, a BatchNorm forward, a write through ``.data``: each copied
        range is digested here and again at the offload; see [Note: early copies] in
        :mod:`refimpl.store.moves.early`). A hint: a tensor not in a layout resident in one flat buffer (before the
        first reload, a backend without ``early_copies``) is skipped and the offload copies it as always
        (``StoreStats.last_early_skipped``). Safe to call from another thread than the offload's (the autograd
        engine's) while no other store operation runs there.
        """
        items = check_early_tensors(tensors, self.rt.device, "copy_early(tensors)")
        with self._exclusive("copy_early"):
            return self.rt.run(self._copy_early(items))

    async def _copy_early(self, tensors: list[torch.Tensor]) -> int:
        # a streamed reload in flight goes on: each copy waits on the device for its own range's pieces
        # ([Note: early copies while a reload streams] in refimpl.store.moves.early)
        wait_for_host_readers(self)  # the copies write into host buffers an async checkpoint may be reading
        streaming = {k: v for r in self._streamed_reloads for k, v in r.filling().items()}
        return await self._early.issue(self._held.layouts, tensors, streaming)

    # ------------------------------------------------------------------ offload

    async def offload_async(
        self, include: Iterable[Category | str] | Category | str | None = None, drop_grads: bool = False
    ) -> None:
        """Copy the state to host memory, then release its device memory.

        ``drop_grads``: gradients are released without a copy and come back as
        zeros. Categories already offloaded are skipped. Every registered tensor
        is parked while offloaded (safe to hold, not to use; see
        :mod:`refimpl.store.state.parking`). Anything that fails before the device
        memory is released leaves the state on the device; a copy failing after
        some storages were released brings them back first (restored from the
        host copies their completed copies made).
        """
        expect_bool(drop_grads, "offload(include, drop_grads)", "drop_grads")
        with self._exclusive("offload"):
            await self._offload(include, drop_grads)

    async def _offload(self, include: Iterable[Category | str] | Category | str | None, drop_grads: bool) -> None:
        await self._finish_streams()
        wanted = Category.select(include)
        partly = self._held.partly_offloaded(wanted)
        if partly:
            raise StoreStateError(
                f"cannot offload {partly}: partly offloaded (a reload(local_only=True) brought back their rank-local "
                f"layouts, the replicated ones are still offloaded); reload them on every rank first"
            )
        cats = wanted - self._held.offloaded
        if not cats:
            logger.debug("offload: %s already offloaded, nothing to do", sorted(c.value for c in wanted))
            return
        wait_for_host_readers(self)  # an async checkpoint may still be reading the host buffers
        rt = self.rt
        self._parking.site = caller_site() if debug_mode() else None
        offload = Offload(rt, self.backend, self.config, cats=cats, drop_grads=drop_grads,
                          items=functools.partial(self._attached.items, cats),
                          tensor_objects=functools.partial(self._attached.tensor_objects, cats),
                          check_phase=self._attached.check_phase, resident=self._held.resident(cats), signature=self._signature,
                          lookahead=self.pool.pin_threads, streams=self._streams, parking=self._parking,
                          early=self._early if self._early else None)
        with rt.span("offload"), gc_paused():  # no collector pass in the switch window
            t0, free_before = rt.now(), rt.memory_info().free
            try:
                figures = await offload.run()
            finally:
                self._signature = offload.signature or self._signature
                await self._early.drain(cats)  # what the offload did not take (a failed one: all of its categories)
                queued_early = self._early.reset_counts()
            self._held.install(cats, offload.layouts, offload.left_in_place)
            figures.early_copy_bytes, figures.early_skipped, figures.early_streaming_bytes = queued_early
            figures.seconds, figures.device_bytes_freed = rt.now() - t0, rt.memory_info().free - free_before
            self._count_offload(figures, cats, len(offload.ordered))
        if offload.error_after_commit is not None:  # completed on this rank as on its peers; say what failed
            raise offload.error_after_commit

    def _count_offload(self, figures: OffloadFigures, cats: frozenset[Category], layouts: int) -> None:
        """A completed offload's figures go into the store's; logged."""
        self._figures.count_offload(figures)
        if logger.isEnabledFor(logging.INFO):
            logger.info("offloaded %s: %d layouts, %.3f GB in %.3f s (%s path; %s)", sorted(x.value for x in cats),
                        layouts, figures.moved_bytes / 1e9, figures.seconds, figures.path, figures.copies)

    # ------------------------------------------------------------------ reload

    async def reload_async(self, include: Iterable[Category | str] | Category | str | None = None, *,
                           local_only: bool = False, stream: bool = False,
                           use_order: Iterable[torch.Tensor] | None = None) -> None:
        """Allocate one flat device buffer per offloaded layout, fill it, re-point every tensor into it.

        Raises :class:`TensorChangedError` (state stays offloaded, nothing
        lost) if a registered tensor was re-assigned or re-pointed meanwhile;
        :meth:`recover` then brings every byte back. Any other failure (a
        backend's collective, a copy) leaves the state offloaded too; call
        reload again (on every rank, for a backend with collectives).

        ``local_only``: bring back only the layouts that need no other rank
        (``StoreBackend.needs_peers``: for ``local_dedup`` everything but the
        1/N slices of replicated layouts), on this rank alone, with no
        collective: a rank's own state when its peers are gone. Categories
        whose replicated layouts stay offloaded stay offloaded (reload them
        with every rank, or restart).

        ``stream``: return once the copies are issued and every tensor re-pointed; each tensor's first torch
        call waits on the device for its own bytes (see [Note: streamed reload] in
        :mod:`refimpl.store.moves.reload`), so the caller's next work (a forward, a gather, an optimizer step) runs
        beside the copies. :meth:`finish_reload`, or the store's next operation, waits for the rest. A
        backend whose reload runs collectives (``local_dedup``) or a runtime that cannot order device work on
        a copy reloads whole instead.

        ``use_order`` (with ``stream``): the registered tensors (DTensors included) in the order the caller's next
        work first uses them; the pieces holding their bytes are issued in that order, the rest after in the
        default order (params, buffers, grads, optimizer state). A hint for speed, bitwise the same: a tensor this
        reload does not bring back is passed over (``stats().last_reload_ordered`` counts those it held). For
        an optimizer stepped per layer in the backward, list each layer's params and optimizer state, last layer
        first.
        """
        expect_bool(local_only, "reload(include, local_only)", "local_only")
        expect_bool(stream, "reload(include, stream)", "stream")
        order = None
        if use_order is not None:
            if not stream:
                raise ValueError("reload(include, use_order): use_order orders a streamed reload's copies; pass "
                                 "stream=True with it")
            order = check_early_tensors(use_order, self.rt.device, "reload(include, use_order)")
        with self._exclusive("reload"):
            await self._reload(include, force=False, local_only=local_only, stream=stream, use_order=order)

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

    async def _reload(self, include: Iterable[Category | str] | Category | str | None, force: bool,
                      local_only: bool = False, stream: bool = False,
                      use_order: list[torch.Tensor] | None = None) -> list[str]:
        cats = Category.select(include)
        if self._streamed_reloads and not stream:
            await self._finish_streams()
        if self._early:  # a reload reads the host buffers early copies write into
            await self._early.drain()
        self._early.prepare()
        offloaded = self._held.offloaded_layouts(cats)
        chosen = frozenset(cats & self._held.offloaded)  # the same on every rank: offloads end alike everywhere
        agreed = not local_only and self.backend.agrees_on_reload(chosen)
        if local_only:
            offloaded = [lay for lay in offloaded if not self.backend.needs_peers(lay)]
        if not offloaded and not agreed:
            self._held.settle_back(cats)
            return []
        rt = self.rt
        if stream and not force and not agreed:
            reload = StreamedReload(rt, self.backend, offloaded, self.config.stream_chunk_bytes,
                                    self.config.stream_window_bytes, self.config.stream_sm_ctas, use_order)
        else:
            reload = (Recover if force else Reload)(rt, self.backend, offloaded, chosen, agreed=agreed)
        with rt.span("reload"), gc_paused():
            t0 = rt.now()
            figures = await reload.run()
            if figures.streaming:
                self._streamed_reloads.append(reload)
            self._held.settle_back(cats)
            figures.seconds = rt.now() - t0
            self._figures.count_reload(figures)
            if logger.isEnabledFor(logging.INFO):
                logger.info("reloaded %s: %d layouts, %.3f GB in %.3f s", sorted(x.value for x in cats),
                            len(reload.layouts), figures.moved_bytes / 1e9, figures.seconds)
            return reload.overwritten


def check_store(store: Any, call: str, param: str = "store") -> Any:
    """``store`` if it is an :class:`~refimpl.store.OffloadStore`; a client of one (``attach_ddp``,
    ``attach_megatron``) or a model is refused with what to pass instead."""
    hint = ""
    if isinstance(getattr(store, "store", None), OffloadStore):
        hint = "this is a client of a store; pass its .store"
    elif isinstance(store, torch.nn.Module):
        hint = "build the store first: store = OffloadStore(TorchRuntime()); then attach the model to it"
    return expect(store, OffloadStore, call, param, "an OffloadStore", hint=hint)


__all__ = ["OffloadStore", "StoreStats", "check_store"]
