"""The reload's all-gathers of ``local_dedup``: the other members' chunks, rebuilt as this rank's H2D lands.

[Note: pipelined reload] One all-gather of the whole chunk waits for the whole
H2D, so the reload costs H2D + all-gather. Pieces of the chunk (the same
boundaries on every member, so every rank issues the same collectives) are
all-gathered into a staging buffer as soon as the H2D segments under them have
landed, and copied into place on the device: the all-gather of piece k runs
over NVLink while the H2D of piece k+1 uses PCIe, so the reload costs about the
H2D plus one piece's all-gather. A chunk of one piece is gathered in place.

[Note: a failure keeps the collectives in step] A failure of this rank's own
(an H2D copy, a fault at the point ``dedup.reload.all_gather``) does not stop
the all-gathers: the members would wait in a collective this rank never joins
until the groups' timeout. The gather goes on with whatever the chunk holds,
then raises the first such failure; the reload's ``reload.commit`` vote then
undoes the reload on every rank, so the bytes gathered are never used. A
collective that fails or times out tears the group down (the next operation's
first vote rebuilds it on every rank) and raises at once, naming the members
that never reached it.
"""
from __future__ import annotations

import logging
import math
from typing import NamedTuple

import torch

from refimpl.runtime.base import CollectiveFailedError, CollectiveTimeoutError, Completion, Runtime
from refimpl.store.backends.dedup_config import DedupConfig, MemberSlice
from refimpl.store.backends.dedup_outcome import peer_error
from refimpl.store.backends.replica import ReplicaGroup
from refimpl.store.config import StoreConfig
from refimpl.store.state.storage_views import own_view

log = logging.getLogger(__name__)

GATHER_POINT = "reload.gather"
"""Where members mark their arrival before a layout's first all-gather (named by a timeout's error)."""


class SegmentCopy(NamedTuple):
    """An H2D copy of one host segment of this rank's slice, in flight."""

    #: the segment's first element in the chunk
    start: int
    completion: Completion


class SliceGather:
    """The all-gathers that rebuild a replicated layout on reload (see the module notes)."""

    def __init__(self, rt: Runtime, config: StoreConfig, dedup: DedupConfig) -> None:
        self.rt, self.config, self.dedup = rt, config, dedup

    def piece_numel(self, part: MemberSlice, dtype: torch.dtype) -> int:
        """Elements of each rank's chunk all-gathered at once: the staging buffer (N pieces) is at most
        ``segment_bytes``; a chunk that fits in one piece is gathered in place, as one collective."""
        align = math.lcm(self.dedup.align_bytes, dtype.itemsize) // dtype.itemsize
        piece = max(align, self.config.segment_bytes // dtype.itemsize // part.group_size // align * align)
        return min(part.chunk, piece)

    async def run(self, completions: list[SegmentCopy], device_flat: torch.Tensor, part: MemberSlice,
                  group: ReplicaGroup) -> None:
        """Rebuild the other members' chunks of ``device_flat``, piece by piece as this rank's H2D lands."""
        rt, n, chunk = self.rt, part.group_size, part.chunk
        mine = own_view(device_flat[part.index * chunk:(part.index + 1) * chunk])
        piece = self.piece_numel(part, device_flat.dtype)
        pending = list(completions)
        failed: list[BaseException] = []

        async def own(step) -> None:
            """Await a step of this rank's own; remember a failure and go on (see the note)."""
            try:
                await step
            except Exception as e:  # noqa: BLE001 - raised after the all-gathers
                if not failed:
                    log.error("rank %d: local_dedup reload of a slice over %s failed here (%s); its all-gathers go on "
                              "so the members stay in step, and the reload is undone on every rank", rt.rank, group, e)
                failed.append(e)

        async def landed(upto: int) -> None:
            """Wait for every H2D segment that starts before element ``upto`` of the chunk."""
            with rt.span("dedup.h2d"):
                while pending and pending[0].start < upto:
                    await own(pending.pop(0).completion)

        stage = None if piece >= chunk else rt.alloc_device(n * piece, device_flat.dtype, tag="dedup.gather_stage")
        try:
            for a in range(0, chunk, piece):
                b = min(a + piece, chunk)
                await landed(b)
                await own(rt.point("dedup.reload.all_gather"))
                if a == 0:
                    rt.mark_arrival(group.name, GATHER_POINT)
                with rt.span("dedup.all_gather"):
                    if stage is None:
                        await self._all_gather(device_flat, mine, group)
                        continue
                    k = b - a
                    await self._all_gather(stage[:n * k], mine[a:b], group)
                    for r in range(n):
                        if r != part.index:
                            device_flat[r * chunk + a:r * chunk + b].copy_(stage[r * k:(r + 1) * k])
        finally:
            await _drain_all(pending)
            if stage is not None:
                rt.release(stage)
        if failed:
            raise failed[0]

    async def _all_gather(self, out: torch.Tensor, inp: torch.Tensor, group: ReplicaGroup) -> None:
        """One all-gather over the group; a failure tears the group down and raises (naming absent members)."""
        try:
            await self.rt.all_gather_into_tensor(out, inp, group.name)
        except (CollectiveTimeoutError, CollectiveFailedError) as e:
            log.warning("rank %d: reload all-gather over replica group %s failed (%s); the state stays in host "
                        "memory and the group is torn down: the next operation rebuilds it on every rank",
                        self.rt.rank, group, e)
            if self.rt.group_live(group.name):
                await self.rt.destroy_group(group.name, abort=True)
            err = peer_error(self.rt, group.name, GATHER_POINT, e)
            if err is e:
                raise
            raise err from e


async def _drain_all(pending: list[SegmentCopy]) -> None:
    """Await H2D copies still in flight (after a failed gather) so their buffers are not freed under them."""
    while pending:
        try:
            await pending.pop(0).completion
        except BaseException as e:  # noqa: BLE001 - the gather's own error is the one raised
            log.error("an H2D copy of a failed local_dedup reload also failed: %s", e)


__all__ = ["GATHER_POINT", "SegmentCopy", "SliceGather"]
