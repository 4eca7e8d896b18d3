"""Settings and counters of a :class:`refimpl.comm.PGLifecycle`.

Both the lifecycle and its :class:`refimpl.comm.role_groups.RoleGroups` read them,
so they live below both.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from refimpl.arguments import ArgumentTypeError, describe, expect, expect_bool, expect_int
from refimpl.comm.agreement import CONTROL_GROUP
from refimpl.comm.states import PGPolicy


@dataclass(frozen=True)
class LifecycleConfig:
    """Validated settings of a :class:`PGLifecycle`.

    ``canary_value`` is what this rank contributes to each canary all-reduce;
    healthy ranks contribute 1.0 and the sum must equal the group size. Setting
    it to anything else on one rank is the documented way to make a canary fail
    (tests, fire drills).

    ``parallel_destroy``: a walk's destroys run together
    (:meth:`Runtime.destroy_groups <refimpl.runtime.base.Runtime.destroy_groups>`)
    instead of one after the other. Every destroy of an initialised NCCL
    communicator waits for its proxy thread's next 500 ms poll timeout, so a walk
    over groups a training step has just initialised takes whole poll periods one
    by one and about one period together (docs/calibration.md has the measured
    walks). Every rank still destroys every group of the walk whatever fails,
    and the walk ends in one agreement.

    ``warm_rebuilt``: after a rebuild, run one one-element all-reduce on each
    rebuilt group (in group order, on every member), so the communicator is
    created inside the rebuild instead of at training's first collective (torch
    creates NCCL communicators lazily). The cost is the same; where it lands
    changes: a resume that runs beside the reload's copies
    (:class:`refimpl.comm.overlap.OverlappedSwitch`) hides it under them
    (docs/comm.md, "The switch beside the copies", has the measurement). A failed or timed-out warm-up (``canary_timeout_s``) is a failure of the
    rebuild, agreed like any other.
    """

    policy: PGPolicy = PGPolicy.DESTROY_DEFERRED
    cooldown_s: float = 2.0
    two_phase: bool = True
    canary_timeout_s: float = 30.0
    agree_timeout_s: float = 300.0
    control_group: str = CONTROL_GROUP
    rebuild_retries: int = 3
    canary_value: float = 1.0
    parallel_destroy: bool = False
    warm_rebuilt: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.policy, str):  # the strings scenarios and the CLI use are accepted too
            object.__setattr__(self, "policy", PGPolicy.parse(self.policy))
        if not isinstance(self.policy, PGPolicy):
            raise ArgumentTypeError(f"LifecycleConfig: policy must be a PGPolicy or its name, got {self.policy!r}")
        self._check_types()
        for name in ("cooldown_s", "canary_timeout_s", "agree_timeout_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0) or (name != "cooldown_s" and v == 0):
                raise ValueError(f"LifecycleConfig.{name} must be a finite number of seconds > 0 (>= 0 for cooldown), got {v}")
        if self.rebuild_retries < 0:
            raise ValueError(f"LifecycleConfig.rebuild_retries must be >= 0, got {self.rebuild_retries}")
        if not self.control_group:
            raise ValueError("LifecycleConfig.control_group needs a name")

    def _check_types(self) -> None:
        where = "LifecycleConfig(...)"
        for name in ("cooldown_s", "canary_timeout_s", "agree_timeout_s", "canary_value"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ArgumentTypeError(f"{where}: {name} must be a number, got {describe(v)}")
        expect_bool(self.two_phase, where, "two_phase")
        expect_bool(self.parallel_destroy, where, "parallel_destroy")
        expect_int(self.rebuild_retries, where, "rebuild_retries")
        expect(self.control_group, str, where, "control_group", "a group name (str)")


@dataclass
class LifecycleStats:
    """Counters of what the lifecycle did (benchmarks and tests read them)."""

    pauses: int = 0
    weight_syncs: int = 0
    resumes: int = 0
    destroys: int = 0
    rebuilds: int = 0
    comm_suspends: int = 0
    comm_resumes: int = 0
    canaries: int = 0
    canary_failures: int = 0
    address_in_use_retries: int = 0
    lazy_bring_ups: int = 0  #: groups a lazy wake left down and use() brought back
    warm_ups: int = 0  #: rebuilt groups whose communicator a warm-up collective created (``warm_rebuilt``)
    fallbacks: int = 0


__all__ = ["LifecycleConfig", "LifecycleStats"]
