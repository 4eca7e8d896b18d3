"""Agreement: every branch of the lifecycle is decided by all ranks together.

Each rank contributes small integers; an ``all_reduce(MIN)`` over a control
group gives every rank the same answer. A flag agrees to True only if every rank
said True; a policy code is checked by reducing ``code`` and ``-code`` at once
(min == max means all ranks asked for the same). The control group is a Gloo
group the lifecycle creates and never destroys or suspends, so agreement works
while the role's NCCL groups are destroyed, suspended or broken.

Every agreement has a timeout. A rank that never arrives (crashed, hung, or
stuck in an earlier collective) makes the others fail with
:class:`AgreementTimeoutError` within that bound instead of hanging: the whole
job fails together, never partially.

[Note: agreements cannot pair across operations] Every agreement carries what
it is about: its sequence number on this control group, the scope of the
agreements (:attr:`ControlGroup.scope`: a lifecycle's role, named by its groups),
a code of its point (``"pause.decide"``, ``"use.request"``, ...) and its number
of values, each reduced as ``x`` and ``-x`` so that MIN shows whether every rank
sent the same. Every collective on a control group has one shape
(:data:`SLOTS` values; an agreement with more values takes more collectives of
that shape, each with the header), so two different agreements met by two ranks
(one rank skipped an operation its peer ran, or ran another role's lifecycle
first: two lifecycles of a process may share one control group) still form one
collective of one shape: every rank sees that the headers differ and raises
:class:`AgreementMismatchError` naming both sides, instead of pairing stale
votes or another role's (or, on Gloo, a buffer of the wrong size that aborts
the process). A header whose MIN of ``-x`` is above its MIN of ``x`` cannot come
out of an ``all_reduce(MIN)``: the result is corrupted on this rank and the
agreement raises :class:`AgreementError` saying so.

Each rank marks its arrival at each agreement (:meth:`Runtime.mark_arrival
<refimpl.runtime.base.Runtime.mark_arrival>`, one counter per scope and point), so
an agreement that times out names the ranks that never reached it (a rank that
skipped ``use()``, a rank that failed and stopped calling the lifecycle).
"""
from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from typing import Sequence

import torch

from refimpl.runtime.base import (
    CollectiveFailedError,
    CollectiveTimeoutError,
    GroupError,
    GroupSpec,
    ReduceOp,
    Runtime,
)

log = logging.getLogger(__name__)

CONTROL_GROUP = "lifecycle.control"
"""Default name of the control group."""


class AgreementError(RuntimeError):
    """Ranks could not agree (a peer is missing, the control group failed, or ranks disagree on a must-match value)."""


class AgreementTimeoutError(AgreementError):
    """A rank did not reach an agreement point within the timeout."""


class AgreementMismatchError(AgreementError):
    """Ranks met at different agreements (another point or sequence number): one skipped or added an operation."""


#: the lifecycle's agreement points, so that a mismatch names a peer's point this rank never reached
POINTS: tuple[str, ...] = (
    "start", "create", "user", "pause.decide", "plan", "plan.preflight", "plan.apply", "release_memory", "canary",
    "weight_sync", "use.request", "run_on", "suspend.preflight", "suspend", "resume.preflight", "resume",
    "destroy", "rebuild.preflight", "rebuild", "warm",
)

#: values in every collective on a control group: the header (:data:`HEADER`) and up to ``SLOTS - HEADER`` of the
#: agreement's own (more take several collectives); 1 KiB of int64, as cheap as a few values on Gloo
SLOTS = 128
#: the header: sequence number, scope code, point code and number of values, each as ``x`` and ``-x``
HEADER = 8

#: point code -> point name, for :data:`POINTS` and the points this process has agreed on
_POINTS: dict[int, str] = {}
#: scope code -> scope, for the control groups of this process (a peer's lifecycle is named by its role's groups)
_SCOPES: dict[int, str] = {}


def _code(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def point_code(point: str) -> int:
    """A small non-negative integer naming ``point`` (the same on every rank: crc32 of its name)."""
    code = _code(point)
    _POINTS.setdefault(code, point)
    return code


for _p in POINTS:
    point_code(_p)


def scope_code(scope: str) -> int:
    """A small non-negative integer naming ``scope`` (crc32 of it; 0 for no scope), remembered for messages."""
    if not scope:
        return 0
    code = _code(scope)
    _SCOPES.setdefault(code, scope)
    return code


def _point_name(code: int) -> str:
    return repr(_POINTS[code]) if code in _POINTS else f"an agreement this rank never ran (code {code})"


def _scope_name(code: int) -> str:
    if code == 0:
        return "agreements of no scope"
    return _SCOPES[code] if code in _SCOPES else f"a scope this process does not have (code {code})"


@dataclass
class ControlGroup:
    """The Gloo group used for agreement, and the agreement operations on it.

    ``scope``: what its agreements are about, the same text on every rank (a lifecycle passes its role's group
    names); agreements of another scope met on the same group raise :class:`AgreementMismatchError`.
    """

    name: str = CONTROL_GROUP
    timeout_s: float = 300.0
    backend: str = "gloo"
    #: agreements run so far (for benchmarks and tests); also each agreement's sequence number
    count: int = 0
    scope: str = ""

    async def ensure(self, rt: Runtime) -> None:
        """Create the control group over all ranks unless it already exists (every rank calls this)."""
        try:
            rt.group_spec(self.name)
            if not rt.group_live(self.name):
                raise AgreementError(f"control group {self.name!r} exists but was destroyed; it must stay live")
            return
        except GroupError:
            pass
        spec = GroupSpec(self.name, tuple(range(rt.world_size)), backend=self.backend, timeout_s=self.timeout_s)
        await rt.new_group(spec)

    async def reduce_min(self, rt: Runtime, values: Sequence[int], point: str, *,
                         timeout_s: float | None = None) -> list[int]:
        """Element-wise MIN of ``values`` over all ranks; raises :class:`AgreementError` on failure.

        The agreement carries its sequence number, scope, ``point`` and size (see the module
        note): a peer at another agreement raises :class:`AgreementMismatchError` on every rank.
        ``timeout_s``: how long to wait for the peers (default :attr:`timeout_s`).
        """
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        n, room = len(values), SLOTS - HEADER
        seq, scope, code = self.count, scope_code(self.scope), point_code(point)
        header = [seq, -seq, scope, -scope, code, -code, n, -n]
        self.count += 1
        arrival = f"{scope}.{point}"
        rt.mark_arrival(self.name, arrival)
        got: list[int] = []
        for start in range(0, max(n, 1), room):
            part = [int(v) for v in values[start:start + room]]
            t = torch.tensor(header + part + [0] * (room - len(part)), dtype=torch.int64)
            await self._all_reduce(rt, t, point, wait_s, arrival)
            out = [int(v) for v in t.tolist()]
            self._check_header(rt, out[:HEADER], header, point)
            got += out[HEADER:HEADER + len(part)]
        return got

    async def _all_reduce(self, rt: Runtime, t: torch.Tensor, point: str, wait_s: float, arrival: str) -> None:
        try:
            await rt.all_reduce(t, ReduceOp.MIN, self.name, timeout_s=wait_s)
        except CollectiveTimeoutError as exc:
            absent = rt.absent_ranks(self.name, arrival)
            who = (f"ranks {list(absent)} never reached it" if absent else
                   "another rank crashed, hung or failed before reaching it")
            raise AgreementTimeoutError(
                f"rank {rt.rank}: agreement at {point!r} timed out after {wait_s:g}s on control group {self.name!r}: "
                f"{who} (agreement #{self.count - 1} of {_scope_name(scope_code(self.scope))}; a rank that skipped "
                "an operation its peers ran, e.g. use() after a lazy wake, or that stopped calling the lifecycle)"
            ) from exc
        except (CollectiveFailedError, GroupError) as exc:
            raise AgreementError(
                f"rank {rt.rank}: agreement at {point!r} failed on control group {self.name!r}: {exc}"
            ) from exc

    def _check_header(self, rt: Runtime, got: list[int], sent: list[int], point: str) -> None:
        """Raise unless every rank sent this agreement's header (see the module note)."""
        lo = got[0::2]
        hi = [-v for v in got[1::2]]
        if any(a > b for a, b in zip(lo, hi)):
            raise AgreementError(
                f"rank {rt.rank}: agreement #{sent[0]} at {point!r} on control group {self.name!r} came back as "
                f"{got} on this rank, which no all_reduce(MIN) of [x, -x] pairs can give: the control group's "
                "result is corrupted on this rank; its peers may have read another result, so stop the job"
            )
        if lo == hi:
            return
        mine = sent[0::2]
        other = [a if a != m else b for a, b, m in zip(lo, hi, mine)]
        parts = []
        if other[1] != mine[1]:
            parts.append(f"of {_scope_name(other[1])}")
        if other[2] != mine[2]:
            parts.append(f"at {_point_name(other[2])}")
        if lo[0] != hi[0]:
            parts.append(f"agreement numbers {lo[0]}..{hi[0]}")
        if other[3] != mine[3]:
            parts.append(f"{other[3]} values against {mine[3]}")
        if other[1] != mine[1]:
            advice = ("ranks called the operations of different lifecycles (roles) at the same time: every rank must "
                      "call the lifecycles of its process in the same order, and pass each the same group names")
        else:
            advice = ("the ranks called the lifecycle's operations (pause, weight_sync, resume, use, run_on, agree) "
                      "in different orders; every rank must make the same calls")
        raise AgreementMismatchError(
            f"rank {rt.rank}: agreement #{mine[0]} at {point!r} of {_scope_name(mine[1])} met a different agreement "
            f"on another rank ({', '.join(parts)}) on control group {self.name!r}: {advice}"
        )

    async def agree(self, rt: Runtime, flag: bool, point: str = "agree") -> bool:
        """True on every rank iff every rank passed True."""
        (value,) = await self.reduce_min(rt, [int(bool(flag))], point)
        return bool(value)


__all__ = ["AgreementError", "AgreementMismatchError", "AgreementTimeoutError", "CONTROL_GROUP", "ControlGroup", "HEADER",
           "POINTS", "SLOTS", "point_code", "scope_code"]
