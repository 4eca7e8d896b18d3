"""The colocated RL step's clock: each phase's span between device synchronisations, and the copy line rates.

Every phase of a step is timed by :meth:`PhaseClock.phase` in seconds since the clock began; the record's
``spans`` are these (:func:`bench.rl.record.phase_spans`). :func:`line_rates` measures the host-to-device
and device-to-host rates the switch's copies are set against, once at the start of the same run.
"""
from __future__ import annotations

import contextlib
import time

import torch


class PhaseClock:
    """Phase spans (start, end) in seconds since the clock began, each closed by a device synchronisation."""

    #: caching-allocator counters read around each phase (outside its timed span)
    ALLOCATOR_KEYS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.t0 = time.perf_counter()
        self.spans: list[tuple[int, str, float, float]] = []
        #: per "step.phase": the caching allocator's counters' change inside the phase (CUDA only)
        self.allocator: dict[str, dict[str, int]] = {}

    def sync(self) -> None:
        """Wait for the device's queued work, every stream (a no-op on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def stream_sync(self) -> None:
        """Wait for the calling thread's current stream only (copies on the store's copy stream may go on)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    @contextlib.contextmanager
    def phase(self, step: int, name: str, *, start: str = "device", end: str = "device"):
        """Context manager: record ``(step, name, start, end)`` around the block, in seconds since the clock began.

        ``start`` / ``end``: what is waited for at each end: ``"device"`` (every stream: nothing the phase queued
        is left), ``"stream"`` (the current stream only: a background copy may run on into the next phase, whose
        time then holds what it costs there) or ``"none"``.
        """
        waits = {"device": self.sync, "stream": self.stream_sync, "none": lambda: None}
        waits[start]()
        before = self._allocator()
        a = time.perf_counter() - self.t0
        yield
        waits[end]()
        b = time.perf_counter() - self.t0
        self.spans.append((step, name, a, b))
        after = self._allocator()
        if after:  # what the caching allocator did inside the phase (a cudaFree synchronises the whole device)
            self.allocator[f"{step}.{name}"] = {k: after[k] - before.get(k, 0) for k in after}

    def _allocator(self) -> dict[str, int]:
        if self.device.type != "cuda":
            return {}
        st = torch.cuda.memory_stats(self.device)
        return {k: int(st.get(k, 0)) for k in self.ALLOCATOR_KEYS}


def line_rates(device: torch.device, nbytes: int, rt) -> dict[str, float]:
    """H2D and D2H GB/s between registered host memory and cached device memory (best of 4)."""
    host = rt.alloc_host(nbytes, torch.uint8, pinned=True, tag="line")
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for name, (dst, src) in (("h2d_gbps", (dev, host)), ("d2h_gbps", (host, dev))):
        best = float("inf")
        for _ in range(4):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        out[name] = nbytes / best / 1e9
    rt.free_host(host)
    return out


__all__ = ["PhaseClock", "line_rates"]
