"""The ``local_dedup`` backend: replicated state costs host memory once per replica group.

Theory of operation
-------------------
The store groups tensors into flat layouts keyed by (category, dtype,
placement key); for this backend the placement key is the entry's
:class:`~refimpl.store.backends.replica.ReplicaGroup` (``None`` for the ``local`` path,
see :mod:`refimpl.store.backends.replica`). For a layout of ``numel`` elements whose
group has N members, member ``i`` owns the balanced slice
``[i*chunk, min((i+1)*chunk, numel))`` with ``chunk = ceil(numel/N)`` rounded up
to ``align_bytes`` (:class:`~refimpl.store.backends.dedup_config.MemberSlice`). Everything past ``numel`` is padding.

* Offload: each member copies only the elements of its slice into a host
  buffer of exactly that many elements (pinned once, reused every cycle), so
  host bytes per rank are at most ``ceil(bytes/N)`` plus alignment.
* Reload: the flat device buffer holds ``N*chunk`` elements (the store asks
  :meth:`DedupBackend.padded_numel`); each member copies its host slice (H2D)
  into its own chunk, then all-gathers per layout, i.e. per (category, dtype,
  group), rebuild the other chunks, piece by piece as the H2D lands
  (:mod:`refimpl.store.backends.dedup_gather`). Bytes come back bitwise.
  Layouts without a group take the local path: no collective at all.
* Groups: :func:`~refimpl.store.backends.replica_sync.agree_on_groups` tells every rank
  every other rank's groups, and every rank creates the union in one sorted
  order (torch requires all ranks to create every group). Layouts are
  processed in sorted key order, one global order, so no two ranks wait on
  each other's groups in opposite orders.
* Outcomes: every offload and reload ends the same way on every rank, settled
  by votes among all ranks (``offload.begin`` / ``offload.commit``,
  ``reload.begin`` / ``reload.commit``; [Note: the outcome votes] in
  :mod:`refimpl.store.backends.dedup_outcome`). A failure on one rank after the
  replica checks rolls the offload back on every rank; a rank that does not
  take part is named in every rank's error within ``DedupConfig.timeout_s``.
  The first vote of an operation also says which groups some rank saw
  destroyed (a lifecycle's teardown, a failed all-gather), and every rank
  rebuilds those, in one order.
* Layout agreement (always): each member's layout signature for each group is
  compared over the group; a mismatch means the replica inference is wrong and
  the all-gather would splice unrelated bytes, so the offload is refused.
* Content check (``verify_replicas``, on by default): when a layout is first
  deduplicated and whenever it changes (a new layout object), each replicated
  tensor's bytes are hashed on the device
  (:func:`~refimpl.store.backends.replica_sync.content_digest`) and compared over the
  group the same way; in debug mode (or with ``verify_replicas=True``) at every
  offload; ``verify_replicas=False`` turns it off. A wrong inference would
  otherwise silently overwrite one rank's weights with another's on reload.
  Whether a group checks is agreed inside the layout-signature collective (a
  flag reduced with MAX), so members never disagree on running the check.
  Either check's result is cast at ``offload.commit``, so every rank refuses
  together, before any device memory is released.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Awaitable, Hashable, Sequence

import torch

from refimpl.runtime.base import CollectiveTimeoutError, CopyKind, Runtime, gather
from refimpl.store.backends.base import LayoutSource, StoreBackend
from refimpl.store.backends.dedup_config import DedupConfig, DedupError, MemberSlice, ReplicaShare
from refimpl.store.backends.dedup_gather import SegmentCopy, SliceGather
from refimpl.store.backends.dedup_outcome import Code, OutcomeVotes, Stage, peer_error
from refimpl.store.backends.local import LocalBackend
from refimpl.store.backends.pool import HostBuffer, PinnedHostPool
from refimpl.store.backends.replica import ReplicaGroup
from refimpl.store.config import CATEGORY_ORDER, Category, StoreConfig
from refimpl.store.state.layout import FlatLayout, LayoutKey, StorageEntry
from refimpl.store.state.storage_views import own_view
from refimpl.store.backends.replica_sync import (
    agree_on_groups, content_digest, ensure_groups, layout_signature, members_agree, members_agree_any,
    release_digest_weights,
)

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- the backend

_NEW_GROUPS = 0  # offload.begin mark: this rank found replica groups not agreed yet (group i destroyed: i + 1)
_NCAT = len(CATEGORY_ORDER)  # offload.commit marks: group i holds category c -> i * _NCAT + c


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
        # [Note: the outcome votes] in dedup_outcome
        self._votes = OutcomeVotes(runtime, self.dedup.timeout_s)
        self._gather = SliceGather(runtime, config, self.dedup)
        self._stage = Stage.IDLE
        self._checked: tuple[Code, list[str]] = (Code.OK, [])  # this offload's replica checks: worst code, problems
        self._prepared: list[FlatLayout] = []
        self._group_cats: dict[ReplicaGroup, int] = {}  # agreed: categories each group held at an offload, as bits

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
        """Vote ``offload.begin``, rebuild or create the replica groups it calls for, then check that layouts (and,
        with ``verify``, contents) agree per group; the checks' result is cast at ``offload.commit``."""
        grouped = [lay for lay in layouts if isinstance(lay.key.placement, ReplicaGroup)]
        mine = {lay.key.placement for lay in grouped}
        new = self.dedup.groups is None and any(g not in self._groups for g in mine)
        destroyed = {1 + i for i, g in enumerate(self._groups) if not self.rt.group_live(g.name)}
        verdict = await self._votes.begin("offload.begin", 0, ({_NEW_GROUPS} if new else set()) | destroyed)
        if not verdict.agreed:
            self._stage = Stage.SETTLED
            self._votes.raise_unless_agreed(verdict, "offload")
        self._stage = Stage.BEGUN
        await self._rebuild(sorted(m - 1 for m in verdict.marks if m > _NEW_GROUPS))
        await self._ensure_groups(mine, _NEW_GROUPS in verdict.marks)
        self._prepared = grouped
        self._checked = await self._check(grouped)

    async def _rebuild(self, indices: Sequence[int]) -> None:
        """Recreate the agreed groups ``indices`` on every rank, in order (a live one is torn down first: some rank
        saw it destroyed, so it is broken for the group)."""
        for i in indices:
            g = self._groups[i]
            if self.rt.group_live(g.name):
                await self.rt.destroy_group(g.name, abort=True)
            await self.rt.recreate_group(g.name)
            log.info("rank %d: local_dedup rebuilt replica group %s", self.rt.rank, g)

    async def _ensure_groups(self, mine: set, exchange: bool) -> None:
        """Create the declared groups, or (``exchange``: some rank found new ones) every rank's union of them."""
        rt = self.rt
        if self.dedup.groups is not None:
            wanted = list(self.dedup.groups)
        elif not exchange:
            return
        else:
            if rt.device.type == "meta":
                raise DedupError(
                    "local_dedup on a runtime whose collectives move no data (meta payloads) cannot exchange "
                    "replica groups between ranks; declare them with DedupConfig(groups=...) "
                    "(e.g. MeshTopology.groups_over(['ddp']))"
                )
            found = await agree_on_groups(rt, [g for g in mine if g not in self._groups])
            wanted = sorted(set(self._groups) | set(found))
        if wanted != self._groups:
            await ensure_groups(rt, [g for g in wanted if g not in self._groups], backend=self.dedup.group_backend,
                                ranks_per_host=self.dedup.ranks_per_host(), timeout_s=self.dedup.timeout_s)
            self._groups = wanted
            log.info("rank %d: local_dedup replica groups %s", rt.rank, [str(g) for g in wanted])

    async def _check(self, grouped: Sequence[FlatLayout]) -> tuple[Code, list[str]]:
        """Per member group: layout signatures (always) and content hashes (``verify``) compared; the worst code."""
        rt = self.rt
        by_group: dict[ReplicaGroup, list[FlatLayout]] = {}
        for lay in grouped:
            by_group.setdefault(lay.key.placement, []).append(lay)  # type: ignore[arg-type]
        problems: list[str] = []
        code = Code.OK
        every, changed = self.dedup.verify, self.dedup.verify_changed
        verified = False
        self.last_verify_s = 0.0
        for g in self._groups:  # every member takes part, with or without layouts of its own
            if rt.rank not in g.ranks:
                continue
            lays = by_group.get(g, [])
            need = every or (changed and any(lay not in self._verified for lay in lays))
            sig = torch.tensor(layout_signature(lays, self._signatures), dtype=torch.int64)
            rt.mark_arrival(g.name, "offload.check")
            try:
                same, anyone = await members_agree_any(rt, sig, need, g.name)
            except CollectiveTimeoutError as e:
                raise peer_error(rt, g.name, "offload.check", e) from e
            if same is False:
                code = max(code, Code.LAYOUT_MISMATCH)
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
                    code = max(code, Code.CONTENT_MISMATCH)
                    problems.append(f"replica group {g}: tensors {sorted(set(bad))} differ between members")
                    continue
                self._verified.update(lays)
        if verified:
            self.verified_offloads += 1
            release_digest_weights()  # their device memory goes back with the state's
        return code, problems

    async def _settle_stage(self, op: str, error: BaseException | None, hint: str) -> bool:
        """The common head of :meth:`settle_offload` and :meth:`settle_reload`: the stage back to idle; on ``error``
        this rank's failure cast at the vote the operation stopped before (unless a vote already settled it) and
        False; True when the operation began and may vote its commit; a settle without a begin raises."""
        stage, self._stage = self._stage, Stage.IDLE
        if error is not None:
            if stage is not Stage.SETTLED:
                begun = stage is Stage.BEGUN
                await self._votes.cast_failure(f"{op}.commit" if begun else f"{op}.begin", error, begun=begun)
            return False
        if stage is not Stage.BEGUN:
            raise DedupError(f"rank {self.rt.rank}: local_dedup {op} settled without its {op}.begin vote "
                             f"(stage {stage.value}); {hint}")
        return True

    async def settle_offload(self, error: BaseException | None) -> None:
        """Vote ``offload.commit`` (or cast this rank's failure where the offload stopped); raise unless every rank
        committed. See [Note: the outcome votes]."""
        if not await self._settle_stage("offload", error, "the store must call prepare before settle_offload"):
            return
        code, problems = self._checked
        marks = {self._groups.index(lay.key.placement) * _NCAT + CATEGORY_ORDER[lay.category]
                 for lay in self._prepared}
        verdict = await self._votes.commit("offload.commit", code, marks)
        if not verdict.agreed:
            self._votes.raise_unless_agreed(verdict, "offload", problems)
        for m in verdict.marks:
            g = self._groups[m // _NCAT]
            self._group_cats[g] = self._group_cats.get(g, 0) | 1 << (m % _NCAT)

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

    def needs_peers(self, layout: FlatLayout) -> bool:
        """Replicated layouts: only a slice is here, the rest comes from the members."""
        return isinstance(layout.key.placement, ReplicaGroup)

    def agrees_on_reload(self, cats: frozenset[Category]) -> bool:
        """True with other ranks and something offloaded: every reload's outcome is agreed, also one of rank-local
        layouts only (it runs no collective and rebuilds no group, but its ranks end alike). Alone, without peers:
        ``reload(local_only=True)``."""
        return bool(cats) and self.rt.world_size > 1

    def _groups_for(self, cats: frozenset[Category]) -> list[int]:
        """Indices of the agreed groups that held layouts of ``cats`` on some rank."""
        mask = sum(1 << CATEGORY_ORDER[c] for c in cats)
        return [i for i, g in enumerate(self._groups) if self._group_cats.get(g, 0) & mask]

    async def prepare_reload(self, cats: frozenset[Category], layouts: Sequence[FlatLayout]) -> None:
        """Vote ``reload.begin``; rebuild the groups of ``cats`` that any rank sees destroyed (on every rank)."""
        need = self._groups_for(cats)
        destroyed = {i for i in need if not self.rt.group_live(self._groups[i].name)}
        verdict = await self._votes.begin("reload.begin", 0, destroyed)
        if not verdict.agreed:
            self._stage = Stage.SETTLED
            self._votes.raise_unless_agreed(verdict, "reload")
        self._stage = Stage.BEGUN
        await self._rebuild(sorted(verdict.marks))

    async def settle_reload(self, cats: frozenset[Category], error: BaseException | None) -> None:
        """Vote ``reload.commit`` (or cast this rank's failure); raise unless every rank's reload completed."""
        if not await self._settle_stage("reload", error, "the store must call prepare_reload first"):
            return
        verdict = await self._votes.commit("reload.commit")
        if not verdict.agreed:
            self._votes.raise_unless_agreed(verdict, "reload")

    async def reload(self, layout: FlatLayout, device_flat: torch.Tensor) -> Awaitable[None]:
        """Local layouts: the local path (no collective). Replicated ones: the H2D of this rank's slice into its
        chunk, then the all-gathers over the group (:class:`~refimpl.store.backends.dedup_gather.SliceGather`)."""
        key = layout.key
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
        return self._gather.run(completions, device_flat, part, key.placement)

    # ---- host memory --------------------------------------------------------

    def host_view(self, layout: FlatLayout, start: int, stop: int) -> torch.Tensor | None:
        """Local layouts: a view of the pinned buffer. Replicated ones: None (only a slice is here)."""
        if isinstance(layout.key.placement, ReplicaGroup):
            return None
        return self._local.host_view(layout, start, stop)

    def host_slice(self, layout: FlatLayout) -> tuple[MemberSlice, torch.Tensor] | None:
        """This rank's part of an offloaded replicated layout: its slice and a copy of the slice's real elements
        (layout elements ``[slice.start, slice.stop)``), for checks; None for other layouts."""
        part, host = self._slices.get(layout.key), self._held.get(layout.key)
        if part is None or not isinstance(layout.key.placement, ReplicaGroup):
            return None
        if host is None:
            return part, torch.empty(0, dtype=layout.dtype)
        return part, torch.cat([host.segment(i).reshape(-1) for i in range(len(host.ranges()))])[:part.valid].clone()

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


__all__ = ["DedupBackend"]
