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
it is about: its sequence number on this control group and a code of its point
(``"pause.decide"``, ``"use.request"``, ...), each reduced as ``x`` and ``-x``
so that MIN shows whether every rank sent the same. The values are padded to
one width per control group (:attr:`ControlGroup.width`, set by the lifecycle
from its number of groups), so two different agreements met by two ranks (one
rank skipped an operation its peer ran) still form one collective of one shape:
both ranks see that the headers differ and raise
:class:`AgreementMismatchError` naming both points, instead of pairing stale
votes (or, on Gloo, a buffer of the wrong size that aborts the process).
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
    "start", "user", "pause.decide", "plan", "plan.preflight", "plan.apply", "release_memory", "canary",
    "weight_sync", "use.request", "run_on", "suspend.preflight", "suspend", "resume.preflight", "resume",
    "destroy", "rebuild",
)

#: point code -> point name, for :data:`POINTS` and the points this process has agreed on
_POINTS: dict[int, str] = {}


def point_code(point: str) -> int:
    """A small non-negative integer naming ``point`` (the same on every rank: crc32 of its name)."""
    code = zlib.crc32(point.encode()) & 0x7FFFFFFF
    _POINTS.setdefault(code, point)
    return code


for _p in POINTS:
    point_code(_p)


def _point_name(code: int) -> str:
    return repr(_POINTS[code]) if code in _POINTS else f"an agreement this rank never ran (code {code})"


@dataclass
class ControlGroup:
    """The Gloo group used for agreement, and the agreement operations on it."""

    name: str = CONTROL_GROUP
    timeout_s: float = 300.0
    backend: str = "gloo"
    #: agreements run so far (for benchmarks and tests); also each agreement's sequence number
    count: int = 0
    #: values per agreement, padded (0: as many as given); the same on every rank, at least the longest agreement
    width: int = 0

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

        The agreement carries its sequence number and ``point`` (see the module
        note): a peer at another agreement raises :class:`AgreementMismatchError` on every rank.
        ``timeout_s``: how long to wait for the peers (default :attr:`timeout_s`).
        """
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        n = len(values)
        if self.width and n > self.width:
            raise ValueError(f"agreement at {point!r} has {n} values; control group {self.name!r} carries at most "
                             f"{self.width} (ControlGroup.width)")
        seq, code = self.count, point_code(point)
        t = torch.tensor([seq, -seq, code, -code, *values] + [0] * (max(self.width, n) - n), dtype=torch.int64)
        self.count += 1
        try:
            await rt.all_reduce(t, ReduceOp.MIN, self.name, timeout_s=wait_s)
        except CollectiveTimeoutError as exc:
            raise AgreementTimeoutError(
                f"rank {rt.rank}: agreement at {point!r} timed out after {wait_s:g}s on control group "
                f"{self.name!r}: another rank crashed, hung or failed before reaching it"
            ) from exc
        except (CollectiveFailedError, GroupError) as exc:
            raise AgreementError(
                f"rank {rt.rank}: agreement at {point!r} failed on control group {self.name!r}: {exc}"
            ) from exc
        got = [int(v) for v in t.tolist()]
        lo_seq, hi_seq, lo_code, hi_code = got[0], -got[1], got[2], -got[3]
        if (lo_seq, lo_code) != (hi_seq, hi_code):
            other = lo_code if lo_code != code else hi_code
            raise AgreementMismatchError(
                f"rank {rt.rank}: agreement #{seq} at {point!r} met a different agreement on another rank "
                f"({_point_name(other) if other != code else repr(point)}, agreement numbers {lo_seq}..{hi_seq}) on "
                f"control group {self.name!r}: the ranks called the lifecycle's operations (pause, weight_sync, "
                "resume, use, run_on, agree) in different orders; every rank must make the same calls"
            )
        return got[4:4 + n]

    async def agree(self, rt: Runtime, flag: bool, point: str = "agree") -> bool:
        """True on every rank iff every rank passed True."""
        (value,) = await self.reduce_min(rt, [int(bool(flag))], point)
        return bool(value)


__all__ = ["AgreementError", "AgreementMismatchError", "AgreementTimeoutError", "CONTROL_GROUP", "ControlGroup", "POINTS",
           "point_code"]
