"""The protocols of the simulated machine, through which :class:`sim.SimRuntime` gets time, memory and faults.

The runtime never hard-codes a bandwidth, a capacity or a fault: it asks five
small parts of the machine, each a ``typing.Protocol`` with a simple default here, so richer
parts (the topology and max-min fair flows, calibrated presets, fault plans)
plug in without touching the runtime:

=================  =========================================  ==========================
protocol           asked for                                  default
=================  =========================================  ==========================
``Transport``      when a D2H / H2D / D2D copy finishes       :class:`FixedBandwidthTransport`
``CollectiveCost`` how long a collective takes                :class:`RingCollectiveCost`
``Memory``    device / host ledgers, OOM, pinning        :class:`LedgerMemory`
``FaultHooks``     crash / hang / raise / corrupt / delay     :class:`NoFaults`
``CommCosts``      communicator memory and lifecycle costs    :class:`NcclCommCosts`
=================  =========================================  ==========================

Binding: when a :class:`sim.SimWorld` is built it calls ``part.bind(world)``
on every part that has a ``bind`` method, so a part can reach
``world.engine`` (to schedule completions), ``world.world_size`` and
``world.rng`` (the seeded random source): the :class:`WorldBinding` protocol,
which :class:`sim.SimWorld` satisfies. Parts must be deterministic given that
seed: no wall clock, no iteration over sets or ``id()``-keyed order.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

from refimpl.runtime.base import CommMemory, CopyKind, GroupSpec, MemoryInfo, PinningError
from sim.kernel.errors import SimOutOfMemoryError

if TYPE_CHECKING:  # pragma: no cover
    import random

    from sim.kernel.engine import Engine

log = logging.getLogger(__name__)


class WorldBinding(Protocol):
    """What a part of the machine may reach of the world it is bound to (``part.bind(world)``).

    :class:`sim.SimWorld` is one; declaring it here keeps this module below the world.
    """

    engine: "Engine"
    world_size: int
    rng: "random.Random"

MiB = 1 << 20


# --------------------------------------------------------------------------- protocols


@runtime_checkable
class Transport(Protocol):
    """Times device<->host and device<->device copies.

    ``start`` is called when a rank issues a copy of ``nbytes``; the transport
    must call ``on_done()`` exactly once, from an engine event, at the
    simulated time the copy finishes. Max-min fair flows may finish concurrent
    transfers at times that depend on each other. A transport may also define
    ``device_freed(rank, nbytes)``, called when device memory goes back to the
    driver, to simulate the driver's scrub ([Note: the driver's scrub of freed
    memory] in :mod:`sim.machine.flows`).
    """

    def start(self, rank: int, kind: CopyKind, nbytes: int, on_done: Callable[[], None]) -> None:
        """Begin a copy of ``nbytes`` of ``kind`` issued by ``rank``; call ``on_done()`` exactly once, from an engine
        event, at the simulated time it finishes."""


@runtime_checkable
class CollectiveCost(Protocol):
    """Duration in seconds of a collective once every member has arrived.

    ``op`` is ``"all_gather"``, ``"all_reduce"``, ``"broadcast"`` or
    ``"barrier"``; ``ranks`` are the group's global ranks; ``nbytes`` follows
    the nccl-tests *size* convention: the output bytes for all_gather, the
    tensor bytes for all_reduce and broadcast, 0 for barrier.
    """

    def time(self, op: str, ranks: tuple[int, ...], nbytes: int) -> float:
        """Seconds the collective ``op`` over global ``ranks`` takes after the last member arrives, for ``nbytes`` in
        the nccl-tests size convention (see the class docstring)."""


@runtime_checkable
class Memory(Protocol):
    """Per-rank device and host memory ledgers.

    ``alloc_device`` raises :class:`sim.SimOutOfMemoryError` when the bytes do
    not fit; ``alloc_host`` with ``pinned`` raises
    :class:`refimpl.runtime.PinningError` when pinning fails.
    """

    def alloc_device(self, rank: int, nbytes: int, tag: str) -> None:
        """Charge ``nbytes`` of device memory to ``rank`` under ``tag``; raise :class:`sim.SimOutOfMemoryError` when
        they do not fit (and charge nothing)."""

    def free_device(self, rank: int, nbytes: int, tag: str) -> None:
        """Return ``nbytes`` of device memory that ``rank`` charged under ``tag``."""

    def alloc_host(self, rank: int, nbytes: int, pinned: bool, tag: str) -> None:
        """Charge ``nbytes`` of host memory (page-locked if ``pinned``) to ``rank``; raise
        :class:`refimpl.runtime.PinningError` when it cannot be had (and charge nothing)."""

    def free_host(self, rank: int, nbytes: int, pinned: bool, tag: str) -> None:
        """Return ``nbytes`` of host memory that ``rank`` charged with the same ``pinned``."""

    def device_info(self, rank: int) -> MemoryInfo:
        """``rank``'s device free and total bytes now, as the driver would report them."""


class FaultKind(enum.Enum):
    """What an injected fault does to the rank it hits."""

    CRASH = "crash"  # the rank's process stops; no code of it runs again
    HANG = "hang"  # the rank blocks forever at that point
    RAISE = "raise"  # an exception is raised in the rank at that point
    CORRUPT = "corrupt"  # collectives: this rank receives a wrong result
    DELAY = "delay"  # the rank is held up for ``delay_s`` simulated seconds


@dataclass(frozen=True)
class FaultAction:
    """One injected fault. Build with :meth:`crash`, :meth:`hang`, :meth:`fail`,
    :meth:`corrupt` or :meth:`delay`."""

    kind: FaultKind
    exc: BaseException | None = None
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind is FaultKind.RAISE and self.exc is None:
            raise ValueError("FaultAction RAISE needs the exception to raise: FaultAction.fail(exc)")
        if self.kind is FaultKind.DELAY and not (self.delay_s >= 0 and math.isfinite(self.delay_s)):
            raise ValueError(f"FaultAction DELAY needs a finite delay_s >= 0, got {self.delay_s}")

    @classmethod
    def crash(cls) -> "FaultAction":
        """The rank's process stops here (like SIGKILL: no ``finally`` runs)."""
        return cls(FaultKind.CRASH)

    @classmethod
    def hang(cls) -> "FaultAction":
        """The rank blocks here forever."""
        return cls(FaultKind.HANG)

    @classmethod
    def fail(cls, exc: BaseException) -> "FaultAction":
        """``exc`` is raised in the rank here."""
        return cls(FaultKind.RAISE, exc=exc)

    @classmethod
    def corrupt(cls) -> "FaultAction":
        """The rank's collective result is wrong (its output is perturbed)."""
        return cls(FaultKind.CORRUPT)

    @classmethod
    def delay(cls, seconds: float) -> "FaultAction":
        """The rank is held up ``seconds`` before going on."""
        return cls(FaultKind.DELAY, delay_s=float(seconds))


@runtime_checkable
class FaultHooks(Protocol):
    """Asked by the runtime whether to inject a fault; ``None`` means go on.

    * ``on_point``: at ``await rt.point(name)``.
    * ``on_collective``: when a rank enters a collective (before it arrives);
      ``seq`` is the rank's sequence number on that group generation.
    * ``on_group_create``: when a member enters ``new_group``/``recreate_group``
      (RAISE with :class:`refimpl.runtime.AddressInUseError` simulates a port in
      TIME_WAIT).
    * ``on_pin``: when a pinned host buffer is allocated; only RAISE is
      possible there (the call is synchronous); the default exception type is
      :class:`refimpl.runtime.PinningError`.
    """

    def on_point(self, rank: int, name: str) -> FaultAction | None:
        """The fault to inject when ``rank`` reaches ``await rt.point(name)``, or None."""

    def on_collective(self, rank: int, group: str, op: str, seq: int) -> FaultAction | None:
        """The fault to inject when ``rank`` enters collective ``op`` on ``group`` (its ``seq``-th on that group
        generation), before it arrives; or None."""

    def on_group_create(self, rank: int, spec: GroupSpec) -> FaultAction | None:
        """The fault to inject when member ``rank`` enters ``new_group``/``recreate_group`` of ``spec``, or None."""

    def on_pin(self, rank: int, nbytes: int) -> FaultAction | None:
        """The fault to inject when ``rank`` allocates a pinned host buffer of ``nbytes``, or None; only
        :meth:`FaultAction.fail` is allowed here."""


@runtime_checkable
class CommCosts(Protocol):
    """Communicator memory and the time of communicator lifecycle operations.

    ``memory(spec, rank)`` is what a live communicator of that group holds on
    that rank (``spec.backend`` is already resolved, never ``None``). The
    runtime charges it to the simulated memory on create and resume and releases
    it on suspend (the suspendable part) and destroy (all of it).
    """

    def memory(self, spec: GroupSpec, rank: int) -> CommMemory:
        """Device bytes (suspendable and persistent) a live communicator of ``spec`` holds on ``rank``;
        ``spec.backend`` is resolved."""

    def create_time(self, spec: GroupSpec) -> float:
        """Seconds from the last member's arrival in ``new_group``/``recreate_group`` to a usable communicator (every
        member waits for it)."""

    def destroy_time(self, spec: GroupSpec) -> float:
        """Seconds one member spends in a graceful destroy of its communicator (an abort is not charged)."""

    def suspend_time(self, spec: GroupSpec) -> float:
        """Seconds one member spends suspending its communicator (``ncclCommSuspend``)."""

    def resume_time(self, spec: GroupSpec) -> float:
        """Seconds one member spends resuming its communicator (``ncclCommResume``)."""


# --------------------------------------------------------------------------- defaults


@dataclass
class FixedBandwidthTransport:
    """One copy engine per rank and direction: copies of a kind run one after another.

    A copy finishes at ``max(now, engine free) + latency_s + nbytes / bandwidth``.
    Ranks and directions do not share bandwidth (the flows in
    :mod:`sim.machine.flows` does). Defaults: 55.2 GB/s each way (pinned, PCIe Gen5
    x16, measured on the H200, /work/shared/GPU.md), 4.1 TB/s device to device
    (read+write), 10 us per copy.
    """

    h2d_bps: float = 55.2e9
    d2h_bps: float = 55.2e9
    d2d_bps: float = 4.1e12
    latency_s: float = 10e-6

    def __post_init__(self) -> None:
        for f in ("h2d_bps", "d2h_bps", "d2d_bps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"FixedBandwidthTransport.{f} must be > 0, got {getattr(self, f)}")
        if self.latency_s < 0:
            raise ValueError(f"FixedBandwidthTransport.latency_s must be >= 0, got {self.latency_s}")
        self._busy_until: dict[tuple[int, CopyKind], float] = {}
        self._engine = None

    def bind(self, world: WorldBinding) -> None:
        """Attach to the world's engine (called by SimWorld)."""
        self._engine = world.engine
        self._busy_until.clear()

    def bandwidth(self, kind: CopyKind) -> float:
        """Bytes per second of one copy of ``kind``."""
        if kind is CopyKind.D2H:
            return self.d2h_bps
        if kind is CopyKind.H2D:
            return self.h2d_bps
        return self.d2d_bps

    def start(self, rank: int, kind: CopyKind, nbytes: int, on_done: Callable[[], None]) -> None:
        """Queue the copy on the rank's copy engine for ``kind`` and call ``on_done`` when it ends."""
        engine = self._engine
        if engine is None:
            raise RuntimeError("FixedBandwidthTransport is not bound to a SimWorld; pass it to SimWorld(transport=...)")
        key = (rank, kind)
        now = engine.now
        busy = self._busy_until.get(key, 0.0)
        end = (busy if busy > now else now) + self.latency_s + nbytes / self.bandwidth(kind)
        self._busy_until[key] = end
        engine.schedule(end - now, on_done)


@dataclass(frozen=True)
class RingCollectiveCost:
    """Alpha-beta cost of ring collectives with nccl-tests bus-bandwidth conventions.

    With ``n`` ranks, ``S`` bytes (see :class:`CollectiveCost`), bus bandwidth
    ``B`` and per-step latency ``a``:

    * all_reduce: ``2 (n-1) a + 2 (n-1)/n * S / B``
    * all_gather: ``(n-1) a + (n-1)/n * S / B``
    * broadcast: ``(n-1) a + S / B`` (pipelined ring)
    * barrier: ``2 ceil(log2 n) a``

    A one-rank group costs 0. Defaults (100 GB/s, 10 us) are placeholders for
    an NVLink-class fabric; calibrated figures come from :mod:`sim.machine.collectives`.
    """

    bus_bps: float = 100e9
    alpha_s: float = 10e-6

    def __post_init__(self) -> None:
        if not self.bus_bps > 0 or self.alpha_s < 0:
            raise ValueError(f"RingCollectiveCost needs bus_bps > 0 and alpha_s >= 0, got {self.bus_bps}, {self.alpha_s}")

    def time(self, op: str, ranks: tuple[int, ...], nbytes: int) -> float:
        """Seconds the collective takes after the last member arrives."""
        n = len(ranks)
        if n <= 1:
            return 0.0
        a, b = self.alpha_s, self.bus_bps
        if op == "all_reduce":
            return 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / b
        if op == "all_gather":
            return (n - 1) * a + (n - 1) / n * nbytes / b
        if op == "broadcast":
            return (n - 1) * a + nbytes / b
        if op == "barrier":
            return 2 * math.ceil(math.log2(n)) * a
        raise ValueError(f"RingCollectiveCost: unknown collective {op!r}")


@dataclass
class RankLedger:
    """One rank's memory: bytes in use now and the peak, per device and host."""

    device_used: int = 0
    device_peak: int = 0
    host_pinned: int = 0
    host_pinned_peak: int = 0
    host_pageable: int = 0
    host_pageable_peak: int = 0
    by_tag: dict[str, int] = dataclasses.field(default_factory=dict)


class LedgerMemory:
    """Default memory: a fixed device capacity per GPU, host memory unlimited
    unless ``host_capacity`` is given, peaks tracked.

    Device capacity defaults to 141e9 bytes (H200). ``ledger(rank)`` exposes the
    counters; ``by_tag`` in it holds device bytes per tag.
    """

    def __init__(self, device_capacity: int = int(141e9), host_capacity: int | None = None):
        if device_capacity <= 0:
            raise ValueError(f"LedgerMemory: device_capacity must be > 0, got {device_capacity}")
        if host_capacity is not None and host_capacity <= 0:
            raise ValueError(f"LedgerMemory: host_capacity must be > 0 or None, got {host_capacity}")
        self.device_capacity = int(device_capacity)
        self.host_capacity = host_capacity
        self._ledgers: dict[int, RankLedger] = {}

    def ledger(self, rank: int) -> RankLedger:
        """The ledger of ``rank`` (created empty on first use)."""
        led = self._ledgers.get(rank)
        if led is None:
            led = self._ledgers[rank] = RankLedger()
        return led

    def alloc_device(self, rank: int, nbytes: int, tag: str) -> None:
        """Charge ``nbytes`` of device memory; raise SimOutOfMemoryError if it does not fit."""
        led = self.ledger(rank)
        if led.device_used + nbytes > self.device_capacity:
            top = sorted(((n, t) for t, n in led.by_tag.items() if n), reverse=True)[:3]
            raise SimOutOfMemoryError(
                rank, nbytes, self.device_capacity - led.device_used, self.device_capacity, tag,
                ", ".join(f"{t or '<untagged>'}={n:,}" for n, t in top),
            )
        led.device_used += nbytes
        led.by_tag[tag] = led.by_tag.get(tag, 0) + nbytes
        if led.device_used > led.device_peak:
            led.device_peak = led.device_used

    def free_device(self, rank: int, nbytes: int, tag: str) -> None:
        """Return ``nbytes`` of device memory charged under ``tag``."""
        led = self.ledger(rank)
        if nbytes > led.device_used:
            raise ValueError(f"rank {rank}: freeing {nbytes:,} device bytes ({tag!r}) but only {led.device_used:,} in use")
        led.device_used -= nbytes
        left = led.by_tag.get(tag, 0) - nbytes
        if left:
            led.by_tag[tag] = left
        else:
            led.by_tag.pop(tag, None)

    def alloc_host(self, rank: int, nbytes: int, pinned: bool, tag: str) -> None:
        """Charge host memory; raise PinningError if a capacity is set and exceeded."""
        led = self.ledger(rank)
        if self.host_capacity is not None and led.host_pinned + led.host_pageable + nbytes > self.host_capacity:
            raise PinningError(
                f"rank {rank}: cannot allocate {nbytes:,} host bytes for {tag!r}: host capacity "
                f"{self.host_capacity:,} with {led.host_pinned + led.host_pageable:,} in use; free host buffers "
                "or raise the host capacity"
            )
        if pinned:
            led.host_pinned += nbytes
            led.host_pinned_peak = max(led.host_pinned_peak, led.host_pinned)
        else:
            led.host_pageable += nbytes
            led.host_pageable_peak = max(led.host_pageable_peak, led.host_pageable)

    def free_host(self, rank: int, nbytes: int, pinned: bool, tag: str) -> None:
        """Return host memory."""
        led = self.ledger(rank)
        if pinned:
            led.host_pinned -= nbytes
        else:
            led.host_pageable -= nbytes
        if led.host_pinned < 0 or led.host_pageable < 0:
            raise ValueError(f"rank {rank}: freed more host memory ({tag!r}) than was allocated")

    def device_info(self, rank: int) -> MemoryInfo:
        """Free and total device bytes of ``rank``."""
        led = self.ledger(rank)
        return MemoryInfo(free=self.device_capacity - led.device_used, total=self.device_capacity)


class NoFaults:
    """Fault hooks that never inject anything (the default)."""

    def on_point(self, rank: int, name: str) -> FaultAction | None:
        """None: no fault."""
        return None

    def on_collective(self, rank: int, group: str, op: str, seq: int) -> FaultAction | None:
        """None: no fault."""
        return None

    def on_group_create(self, rank: int, spec: GroupSpec) -> FaultAction | None:
        """None: no fault."""
        return None

    def on_pin(self, rank: int, nbytes: int) -> FaultAction | None:
        """None: no fault."""
        return None


@dataclass(frozen=True)
class NcclCommCosts:
    """Communicator memory and lifecycle times of NCCL-like and Gloo groups.

    NCCL groups hold ``nccl_suspendable`` + ``nccl_persistent`` bytes per rank
    (384 MiB + 4 MiB, ``ncclCommMemStats`` on one H200, /work/shared/GPU.md);
    Gloo groups hold no device memory. Suspend 0.30 s and resume 0.097 s are
    measured there; create (0.25 s) and destroy (0.05 s) are estimates, not
    measurements. A group of one rank is created the same way.
    """

    nccl_suspendable: int = 384 * MiB
    nccl_persistent: int = 4 * MiB
    nccl_create_s: float = 0.25
    nccl_destroy_s: float = 0.05
    suspend_s: float = 0.30
    resume_s: float = 0.097
    gloo_create_s: float = 0.01
    gloo_destroy_s: float = 0.001

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"NcclCommCosts.{f.name} must be >= 0, got {getattr(self, f.name)}")

    def memory(self, spec: GroupSpec, rank: int) -> CommMemory:
        """Device bytes a live communicator of ``spec`` holds on ``rank``."""
        if spec.backend == "nccl":
            return CommMemory(suspendable=self.nccl_suspendable, persistent=self.nccl_persistent)
        return CommMemory()

    def create_time(self, spec: GroupSpec) -> float:
        """Seconds from the last member's arrival to a usable communicator."""
        return self.nccl_create_s if spec.backend == "nccl" else self.gloo_create_s

    def destroy_time(self, spec: GroupSpec) -> float:
        """Seconds a rank spends destroying its communicator."""
        return self.nccl_destroy_s if spec.backend == "nccl" else self.gloo_destroy_s

    def suspend_time(self, spec: GroupSpec) -> float:
        """Seconds ``ncclCommSuspend`` takes on one rank."""
        return self.suspend_s

    def resume_time(self, spec: GroupSpec) -> float:
        """Seconds ``ncclCommResume`` takes on one rank."""
        return self.resume_s


__all__ = [
    "CollectiveCost",
    "CommCosts",
    "FaultAction",
    "FaultHooks",
    "FaultKind",
    "FixedBandwidthTransport",
    "LedgerMemory",
    "Memory",
    "NcclCommCosts",
    "NoFaults",
    "RankLedger",
    "RingCollectiveCost",
    "Transport",
]
