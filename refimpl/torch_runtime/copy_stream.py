"""Device<->host copies on a dedicated CUDA copy stream, ordered after the queued compute.

[Note: the ordering a copy needs]
The tensor being offloaded was produced by kernels still queued on the current
(compute) stream. The copy stream therefore first waits on the compute stream,
so the copy reads the finished values; the copy itself runs on its own stream
so it can overlap later compute. A device source is ``record_stream``-ed on the
copy stream: if the caller drops or releases it before the copy ends, the
caching allocator will not hand the block to anyone else until the copy stream
passes this point. Awaiting the :class:`StreamCopy` synchronizes the copy's
event (the host may read the destination, and host buffers may be reused) and
makes the current stream wait on it, so compute queued later sees the copied
bytes on the device. Without CUDA there is nothing to order: copies run at once.
"""
from __future__ import annotations

from typing import Any, Generator

import torch

from refimpl.runtime.base import Completion, CopyKind, CopyStats, Ready, check_same_shape

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


class CopyEngine:
    """Issues copies for one device: on its own CUDA stream, or synchronously on CPU."""

    def __init__(self, device: torch.device, stats: CopyStats) -> None:
        self.device = device
        self.stats = stats
        self._stream: "torch.cuda.Stream | None" = None

    @property
    def stream(self) -> "torch.cuda.Stream":
        """The copy stream (created on first use)."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        return self._stream

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
        stream = self.stream
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


def copy_into(dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool) -> None:
    """Element-for-element copy between tensors of equal numel (shapes may differ)."""
    if dst.is_contiguous():
        dst.view(-1).copy_(src.reshape(-1), non_blocking=non_blocking)
    else:
        dst.copy_(src.reshape(dst.shape), non_blocking=non_blocking)
