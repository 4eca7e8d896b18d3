"""DCP loads that read every element of their target exactly once: a plan with a gap or an overlap fails.

DCP plans a load from the checkpoint's metadata: for each target tensor (on a
rank: its local shard), the saved chunks that overlap it, each a read of one
box. It never checks that those boxes tile the target. If the metadata's chunk
offsets or sizes are wrong (a flipped bit, a file edited or mixed from two
saves), part of the target is read by no box and keeps whatever it held: with
the staged load of :func:`refimpl.torch_runtime.dcp.load_into`, the
uninitialised memory of the staging copy, loaded without error. Where chunks
overlap, two reads write the same elements.

:class:`CoveringLoadPlanner` is DCP's default load planner with one more step:
after it made this rank's plan, :func:`check_coverage` checks that the boxes
read into each target tensor lie inside it, do not overlap, and add up to all
of its elements. A plan that does not raises
:class:`~refimpl.store.CheckpointIntegrityError` naming the tensor. The check
runs in DCP's planning step, whose failures DCP sends to every rank, so every
rank's load fails before any rank reads a byte. Cost: a pass over the plan's
read items (one per saved chunk a target overlaps) and, per tensor, a pairwise
check of its boxes.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType

from refimpl.store.errors import CheckpointIntegrityError

Box = tuple[tuple[int, ...], tuple[int, ...]]


def local_shape(value: Any) -> tuple[int, ...] | None:
    """The shape of what this rank loads into ``value`` (a DTensor's local shard), or None for what DCP loads
    as bytes or as a tensor type this check does not know (a legacy ``ShardedTensor``)."""
    if not isinstance(value, torch.Tensor) or hasattr(value, "local_shards"):
        return None
    mesh = getattr(value, "device_mesh", None)
    if mesh is not None and mesh.get_coordinate() is None:
        return None  # this rank is outside the DTensor's mesh: DCP reads nothing into it
    return tuple(getattr(value, "_local_tensor", value).shape)


def _overlap(a: Box, b: Box) -> bool:
    return all(ao < bo + bl and bo < ao + al for ao, al, bo, bl in zip(a[0], a[1], b[0], b[1]))


def _problem(shape: Sequence[int], boxes: Sequence[Box]) -> str:
    """What is wrong with ``boxes`` as a tiling of a tensor of ``shape`` ('' when they tile it exactly)."""
    for offsets, lengths in boxes:
        if len(offsets) != len(shape) or any(o < 0 or n < 0 or o + n > s for o, n, s in zip(offsets, lengths, shape)):
            return f"a read of {list(lengths)} at {list(offsets)} lies outside its {list(shape)} elements"
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if math.prod(a[1]) and math.prod(b[1]) and _overlap(a, b):
                return f"the reads at {list(a[0])} and {list(b[0])} overlap"
    covered, total = sum(math.prod(n) for _, n in boxes), math.prod(shape)
    if covered != total:
        return f"the saved chunks cover {covered} of its {total} elements"
    return ""


def check_coverage(items: Iterable[Any], state_dict: Mapping[str, Any]) -> int:
    """Check that the read items of a DCP load plan tile every tensor of ``state_dict`` (flattened, as the
    planner holds it) exactly; returns how many tensors were checked. Raises
    :class:`CheckpointIntegrityError` naming the first tensor that is not."""
    boxes: dict[str, list[Box]] = {}
    for item in items:
        if item.type is not LoadItemType.BYTE_IO:
            boxes.setdefault(item.dest_index.fqn, []).append((tuple(item.dest_offsets), tuple(item.lengths)))
    checked = 0
    for fqn, value in state_dict.items():
        shape = local_shape(value)
        if shape is None:
            continue
        problem = _problem(shape, boxes.get(fqn, []))
        if problem:
            raise CheckpointIntegrityError(
                f"{fqn}: the checkpoint's metadata does not describe this rank's {list(shape)} elements of it "
                f"exactly ({problem}); the load would leave elements unread or read them twice. The metadata is "
                f"damaged or belongs to another save: copy the checkpoint again or load an earlier one", fqn)
        checked += 1
    return checked


class CoveringLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner whose local plan must read every element of every target exactly once
    (:func:`check_coverage`); used by :func:`refimpl.torch_runtime.dcp.load_into`."""

    def create_local_plan(self) -> Any:
        """DCP's plan for this rank, checked; raises :class:`CheckpointIntegrityError` (on every rank, through
        DCP's planning step) when it does not tile a target."""
        plan = super().create_local_plan()
        check_coverage(plan.items, self.state_dict)
        return plan


__all__ = ["CoveringLoadPlanner", "check_coverage", "local_shape"]
