"""Agreements cannot pair across operations, on real Gloo processes (TorchRuntime, tests/_dist.py).

Every agreement on the control group carries its operation and its sequence
number. One rank that skips ``use()`` while its peer calls it (a lazy wake's
program out of step) used to pair the peer's ``use`` agreement with its own next
``pause``: a collective of the wrong shape, ranks in different states. Now the
mismatch is reported as such (``AgreementMismatchError``) on every rank, within
the agreement timeout, and every rank ends FAILED.
"""
from __future__ import annotations

import time

import pytest

from tests._dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

AGREE_S = 4.0


def _skip_use(rank, world_size, late):
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.comm.group_plan import GroupPlanRules
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    p = "skip"
    groups = [GroupSpec(f"{p}.dp", tuple(range(world_size))), GroupSpec(f"{p}.ep", tuple(range(world_size)))]
    config = LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, cooldown_s=0.2, agree_timeout_s=AGREE_S,
                             canary_timeout_s=4, two_phase=False, control_group=f"{p}.control")
    rules = GroupPlanRules(wake_groups={f"{p}.dp"}, destroy={f"{p}.dp", f"{p}.ep"})
    lc = PGLifecycle(rt, groups, config=config, plan=rules)
    lc.sync.pause()
    lc.sync.weight_sync(lambda: None)
    time.sleep(0.3)
    lc.sync.resume()  # ACTIVE_LAZY: ep left down
    out = {"lazy": lc.state.name}
    t0 = time.monotonic()
    errors = []
    for call in ((lambda: lc.sync.use([f"{p}.ep"])) if rank == 0 else (lambda: time.sleep(late)), lc.sync.pause):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - which error, is the assertion
            errors.append((type(exc).__name__, str(exc)[:300]))
    out.update(state=lc.state.name, errors=errors, took=time.monotonic() - t0)
    return out


@pytest.mark.parametrize("late", [0.0, 2 * AGREE_S], ids=["at_once", "after_the_peer_timed_out"])
def test_a_rank_that_skips_use_meets_a_reported_mismatch_and_every_rank_ends_failed(late):
    out = run_distributed(_skip_use, 2, (late,), timeout=90)
    assert [o["lazy"] for o in out] == ["ACTIVE_LAZY", "ACTIVE_LAZY"]
    assert [o["state"] for o in out] == ["FAILED", "FAILED"], out
    first = [o["errors"][0] for o in out]
    if late == 0.0:  # they meet at once: both see the mismatch, named as such
        for name, msg in first:
            assert name == "AgreementMismatchError" and "'use.request'" in msg and "'pause.decide'" in msg, first
    else:  # rank 0 waited alone: a timeout; rank 1's pause then fails within the agreement timeout too (Gloo
        # closed the pair rank 0 gave up on, so rank 1 hears of that, not of a stale vote)
        assert first[0][0] == "AgreementTimeoutError", first
        assert first[1][0] in ("AgreementError", "AgreementMismatchError", "AgreementTimeoutError"), first
    assert all(o["took"] < late + 3 * AGREE_S for o in out), out
