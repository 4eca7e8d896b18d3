"""The ``local_dedup`` backend: replicated state costs host memory once per replica group.

Theory of operation
-------------------
The store groups tensors into flat layouts keyed by (category, dtype,
placement key); for this backend the placement key is the entry's
:class:`~refimpl.store.replica.ReplicaGroup` (``None`` for the ``local`` path,
see :mod:`refimpl.store.replica`). For a layout of ``numel`` elements whose
group has N members, member ``i`` owns the balanced slice
``[i*chunk, min((i+1)*chunk, numel))`` with ``chunk = ceil(numel/N)`` rounded up
to ``align_bytes`` (:class:`~refimpl.store.backends.dedup_config.MemberSlice`). Everything past ``numel`` is padding.

* Offload: each member copies only the elements of its slice into a host
  buffer of exactly that many elements (pinned once, reused every cycle), so
  host bytes per rank are at most ``ceil(bytes/N)`` plus alignment.
* Reload: the flat device buffer holds ``N*chunk`` elements (the store asks
  :meth:`DedupBackend.padded_numel`); each member copies its host slice (H2D)
  into its own chunk, then one in-place ``all_gather_into_tensor`` per layout,
  i.e. per (category, dtype, group), rebuilds the other chunks. Bytes come
  back bitwise.
* Groups: :func:`~refimpl.store.replica_sync.agree_on_groups` tells every rank
  every other rank's groups, and every rank creates the union in one sorted
  order (torch requires all ranks to create every group). Layouts are
  processed in sorted key order, one global order, so no two ranks wait on
  each other's groups in opposite orders.
* Layout agreement (always): before anything moves, each member's layout
  signature for each group is compared over the group; a mismatch means the
  replica inference is wrong and the all-gather would splice unrelated
  bytes, so the offload is refused.
* Content check (``verify_replicas``, on by default): when a layout is first
  deduplicated and whenever it changes (a new layout object), each replicated
  tensor's bytes are hashed on the device
  (:func:`~refimpl.store.replica_sync.content_digest`) and compared over the
  group the same way; in debug mode (or with ``verify_replicas=True``) at every
  offload; ``verify_replicas=False`` turns it off. A wrong inference would
  otherwise silently overwrite one rank's weights with another's on reload.
  Whether a group checks is agreed inside the layout-signature collective (a
  flag reduced with MAX), so members never disagree on running the check.
* A reload that some member does not join fails on the members that did (the
  group's timeout, ``DedupConfig.timeout_s``) with the state still in host
  memory; the failed member tears its group down, and the next reload on every
  rank rebuilds it (a member whose collective fails because a peer tore the
  group down rebuilds it and retries once) and brings the state back.
* Either check ends in one ``all_reduce(MAX)`` of a failure code over
  ``world``, so every rank raises together (nothing has moved yet) instead of
  some ranks waiting in collectives the others never join.
"""
from __future__ import annotations

import logging
import math
import weakref
from typing import Any, Awaitable, Hashable, NamedTuple, Sequence

import torch

from refimpl.runtime.base import (
    WORLD, CollectiveFailedError, CollectiveTimeoutError, Completion, CopyKind, ReduceOp, Runtime, gather,
)
from refimpl.store.backends.base import LayoutSource, StoreBackend
from refimpl.store.backends.dedup_config import (
    DedupConfig, DedupError, LayoutMismatchError, MemberSlice, ReplicaMismatchError, ReplicaShare, SlicePlan,
)
from refimpl.store.backends.local import LocalBackend
from refimpl.store.config import StoreConfig
from refimpl.store.layout import FlatLayout, LayoutKey, StorageEntry
from refimpl.store.pool import HostBuffer, PinnedHostPool
from refimpl.store.replica import ReplicaGroup
from refimpl.store.parking import DEBUG_ENV, debug_mode, own_view
from refimpl.store.replica_sync import (
    agree_on_groups, content_digest, ensure_groups, layout_signature, members_agree, members_agree_any,
    release_digest_weights,
)

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- the backend

_LAYOUT_MISMATCH, _CONTENT_MISMATCH = 1, 2


class SegmentCopy(NamedTuple):
    """An H2D copy of one host segment of this rank's slice, in flight."""

    #: the segment's first element in the chunk
    start: int
    completion: Completion


class DedupBackend(StoreBackend):
    """``local_dedup``: replicated layouts are kept 1/N per member and all-gathered on reload.

    Layouts without a replica group (placement key ``None``) take the
    ``local`` path through a :class:`LocalBackend`. Options: ``dedup=`` a
    :class:`DedupConfig`, or its fields as keywords
    (``OffloadStore(rt, backend="local_dedup", policy=ReplicaPolicy(dp_ranks=...))``).
    """

    name = "local_dedup"

    def __init__(
        self, runtime: Runtime, pool: PinnedHostPool, config: StoreConfig, *, dedup: DedupConfig | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(runtime, pool, config)
        if dedup is not None and fields:
            raise ValueError(f"pass either dedup=DedupConfig(...) or its fields, not both (got {sorted(fields)})")
        self.dedup = dedup if dedup is not None else DedupConfig(**fields)
        self._local = LocalBackend(runtime, pool, config)
        self._held: dict[LayoutKey, HostBuffer | None] = {}
        self._slices: dict[LayoutKey, MemberSlice] = {}
        self._layout_bytes: dict[LayoutKey, int] = {}
        self._groups: list[ReplicaGroup] = []  # agreed and created, sorted; identical on every rank
        self._signatures: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._declared = frozenset(self.dedup.groups or ())
        #: offloads whose replicated tensors were hash-checked (verify_replicas)
        self.verified_offloads = 0
        #: seconds the last offload spent on the content check (digests and their comparison), 0 if none ran
        self.last_verify_s = 0.0
        self._verified: weakref.WeakSet = weakref.WeakSet()  # layout objects whose content was checked

    # ---- layout keys --------------------------------------------------------

    def placement_key(self, entry: StorageEntry) -> Hashable | None:
        """The entry's replica group (``None``, the local path, for groups of one rank)."""
        tensor = entry.dtensor
        if tensor is None and entry.refs:
            tensor = entry.refs[0].live()
        group = self.dedup.policy.resolve(tensor, self.rt.rank, name=entry.name, category=entry.kind)
        if group is None or group.trivial:
            return None
        declared = self.dedup.groups
        if declared is not None and group not in self._declared:
            raise DedupError(
                f"{entry.name}: resolved replica group {group.ranks} is not among DedupConfig.groups "
                f"{[g.ranks for g in declared]}; declare every group of the job, or leave groups=None"
            )
        return group

    def _balanced_slice(self, key: LayoutKey, numel: int) -> MemberSlice:
        group: ReplicaGroup = key.placement  # type: ignore[assignment]
        return MemberSlice.balanced(numel, group.size, group.index_of(self.rt.rank), itemsize=key.dtype.itemsize,
                                  align_bytes=self.dedup.align_bytes)

    def _layout_slice(self, layout: FlatLayout) -> MemberSlice:
        """The slice of a padded layout: chunks of ``numel / N``; real data ends at ``data_numel``."""
        group: ReplicaGroup = layout.key.placement  # type: ignore[assignment]
        if layout.numel % group.size or layout.numel < self._balanced_slice(layout.key, layout.data_numel).padded_numel:
            raise DedupError(f"layout {layout.key.label()} has {layout.numel} elements, not padded for a group "
                             f"of {group.size}; the store must apply StoreBackend.padded_numel")
        return MemberSlice(layout.data_numel, group.size, group.index_of(self.rt.rank), layout.numel // group.size)

    def padded_numel(self, key: LayoutKey, numel: int) -> int:
        """Replicated layouts grow to ``N * chunk`` elements so the all-gather fills them exactly."""
        if not isinstance(key.placement, ReplicaGroup):
            return numel
        return self._balanced_slice(key, numel).padded_numel

    # ---- offload ------------------------------------------------------------

    async def prepare(self, layouts: Sequence[FlatLayout]) -> None:
        """Create replica groups, then check layouts (and, with ``verify``, contents) agree per group."""
        grouped = [lay for lay in layouts if isinstance(lay.key.placement, ReplicaGroup)]
        await self._ensure_groups({lay.key.placement for lay in grouped})
        await self._check(grouped)

    async def _ensure_groups(self, mine: set) -> None:
        rt = self.rt
        if self.dedup.groups is not None:
            wanted = list(self.dedup.groups)
        else:
            new = [g for g in mine if g not in self._groups]
            if rt.device.type == "meta":
                raise DedupError(
                    "local_dedup on a runtime whose collectives move no data (meta payloads) cannot exchange "
                    "replica groups between ranks; declare them with DedupConfig(groups=...) "
                    "(e.g. MeshTopology.groups_over(['ddp']))"
                )
            found = await agree_on_groups(rt, new)
            wanted = sorted(set(self._groups) | set(found))
        if wanted != self._groups:
            await ensure_groups(rt, [g for g in wanted if g not in self._groups], backend=self.dedup.group_backend,
                                ranks_per_host=self.dedup.ranks_per_host(), timeout_s=self.dedup.timeout_s)
            self._groups = wanted
            log.info("rank %d: local_dedup replica groups %s", rt.rank, [str(g) for g in wanted])

    async def _check(self, grouped: Sequence[FlatLayout]) -> None:
        """Per member group: layout signatures (always) and content hashes (``verify``) agree; else raise."""
        rt = self.rt
        by_group: dict[ReplicaGroup, list[FlatLayout]] = {}
        for lay in grouped:
            by_group.setdefault(lay.key.placement, []).append(lay)  # type: ignore[arg-type]
        problems: list[str] = []
        code = 0
        every, changed = self.dedup.verify, self.dedup.verify_changed
        verified = False
        self.last_verify_s = 0.0
        for g in self._groups:  # every member takes part, with or without layouts of its own
            if rt.rank not in g.ranks:
                continue
            lays = by_group.get(g, [])
            need = every or (changed and any(lay not in self._verified for lay in lays))
            sig = torch.tensor(layout_signature(lays, self._signatures), dtype=torch.int64)
            same, anyone = await members_agree_any(rt, sig, need, g.name)
            if same is False:
                code = max(code, _LAYOUT_MISMATCH)
                problems.append(
                    f"replica group {g}: members laid out different tensors ({sum(len(x.entries) for x in lays)} "
                    f"storages in {[x.key.label() for x in lays]} here). The replica inference is wrong for this "
                    f"model; fix the layout or set an override (ReplicaPolicy(overrides=...))"
                )
                continue
            entries = [e for x in lays for e in x.entries]
            if anyone and entries:  # equal signatures: every member has as many entries
                t0 = rt.now()
                digests = content_digest([e.base for e in entries], device=rt.device)
                equal = await members_agree(rt, digests, g.name, elementwise=True)
                self.last_verify_s += rt.now() - t0
                verified = True
                if equal is not None and not all(equal):
                    bad = [entries[i // 2].name for i, ok in enumerate(equal) if not ok][:5]
                    code = max(code, _CONTENT_MISMATCH)
                    problems.append(f"replica group {g}: tensors {sorted(set(bad))} differ between members")
                    continue
                self._verified.update(lays)
        if verified:
            self.verified_offloads += 1
            release_digest_weights()  # their device memory goes back with the state's
        await self._raise_together(code, problems)

    async def _raise_together(self, code: int, problems: list[str]) -> None:
        """One ``all_reduce(MAX)`` of the failure code over ``world``: every rank raises, or none."""
        rt = self.rt
        flag = rt.alloc_device(1, torch.int64, tag="dedup.flag")
        flag.fill_(code)
        await rt.all_reduce(flag, ReduceOp.MAX, WORLD)
        worst = 0 if rt.device.type == "meta" else int(flag.item())
        if worst:
            err = LayoutMismatchError if worst == _LAYOUT_MISMATCH else ReplicaMismatchError
            detail = "; ".join(problems) if problems else "a replica group of other ranks failed the check"
            raise err(f"rank {rt.rank}: local_dedup refused to offload (nothing moved): {detail}. A wrong replica "
                      f"inference would overwrite one rank's state with another's on reload.")

    async def offload(self, layout: FlatLayout, source: LayoutSource) -> Awaitable[None]:
        """Copy this rank's slice of a replicated layout (the whole layout on the local path)."""
        key = layout.key
        if not isinstance(key.placement, ReplicaGroup):
            return await self._local.offload(layout, source)
        part = self._layout_slice(layout)
        self._slices[key] = part
        self._layout_bytes[key] = layout.data_nbytes
        if part.valid == 0:
            self._drop(key)
            self._held[key] = None
            return gather()
        host = self.pool.acquire(key, layout.dtype, self._segments(part.valid, layout.dtype))
        self._held[key] = host
        try:
            completions = await source.copy_to_host(host, part.start, part.stop)
        except BaseException:
            if getattr(host, "failed", False):  # a buffer that failed to pin is not kept
                self._held.pop(key, None)
                self.pool.free(key)
            raise
        return gather(*completions)

    def reserve(self, layout: FlatLayout) -> None:
        """Pin the host memory the layout's next offload needs (this rank's slice only)."""
        if not isinstance(layout.key.placement, ReplicaGroup):
            self._local.reserve(layout)
            return
        part = self._layout_slice(layout)
        if part.valid:
            self._held[layout.key] = self.pool.acquire(layout.key, layout.dtype,
                                                       self._segments(part.valid, layout.dtype))

    def _segments(self, numel: int, dtype: torch.dtype) -> tuple[int, ...]:
        step = max(1, self.config.segment_bytes // dtype.itemsize)
        return tuple(min(step, numel - a) for a in range(0, numel, step))

    # ---- reload -------------------------------------------------------------

    async def reload(self, layout: FlatLayout, device_flat: torch.Tensor) -> Awaitable[None]:
        """H2D of this rank's slice into its chunk, then one in-place all-gather over the group."""
        key = layout.key
        await self._revive_groups()
        if not isinstance(key.placement, ReplicaGroup):
            return await self._local.reload(layout, device_flat)
        part = self._slices.get(key)
        if part is None or key not in self._held:
            raise DedupError(f"local_dedup holds no slice of layout {key.label()}; it was never offloaded here")
        if device_flat.numel() != part.padded_numel:
            raise DedupError(f"layout {key.label()}: device buffer has {device_flat.numel()} elements, the "
                             f"all-gather needs {part.padded_numel} (padded_numel was not applied)")
        lo = part.index * part.chunk
        mine = own_view(device_flat[lo:lo + part.chunk])
        host = self._held[key]
        completions: list[SegmentCopy] = []
        if host is not None:
            completions = [SegmentCopy(a, self.rt.copy_async(mine[a:b], host.segment(i), CopyKind.H2D))
                           for i, (a, b) in enumerate(host.ranges()) if b > a]
        if part.valid < part.chunk:
            mine[part.valid:].zero_()
        return self._gather(completions, device_flat, part, key.placement)

    def _piece_numel(self, part: MemberSlice, dtype: torch.dtype) -> int:
        """Elements of each rank's chunk all-gathered at once: the staging buffer (N pieces) is at most
        ``segment_bytes``; a chunk that fits in one piece is gathered in place, as one collective."""
        align = math.lcm(self.dedup.align_bytes, dtype.itemsize) // dtype.itemsize
        piece = max(align, self.config.segment_bytes // dtype.itemsize // part.group_size // align * align)
        return min(part.chunk, piece)

    async def _gather(self, completions: list[SegmentCopy], device_flat: torch.Tensor, part: MemberSlice,
                      group: ReplicaGroup) -> None:
        """Rebuild the other members' chunks, piece by piece as this rank's H2D lands.

        [Note: pipelined reload] One all-gather of the whole chunk waits for the
        whole H2D, so the reload costs H2D + all-gather. Pieces of the chunk (the
        same boundaries on every member, so every rank issues the same
        collectives) are all-gathered into a staging buffer as soon as the H2D
        segments under them have landed, and copied into place on the device:
        the all-gather of piece k runs over NVLink while the H2D of piece k+1
        uses PCIe, so the reload costs about the H2D plus one piece's
        all-gather. A chunk of one piece is gathered in place, as before.
        """
        rt, n, chunk = self.rt, part.group_size, part.chunk
        mine = own_view(device_flat[part.index * chunk:(part.index + 1) * chunk])
        piece = self._piece_numel(part, device_flat.dtype)
        pending = list(completions)

        async def landed(upto: int) -> None:
            """Wait for every H2D segment that starts before element ``upto`` of the chunk."""
            with rt.span("dedup.h2d"):
                while pending and pending[0].start < upto:
                    await pending.pop(0).completion

        if piece >= chunk:
            await landed(chunk)
            await rt.point("dedup.reload.all_gather")
            with rt.span("dedup.all_gather"):
                await self._all_gather(device_flat, mine, group)
            return
        stage = rt.alloc_device(n * piece, device_flat.dtype, tag="dedup.gather_stage")
        try:
            for a in range(0, chunk, piece):
                b = min(a + piece, chunk)
                await landed(b)
                await rt.point("dedup.reload.all_gather")
                k = b - a
                with rt.span("dedup.all_gather"):
                    await self._all_gather(stage[:n * k], mine[a:b], group)
                    for r in range(n):
                        if r != part.index:
                            device_flat[r * chunk + a:r * chunk + b].copy_(stage[r * k:(r + 1) * k])
        finally:
            await _drain_all(pending)
            rt.release(stage)

    async def _all_gather(self, out: torch.Tensor, inp: torch.Tensor, group: ReplicaGroup) -> None:
        """The reload's all-gather; a failure tears the group down (see the module docstring)."""
        try:
            await self.rt.all_gather_into_tensor(out, inp, group.name)
        except CollectiveTimeoutError:
            await self._tear_down(group, "timed out (did every member call reload?)")
            raise
        except CollectiveFailedError as e:
            # a peer tore the group down after its own failed reload: rebuild (it rebuilds too) and retry once
            await self._tear_down(group, f"failed ({e})")
            await self.rt.recreate_group(group.name)
            await self.rt.all_gather_into_tensor(out, inp, group.name)

    async def _tear_down(self, group: ReplicaGroup, why: str) -> None:
        """Destroy a replica group whose collective failed; the next reload on every rank rebuilds it."""
        log.warning("rank %d: reload all-gather over replica group %s %s; the state stays in host memory and the "
                    "group is torn down: call reload on every rank to rebuild it and retry", self.rt.rank, group, why)
        if self.rt.group_live(group.name):
            await self.rt.destroy_group(group.name, abort=True)

    async def _revive_groups(self) -> None:
        """Recreate agreed replica groups someone destroyed (all ranks, sorted order)."""
        for g in self._groups:
            if not self.rt.group_live(g.name):
                await self.rt.recreate_group(g.name)

    # ---- host memory --------------------------------------------------------

    def host_view(self, layout: FlatLayout, start: int, stop: int) -> torch.Tensor | None:
        """Local layouts: a view of the pinned buffer. Replicated ones: None (only a slice is here)."""
        if isinstance(layout.key.placement, ReplicaGroup):
            return None
        return self._local.host_view(layout, start, stop)

    def host_bytes(self) -> int:
        """Bytes of every host buffer held (local layouts whole, replicated ones as slices)."""
        return self._local.host_bytes() + sum(h.nbytes for h in self._held.values() if h is not None)

    def shares(self) -> list[ReplicaShare]:
        """Per replicated layout: its bytes and the bytes kept on this rank (about 1/N)."""
        out = []
        for key in sorted(self._held, key=LayoutKey.sort_key):
            h = self._held[key]
            out.append(ReplicaShare(key.placement, key.label(), self._layout_bytes.get(key, 0),
                                    0 if h is None else h.nbytes))
        return out

    def _drop(self, key: LayoutKey) -> None:
        if self._held.pop(key, None) is not None:
            self.pool.free(key)

    def discard(self, layout: FlatLayout) -> None:
        """Forget the layout's host copy."""
        if isinstance(layout.key.placement, ReplicaGroup):
            self._drop(layout.key)
            self._slices.pop(layout.key, None)
        else:
            self._local.discard(layout)

    def close(self) -> None:
        """Free every host buffer."""
        for key in list(self._held):
            self._drop(key)
        self._local.close()


async def _drain_all(pending: list[SegmentCopy]) -> None:
    """Await H2D copies still in flight (after a failed gather) so their buffers are not freed under them."""
    while pending:
        try:
            await pending.pop(0).completion
        except BaseException as e:  # noqa: BLE001 - the gather's own error is the one raised
            log.error("an H2D copy of a failed local_dedup reload also failed: %s", e)


__all__ = [
    "DEBUG_ENV",
    "DedupBackend",
    "DedupConfig",
    "DedupError",
    "LayoutMismatchError",
    "MemberSlice",
    "ReplicaMismatchError",
    "ReplicaShare",
    "SlicePlan",
    "debug_mode",
]
