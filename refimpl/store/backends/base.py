"""The backend seam of the offload store: what a backend must implement, and what it may.

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
the same order on every rank (an offload's in ``LayoutKey.sort_key`` order, a
reload's in ``LayoutKey.reload_key`` order: a training step's first use, then
the sort key). A finisher must always be
awaited, also when the store is about to raise, so ranks never diverge.

The store releases device memory only after every finisher of an offload
has completed, and re-points tensors only after validation, so a backend error
loses nothing. The one exception is opt-in: a backend that sets
``release_as_copied`` promises that nothing but the copies it issued through
``source.copy_to_host`` reads the device data, and that by the time its
``offload`` returns all its host memory is allocated; the store may then
release each storage as soon as the copies carrying its bytes completed, while
later copies still run (the ``local`` backend does).

``prepare(layouts)`` runs once per offload after collection, with all layouts
to copy (sorted), before any of them is issued, for backends that need
collective setup. ``settle_offload(error)`` ends every offload exactly once
(``prepare_reload`` / ``settle_reload`` do the same for a reload), so a backend
whose ranks must end an operation the same way can agree on its outcome there
(``local_dedup``'s outcome votes, [Note: the outcome votes] in
:mod:`refimpl.store.backends.dedup_outcome`). A backend that sets ``copy_ahead`` (no collectives
in ``offload``) may see ``offload`` of an unchanged layout issued before
collection and ``prepare``; the store awaits and discards it if the layout
turns out to have changed.

The required interface is two coroutines, :meth:`StoreBackend.offload` and
:meth:`StoreBackend.reload`; every other method has a working default for a
rank-local backend. Streaming the first offload (:mod:`refimpl.store.moves.streaming`)
is an optional protocol, :class:`StreamingBackend`: a backend that implements
its four methods is streamed, any other is not, and nothing of it is part of
the required contract.

Backends are found by name in :mod:`refimpl.store.registry`
(:func:`~refimpl.store.registry.register_backend` ``(name, factory)`` with
``factory(runtime, pool, config, **options) -> StoreBackend``);
``OffloadStore(backend="local_dedup")`` imports :mod:`refimpl.store.backends.dedup` on
first use.
"""
from __future__ import annotations

import abc
import bisect
import logging
from typing import Awaitable, ClassVar, Hashable, Iterable, Iterator, NamedTuple, Protocol, Sequence, runtime_checkable

import torch

from refimpl.runtime.base import Completion, Runtime
from refimpl.store.backends.pool import HostBuffer, PinnedHostPool
from refimpl.store.config import Category, StoreConfig
from refimpl.store.state.layout import FlatLayout, LayoutKey, StorageEntry
from refimpl.store.state.storage_views import own_view

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

    Required: :attr:`name`, :meth:`offload` and :meth:`reload`. Optional, with
    defaults for a rank-local backend: the layout hooks (:meth:`placement_key`,
    :meth:`padded_numel`, :meth:`prepare`), host memory (:meth:`reserve`,
    :meth:`host_view`, :meth:`host_bytes`, :meth:`discard`, :meth:`close`), three
    capability flags the store may use to overlap work (``copy_ahead``,
    ``release_as_copied``, ``early_copies``; all off by default) and ``agrees_on_offload`` (off: how a failure
    in the release stage ends). Streaming is :class:`StreamingBackend`.
    """

    #: the name ``OffloadStore(backend=...)`` uses
    name: ClassVar[str] = ""
    #: True if :meth:`offload` of an unchanged resident layout may be issued before collection (and
    #: possibly discarded); only for backends whose offload runs no collective. See the store's note.
    copy_ahead: ClassVar[bool] = False
    #: True if :meth:`offload` reads device data only through ``source.copy_to_host`` and nothing in its
    #: finisher reads it again: the store may then release each storage as soon as its copies completed
    release_as_copied: ClassVar[bool] = False
    #: True if :meth:`copy_early` copies a resident layout's range into the host buffer the next offload uses
    #: and :meth:`offload_rest` copies the rest (see [Note: early copies] in :mod:`refimpl.store.moves.early`)
    early_copies: ClassVar[bool] = False
    #: True if :meth:`settle_offload` with no error commits the offload among ranks (its peers release their
    #: device memory next): a failure in the store's release stage then completes the offload on this rank instead
    #: of copying the state back (the store raises the error after). False: the offload is this rank's alone
    #: and a failure in the release stage is undone from the host copies (which :meth:`host_view` must give).
    agrees_on_offload: ClassVar[bool] = False

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

    async def settle_offload(self, error: BaseException | None) -> None:
        """Called exactly once per offload, on every rank: with ``error=None`` once every copy completed (before any
        device memory is released), with the error after a failure (the offload rolled back here).

        A backend whose ranks must end an offload the same way agrees here: on success it may raise (a peer
        failed; the store then rolls this rank back too); on failure it tells the peers and must not raise.
        The default (rank-local backends) does nothing.
        """

    async def prepare_reload(self, cats: frozenset[Category], layouts: Sequence[FlatLayout]) -> None:
        """Called once per reload of the categories ``cats`` (offloaded, the same on every rank) before any layout is
        issued, with this rank's layouts to reload (sorted; possibly none)."""

    async def settle_reload(self, cats: frozenset[Category], error: BaseException | None) -> None:
        """Called exactly once per reload, as :meth:`settle_offload` is per offload (``error=None``: every layout
        filled, before the reload is marked done; else the reload rolled back here)."""

    def needs_peers(self, layout: FlatLayout) -> bool:
        """Whether reloading ``layout`` takes other ranks (a slice kept here, the rest on peers). Default: no."""
        return False

    def agrees_on_reload(self, cats: frozenset[Category]) -> bool:
        """Whether a reload of ``cats`` involves other ranks on any rank (then every rank calls the reload hooks,
        also one holding no layout of ``cats``). Default: no."""
        return False

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

    async def reload_pieces(self, layout: FlatLayout, device_flat: torch.Tensor,
                            chunk_numel: int) -> list[Piece] | None:
        """Optional: issue the fill of ``device_flat`` as pieces of at most ``chunk_numel`` elements, each with
        its own completion, so a streamed reload can hand each tensor over as its piece lands (see
        :class:`refimpl.store.moves.reload.StreamedReload`). None (the default): not supported (a backend with
        collectives in its reload, or one that fills the buffer in one step); :meth:`reload` is used."""
        return None

    def piece_ranges(self, layout: FlatLayout, chunk_numel: int) -> list[tuple[int, int]] | None:
        """Optional, with :meth:`reload_piece`: the element ranges :meth:`reload_pieces` would cut ``layout`` into
        (ascending, none crossing a host segment), without issuing anything, so that a streamed reload can issue the
        pieces of all its layouts in the order their tensors are first used (``reload(use_order=...)``). None (the
        default): not supported; each layout's pieces are issued in offset order."""
        return None

    async def reload_piece(self, layout: FlatLayout, device_flat: torch.Tensor, start: int, stop: int) -> Piece:
        """With :meth:`piece_ranges`: issue the copy of one of its ranges into ``device_flat``."""
        raise NotImplementedError(f"{type(self).__name__} has no piece_ranges")

    async def copy_early(self, layout: FlatLayout, flat: torch.Tensor, start: int,
                         stop: int) -> list[Completion] | None:
        """Optional (``early_copies``): issue the copy of the resident layout's elements ``[start, stop)`` (one
        entry, inside one host segment) from its flat buffer ``flat`` into the host buffer the next offload of the
        layout fills; None where that buffer is not held (the offload copies the range then). Default: None."""
        return None

    async def offload_rest(self, layout: FlatLayout, source: LayoutSource,
                           done: list[tuple[int, int]]) -> Awaitable[None]:
        """Issue the copy of ``layout`` to host but for the element ranges ``done`` (copied early by
        :meth:`copy_early`, ascending); return an awaitable that completes it. Default: the whole layout."""
        return await self.offload(layout, source)

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


class Piece(NamedTuple):
    """Layout elements ``[start, stop)`` of a reload and the completion of their copy."""

    start: int
    stop: int
    completion: Completion


@runtime_checkable
class StreamingBackend(Protocol):
    """Optional: a backend that can take the first offload streamed while collection goes on.

    A backend implementing these four methods (no padding, no collectives in
    ``offload``) gets its first offload of scattered state streamed (see [Note:
    why stream] in :mod:`refimpl.store.moves.streaming`); ``prepare`` is not called then.
    """

    def stream_begin(self, layout: FlatLayout) -> None:
        """``layout`` (still growing) is about to send its host segments."""

    def stream_reserve(self, layout: FlatLayout, numel: int) -> int:
        """The next host segment has ``numel`` elements; start allocating it, return its index."""

    async def stream_copy(self, layout: FlatLayout, source: LayoutSource, index: int, start: int,
                          stop: int) -> list[Completion]:
        """Issue the copies of layout range ``[start, stop)`` into segment ``index``."""

    def stream_end(self, layout: FlatLayout) -> None:
        """``layout`` is complete (all its segments reserved)."""


def streams(backend: StoreBackend) -> bool:
    """Whether ``backend`` implements :class:`StreamingBackend`."""
    return isinstance(backend, StreamingBackend)


def complement(ranges: list[tuple[int, int]], numel: int, cuts: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``[0, numel)`` not in ``ranges`` (ascending, disjoint), split at the host segments ``cuts``: what
    :meth:`StoreBackend.offload_rest` still copies after the ranges copied early."""
    gaps, at = [], 0
    for a, b in ranges:
        if a > at:
            gaps.append((at, a))
        at = max(at, b)
    if at < numel:
        gaps.append((at, numel))
    out = []
    for lo, hi in gaps:
        for a, b in cuts:
            x, y = max(lo, a), min(hi, b)
            if x < y:
                out.append((x, y))
    return out


__all__ = ["LayoutSource", "Piece", "StoreBackend", "StreamingBackend", "complement", "streams"]
