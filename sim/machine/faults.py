"""Fault plans: which fault hits which rank, when, in a simulated job.

A :class:`FaultPlan` is a list of :class:`Fault` specs and implements
:class:`sim.machine.protocols.FaultHooks`, so it is passed as ``SimWorld(faults=plan)``.
Each fault has a kind and a trigger:

=====================  ===========================================================
kind                   what happens
=====================  ===========================================================
``crash``              the rank's process stops (no ``finally`` runs)
``hang``               the rank blocks forever
``nccl_error``         a collective raises :class:`CollectiveFailedError`
``canary_corruption``  a collective returns a wrong result on that rank (the
                       lifecycle's canary should catch it)
``address_in_use``     a group *rebuild* raises :class:`AddressInUseError`
                       (the port is still in TIME_WAIT)
``slow_link``          a link's capacity is scaled by ``factor`` (needs the
                       :class:`sim.machine.flows.FlowTransport`); ``duration_s`` ends it
``pin_failure``        pinning a host buffer raises :class:`PinningError`
=====================  ===========================================================

Triggers: ``at_time`` (simulated seconds) and/or ``at_point`` (a glob over
named protocol points, e.g. ``"lifecycle.canary*"``). A fault fires at the
first opportunity of its kind on a matching rank once its trigger is met:
crash and hang at the next protocol point or collective (or group creation)
of the rank; nccl_error and canary_corruption at the rank's next collective
on a group matching ``group`` (a glob, default any); address_in_use at the
next rebuild (generation >= 1) of a matching group; pin_failure at the next
pinned allocation of at least ``min_bytes``; slow_link exactly at ``at_time``
or when any rank reaches ``at_point``. ``nth`` skips the first ``nth - 1``
opportunities; ``times`` fires on that many consecutive ones. ``ranks`` lists
the ranks it applies to (all when omitted).

Every firing is recorded in :attr:`FaultPlan.fired` for the scenario result.
"""
from __future__ import annotations

from refimpl.cli_errors import CliInputError  # bad input: the CLI answers it with one line and exit 2

import enum
import fnmatch
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from refimpl.runtime.base import AddressInUseError, CollectiveFailedError, GroupSpec, PinningError
from sim.machine.protocols import FaultAction, WorldBinding

if TYPE_CHECKING:  # pragma: no cover
    from sim.machine.protocols import Transport

log = logging.getLogger(__name__)


class FaultWorld(WorldBinding, Protocol):
    """What a fault plan reaches of the world it is bound to (:class:`sim.SimWorld` is one): its transport too."""

    transport: "Transport"


class FaultPlanError(CliInputError):
    """A fault plan is invalid; the message names the field."""


class FaultType(enum.Enum):
    """The faults a plan can inject (see the module docstring)."""

    CRASH = "crash"
    HANG = "hang"
    NCCL_ERROR = "nccl_error"
    CANARY_CORRUPTION = "canary_corruption"
    ADDRESS_IN_USE = "address_in_use"
    SLOW_LINK = "slow_link"
    PIN_FAILURE = "pin_failure"


_FIELDS = {"kind", "ranks", "at_time", "at_point", "group", "nth", "times", "link", "factor", "duration_s", "min_bytes"}


@dataclass(frozen=True)
class Fault:
    """One fault of a plan. See the module docstring for the fields' meaning."""

    kind: FaultType
    ranks: tuple[int, ...] | None = None
    at_time: float | None = None
    at_point: str | None = None
    group: str = "*"
    nth: int = 1
    times: int = 1
    link: str | None = None
    factor: float = 0.5
    duration_s: float | None = None
    min_bytes: int = 0

    def __post_init__(self) -> None:
        k = self.kind
        if self.at_time is not None and not (math.isfinite(self.at_time) and self.at_time >= 0):
            raise FaultPlanError(f"{k.value}: at_time must be a finite time >= 0, got {self.at_time}")
        if self.nth < 1 or self.times < 1:
            raise FaultPlanError(f"{k.value}: nth and times must be >= 1, got nth={self.nth}, times={self.times}")
        if k is FaultType.SLOW_LINK:
            if not self.link:
                raise FaultPlanError("slow_link: 'link' is required (an element like 'n0/pcisw0' or a resource name)")
            if not self.factor > 0:
                raise FaultPlanError(f"slow_link: factor must be > 0, got {self.factor}")
            if self.at_time is None and self.at_point is None:
                raise FaultPlanError("slow_link: give at_time or at_point")
        if self.duration_s is not None and not self.duration_s > 0:
            raise FaultPlanError(f"{k.value}: duration_s must be > 0, got {self.duration_s}")

    def applies_to(self, rank: int) -> bool:
        """True if this fault may hit ``rank``."""
        return self.ranks is None or rank in self.ranks

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "fault") -> "Fault":
        """Build from JSON; errors name the field (``faults[2].at_time: ...``)."""
        from sim.presets.schemas import check_fields

        check_fields(raw, where, (), sorted(_FIELDS), FaultPlanError)
        try:
            kind = FaultType(raw.get("kind"))
        except ValueError:
            raise FaultPlanError(f"{where}.kind: {raw.get('kind')!r} is not one of {[k.value for k in FaultType]}") from None
        kw: dict[str, Any] = {"kind": kind}
        if "ranks" in raw:
            r = raw["ranks"]
            if not (isinstance(r, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in r)):
                raise FaultPlanError(f"{where}.ranks: expected a list of rank numbers, got {r!r}")
            kw["ranks"] = tuple(r)
        for key, typ in (("at_time", float), ("factor", float), ("duration_s", float)):
            if key in raw:
                v = raw[key]
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    raise FaultPlanError(f"{where}.{key}: expected a number, got {v!r}")
                kw[key] = typ(v)
        for key in ("nth", "times", "min_bytes"):
            if key in raw:
                v = raw[key]
                if not isinstance(v, int) or isinstance(v, bool):
                    raise FaultPlanError(f"{where}.{key}: expected an integer, got {v!r}")
                kw[key] = v
        for key in ("at_point", "group", "link"):
            if key in raw:
                v = raw[key]
                if not isinstance(v, str) or not v:
                    raise FaultPlanError(f"{where}.{key}: expected a non-empty string, got {v!r}")
                kw[key] = v
        try:
            return cls(**kw)
        except FaultPlanError as exc:
            raise FaultPlanError(f"{where}: {exc}") from None


@dataclass
class _Armed:
    """Per (fault, rank) counters."""

    seen: int = 0
    fired: int = 0
    triggered: bool = False


@dataclass(frozen=True)
class FiredFault:
    """A fault that fired: when, on which rank (None for a link), what and where."""

    time: float
    rank: int | None
    kind: str
    where: str


class FaultPlan:
    """A list of faults, applied through the :class:`sim.machine.protocols.FaultHooks` protocol."""

    def __init__(self, faults: list[Fault] | tuple[Fault, ...] = ()):
        self.faults: tuple[Fault, ...] = tuple(faults)
        self.fired: list[FiredFault] = []
        self._state: dict[tuple[int, int], _Armed] = {}
        self._links_slowed: set[int] = set()
        self._world: "FaultWorld | None" = None

    @classmethod
    def from_json(cls, raw: Any, where: str = "faults") -> "FaultPlan":
        """Build from a JSON list of fault objects."""
        if not isinstance(raw, list):
            raise FaultPlanError(f"{where}: expected a list of faults")
        return cls([Fault.from_dict(f, f"{where}[{i}]") for i, f in enumerate(raw)])

    def bind(self, world: "FaultWorld") -> None:
        """Reset counters and schedule time-triggered link faults (SimWorld calls this)."""
        self._world = world
        self._state.clear()
        self._links_slowed.clear()
        self.fired.clear()
        for i, f in enumerate(self.faults):
            if f.ranks is not None and any(r >= world.world_size for r in f.ranks):
                raise FaultPlanError(f"faults[{i}].ranks: {list(f.ranks)} names ranks outside a world of {world.world_size}")
            if f.kind is FaultType.SLOW_LINK:
                if not hasattr(world.transport, "slow"):
                    raise FaultPlanError(f"faults[{i}]: slow_link needs the topology flow transport (sim.machine.flows.FlowTransport)")
                check_link(f.link, world.transport, f"faults[{i}].link")  # fail early on an unknown link
                if f.at_time is not None and f.at_point is None:
                    world.engine.schedule(f.at_time, self._slow, f)

    # ------------------------------------------------------------------ hooks

    def on_point(self, rank: int, name: str) -> FaultAction | None:
        """At ``await rt.point(name)``: crash/hang by time or point; arm point-triggered faults."""
        for i, f in enumerate(self.faults):
            if not f.applies_to(rank) or f.at_point is None or not fnmatch.fnmatchcase(name, f.at_point):
                continue
            st = self._st(i, rank)
            if f.kind is FaultType.SLOW_LINK:
                if i not in self._links_slowed:  # the first rank to reach the point slows the link, once
                    self._links_slowed.add(i)
                    self._slow(f)
                continue
            if self._time_ok(f):
                st.triggered = True
        return self._first(rank, (FaultType.CRASH, FaultType.HANG), f"point {name!r}")

    def on_collective(self, rank: int, group: str, op: str, seq: int) -> FaultAction | None:
        """Entering a collective: crash/hang, NCCL error, corruption."""
        where = f"{op} on {group!r} seq {seq}"
        act = self._first(rank, (FaultType.CRASH, FaultType.HANG), where)
        if act is not None:
            return act
        return self._first(rank, (FaultType.NCCL_ERROR, FaultType.CANARY_CORRUPTION), where, group=group)

    def on_group_create(self, rank: int, spec: GroupSpec) -> FaultAction | None:
        """Entering new_group/recreate_group: crash/hang, EADDRINUSE on rebuilds."""
        where = f"{'recreate' if spec.generation else 'new'}_group {spec.name!r} gen {spec.generation}"
        act = self._first(rank, (FaultType.CRASH, FaultType.HANG), where)
        if act is not None or spec.generation == 0:
            return act
        return self._first(rank, (FaultType.ADDRESS_IN_USE,), where, group=spec.name)

    def on_pin(self, rank: int, nbytes: int) -> FaultAction | None:
        """Pinning a host buffer: pinning failure."""
        return self._first(rank, (FaultType.PIN_FAILURE,), f"pinning {nbytes:,} bytes", nbytes=nbytes)

    # ------------------------------------------------------------------ internals

    def _st(self, i: int, rank: int) -> _Armed:
        key = (i, rank)
        st = self._state.get(key)
        if st is None:
            st = self._state[key] = _Armed()
        return st

    def _now(self) -> float:
        return self._world.engine.now if self._world is not None else 0.0

    def _time_ok(self, f: Fault) -> bool:
        return f.at_time is None or self._now() >= f.at_time

    def _first(self, rank: int, kinds: tuple[FaultType, ...], where: str, *, group: str | None = None,
               nbytes: int | None = None) -> FaultAction | None:
        for i, f in enumerate(self.faults):
            if f.kind not in kinds or not f.applies_to(rank):
                continue
            if group is not None and not fnmatch.fnmatchcase(group, f.group):
                continue
            if nbytes is not None and nbytes < f.min_bytes:
                continue
            st = self._st(i, rank)
            if f.at_point is not None and not st.triggered:
                continue
            if not self._time_ok(f) or st.fired >= f.times:
                continue
            st.seen += 1
            if st.seen < f.nth:
                continue
            st.fired += 1
            self.fired.append(FiredFault(self._now(), rank, f.kind.value, where))
            log.info("fault plan: %s on rank %d %s", f.kind.value, rank, where)
            return self._action(f, rank, where)
        return None

    def _action(self, f: Fault, rank: int, where: str) -> FaultAction:
        k = f.kind
        if k is FaultType.CRASH:
            return FaultAction.crash()
        if k is FaultType.HANG:
            return FaultAction.hang()
        if k is FaultType.CANARY_CORRUPTION:
            return FaultAction.corrupt()
        if k is FaultType.NCCL_ERROR:
            return FaultAction.fail(CollectiveFailedError(
                f"rank {rank}: NCCL error (injected: ncclUnhandledCudaError) in {where}; the communicator is "
                "unusable; abort and rebuild the group"))
        if k is FaultType.ADDRESS_IN_USE:
            return FaultAction.fail(AddressInUseError(
                f"rank {rank}: {where}: Address already in use (injected: the rendezvous port is still in "
                "TIME_WAIT); wait for the port-release cooldown before rebuilding"))
        if k is FaultType.PIN_FAILURE:
            return FaultAction.fail(PinningError(
                f"rank {rank}: cudaHostRegister failed while {where} (injected: ulimit -l or out of host memory); "
                "fall back to pageable memory or free pinned buffers"))
        raise FaultPlanError(f"{k.value} is not a per-rank fault")  # pragma: no cover

    def _slow(self, f: Fault) -> None:
        world = self._world
        res = world.transport.resources_matching(f.link)
        world.transport.slow(res, f.factor)
        self.fired.append(FiredFault(world.engine.now, None, f.kind.value, f"{f.link} x{f.factor:g}"))
        log.info("fault plan: link %s slowed to x%g", f.link, f.factor)
        if f.duration_s is not None:
            world.engine.schedule(f.duration_s, world.transport.slow, res, 1.0)


def check_link(link: str, transport: Any, where: str) -> None:
    """Raise FaultPlanError naming ``where`` if ``link`` is no link, element or resource of the transport's topology."""
    from sim.machine.flows import FlowError, _endpoints

    try:
        transport.resources_matching(link)
    except FlowError:
        elements = sorted({e for name in transport.network.names for e in _endpoints(name)})
        shown = ", ".join(elements[:12]) + (" ..." if len(elements) > 12 else "")
        raise FaultPlanError(
            f"{where}: {link!r} is not a link or element of topology {transport.topology.name!r}; name an element "
            f"(one of {shown}) or a resource such as 'link:n0/gpu0>n0/pcisw0'"
        ) from None


__all__ = ["Fault", "FaultPlan", "FaultPlanError", "FaultType", "FaultWorld", "FiredFault", "check_link"]
