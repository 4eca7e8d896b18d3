"""Pinned host buffers, pinned once at their exact size and reused every cycle.

Theory of operation
-------------------
A :class:`HostBuffer` is the host home of one flat layout (or of the part of
it a backend keeps). It is made of *segments*, each one
``Runtime.alloc_host(numel, dtype, pinned=True)`` call, i.e. one
``cudaHostRegister`` of exactly that many bytes; the segment sizes add up to
the layout's size, so nothing is rounded up. Segments let the first offload
start copying segment 0 while later segments are still being pinned, and let
several threads pin at once (``cudaHostRegister`` spends its time faulting in
and locking pages, and the CUDA binding releases the GIL while it does).

:meth:`PinnedHostPool.acquire` returns the buffer a key had last time when its
segment sizes are unchanged (a *reuse*: no pinning at all), and otherwise
unpins the old one and pins a new one. Buffers are never returned to the OS
while the pool lives: the high-water mark stays resident and is reported as
``host_pinned_bytes`` / ``host_pinned_gb``.

When pinning fails the runtime raises ``PinningError`` naming the size. With
``fallback="raise"`` that error reaches the caller and nothing has moved yet.
With ``fallback="pageable_warn"`` the pool warns (``warnings.warn`` and the
log, both naming the size) and uses pageable memory for that segment; the
bytes are reported as ``host_pageable_bytes``. A pageable copy is never silent.
"""
from __future__ import annotations

import logging
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from refimpl.runtime.base import PinningError, Runtime

logger = logging.getLogger(__name__)


class PageableFallbackWarning(RuntimeWarning):
    """Host memory could not be pinned; a pageable buffer is used instead (slow copies)."""


@dataclass(frozen=True)
class PoolStats:
    """Counters of a :class:`PinnedHostPool`.

    ``registrations``: segments pinned (``cudaHostRegister`` calls) over the
    pool's life. ``reuses``: segments handed out again without pinning.
    ``host_pinned_bytes``: bytes pinned now (the resident high-water mark).
    """

    host_pinned_bytes: int
    host_pageable_bytes: int
    registrations: int
    reuses: int
    pageable_fallbacks: int
    buffers: int

    @property
    def host_pinned_gb(self) -> float:
        """:attr:`host_pinned_bytes` in GB (10**9 bytes)."""
        return self.host_pinned_bytes / 1e9


class HostBuffer:
    """Host memory for one key: a list of exact-size segments, possibly still being pinned.

    ``segment(i)`` blocks until segment ``i`` is ready and raises the pinning
    error if it failed. Element ``j`` of the buffer lies in the segment whose
    range (see :meth:`ranges`) contains it.
    """

    def __init__(self, key: Hashable, dtype: torch.dtype, segment_numels: Sequence[int]) -> None:
        self.key = key
        self.dtype = dtype
        self.segment_numels = tuple(int(n) for n in segment_numels)
        self._tensors: list[torch.Tensor | None] = [None] * len(self.segment_numels)
        self._futures: list[Future | None] = [None] * len(self.segment_numels)
        self.pinned: list[bool] = [False] * len(self.segment_numels)
        #: a segment failed to allocate; the pool re-pins the whole buffer on the next acquire
        self.failed = False
        #: while growing: the key's previous buffer, whose segments are taken over where sizes match
        self._template: HostBuffer | None = None
        starts, acc = [], 0
        for n in self.segment_numels:
            starts.append(acc)
            acc += n
        self._starts = tuple(starts)
        self.numel = acc

    @property
    def nbytes(self) -> int:
        """Total bytes of the buffer."""
        return self.numel * self.dtype.itemsize

    def append_segment(self, numel: int) -> int:
        """Add a segment of ``numel`` elements at the end (its memory comes later); returns its index."""
        self.segment_numels = (*self.segment_numels, int(numel))
        self._tensors.append(None)
        self._futures.append(None)
        self.pinned.append(False)
        self._starts = (*self._starts, self.numel)
        self.numel += int(numel)
        return len(self.segment_numels) - 1

    def fill(self, i: int, tensor: torch.Tensor, pinned: bool) -> None:
        """Segment ``i``'s memory is ``tensor`` (``pinned``: page-locked, else pageable)."""
        self._tensors[i] = tensor
        self.pinned[i] = pinned

    def filling(self, i: int, future: Future) -> None:
        """Segment ``i`` is being allocated on a pinning thread; ``future`` completes when :meth:`fill` ran."""
        self._futures[i] = future

    def settle(self) -> None:
        """Wait for every segment still being allocated; a failed one simply holds nothing."""
        for fut in self._futures:
            if fut is not None:
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - a failed segment holds nothing to free
                    pass

    def take_segment(self, i: int) -> tuple[torch.Tensor | None, bool]:
        """Hand segment ``i``'s memory over to the caller: ``(tensor or None, pinned)``; the buffer keeps none."""
        t, pinned = self._tensors[i], self.pinned[i]
        self._tensors[i] = None
        return t, pinned

    @property
    def template(self) -> "HostBuffer | None":
        """While growing: the key's previous buffer, whose segments are taken over where sizes match."""
        return self._template

    @template.setter
    def template(self, old: "HostBuffer | None") -> None:
        """Set (or clear, with None) the previous buffer whose segments growth takes over."""
        self._template = old

    def ranges(self) -> list[tuple[int, int]]:
        """``(start, stop)`` element range of each segment within the buffer."""
        return [(s, s + n) for s, n in zip(self._starts, self.segment_numels)]

    def segment(self, i: int) -> torch.Tensor:
        """Segment ``i`` as a 1-D host tensor; waits for its pinning to finish."""
        fut = self._futures[i]
        if fut is not None:
            try:
                fut.result()  # re-raises the PinningError of a failed segment
            except BaseException:
                self.failed = True
                raise
            self._futures[i] = None
        t = self._tensors[i]
        if t is None:
            raise RuntimeError(f"host buffer {self.key!r} segment {i} was freed")
        return t

    def ready(self) -> None:
        """Wait until every segment is pinned (raises the first pinning error)."""
        for i in range(len(self.segment_numels)):
            self.segment(i)

    def view(self, start: int, stop: int) -> torch.Tensor:
        """Elements ``[start, stop)`` of the buffer, which must lie in one segment."""
        for i, (a, b) in enumerate(self.ranges()):
            if a <= start and stop <= b:
                return self.segment(i)[start - a:stop - a]
        raise ValueError(f"range [{start}, {stop}) spans segments of host buffer {self.key!r} {self.ranges()}")


class PinnedHostPool:
    """Exact-size pinned host buffers, keyed by layout, reused every cycle.

    ``runtime`` allocates and pins (``alloc_host``). ``fallback`` is
    ``"raise"`` or ``"pageable_warn"`` (see the module docstring).
    ``pin_threads`` > 1 pins segments concurrently in worker threads; only use
    it with a runtime whose ``alloc_host`` is thread-safe (TorchRuntime).
    """

    def __init__(self, runtime: Runtime, *, fallback: str = "raise", pin_threads: int = 1) -> None:
        if fallback not in ("raise", "pageable_warn"):
            raise ValueError(f"PinnedHostPool fallback must be 'raise' or 'pageable_warn', got {fallback!r}")
        if pin_threads < 1:
            raise ValueError(f"PinnedHostPool pin_threads must be >= 1, got {pin_threads}")
        self.rt = runtime
        self.fallback = fallback
        self.pin_threads = pin_threads
        self._buffers: dict[Hashable, HostBuffer] = {}
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pinned_bytes = 0
        self._pageable_bytes = 0
        self._registrations = 0
        self._reuses = 0
        self._fallbacks = 0

    # ------------------------------------------------------------------ buffers

    def acquire(self, key: Hashable, dtype: torch.dtype, segment_numels: Sequence[int]) -> HostBuffer:
        """The buffer for ``key`` with exactly these segment sizes: reused if unchanged, else pinned anew.

        Pinning runs in the background when ``pin_threads`` > 1; ``segment(i)``
        waits for it. Errors surface from ``segment(i)`` / ``ready()``.
        """
        sizes = tuple(int(n) for n in segment_numels)
        old = self._buffers.get(key)
        if old is not None and not old.failed and old.dtype == dtype and old.segment_numels == sizes:
            with self._lock:
                self._reuses += len(sizes)
            return old
        if old is not None:
            self.free(key)
        buf = HostBuffer(key, dtype, sizes)
        self._buffers[key] = buf
        try:
            for i, n in enumerate(sizes):
                self._start_fill(buf, i, n)
        except BaseException:
            buf.failed = True
            self.free(key)
            raise
        return buf

    def acquire_growing(self, key: Hashable, dtype: torch.dtype) -> HostBuffer:
        """An empty buffer for ``key`` that grows by :meth:`grow`, for an offload that does not know
        its segment sizes yet; :meth:`finish_growing` completes it. It is then the key's buffer like
        any other: a later :meth:`acquire` with the same segment sizes reuses it. Segments of the key's
        old buffer (e.g. pinned ahead) are taken over where the sizes match, the rest freed."""
        old = self._buffers.pop(key, None)
        buf = HostBuffer(key, dtype, ())
        if old is not None and not old.failed and old.dtype == dtype:
            buf.template = old
        elif old is not None:
            self._free_buffer(old)
        self._buffers[key] = buf
        return buf

    def finish_growing(self, buf: HostBuffer) -> None:
        """Free what the old buffer of a grown buffer's key had beyond what was taken over."""
        if buf.template is not None:
            self._free_buffer(buf.template)
            buf.template = None

    def grow(self, buf: HostBuffer, numel: int) -> int:
        """Append a segment of exactly ``numel`` elements to ``buf`` and start pinning it (or take over
        the old buffer's segment at this index when it has that size); returns its index."""
        i = buf.append_segment(numel)
        tpl = buf.template
        if tpl is not None and i < len(tpl.segment_numels) and tpl.segment_numels[i] == numel:
            try:
                tpl.segment(i)  # pinned ahead: wait for it, then take it over
            except Exception:  # noqa: BLE001 - a failed segment is simply pinned anew below
                pass
            else:
                buf.fill(i, *tpl.take_segment(i))
                with self._lock:
                    self._reuses += 1
                return i
        try:
            self._start_fill(buf, i, numel)
        except BaseException:
            buf.failed = True
            raise
        return i

    def wait_all(self) -> None:
        """Block until every buffer's segments are pinned (raises the first pinning error)."""
        for buf in list(self._buffers.values()):
            buf.ready()

    def get(self, key: Hashable) -> HostBuffer | None:
        """The buffer currently held for ``key``, if any."""
        return self._buffers.get(key)

    def free(self, key: Hashable) -> None:
        """Unpin and drop ``key``'s buffer (waits for its pinning to finish first)."""
        buf = self._buffers.pop(key, None)
        if buf is not None:
            self._free_buffer(buf)

    def _free_buffer(self, buf: HostBuffer) -> None:
        buf.settle()
        for i in range(len(buf.segment_numels)):
            t, pinned = buf.take_segment(i)
            if t is None:
                continue
            n = t.numel() * t.element_size()
            if pinned:
                self.rt.free_host(t)
                with self._lock:
                    self._pinned_bytes -= n
            else:
                with self._lock:
                    self._pageable_bytes -= n
        if buf.template is not None:
            self._free_buffer(buf.template)
            buf.template = None
        logger.debug("freed host buffer %r (%d bytes)", buf.key, buf.nbytes)

    def close(self) -> None:
        """Free every buffer and stop the pinning threads."""
        for key in list(self._buffers):
            self.free(key)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # ------------------------------------------------------------------ stats

    @property
    def host_pinned_bytes(self) -> int:
        """Bytes pinned now by this pool."""
        return self._pinned_bytes

    def stats(self) -> PoolStats:
        """A snapshot of the counters."""
        with self._lock:
            return PoolStats(
                host_pinned_bytes=self._pinned_bytes,
                host_pageable_bytes=self._pageable_bytes,
                registrations=self._registrations,
                reuses=self._reuses,
                pageable_fallbacks=self._fallbacks,
                buffers=len(self._buffers),
            )

    # ------------------------------------------------------------------ internals

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.pin_threads, thread_name_prefix="pin")
        return self._executor

    def _start_fill(self, buf: HostBuffer, i: int, numel: int) -> None:
        """Allocate and pin segment ``i`` of ``buf``: on the pinning threads when there are several, else now."""
        if self.pin_threads > 1 and numel > 0:
            buf.filling(i, self._pool().submit(self._fill, buf, i, numel))
        else:
            self._fill(buf, i, numel)

    def _fill(self, buf: HostBuffer, i: int, numel: int) -> None:
        """Allocate segment ``i`` (pinned, or pageable with a warning under the fallback)."""
        tag = f"store host buffer {buf.key!r} segment {i}"
        nbytes = numel * buf.dtype.itemsize
        try:
            t = self.rt.alloc_host(numel, buf.dtype, pinned=True, tag=tag)
            pinned = True
        except PinningError as e:
            if self.fallback != "pageable_warn":
                raise
            msg = (f"could not pin {nbytes} bytes ({nbytes / 2**30:.3f} GiB) for {tag}: {e}. Falling back to "
                   f"PAGEABLE host memory (pin_fallback='pageable_warn'): copies of this state run at a "
                   f"fraction of the PCIe line rate. Raise `ulimit -l` or free host memory to fix this.")
            logger.warning(msg)
            warnings.warn(msg, PageableFallbackWarning, stacklevel=2)
            t = self.rt.alloc_host(numel, buf.dtype, pinned=False, tag=tag)
            pinned = False
        buf.fill(i, t, pinned)
        with self._lock:
            if pinned:
                self._pinned_bytes += nbytes
                self._registrations += 1
            else:
                self._pageable_bytes += nbytes
                self._fallbacks += 1


__all__ = ["HostBuffer", "PageableFallbackWarning", "PinnedHostPool", "PoolStats"]
