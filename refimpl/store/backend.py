"""The backend seam of the offload store, and the ``local`` backend.

Theory of operation
-------------------
The store (:mod:`refimpl.store.store`) decides *what* moves: it collects the
registered tensors, groups them by storage into :class:`StorageEntry` objects,
asks the backend for each entry's :meth:`StoreBackend.placement_key`, and lays
out entries with equal (category, dtype, placement key) in one
:class:`FlatLayout`. A backend decides *where the host copy lives*:

* ``offload(layout, source)`` copies the layout's bytes (or the part this rank
  keeps) from the device to host memory. ``source`` (a :class:`LayoutSource`)
  knows where the bytes are on the device right now: scattered over the
  original storages on the first offload, or one flat buffer after a reload.
* ``reload(layout, device_flat)`` fills ``device_flat``, a freshly allocated
  1-D device buffer of ``layout.numel`` elements, with the layout's bytes.

Both are coroutines that *issue* their work and return an awaitable that
*finishes* it (waits for the copies, runs any collective). The store issues
every layout, does its per-tensor bookkeeping while the copies run, then awaits
the finishers in layout order. Collectives inside finishers therefore run in
the same (sorted layout key) order on every rank. A finisher must always be
awaited, also when the store is about to raise, so ranks never diverge.

The store releases device memory only after every finisher of an offload
has completed, and re-points tensors only after validation, so a backend error
loses nothing. The one exception is opt-in: a backend that sets
``early_release`` promises that nothing but the copies it issued through
``source.copy_to_host`` reads the device data, and that by the time its
``offload`` returns all its host memory is allocated; the store may then
release each storage as soon as the copies carrying its bytes completed, while
later copies still run (the ``local`` backend does).

``prepare(layouts)`` runs once per offload after collection, with all layouts
to copy (sorted), before any of them is issued, for backends that need
collective setup. A backend that sets ``speculative_offload`` (no collectives
in ``offload``) may see ``offload`` of an unchanged layout issued before
collection and ``prepare``; the store awaits and discards it if the layout
turns out to have changed.

Backends are found by name in :mod:`refimpl.store.registry`
(:func:`~refimpl.store.registry.register_backend` ``(name, factory)`` with
``factory(runtime, pool, config, **options) -> StoreBackend``);
``OffloadStore(backend="local_dedup")`` imports :mod:`refimpl.store.dedup` on
first use.
"""
from __future__ import annotations

import abc
import bisect
import logging
from typing import Awaitable, ClassVar, Hashable, Iterator, Sequence

import torch

from refimpl.runtime.base import Completion, CopyKind, Runtime, gather
from refimpl.store.config import StoreConfig
from refimpl.store.errors import StoreStateError
from refimpl.store.layout import FlatLayout, LayoutKey, StorageEntry
from refimpl.store.parking import own_view
from refimpl.store.pool import HostBuffer, PinnedHostPool

logger = logging.getLogger(__name__)


class LayoutSource(abc.ABC):
    """Read access to a layout's bytes where they are on the device now (given to ``offload``).

    Layout element ``j`` is element ``j - entry.offset`` of the entry whose
    range holds ``j``; elements between entries (alignment padding) hold no
    data. Backends must not write through a source.
    """

    layout: FlatLayout

    @property
    @abc.abstractmethod
    def flat(self) -> torch.Tensor | None:
        """The layout's flat device buffer when the layout lives in one (after a reload), else None."""

    def pieces(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """``(layout offset, 1-D device view)`` of every entry's data inside ``[start, stop)``, in order."""
        for off, view, _ in self.entry_pieces(start, stop):
            yield off, view

    def entry_pieces(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, torch.Tensor, StorageEntry]]:
        """Like :meth:`pieces`, with the entry each piece belongs to."""
        stop = self.layout.numel if stop is None else stop
        entries = self.layout.entries
        first = bisect.bisect_right(entries, start, key=_entry_end)  # entries are sorted by offset
        for j in range(first, len(entries)):
            e = entries[j]
            off, end = e.offset, e.offset + e.numel
            if off >= stop:
                break
            assert e.base is not None, f"entry {e.name} has no device data"
            if start <= off and end <= stop:
                yield off, e.base, e
            else:
                lo, hi = max(start, off), min(stop, end)
                yield lo, own_view(e.base[lo - off:hi - off]), e

    @abc.abstractmethod
    async def copy_range(self, dst: torch.Tensor, start: int, stop: int) -> list[Completion]:
        """Issue copies of layout elements ``[start, stop)`` into the host tensor ``dst`` (``dst[0]`` is
        element ``start``); returns the completions. Padding elements are not written."""

    @abc.abstractmethod
    async def copy_to_host(self, host: HostBuffer, start: int = 0, stop: int | None = None) -> list[Completion]:
        """Issue copies of layout elements ``[start, stop)`` into ``host`` (host element 0 = ``start``).

        ``host.numel`` must be ``stop - start``. Waits for each host segment's
        pinning before copying into it. Returns the completions; await them
        before reading ``host``. Padding elements are not written.
        """


def _entry_end(e: StorageEntry) -> int:
    return e.offset + e.numel


class StoreBackend(abc.ABC):
    """Where an offloaded layout's bytes live in host memory. See the module docstring.

    Subclasses set :attr:`name` and implement :meth:`offload` and
    :meth:`reload`; the rest has working defaults for a rank-local backend.
    """

    #: the name ``OffloadStore(backend=...)`` uses
    name: ClassVar[str] = ""
    #: True if :meth:`offload` of an unchanged resident layout may be issued before collection (and
    #: possibly discarded); only for backends whose offload runs no collective. See the store's note.
    speculative_offload: ClassVar[bool] = False
    #: True if :meth:`offload` reads device data only through ``source.copy_to_host`` and nothing in its
    #: finisher reads it again: the store may then release each storage as soon as its copies completed
    early_release: ClassVar[bool] = False
    #: True if the first offload may be streamed through :meth:`stream_begin` / :meth:`stream_reserve` /
    #: :meth:`stream_copy` while collection goes on (no padding, no collectives; see
    #: :mod:`refimpl.store.streaming`)
    streaming_offload: ClassVar[bool] = False

    def __init__(self, runtime: Runtime, pool: PinnedHostPool, config: StoreConfig) -> None:
        self.rt = runtime
        self.pool = pool
        self.config = config

    def placement_key(self, entry: StorageEntry) -> Hashable | None:
        """Which layout ``entry`` joins besides its category and dtype (``None``: the plain one).

        Must be deterministic and equal on every rank that shares the layout;
        keys of one store must be mutually ``repr``-orderable (layouts are
        processed in ``LayoutKey.sort_key`` order).
        """
        return None

    def padded_numel(self, key: LayoutKey, numel: int) -> int:
        """Size of the flat buffer for a layout whose data ends at ``numel`` (default: no padding)."""
        return numel

    async def prepare(self, layouts: Sequence[FlatLayout]) -> None:
        """Called once per offload, before any layout is issued, with all of them (sorted)."""

    def reserve(self, layout: FlatLayout) -> None:
        """Start allocating (pinning) the host memory ``layout`` will need, without copying anything.

        Called by :meth:`OffloadStore.pin_ahead`; the default does nothing.
        """

    @abc.abstractmethod
    async def offload(self, layout: FlatLayout, source: LayoutSource) -> Awaitable[None]:
        """Issue the copy of ``layout`` to host; return an awaitable that completes it."""

    @abc.abstractmethod
    async def reload(self, layout: FlatLayout, device_flat: torch.Tensor) -> Awaitable[None]:
        """Issue the fill of ``device_flat`` (``layout.numel`` elements); return an awaitable that completes it."""

    def stream_begin(self, layout: FlatLayout) -> None:
        """Streaming offload: ``layout`` (still growing) is about to send its host segments."""
        raise NotImplementedError(f"{type(self).__name__} does not stream offloads")

    def stream_reserve(self, layout: FlatLayout, numel: int) -> int:
        """Streaming offload: the next host segment has ``numel`` elements; start allocating it, return its index."""
        raise NotImplementedError(f"{type(self).__name__} does not stream offloads")

    async def stream_copy(self, layout: FlatLayout, source: LayoutSource, index: int, start: int,
                          stop: int) -> list[Completion]:
        """Streaming offload: issue the copies of layout range ``[start, stop)`` into segment ``index``."""
        raise NotImplementedError(f"{type(self).__name__} does not stream offloads")

    def stream_end(self, layout: FlatLayout) -> None:
        """Streaming offload: ``layout`` is complete (all its segments reserved)."""

    def host_view(self, layout: FlatLayout, start: int, stop: int) -> torch.Tensor | None:
        """Host memory holding layout elements ``[start, stop)`` while offloaded, or None if not held whole here."""
        return None

    def host_bytes(self) -> int:
        """Host bytes this backend holds now (pinned and pageable)."""
        return 0

    def discard(self, layout: FlatLayout) -> None:
        """Forget ``layout``'s host copy (the layout no longer exists or changed shape)."""

    def close(self) -> None:
        """Free everything the backend holds."""


class LocalBackend(StoreBackend):
    """``local``: each rank keeps a full copy of its layouts in its own pinned host buffers.

    One :class:`HostBuffer` per layout key, pinned at exactly the layout's
    size in segments cut at storage boundaries, reused every cycle.
    """

    name = "local"
    speculative_offload = True
    early_release = True
    streaming_offload = True

    def __init__(self, runtime: Runtime, pool: PinnedHostPool, config: StoreConfig) -> None:
        super().__init__(runtime, pool, config)
        self._held: dict[LayoutKey, HostBuffer] = {}

    def reserve(self, layout: FlatLayout) -> None:
        """Pin the layout's buffer now (in the pool's background threads when it has them)."""
        self._held[layout.key] = self.pool.acquire(layout.key, layout.dtype, layout.segment_numels())

    def stream_begin(self, layout: FlatLayout) -> None:
        """Start an empty, growing pinned buffer for the layout's key."""
        self._held[layout.key] = self.pool.acquire_growing(layout.key, layout.dtype)

    def stream_reserve(self, layout: FlatLayout, numel: int) -> int:
        """Append a segment and start pinning it (on the pool's threads when it has them)."""
        return self.pool.grow(self._held[layout.key], numel)

    async def stream_copy(self, layout: FlatLayout, source: LayoutSource, index: int, start: int,
                          stop: int) -> list[Completion]:
        """Wait for segment ``index`` to be pinned, then copy the layout range into it."""
        return await source.copy_range(self._held[layout.key].segment(index), start, stop)

    def stream_end(self, layout: FlatLayout) -> None:
        """Free whatever the key's previous buffer had that the grown one did not take over."""
        self.pool.finish_growing(self._held[layout.key])

    async def offload(self, layout: FlatLayout, source: LayoutSource) -> Awaitable[None]:
        """Copy the whole layout into the key's pinned buffer (pinned on first use)."""
        host = self.pool.acquire(layout.key, layout.dtype, layout.segment_numels())
        self._held[layout.key] = host
        try:
            completions = await source.copy_to_host(host, 0, layout.numel)
        except BaseException:
            # copy_to_host waited for what it issued; a buffer that failed to pin is dropped
            if host.failed:
                self._held.pop(layout.key, None)
                self.pool.free(layout.key)
            raise
        return gather(*completions)

    async def reload(self, layout: FlatLayout, device_flat: torch.Tensor) -> Awaitable[None]:
        """One host-to-device copy per host segment into ``device_flat``."""
        host = self._held.get(layout.key)
        if host is None or host.numel != layout.numel:
            raise StoreStateError(
                f"local backend holds no host copy of layout {layout.key.label()}; it was never offloaded "
                f"through this backend or was discarded"
            )
        completions = [
            self.rt.copy_async(own_view(device_flat[a:b]), host.segment(i), CopyKind.H2D)
            for i, (a, b) in enumerate(host.ranges())
            if b > a
        ]
        return gather(*completions)

    def host_view(self, layout: FlatLayout, start: int, stop: int) -> torch.Tensor | None:
        """A view of the pinned buffer (no copy)."""
        host = self._held.get(layout.key)
        return None if host is None else host.view(start, stop)

    def host_bytes(self) -> int:
        """Bytes of the buffers this backend holds."""
        return sum(h.nbytes for h in self._held.values())

    def discard(self, layout: FlatLayout) -> None:
        """Unpin and drop the layout's buffer."""
        if self._held.pop(layout.key, None) is not None:
            self.pool.free(layout.key)

    def close(self) -> None:
        """Drop every buffer."""
        for key in list(self._held):
            self._held.pop(key)
            self.pool.free(key)


__all__ = [
    "LayoutSource",
    "LocalBackend",
    "StoreBackend",
]
