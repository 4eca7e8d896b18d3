"""Keeping the members of replica groups in step: which groups exist, and whether members agree.

Theory of operation
-------------------
A rank knows only the replica groups it belongs to (a DeviceMesh slice holds
only the slice through this rank), but creating a process group is a
collective over every rank. :func:`agree_on_groups` exchanges each rank's groups
over ``world`` (one ``all_reduce(MAX)`` of the count, one ``all_gather`` of
membership rows) and every rank creates the union in one sorted order with
:func:`ensure_groups`.

Members of a group must lay out the same tensors in the same order, or the
reload all-gather would splice unrelated bytes together:
:func:`layout_signature` summarises a member's layouts and
:func:`members_agree` compares them over the group with a single
``all_reduce(MAX)`` of ``[v, -v]`` (max equals -max(-v) exactly when every
member holds ``v``). :func:`content_digest` hashes tensors' bytes where they
live for the optional content check.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, MutableMapping, Sequence

import torch

from refimpl.runtime.base import WORLD, GroupError, ReduceOp, Runtime
from refimpl.store.backends.replica import ReplicaGroup, warn_if_multi_host
from refimpl.store.config import CATEGORY_ORDER
from refimpl.store.state.layout import FlatLayout

log = logging.getLogger(__name__)

_MASK62 = (1 << 62) - 1

_DIGEST_COLS = 1021  # words per row of the digest's 2-D view (a prime: power-of-two shifts move every word to another column)
_DIGEST_BATCH = 4096  # tensors whose column sums are held at once (4 KiB each)
_WEIGHTS: dict[str, torch.Tensor] = {}


def _weights(device: torch.device) -> torch.Tensor:
    """Position weights ``j + 1`` of the digest's columns (one tensor per device, kept)."""
    key = str(device)
    w = _WEIGHTS.get(key)
    if w is None:
        w = _WEIGHTS[key] = torch.arange(1, _DIGEST_COLS + 1, dtype=torch.int64, device=device)
    return w


def release_digest_weights() -> None:
    """Drop the cached position weights (device memory); the next :func:`content_digest` builds them again."""
    _WEIGHTS.clear()


def _words(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s raw bytes as int32 words (uint8 when the size is not a multiple of 4); None for meta or empty."""
    if t.device.type == "meta" or t.numel() == 0:
        return None
    raw = t.detach().reshape(-1)
    raw = raw.contiguous().view(torch.uint8) if raw.dtype != torch.bool else raw.view(torch.uint8)
    return raw.view(torch.int32) if raw.numel() % 4 == 0 else raw


def _column_sums_into(row: torch.Tensor, words: torch.Tensor) -> None:
    """Write into ``row`` (int32, one per column) the wrapping sums of ``words`` laid out in rows of 1,021.

    One read of the data and one or two kernels: the reduction runs over the
    leading dimension of a contiguous view in int32 (wrapping, so the result
    is the exact sum mod 2**32 in any reduction order) with no widened copy; a
    tail shorter than a row is added into the first columns.
    """
    rows, tail = divmod(words.numel(), _DIGEST_COLS)
    if rows:
        torch.sum(words[:rows * _DIGEST_COLS].view(rows, _DIGEST_COLS), dim=0, dtype=torch.int32, out=row)
    if tail:
        row[:tail] += words[rows * _DIGEST_COLS:]


def content_digest(tensors: Sequence[torch.Tensor], *, device: torch.device | None = None) -> torch.Tensor:
    """Two 64-bit integer hashes per tensor of its raw bytes, computed where the tensor lives.

    The bytes are read as int32 words (uint8 when the size is not a multiple
    of 4) laid out in rows of 1,021 (a prime); each column's words are summed
    as int32 (wrapping, one pass over the data with no widened copy). ``h1`` is
    the sum of the column sums and ``h2`` weights column ``j`` by ``j + 1``, so
    words moved to another column (swapped halves, any shift that is not a
    multiple of 1,021 words) change it; whole rows swapped do not. Wrapping
    integer sums are exact in any reduction order, so equal bytes give equal
    hashes on every rank and device. Meta and empty tensors hash to zeros.
    The column sums of up to 4,096 tensors are held at once and reduced
    together, so a tensor costs one or two kernels.
    """
    dev = device or (tensors[0].device if tensors else torch.device("cpu"))
    out = torch.zeros(2 * len(tensors), dtype=torch.int64, device=dev)
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for i, t in enumerate(tensors):
        words = _words(t)
        if words is not None:
            by_device.setdefault(words.device, []).append((i, words))
    for d, items in by_device.items():
        for lo in range(0, len(items), _DIGEST_BATCH):
            part = items[lo:lo + _DIGEST_BATCH]
            cols = torch.zeros(len(part), _DIGEST_COLS, dtype=torch.int32, device=d)
            for k, (_, words) in enumerate(part):
                _column_sums_into(cols[k], words)
            wide = cols.to(torch.int64)
            idx = torch.tensor([2 * i for i, _ in part], dtype=torch.int64, device=dev)
            out[idx] = wide.sum(dim=1).to(dev)
            out[idx + 1] = (wide * _weights(d)).sum(dim=1).to(dev)
    return out


def shape_fingerprint(shapes: Iterable[Sequence[int]]) -> int:
    """A 62-bit integer summarising a list of shapes (order-sensitive), for layout agreement.

    Python's hash of a tuple of ints is deterministic (no per-process salt for
    ints), so every rank of a job computes the same value.
    """
    return hash(tuple(tuple(s) for s in shapes)) & _MASK62


# --------------------------------------------------------------------------- collectives


async def agree_on_groups(rt: Runtime, mine: Iterable[ReplicaGroup]) -> list[ReplicaGroup]:
    """Every rank learns the union of all ranks' non-trivial replica groups, sorted.

    One ``all_reduce(MAX)`` of the group count and one ``all_gather`` of
    membership rows (``count x world`` bytes per rank) over ``world``.
    """
    world = rt.world_size
    own = sorted({g for g in mine if not g.trivial})
    count = rt.alloc_device(1, torch.int64, tag="dedup.agree")
    count.fill_(len(own))
    await rt.all_reduce(count, ReduceOp.MAX, WORLD)
    kmax = int(count.item())
    if kmax == 0:
        return []
    rows = torch.zeros(kmax, world, dtype=torch.uint8)
    for i, g in enumerate(own):
        rows[i, list(g.ranks)] = 1
    inp = rt.alloc_device(kmax * world, torch.uint8, tag="dedup.agree")
    inp.copy_(rows.reshape(-1))
    out = rt.alloc_device(world * kmax * world, torch.uint8, tag="dedup.agree")
    await rt.all_gather_into_tensor(out, inp, WORLD)
    table = out.cpu().reshape(world * kmax, world)
    found = {tuple(int(r) for r in row.nonzero().reshape(-1).tolist()) for row in table if int(row.sum()) > 1}
    return sorted(ReplicaGroup(ranks) for ranks in found)


async def ensure_groups(rt: Runtime, groups: Sequence[ReplicaGroup], *, backend: str | None = None,
                        ranks_per_host: int | None = None, timeout_s: float = 600.0) -> None:
    """Create (or rebuild, if destroyed) each group's process group, in the given order, on every rank.

    ``backend``: the groups' backend (None: the runtime's default); ``ranks_per_host``: warn when a group
    spans hosts; ``timeout_s``: the groups' collective timeout.
    """
    lws = ranks_per_host
    for g in groups:
        try:
            rt.group_spec(g.name)
            known = True
        except GroupError:
            known = False
        if not known:
            await rt.new_group(g.spec(backend=backend, timeout_s=timeout_s))
        elif not rt.group_live(g.name):
            await rt.recreate_group(g.name)
        if lws is not None and rt.rank in g.ranks:
            warn_if_multi_host(g, lws)


def layout_signature(layouts: Sequence[FlatLayout], cache: "MutableMapping[Any, int] | None" = None) -> list[int]:
    """``[layout count, fingerprint]`` of what a member lays out for one group (62-bit, non-negative).

    ``cache`` (e.g. a ``WeakKeyDictionary``) keeps each layout object's
    fingerprint: the store reuses a layout object only while it is unchanged.
    """
    prints = []
    for lay in layouts:
        fp = cache.get(lay) if cache is not None else None
        if fp is None:
            shapes: list[Sequence[int]] = [(CATEGORY_ORDER[lay.category], lay.dtype.itemsize, lay.numel,
                                            len(lay.entries), sum(map(ord, str(lay.dtype))))]
            for e in lay.entries:
                shapes.append((e.numel, len(e.refs)))
                shapes.extend(r.size for r in e.refs)
            fp = shape_fingerprint(shapes)
            if cache is not None:
                cache[lay] = fp
        prints.append((fp,))
    return [len(layouts), shape_fingerprint(prints)]


async def members_agree(rt: Runtime, values: torch.Tensor, group: str, *, elementwise: bool = False):
    """Whether every member holds the same ``values`` (one MAX all-reduce of ``[v, -v]``, 62-bit values).

    Returns a bool, a per-element list with ``elementwise``, or None where
    collectives move no data (meta payloads) and nothing can be compared.
    """
    n = values.numel()
    buf = rt.alloc_device(2 * n, torch.int64, tag="dedup.check")
    v = values.to(buf.device).bitwise_and(_MASK62) if buf.device.type != "meta" else values.to("meta")
    buf[:n].copy_(v)
    buf[n:].copy_(-v)
    await rt.all_reduce(buf, ReduceOp.MAX, group)
    if buf.device.type == "meta":
        return None
    out = buf.cpu()
    equal = (out[:n] == -out[n:]).tolist()
    return equal if elementwise else all(equal)


async def members_agree_any(rt: Runtime, values: torch.Tensor, flag: bool, group: str):
    """:func:`members_agree` of ``values`` plus whether any member raised ``flag``, in one collective.

    Returns ``(same, any_flag)``; ``same`` is None where collectives move no data (``any_flag`` then False).
    """
    n = values.numel()
    buf = rt.alloc_device(2 * n + 1, torch.int64, tag="dedup.check")
    meta = buf.device.type == "meta"
    v = values.to(buf.device).bitwise_and(_MASK62) if not meta else values.to("meta")
    buf[:n].copy_(v)
    buf[n:2 * n].copy_(-v)
    buf[2 * n:].fill_(int(bool(flag)))
    await rt.all_reduce(buf, ReduceOp.MAX, group)
    if meta:
        return None, False
    out = buf.cpu()
    return bool((out[:n] == -out[n:2 * n]).all()), bool(out[2 * n] > 0)


__all__ = [
    "agree_on_groups",
    "content_digest",
    "release_digest_weights",
    "ensure_groups",
    "layout_signature",
    "members_agree",
    "members_agree_any",
    "shape_fingerprint",
]
