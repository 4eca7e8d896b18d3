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
member holds ``v``). :func:`~refimpl.store.backends.digest.content_digest`
(re-exported here) hashes tensors' bytes where they live for the content check.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, MutableMapping, Sequence

import torch

from refimpl.runtime.base import WORLD, GroupError, ReduceOp, Runtime
from refimpl.store.backends.digest import content_digest, release_digest_weights
from refimpl.store.backends.replica import ReplicaGroup, warn_if_multi_host
from refimpl.store.config import CATEGORY_ORDER
from refimpl.store.state.layout import FlatLayout

log = logging.getLogger(__name__)

_MASK62 = (1 << 62) - 1


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
