"""Device<->host copies on a dedicated CUDA copy stream, ordered after the queued compute.

[Note: the ordering a copy needs]
The tensor being offloaded was produced by kernels still queued on the current
(compute) stream. The copy stream therefore first waits on the compute stream,
so the copy reads the finished values; the copy itself runs on a stream of
its own so it can overlap later compute: one for device-to-host copies and one
for the rest (host-to-device, device-to-device), so that the two directions,
served by separate copy engines, run at once (a streamed reload's pieces and
the next step's early copies to the host, [Note: early copies while a reload
streams] in :mod:`refimpl.store.moves.early`); on one stream the second
direction would queue behind the first. Nothing relies on the order of two
copies of different directions: each dependency is an await or a device wait
on a copy's event. A device source is ``record_stream``-ed on the
copy stream: if the caller drops or releases it before the copy ends, the
caching allocator will not hand the block to anyone else until the copy stream
passes this point. Awaiting the :class:`StreamCopy` synchronizes the copy's
event (the host may read the destination, and host buffers may be reused) and
makes the current stream wait on it, so compute queued later sees the copied
bytes on the device. Without CUDA there is nothing to order: copies run at once.

[Note: paced copies]
The copy engine of each direction serves the copies queued on it in order,
whatever their stream or its priority: a 716 KiB pinned host-to-device copy
issued on another (even a high-priority) stream right after 8 GB of pieces
were queued completes after all of them, 143 ms later on the H200
(``bench/gpu/copy_queue_probe.py``; a small pageable copy and a
device-to-device one do not wait). A streamed reload queues gigabytes and
hands the device to the next training step, whose own pinned host-to-device
copies (FSDP2's in backward) then wait for the whole reload. Copies made on
SMs ([Note: copies on SMs] in :mod:`refimpl.torch_runtime.sm_copy`) leave the
engine free instead. Inside
:meth:`CopyEngine.paced` the engine keeps at most ``window_bytes`` of copies
queued on the device and holds the rest on the host; a feeder thread issues
them a window at a time, each once the window before it has completed (it
sleeps in ``cudaEventSynchronize`` on a blocking-sync event, without the GIL
and without spinning): the engine idles for a moment between windows, the
only point at which it turns to another stream's copies (keeping the window
topped up piece by piece left the other stream waiting as long as before:
141 ms), so another stream's copy waits behind one window at most (2.4-3.8 ms
for windows of 2-8 pieces of 64 MiB, the bulk 2-4% slower at 4-8 pieces). Each
held copy keeps the ordering of an immediate one: an event recorded on the
caller's stream when it was asked for is what the copy stream waits for
before it runs. A held copy's completion blocks the host until it is issued
where it must (``order_on_device`` and ``await``: an unrecorded event would
order nothing).

[Note: the feeder's GIL]
Between two windows the feeder sleeps in ``cudaEventSynchronize`` without
the GIL; to issue the next window it needs the GIL back. A thread asking for
the GIL gets it only once the holder has run for the interpreter's switch
interval (``sys.getswitchinterval()``, 5 ms by default), and in a training
step the thread holding it is the one launching the step (FSDP2's hooks, the
optimizer stepped in the backward, the autograd engine's Python callbacks):
on a CPU, a thread woken every 2 ms beside a thread running Python got the
GIL back 5.3 ms late (median of 50), 0.1 ms late beside an idle one. Every
window then waits on the host longer than it takes to copy (a 128-MiB window
is 2.4 ms at 55 GB/s), and the copy engine idles in between. While it holds
copies the pacer lowers the interpreter's switch interval to
:data:`PACED_SWITCH_INTERVAL_S` (0.7 ms late on the same CPU test at 0.5 ms)
and restores it once nothing is held; the pacers share one lowering with the
switch's background threads (:data:`~refimpl.runtime.switch_interval.SWITCH_INTERVAL`;
[Note: the GIL's switch interval] in :mod:`refimpl.runtime.switch_interval`).
``Pacer.switch_interval_s`` (the runtime's ``pacer_switch_interval_s``) sets
it; None leaves the interpreter's.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Any, Generator, Iterator

import torch

from refimpl.runtime.base import Completion, CopyKind, CopyStats, Ready, check_same_shape
from refimpl.runtime.switch_interval import RESPONSIVE_SWITCH_INTERVAL_S, SWITCH_INTERVAL
from refimpl.torch_runtime.sm_copy import SmCopier

logger = logging.getLogger(__name__)

#: the interpreter's switch interval while a pacer holds copies (seconds; [Note: the feeder's GIL])
PACED_SWITCH_INTERVAL_S = RESPONSIVE_SWITCH_INTERVAL_S



_EXPECTED_DEVICES = {CopyKind.D2H: ("cuda", "cpu"), CopyKind.H2D: ("cpu", "cuda"), CopyKind.D2D: ("cuda", "cuda")}


class StreamCopy(Completion):
    """A copy queued on the copy stream; awaiting it waits for the copy's event without yielding."""

    def __init__(self, event: "torch.cuda.Event", dst: torch.Tensor, src: torch.Tensor, device: torch.device):
        self._event = event
        self._keep: tuple[torch.Tensor, ...] = (dst, src)  # host buffers must outlive the DMA
        self._device = device
        self._dst_on_device = dst.device.type == "cuda"

    def done(self) -> bool:
        """True once the copy has finished on the device."""
        return self._event.query()

    def order_on_device(self) -> bool:
        """The calling thread's current stream on the copy's device waits for the copy's event (the host does
        not); the copy's buffers are kept until the copy is awaited."""
        if self._dst_on_device:
            torch.cuda.current_stream(self._device).wait_event(self._event)
            return True
        return self.done()

    def __await__(self) -> Generator[Any, None, None]:
        self._event.synchronize()
        if self._dst_on_device:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        self._keep = ()
        return
        yield  # pragma: no cover - makes this a generator


class HeldCopy(StreamCopy):
    """A copy :class:`Pacer` holds on the host until the window has room (see [Note: paced copies])."""

    def __init__(self, event: "torch.cuda.Event", dst: torch.Tensor, src: torch.Tensor, device: torch.device,
                 after: "torch.cuda.Event", nbytes: int, kind: CopyKind = CopyKind.H2D) -> None:
        super().__init__(event, dst, src, device)
        self.after = after
        self.kind = kind
        self.nbytes = nbytes
        self.issued = threading.Event()
        self.error: BaseException | None = None

    def _wait_issued(self) -> None:
        self.issued.wait()
        if self.error is not None:
            raise self.error

    def done(self) -> bool:
        """True once the copy has been issued and has finished on the device."""
        return self.issued.is_set() and self.error is None and self._event.query()

    def order_on_device(self) -> bool:
        """As :meth:`StreamCopy.order_on_device`, once the feeder has issued the copy (the host waits until then)."""
        self._wait_issued()
        return super().order_on_device()

    def __await__(self) -> Generator[Any, None, None]:
        self._wait_issued()
        return (yield from super().__await__())


class Pacer:
    """Keeps at most ``window_bytes`` of an engine's held copies queued on the device; a feeder thread (one per
    engine, started at the first paced copy, asleep while nothing is held) issues them in order, a window at a
    time, each once the window before it has completed (see [Note: paced copies])."""

    def __init__(self, engine: "CopyEngine") -> None:
        self.engine = engine
        self.window_bytes = 0
        #: the interpreter's switch interval while copies are held (None: as it is; [Note: the feeder's GIL])
        self.switch_interval_s: float | None = PACED_SWITCH_INTERVAL_S
        self._lowered = False  # this pacer's share of SWITCH_INTERVAL (under _cond)
        self._held: collections.deque[HeldCopy] = collections.deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._feed, name="timeshare-copy-pacer", daemon=True)
        self._thread.start()

    def holding(self) -> bool:
        """True while copies wait to be issued (a copy asked for now must queue behind them to keep the order)."""
        return bool(self._held)

    def submit(self, held: HeldCopy) -> None:
        """Queue ``held`` behind the copies already held."""
        with self._cond:
            if not self._held and not self._lowered and self.switch_interval_s:
                SWITCH_INTERVAL.lower(self.switch_interval_s)
                self._lowered = True
            self._held.append(held)
            self._cond.notify()

    def _feed(self) -> None:
        torch.cuda.set_device(self.engine.device)
        in_flight: collections.deque[HeldCopy] = collections.deque()
        queued = 0
        while True:
            with self._cond:
                while not self._held:
                    while in_flight and in_flight[0]._event.query():  # keep nothing that is done
                        queued -= in_flight.popleft().nbytes
                    self._cond.wait(timeout=0.05 if in_flight else None)
                nxt = self._held[0]
            if in_flight and queued + nxt.nbytes > max(self.window_bytes, 1):
                # the whole window, not its oldest piece: the engine goes idle for a moment, the only point at
                # which it turns to another stream's copies (no GIL held while the device works)
                in_flight[-1]._event.synchronize()
                in_flight.clear()
                queued = 0
            try:
                self.engine.issue(nxt)
            except BaseException as exc:  # noqa: BLE001 - the copy's awaiter raises it
                nxt.error = exc
                logger.error("a paced copy failed to issue: %r", exc)
            else:
                in_flight.append(nxt)
                queued += nxt.nbytes
            with self._cond:
                self._held.popleft()
                if not self._held and self._lowered:  # nothing more to issue: the GIL may be slow again
                    SWITCH_INTERVAL.restore()
                    self._lowered = False
            nxt.issued.set()


class CopyEngine:
    """Issues copies for one device: on its own CUDA stream, or synchronously on CPU."""

    def __init__(self, device: torch.device, stats: CopyStats) -> None:
        self.device = device
        self.stats = stats
        self._stream: "torch.cuda.Stream | None" = None
        self._d2h_stream: "torch.cuda.Stream | None" = None
        self._pacer: Pacer | None = None
        self._pacing = 0
        self._sm_ctas = 0
        #: the interpreter's switch interval while this engine's pacer holds copies ([Note: the feeder's GIL])
        self.switch_interval_s: float | None = PACED_SWITCH_INTERVAL_S
        #: host-to-device copies made by SMs inside :meth:`on_sms` (see [Note: copies on SMs])
        self.sm = SmCopier()

    @contextlib.contextmanager
    def on_sms(self, ctas: int | None) -> Iterator[None]:
        """Host-to-device copies asked for inside the block from pinned, contiguous host memory are made by a kernel
        of ``ctas`` programs instead of the copy engine ([Note: copies on SMs] in :mod:`refimpl.torch_runtime.sm_copy`);
        ``None`` or 0, or without CUDA: as outside. Leaving the block does not wait for them."""
        if not ctas or self.device.type != "cuda":
            yield
            return
        before, self._sm_ctas = self._sm_ctas, int(ctas)
        try:
            yield
        finally:
            self._sm_ctas = before

    @contextlib.contextmanager
    def paced(self, window_bytes: int | None) -> Iterator[None]:
        """Copies asked for inside the block are queued on the device ``window_bytes`` at a time (see [Note: paced
        copies]); device-to-host ones, on their own stream, are issued at once; ``None`` or 0, or without CUDA: as
        outside. Leaving the block does not wait for them."""
        if not window_bytes or self.device.type != "cuda":
            yield
            return
        if self._pacer is None:
            self._pacer = Pacer(self)
        self._pacer.window_bytes = int(window_bytes)
        self._pacer.switch_interval_s = self.switch_interval_s
        self._pacing += 1
        try:
            yield
        finally:
            self._pacing -= 1

    @property
    def stream(self) -> "torch.cuda.Stream":
        """The stream of host-to-device and device-to-device copies (created on first use)."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        return self._stream

    @property
    def d2h_stream(self) -> "torch.cuda.Stream":
        """The stream of device-to-host copies (created on first use): the other direction's engine."""
        if self._d2h_stream is None:
            self._d2h_stream = torch.cuda.Stream(device=self.device)
        return self._d2h_stream

    def stream_for(self, kind: CopyKind) -> "torch.cuda.Stream":
        """The stream a copy of ``kind`` runs on (see the module note)."""
        return self.d2h_stream if kind is CopyKind.D2H else self.stream

    def copy(self, dst: torch.Tensor, src: torch.Tensor, kind: CopyKind) -> Completion:
        """Copy ``src`` into ``dst`` element for element; see the module note for the ordering."""
        check_same_shape(dst, src)
        nbytes = src.numel() * src.element_size()
        if not (dst.device.type == "cuda" or src.device.type == "cuda"):
            copy_into(dst, src, non_blocking=False)
            self.stats.record(kind, nbytes)
            return Ready()
        want = _EXPECTED_DEVICES[kind]
        if (src.device.type, dst.device.type) != want:
            raise ValueError(
                f"copy_async kind {kind.name} needs src on {want[0]} and dst on {want[1]}, got src on "
                f"{src.device} and dst on {dst.device}; pass the kind that matches the tensors"
            )
        stream = self.stream_for(kind)
        if self._sm_ctas and kind is CopyKind.H2D and self.sm.can_copy(dst, src):
            done = self._copy_on_sms(dst, src, stream)
            if done is not None:
                self.stats.record(kind, nbytes)
                return done
        # held ones go first, to keep the order of their stream; a device-to-host copy is never held (its own stream)
        if self._pacer is not None and kind is not CopyKind.D2H and (self._pacing or self._pacer.holding()):
            after = torch.cuda.Event()
            after.record(torch.cuda.current_stream(self.device))  # what an immediate copy would wait for
            for t in (src, dst):
                if t.device.type == "cuda":
                    t.record_stream(stream)
            self.stats.record(kind, nbytes)
            held = HeldCopy(torch.cuda.Event(blocking=True), dst, src, self.device, after, nbytes, kind)
            self._pacer.submit(held)
            return held
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            copy_into(dst, src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        for t in (src, dst):
            if t.device.type == "cuda":
                t.record_stream(stream)
        self.stats.record(kind, nbytes)
        return StreamCopy(event, dst, src, self.device)

    def _copy_on_sms(self, dst: torch.Tensor, src: torch.Tensor, stream: "torch.cuda.Stream") -> StreamCopy | None:
        """The copy as a kernel on the copy stream, ordered like an engine copy; None if the device cannot."""
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            if not self.sm.copy(dst, src, self._sm_ctas):
                return None
            event = torch.cuda.Event()
            event.record(stream)
        dst.record_stream(stream)
        return StreamCopy(event, dst, src, self.device)

    def issue(self, held: HeldCopy) -> None:
        """The feeder's half of a held copy: the copy stream waits for the caller's point, then copies."""
        stream = self.stream_for(held.kind)
        stream.wait_event(held.after)
        dst, src = held._keep
        with torch.cuda.stream(stream):
            copy_into(dst, src, non_blocking=True)
            held._event.record(stream)


def copy_into(dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool) -> None:
    """Element-for-element copy between tensors of equal numel (shapes may differ)."""
    if dst.is_contiguous():
        dst.view(-1).copy_(src.reshape(-1), non_blocking=non_blocking)
    else:
        dst.copy_(src.reshape(dst.shape), non_blocking=non_blocking)
