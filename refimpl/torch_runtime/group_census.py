"""Every process group alive in this process, and the NCCL communicators they hold.

A role's lifecycle knows its own groups; what a training step leaves holding device memory through a rollout
may be others: a ``DeviceMesh`` dimension that reused the default group, a group a library made and kept, the
default group itself once a collective ran on it. :func:`live_groups` reads torch's own registry of process
groups (every group ``init_process_group`` and ``new_group`` made and nobody destroyed), so nothing is missed
because it was made elsewhere:

* ``communicator``: an NCCL group has a communicator only once a collective (or an eager init) created it
  (``ProcessGroupNCCL._comm_ptr()`` non-zero; [Note: communicator handles] in
  :mod:`refimpl.torch_runtime.nccl`); a Gloo group holds its connections from its creation, and no device memory.
* ``bytes``: the communicator's device memory by ``ncclCommMemStats`` (suspendable + persistent) where the
  loaded NCCL has it (>= 2.29.7), else None: the count of communicators is then what is known.
* ``collectives``: the group's sequence number (collectives issued on it so far), which tells a default group
  that never carried a collective (its NCCL communicator never existed) from one that did.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveGroup:
    """One process group alive in this process."""

    #: torch's name of the group (its store prefix)
    torch_name: str
    #: the runtime's name for it ("" when no runtime of this process made or adopted it)
    name: str
    backend: str
    ranks: tuple[int, ...]
    #: True for the default (world) group
    default: bool
    #: collectives issued on it so far (its sequence number; -1 where the backend does not count them)
    collectives: int
    #: an NCCL communicator exists for it on this rank (a Gloo group: its connections, always)
    communicator: bool
    #: the communicator's device memory by ncclCommMemStats (None: not NCCL, or no ncclCommMemStats here)
    bytes: int | None

    def as_dict(self) -> dict[str, Any]:
        """The row as a plain dict (a record's field)."""
        return asdict(self)


def live_groups(runtime_names: Mapping[str, str] | None = None) -> list[LiveGroup]:
    """Every process group in torch's registry of this process, the default group first; ``runtime_names`` maps
    torch names to the runtime's names. Empty without an initialised ``torch.distributed``."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    names = dict(runtime_names or {})
    world = dist.distributed_c10d._get_default_group()
    pgs = list(dist.distributed_c10d._world.pg_map)
    pgs.sort(key=lambda pg: (pg is not world, str(_torch_name(pg))))
    return [_row(pg, pg is world, names) for pg in pgs]


def _torch_name(pg: Any) -> str:
    try:
        return str(pg.group_name)
    except Exception:  # noqa: BLE001 - older builds
        return ""


def _row(pg: Any, default: bool, names: Mapping[str, str]) -> LiveGroup:
    backend = str(dist.get_backend(pg))
    torch_name = _torch_name(pg)
    try:
        collectives = int(pg._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a backend that does not count them
        collectives = -1
    communicator, nbytes = (True, None) if backend != "nccl" else _nccl_state(pg)
    return LiveGroup(torch_name=torch_name, name=names.get(torch_name, ""), backend=backend,
                     ranks=tuple(dist.get_process_group_ranks(pg)), default=default, collectives=collectives,
                     communicator=communicator, bytes=nbytes if backend == "nccl" else None)


def _nccl_state(pg: Any) -> tuple[bool, int | None]:
    """(an NCCL communicator exists, its bytes or None) for an NCCL group on this rank; nothing is created."""
    if not torch.cuda.is_available():
        return False, None
    from refimpl.torch_runtime.nccl import NcclLibrary, comm_mem_stats, pg_comm_handles

    handles = pg_comm_handles(pg, create_lazy=False)
    if not handles:
        return False, 0
    try:
        lib = NcclLibrary.load()
        if not lib.has_mem_stats:
            return True, None
        mem = [comm_mem_stats(h) for h in handles]
        return True, int(sum(m.suspendable + m.persistent for m in mem))
    except Exception as e:  # noqa: BLE001 - the count is still known
        log.debug("ncclCommMemStats unavailable: %s", e)
        return True, None


__all__ = ["LiveGroup", "live_groups"]
