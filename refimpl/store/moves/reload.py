"""One reload in flight: :class:`Reload` (and :class:`Recover`, which overwrites changes).

Read :meth:`Reload.run` top to bottom:

1. :meth:`~Reload.issue_copies` (phase ``issue``): one flat device buffer per
   offloaded layout, filled by the backend (:class:`~refimpl.store.moves.copies.ReloadCopies`),
   in the order a training step first uses them (params, buffers, grads,
   optimizer state: ``FIRST_USE_ORDER``; [Note: streamed reload] says why).
2. :meth:`~Reload.check` (phase ``validate``): every ref still parked as the
   offload left it (:func:`~refimpl.store.state.tensor_changes.changed_tensors`); a changed
   one raises :class:`TensorChangedError` with the state still offloaded
   (:class:`Recover` makes every ref re-pointable instead and warns).
3. :meth:`~Reload.repoint` (phase ``repoint``), while the copies run: every ref
   into its layout's flat buffer (:meth:`FlatLayout.repoint`).
4. :meth:`~Reload.wait` (phase ``wait``): every finisher awaited.
5. :meth:`~Reload.mark_resident`: every layout resident in its flat buffer.

A failure in 1-4 runs :meth:`~Reload.roll_back` (refs parked again, flat
buffers freed): the state stays offloaded, the host copy kept. The backend
prepares a reload before stage 1 and settles its outcome after stage 4
(``prepare_reload`` / ``settle_reload``; ``local_dedup`` votes there, so a
reload that failed on one rank stays offloaded on every rank).
"""
from __future__ import annotations

import bisect
import logging
from typing import ClassVar, Sequence

import torch

from refimpl.runtime.base import Runtime
from refimpl.store.backends.base import Piece, StoreBackend
from refimpl.store.config import Category
from refimpl.store.errors import TensorChangedError
from refimpl.store.moves.copies import ReloadCopies, reload_order
from refimpl.store.moves.early import StreamingFlat
from refimpl.store.state.guard import OnAccess, guard, unguard
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutState
from refimpl.store.state.tensor_changes import changed_tensors, force_repoint_prepare
from refimpl.store.stats import PhaseClock, ReloadFigures

logger = logging.getLogger(__name__)


class Reload:
    """One reload of the offloaded ``layouts`` in flight; :meth:`run` once."""

    #: ``reload`` or ``recover``, for logs
    name: ClassVar[str] = "reload"

    def __init__(self, rt: Runtime, backend: StoreBackend, layouts: list[FlatLayout],
                 cats: frozenset[Category] = frozenset(), *, agreed: bool = True) -> None:
        self.rt, self.backend, self.cats, self.agreed = rt, backend, cats, agreed
        self.layouts = sorted(layouts, key=reload_order)  # params, buffers, grads, optimizer state
        self.copies = ReloadCopies(rt, backend)
        self.clock = PhaseClock(rt, "reload")
        #: names of the refs whose change the reload overwrote (only :class:`Recover` overwrites)
        self.overwritten: list[str] = []

    async def run(self) -> ReloadFigures:
        """Stages 1-5 in order (rolled back on failure); returns what it did (the bytes brought back, the phases).

        The backend settles the outcome before stage 5 (``settle_reload``), as it does for an offload: a
        peer's failure makes this rank roll back too (``agreed=False``, a reload of layouts that need no
        peer by one rank alone: no hooks).
        """
        try:
            await self.rt.point("store.reload.begin")
            await self.issue_copies()
            self.check()
            self.repoint()
            await self.wait()
        except GeneratorExit:  # the coroutine is being closed (its rank is gone): nothing may await any more
            raise
        except BaseException as error:
            await self.roll_back()
            if self.agreed:
                await self.backend.settle_reload(self.cats, error)
            raise
        if self.agreed:
            try:
                await self.backend.settle_reload(self.cats, None)
            except BaseException:
                await self.roll_back()
                raise
        return self.figures(self.mark_resident())

    async def issue_copies(self) -> None:
        """Stage 1: the backend prepares (``prepare_reload``), then each layout's flat buffer is allocated and
        filled."""
        if self.agreed:
            await self.backend.prepare_reload(self.cats, self.layouts)
        await self.copies.issue(self.layouts)
        self.clock.lap("issue")

    def check(self) -> None:
        """Stage 2: raise :class:`TensorChangedError` if a registered tensor changed while offloaded."""
        problems = changed_tensors(self.layouts)
        self.clock.lap("validate")
        if problems:
            raise TensorChangedError(
                f"{len(problems)} registered tensor(s) changed while offloaded: " + "; ".join(problems[:5])
                + ". The offloaded copy is kept (store.host_tensors() reads it); store.recover() reloads "
                "it into every registered tensor, overwriting the change"
            )

    def repoint(self) -> None:
        """Stage 3, while the copies run: every ref into its layout's flat buffer."""
        with torch.no_grad():
            for lay, flat in zip(self.layouts, self.copies.flats.values()):  # flats in layout order
                lay.repoint(flat)
        self.clock.lap("repoint")

    async def wait(self) -> None:
        """Stage 4: every backend finisher awaited, in layout order."""
        await self.rt.point("store.reload.wait")
        await self.copies.wait()
        self.clock.lap("wait")

    def mark_resident(self) -> int:
        """Stage 5: every layout resident in its flat buffer; returns the bytes brought back."""
        return sum([lay.mark_resident(flat) for lay, flat in zip(self.layouts, self.copies.flats.values())])

    def figures(self, moved: int, streaming: bool = False) -> ReloadFigures:
        """What this reload did: ``moved`` bytes brought back (or on their way, ``streaming``), the phases so far."""
        return ReloadFigures(moved, phases=dict(self.clock.laps), streaming=streaming,
                             ordered_tensors=self.copies.ordered_tensors)

    async def roll_back(self) -> None:
        """Undo stages 4 to 1: finishers drained, refs parked again, flat buffers freed."""
        await self.copies.drain()
        with torch.no_grad():
            for lay in self.layouts:
                if lay.state is LayoutState.REPOINTED:
                    lay.repark()
        self.copies.release_flats()


class StreamedReload(Reload):
    """A reload that hands each tensor over as its bytes land (``OffloadStore.reload(stream=True)``).

    [Note: streamed reload]
    :meth:`run` stops after stage 3: the copies are issued in pieces of at most
    ``chunk_bytes`` bytes (``StoreBackend.reload_pieces``), every ref is
    re-pointed into its flat buffer, and then guarded again (see [Note:
    offload guard] in :mod:`refimpl.store.state.guard`) with an ``on_access`` that
    orders the caller's device stream after the pieces holding that tensor's
    bytes (``Completion.order_on_device``: a wait on the device, not on the
    host) and drops the guard. So the first torch call that touches a tensor,
    however early (a forward that reaches a layer before its copy ended, a
    gather into another model, an optimizer step), runs after its bytes are
    there, and what touches later-copied tensors queues behind their pieces
    while the host goes on. :meth:`finish` (stages 4-5: every copy awaited,
    the guards left on untouched tensors dropped, the layouts resident) runs
    at the store's next operation or ``OffloadStore.finish_reload()``.

    Layouts are issued in the order a training step first uses them (params,
    buffers, grads, optimizer state: ``FIRST_USE_ORDER`` in
    :mod:`refimpl.store.config`), so what the forward touches lands first (a
    buffer read in the first layer, such as a rotary ``inv_freq``, would
    otherwise wait for the optimizer state's pieces). A caller whose step uses
    its tensors in another order passes it (``reload(stream=True,
    use_order=...)``): the pieces of every layout are then issued in that
    order, those holding none of the listed tensors after, as above. An
    optimizer stepped unit by unit in the backward uses the last layer's
    params and moments first; in layout order it waited for every piece.

    The copy engine serves one stream's queued copies before another's, so a
    pinned copy of the caller's own (FSDP2's in backward) waits behind every
    piece still queued; a small pageable copy (a batch moved to the device)
    and a device-to-device one do not (``bench/gpu/copy_queue_probe.py``,
    ``bench/gpu/sm_copy_probe.py``). With ``sm_ctas``
    (``StoreConfig.stream_sm_ctas``) a kernel of that many programs makes the
    copies instead, reading the pinned host buffers, and the engine stays free
    for the caller's copies ([Note: copies on SMs] in
    :mod:`refimpl.torch_runtime.sm_copy`). With ``window_bytes``
    (``StoreConfig.stream_window_bytes``, off by default) the pieces are fed
    to the device that many bytes at a time (``Runtime.paced_copies``; see
    [Note: paced copies] in :mod:`refimpl.torch_runtime.copy_stream`).

    What reads a ref's bytes without a torch call (a C++ kernel given its data
    pointer, a collective called on the ProcessGroup directly) would not wait:
    those meet the guard's checks as before (see the guard's Note), and the
    store finishes a streamed reload before anything of its own reads them.
    Where the backend fills layouts in one step (``local_dedup``, whose reload
    gathers across ranks) or the runtime cannot order device work on a copy
    (the simulator), :meth:`run` is a whole reload.
    """

    name: ClassVar[str] = "reload (streamed)"

    def __init__(self, rt: Runtime, backend: StoreBackend, layouts: list[FlatLayout], chunk_bytes: int,
                 window_bytes: int | None = None, sm_ctas: int | None = None,
                 use_order: Sequence[torch.Tensor] | None = None) -> None:
        super().__init__(rt, backend, layouts, agreed=False)
        self.copies = ReloadCopies(rt, backend, chunk_bytes=chunk_bytes, use_order=use_order)
        #: at most this many bytes of the pieces queued on the device at once (``Runtime.paced_copies``)
        self.window_bytes = window_bytes
        #: the host-to-device copies made by a kernel of this many programs (``Runtime.copies_on_sms``), or None
        self.sm_ctas = sm_ctas
        #: True while copies are in flight behind the guards (set by :meth:`run`, cleared by :meth:`finish`)
        self.streaming = False
        self._filling: dict[LayoutKey, StreamingFlat] | None = None

    async def run(self) -> ReloadFigures:
        """Stages 1-3 and the arrival guards (or, where nothing can stream, the whole reload); returns what it did
        (while ``streaming``, the bytes on their way: :meth:`finish` returns them once landed)."""
        if not self.rt.orders_on_device:
            return await super().run()
        try:
            await self.rt.point("store.reload.begin")
            with self.rt.paced_copies(self.window_bytes), self.rt.copies_on_sms(self.sm_ctas):
                await self.issue_copies()
            if len(self.copies.pieces) < sum(1 for lay in self.layouts if not lay.dropped):
                self.check()
                self.repoint()
                await self.wait()
                return self.figures(self.mark_resident())
            self.check()
            self.repoint()
            self.arm()
        except GeneratorExit:
            raise
        except BaseException:
            await self.roll_back()
            raise
        self.streaming = True
        return self.figures(sum(lay.data_nbytes for lay in self.layouts if not lay.dropped), streaming=True)

    def filling(self) -> dict[LayoutKey, StreamingFlat]:
        """While copies are in flight (:attr:`streaming`): each layout's flat buffer and its pieces (what
        ``copy_early`` orders after, [Note: early copies while a reload streams] in :mod:`refimpl.store.moves.early`);
        empty otherwise."""
        if not self.streaming:
            return {}
        if self._filling is None:  # the pieces are final once issued: built once, at the first copy_early
            self._filling = {lay.key: StreamingFlat(self.copies.flats[lay.key],
                                                    tuple(self.copies.pieces.get(lay.key, ())))
                             for lay in self.layouts if not lay.dropped}
        return self._filling

    def arm(self) -> None:
        """Guard every ref of every layout with its pieces' device wait (see the class Note)."""
        for lay in self.layouts:
            pieces = self.copies.pieces.get(lay.key)
            if not pieces:
                continue
            starts = [p.start for p in pieces]
            for e in lay.entries:
                first = max(0, bisect.bisect_right(starts, e.offset) - 1)
                mine = tuple(p for p in pieces[first:] if p.start < e.offset + e.numel)
                wait = _arrival(mine)
                for r in e.refs:
                    t = r.live()
                    if t is None:
                        continue
                    guard(t, r.name, on_access=wait)
                    dt = r.live_dtensor()
                    if dt is not None:  # DTensor's dispatch unwraps below the local tensor's guard
                        guard(dt, r.name, on_access=wait)
        self.clock.lap("arm")

    async def finish(self) -> int:
        """Stages 4-5 of a streamed reload: every copy awaited, untouched refs unguarded, the layouts resident;
        returns the bytes brought back. A failure leaves the state offloaded (see :meth:`Reload.roll_back`)."""
        if not self.streaming:
            return 0
        self.streaming, self._filling = False, None
        try:
            await self.wait()
        except BaseException:
            self._drop_arrival_guards()
            await self.roll_back()
            raise
        self._drop_arrival_guards()
        return self.mark_resident()

    def _drop_arrival_guards(self) -> None:
        for lay in self.layouts:
            for e in lay.entries:
                for r in e.refs:
                    for x in (r.live(), r.live_dtensor()):
                        if x is not None:
                            unguard(x)


def _arrival(pieces: tuple[Piece, ...]) -> OnAccess:
    """The guard's ``on_access`` for a tensor whose bytes are in ``pieces``: order the caller's device stream
    after them (block the host only where a completion cannot be ordered on the device)."""
    def wait(_t: torch.Tensor) -> None:
        for p in pieces:
            if not p.completion.order_on_device():
                for _ in p.completion.__await__():  # TorchRuntime's completions finish without yielding
                    raise RuntimeError("a streamed reload's copy cannot be waited for here")

    return wait


class Recover(Reload):
    """A reload that overwrites changes: every registered tensor gets its offloaded bytes back."""

    name: ClassVar[str] = "recover"

    def check(self) -> None:
        """Stage 2: make every ref re-pointable (see :func:`force_repoint_prepare`); warn about the changes."""
        problems = force_repoint_prepare(self.layouts)
        self.clock.lap("validate")
        if problems:
            logger.warning("recover(): %d registered tensor(s) changed while offloaded get their offloaded "
                           "bytes back, overwriting the change: %s", len(problems), "; ".join(problems[:5]))
        self.overwritten = problems


__all__ = ["Recover", "Reload", "StreamedReload"]
