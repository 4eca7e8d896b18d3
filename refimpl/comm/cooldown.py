"""The deferred port-release cooldown: a deadline that only grows.

After NCCL groups are destroyed, their sockets' ports stay in TCP TIME_WAIT for
a while, and a rebuild that reuses them too early fails with "Address already in
use". The Relax baseline waits a fixed 2 s right after every destroy. Here a
destroy only records ``deadline = max(deadline, now + delay)``, and a rebuild
waits for ``deadline - now`` if that is still positive. Between a destroy before
the rollout and the rebuild after it there are usually minutes, so nothing is
left to wait. TIME_WAIT runs on the wall clock whether or not the process sleeps,
which is why overlapping it with useful work is safe.

Time comes from the runtime (:meth:`Runtime.now` / :meth:`Runtime.sleep`), so
the simulator runs the same arithmetic on simulated time.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from refimpl.runtime.base import Runtime

log = logging.getLogger(__name__)


@dataclass
class PortCooldown:
    """The deadline before which a rebuilt group may hit ports still in TIME_WAIT."""

    delay_s: float = 2.0
    #: absolute time (runtime clock) before which a rebuild must not start; only grows
    deadline: float = -math.inf
    #: total time actually spent waiting for it
    waited_s: float = 0.0
    #: how many waits found time left
    waits: int = 0
    history: list[float] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not (self.delay_s >= 0 and math.isfinite(self.delay_s)):
            raise ValueError(f"cooldown delay must be a finite number >= 0 seconds, got {self.delay_s}")

    def defer(self, now: float, delay_s: float | None = None) -> float:
        """Record that ports were released at ``now``; returns the (possibly unchanged) deadline."""
        delay = self.delay_s if delay_s is None else delay_s
        if delay < 0:
            raise ValueError(f"cooldown delay must be >= 0 seconds, got {delay}")
        self.deadline = max(self.deadline, now + delay)
        self.history.append(self.deadline)
        return self.deadline

    def remaining(self, now: float) -> float:
        """Seconds still to wait at ``now`` (0 if the deadline has passed)."""
        return max(0.0, self.deadline - now)

    async def wait(self, rt: Runtime) -> float:
        """Wait only for what is left of the cooldown; returns the seconds waited."""
        left = self.remaining(rt.now())
        if left > 0:
            log.debug("waiting %.3fs for released ports to leave TIME_WAIT", left)
            with rt.span("lifecycle.cooldown"):
                await rt.sleep(left)
            self.waited_s += left
            self.waits += 1
        return left


__all__ = ["PortCooldown"]
