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
"""
from __future__ import annotations

import logging
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


@dataclass
class ControlGroup:
    """The Gloo group used for agreement, and the agreement operations on it."""

    name: str = CONTROL_GROUP
    timeout_s: float = 300.0
    backend: str = "gloo"
    #: agreements run so far (for benchmarks and tests)
    count: int = 0

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

    async def reduce_min(self, rt: Runtime, values: Sequence[int], point: str) -> list[int]:
        """Element-wise MIN of ``values`` over all ranks; raises :class:`AgreementError` on failure."""
        t = torch.tensor(list(values), dtype=torch.int64)
        self.count += 1
        try:
            await rt.all_reduce(t, ReduceOp.MIN, self.name, timeout_s=self.timeout_s)
        except CollectiveTimeoutError as exc:
            raise AgreementTimeoutError(
                f"rank {rt.rank}: agreement at {point!r} timed out after {self.timeout_s:g}s on control group "
                f"{self.name!r}: another rank crashed, hung or failed before reaching it"
            ) from exc
        except (CollectiveFailedError, GroupError) as exc:
            raise AgreementError(
                f"rank {rt.rank}: agreement at {point!r} failed on control group {self.name!r}: {exc}"
            ) from exc
        return [int(v) for v in t.tolist()]

    async def agree(self, rt: Runtime, flag: bool, point: str = "agree") -> bool:
        """True on every rank iff every rank passed True."""
        (value,) = await self.reduce_min(rt, [int(bool(flag))], point)
        return bool(value)


__all__ = ["AgreementError", "AgreementTimeoutError", "CONTROL_GROUP", "ControlGroup"]
