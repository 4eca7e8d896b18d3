"""LifecycleConfig refuses settings that would break the lifecycle, and the error tree users catch."""
from __future__ import annotations

import pytest

from refimpl.comm import (
    LifecycleConfig,
    LifecycleError,
    LifecycleFailedError,
    LifecycleStateError,
    PeerFailedError,
    PGPolicy,
    ResumeMemoryError,
)


@pytest.mark.parametrize("field,value", [("agree_timeout_s", 0.0), ("canary_timeout_s", 0.0),
                                         ("agree_timeout_s", float("inf")), ("cooldown_s", -1.0),
                                         ("cooldown_s", float("nan"))])
def test_a_timeout_that_cannot_work_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"LifecycleConfig\.{field} must be a finite number of seconds"):
        LifecycleConfig(**{field: value})


def test_a_zero_cooldown_and_a_policy_by_name_are_accepted():
    cfg = LifecycleConfig(cooldown_s=0.0, policy="Suspend-Planned")
    assert cfg.policy is PGPolicy.SUSPEND_PLANNED
    with pytest.raises(ValueError, match="rebuild_retries must be >= 0"):
        LifecycleConfig(rebuild_retries=-1)
    with pytest.raises(ValueError, match="unknown process-group policy"):
        LifecycleConfig(policy="keep")


def test_every_lifecycle_error_is_caught_by_except_lifecycle_error():
    for cls in (LifecycleStateError, LifecycleFailedError, PeerFailedError, ResumeMemoryError):
        assert issubclass(cls, LifecycleError), cls
