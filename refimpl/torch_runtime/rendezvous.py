"""A group's own rendezvous port: the fixed-port group (re)creation that the port cooldown exists for.

Frameworks that rebuild NCCL groups by re-running a rendezvous on a fixed port (one TCP store per
group, as Relax does) hit ``EADDRINUSE`` when a rebuild comes while the port is still held (TIME_WAIT,
or another process). ``GroupSpec(..., options=(("rendezvous_port", P),))`` gives a group that
behaviour under :class:`~refimpl.torch_runtime.TorchRuntime`: after ``dist.new_group`` (called by every rank
as torch requires), the group's lowest member binds a ``TCPStore`` on port ``P`` and every member
checks in through it; the store is kept while the group is live and closed when it is destroyed.

* The master's bind failure raises :class:`AddressInUseError`.
* A member that cannot reach the master within the group's ``timeout_s`` raises
  :class:`CollectiveTimeoutError` (its master failed to bind, or is late).

Either way the new process group is destroyed again on that rank, so every member ends without the
group and :class:`refimpl.comm.PGLifecycle`'s rebuild retries after its cooldown. The host is
``MASTER_ADDR`` (default ``127.0.0.1``): the lowest member's host in a one-host job.
"""
from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from refimpl.runtime.base import AddressInUseError, CollectiveTimeoutError, GroupError, GroupSpec

log = logging.getLogger(__name__)

RENDEZVOUS_PORT = "rendezvous_port"
"""The ``GroupSpec.options`` key that gives a group its own rendezvous port."""


def rendezvous_port(spec: GroupSpec) -> int | None:
    """The group's rendezvous port from its options, or None; a bad value raises :class:`GroupError`."""
    for key, value in spec.options:
        if key == RENDEZVOUS_PORT:
            if not isinstance(value, int) or not 0 < value < 65536:
                raise GroupError(f"group {spec.name!r}: {RENDEZVOUS_PORT} must be a TCP port 1-65535, got {value!r}")
            return value
    return None


def backend_options(spec: GroupSpec) -> tuple[tuple[str, Any], ...]:
    """The spec's options without the runtime's own (what goes to the backend)."""
    return tuple((k, v) for k, v in spec.options if k != RENDEZVOUS_PORT)


def _address_in_use(e: BaseException | None) -> bool:
    while e is not None:
        text = str(e).lower()
        if getattr(e, "errno", None) == 98 or "address already in use" in text or "eaddrinuse" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


def check_in(spec: GroupSpec, rank: int, port: int) -> Any:
    """Bind (lowest member) or reach the group's store on ``port`` and wait for every member; returns the store."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    master = rank == spec.ranks[0]
    timeout = timedelta(seconds=spec.timeout_s)
    try:
        store = dist.TCPStore(host, port, spec.size, master, timeout=timeout, wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - classified below
        if master and _address_in_use(e):
            raise AddressInUseError(
                f"group {spec.name!r} (generation {spec.generation}): rank {rank} could not bind its rendezvous "
                f"port {host}:{port}: {e}. Wait for the port's TIME_WAIT to pass (the lifecycle's cooldown) "
                f"and retry, or give the group another port."
            ) from e
        raise CollectiveTimeoutError(
            f"group {spec.name!r} (generation {spec.generation}): rank {rank} could not "
            f"{'bind' if master else 'reach'} the rendezvous store at {host}:{port} within {spec.timeout_s:g} s: {e}"
        ) from e
    prefix = f"{spec.name}/gen{spec.generation}"
    try:
        store.set(f"{prefix}/rank{rank}", "1")
        store.wait([f"{prefix}/rank{r}" for r in spec.ranks], timeout)
    except Exception as e:  # noqa: BLE001
        raise CollectiveTimeoutError(f"group {spec.name!r}: members did not all check in at {host}:{port} within "
                                     f"{spec.timeout_s:g} s: {e}") from e
    log.debug("group %r generation %d: rank %d checked in on port %d", spec.name, spec.generation, rank, port)
    return store


__all__ = ["RENDEZVOUS_PORT", "backend_options", "check_in", "rendezvous_port"]
