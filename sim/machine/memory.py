"""Memory ledgers: HBM per GPU and host memory (pinned and pageable) per NUMA node.

:class:`TopologyMemory` implements :class:`sim.machine.protocols.Memory` with the
capacities of a :class:`sim.machine.topology.Topology`:

* each rank's GPU has the preset's HBM capacity; every allocation is charged
  under its tag (``"param"``, ``"comm tp0"``, ``"allocator cache"`` ...). An
  allocation that does not fit raises :class:`sim.kernel.errors.SimOutOfMemoryError`
  whose message lists every holder on that GPU, largest first;
* host buffers are charged to the NUMA node nearest the rank's GPU. Pinned
  bytes may not exceed the node's ``pinnable`` limit (``ulimit -l``, a
  registration quota) and all bytes may not exceed its capacity; a pinned
  allocation that fails raises :class:`refimpl.runtime.PinningError`, a
  pageable one :class:`HostOutOfMemoryError`, both naming who holds what.

Peaks are kept per rank (device, pinned, pageable) and per NUMA node, and
with ``record=True`` a timeline of device use per rank, so a scenario can say
how much memory a phase held (e.g. the paused window of a weight sync).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from refimpl.runtime.base import MemoryInfo, PinningError
from sim.kernel.errors import SimError, SimOutOfMemoryError
from sim.machine.protocols import RankLedger

if TYPE_CHECKING:  # pragma: no cover
    from sim.machine.topology import Topology
    from sim.machine.protocols import WorldBinding

log = logging.getLogger(__name__)


class HostOutOfMemoryError(SimError, MemoryError):
    """A pageable host allocation did not fit into its NUMA node's memory."""


@dataclass
class NumaLedger:
    """Host memory of one NUMA node: capacity, pinnable limit, use and peaks, by rank."""

    name: str
    capacity: int
    pinnable: int
    pinned: int = 0
    pageable: int = 0
    pinned_peak: int = 0
    used_peak: int = 0
    pinned_by_rank: dict[int, int] = field(default_factory=dict)

    @property
    def used(self) -> int:
        """Pinned plus pageable bytes in use now."""
        return self.pinned + self.pageable


def _holders(by_tag: dict[str, int], limit: int = 8) -> str:
    items = sorted(((n, t) for t, n in by_tag.items() if n), key=lambda x: (-x[0], x[1]))
    shown = ", ".join(f"{t or '<untagged>'}={n / 2**30:.2f} GiB" for n, t in items[:limit])
    if len(items) > limit:
        shown += f", and {len(items) - limit} more"
    return shown or "nothing"


class NumaLedgers(Mapping[str, NumaLedger]):
    """The NUMA nodes' ledgers, each made when first asked for (a 16,384-node topology has 32,768 NUMA nodes; a
    folded run touches a few). Iteration gives the ledgers made so far, in the topology's order: a NUMA node
    never asked for holds nothing."""

    def __init__(self, topology: "Topology"):
        self._topology = topology
        self._made: dict[str, NumaLedger] = {}

    def __getitem__(self, name: str) -> NumaLedger:
        led = self._made.get(name)
        if led is None:
            try:
                cap, pinnable = self._topology.host_capacity(name), self._topology.pinnable_bytes(name)
            except KeyError:
                raise KeyError(name) from None
            led = self._made[name] = NumaLedger(name, cap, pinnable)
        return led

    def __iter__(self) -> Iterator[str]:
        if len(self._made) == 0:
            return iter(())
        return (n for n in self._topology.host_memory_nodes() if n in self._made)

    def __len__(self) -> int:
        return len(self._made)


class TopologyMemory:
    """HBM and host-memory ledgers sized by a topology (see the module docstring).

    Args:
        topology: capacities (HBM per GPU, host memory and pinnable bytes per NUMA node).
        device_capacity: override of the HBM capacity in bytes (all GPUs).
        record: keep a timeline of device use per rank (:meth:`timeline`).
    """

    def __init__(self, topology: "Topology", *, device_capacity: int | None = None, record: bool = True):
        if device_capacity is not None and device_capacity <= 0:
            raise ValueError(f"device_capacity must be > 0 bytes, got {device_capacity}")
        self.topology = topology
        self._device_capacity = device_capacity
        self.record = record
        self._ledgers: dict[int, RankLedger] = {}
        self._capacity: dict[int, int] = {}
        self._numa_of: dict[int, str] = {}
        self.numa = NumaLedgers(topology)
        self._engine = None
        self._timeline: dict[int, list[tuple[float, int]]] = {}

    def bind(self, world: "WorldBinding") -> None:
        """Attach to the world's clock (SimWorld calls this)."""
        self._engine = world.engine

    # ------------------------------------------------------------------ queries

    def ledger(self, rank: int) -> RankLedger:
        """The counters of ``rank`` (device use and peak, pinned and pageable host use and peaks, by tag)."""
        led = self._ledgers.get(rank)
        if led is None:
            led = self._ledgers[rank] = RankLedger()
            self._capacity[rank] = self._device_capacity or self.topology.hbm_bytes(rank)
            self._numa_of[rank] = self.topology.numa_of(rank)
        return led

    def capacity(self, rank: int) -> int:
        """HBM bytes of ``rank``'s GPU."""
        self.ledger(rank)
        return self._capacity[rank]

    def device_info(self, rank: int) -> MemoryInfo:
        """Free and total device bytes of ``rank`` as the driver would report them."""
        led = self.ledger(rank)
        return MemoryInfo(free=self._capacity[rank] - led.device_used, total=self._capacity[rank])

    def timeline(self, rank: int) -> list[tuple[float, int]]:
        """``(time, device bytes in use)`` after every change on ``rank`` (needs ``record``)."""
        return list(self._timeline.get(rank, ()))

    def peak_between(self, rank: int, start: float, end: float) -> int:
        """Largest device use of ``rank`` within ``[start, end)`` (needs ``record``).

        Half open: what changes at ``end`` belongs to what starts there (the next
        phase starts at the instant this one ends, and its first allocation is
        timed at that instant); the use at ``start`` is the last one recorded at
        or before it.
        """
        tl = self._timeline.get(rank, [])
        best = 0
        for t, u in tl:
            if t > start:
                break
            best = u
        for t, u in tl:
            if start < t < end:
                best = max(best, u)
        return best

    def holders(self, rank: int) -> dict[str, int]:
        """Device bytes per tag held on ``rank`` now."""
        return dict(self.ledger(rank).by_tag)

    # ------------------------------------------------------------------ device

    def alloc_device(self, rank: int, nbytes: int, tag: str) -> None:
        """Charge ``nbytes`` of HBM under ``tag``; raise SimOutOfMemoryError listing the holders."""
        led = self.ledger(rank)
        cap = self._capacity[rank]
        if led.device_used + nbytes > cap:
            raise SimOutOfMemoryError(rank, nbytes, cap - led.device_used, cap, tag, _holders(led.by_tag))
        led.device_used += nbytes
        led.by_tag[tag] = led.by_tag.get(tag, 0) + nbytes
        if led.device_used > led.device_peak:
            led.device_peak = led.device_used
        self._note(rank, led.device_used)

    def free_device(self, rank: int, nbytes: int, tag: str) -> None:
        """Return ``nbytes`` charged under ``tag``."""
        led = self.ledger(rank)
        held = led.by_tag.get(tag, 0)
        if nbytes > held:
            raise ValueError(
                f"rank {rank}: freeing {nbytes:,} device bytes under {tag!r}, which holds only {held:,}; "
                "every free must match an allocation"
            )
        led.device_used -= nbytes
        if held - nbytes:
            led.by_tag[tag] = held - nbytes
        else:
            del led.by_tag[tag]
        self._note(rank, led.device_used)

    def _note(self, rank: int, used: int) -> None:
        if self.record and self._engine is not None:
            self._timeline.setdefault(rank, []).append((self._engine.now, used))

    # ------------------------------------------------------------------ host

    def alloc_host(self, rank: int, nbytes: int, pinned: bool, tag: str) -> None:
        """Charge host memory on the rank's NUMA node; raise if it does not fit (see module docstring)."""
        led = self.ledger(rank)
        node = self.numa[self._numa_of[rank]]
        if node.used + nbytes > node.capacity or (pinned and node.pinned + nbytes > node.pinnable):
            who = ", ".join(f"rank {r}={n / 2**30:.2f} GiB" for r, n in sorted(node.pinned_by_rank.items()) if n)
            limit, what = (node.pinnable, "pinnable") if pinned and node.pinned + nbytes > node.pinnable else (node.capacity, "total")
            msg = (
                f"rank {rank}: cannot allocate {nbytes / 2**30:.3f} GiB of {'pinned' if pinned else 'pageable'} host "
                f"memory for {tag!r} on {node.name}: {what} limit {limit / 2**30:.2f} GiB, pinned in use "
                f"{node.pinned / 2**30:.2f} GiB ({who or 'nobody'}), pageable {node.pageable / 2**30:.2f} GiB. "
                "Use the local_dedup backend, offload less, or raise the host limit (ulimit -l)."
            )
            if pinned:
                raise PinningError(msg)
            raise HostOutOfMemoryError(msg)
        if pinned:
            node.pinned += nbytes
            node.pinned_by_rank[rank] = node.pinned_by_rank.get(rank, 0) + nbytes
            node.pinned_peak = max(node.pinned_peak, node.pinned)
            led.host_pinned += nbytes
            led.host_pinned_peak = max(led.host_pinned_peak, led.host_pinned)
        else:
            node.pageable += nbytes
            led.host_pageable += nbytes
            led.host_pageable_peak = max(led.host_pageable_peak, led.host_pageable)
        node.used_peak = max(node.used_peak, node.used)

    def free_host(self, rank: int, nbytes: int, pinned: bool, tag: str) -> None:
        """Return host memory charged by :meth:`alloc_host`."""
        led = self.ledger(rank)
        node = self.numa[self._numa_of[rank]]
        if pinned:
            if nbytes > led.host_pinned:
                raise ValueError(f"rank {rank}: freeing {nbytes:,} pinned bytes ({tag!r}) but only {led.host_pinned:,} pinned")
            led.host_pinned -= nbytes
            node.pinned -= nbytes
            node.pinned_by_rank[rank] -= nbytes
        else:
            if nbytes > led.host_pageable:
                raise ValueError(f"rank {rank}: freeing {nbytes:,} pageable bytes ({tag!r}) but only {led.host_pageable:,} in use")
            led.host_pageable -= nbytes
            node.pageable -= nbytes


__all__ = ["HostOutOfMemoryError", "NumaLedger", "NumaLedgers", "TopologyMemory"]
