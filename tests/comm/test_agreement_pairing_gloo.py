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


def _one_agreement_ahead(rank, world_size):
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    lc = PGLifecycle(rt, [GroupSpec("ahead.dp", (0, 1))], config=LifecycleConfig(
        policy=PGPolicy.DESTROY_DEFERRED, cooldown_s=0.1, agree_timeout_s=AGREE_S, canary_timeout_s=4,
        control_group="ahead.control"))
    lc.sync.pause()
    lc.sync.weight_sync(lambda: None)
    lc.sync.resume()  # in step so far
    at = lc.control.count
    if rank == 1:
        # one agreement ahead at the same point (what an agreement its peer never saw leaves behind)
        lc.control.count += 1
    t0 = time.monotonic()
    try:
        lc.sync.pause()
        error = None
    except Exception as exc:  # noqa: BLE001 - which error, is the assertion
        error = (type(exc).__name__, str(exc))
    return dict(at=at, error=error, state=lc.state.name, took=time.monotonic() - t0)


def test_a_rank_one_agreement_ahead_at_the_same_point_is_a_mismatch_on_every_rank():
    out = run_distributed(_one_agreement_ahead, 2, (), timeout=90)
    at = out[0]["at"]
    assert [o["state"] for o in out] == ["FAILED", "FAILED"], out
    for o in out:
        name, msg = o["error"]
        assert name == "AgreementMismatchError" and "'pause.decide'" in msg, o
        assert f"agreement numbers {at}..{at + 1}" in msg, msg
        assert o["took"] < AGREE_S, "reported at once"


def _skip_use_and_collective(rank, world_size):
    import torch

    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.comm.group_plan import GroupPlanRules
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    p = "raw"
    groups = [GroupSpec(f"{p}.dp", tuple(range(world_size))), GroupSpec(f"{p}.ep", tuple(range(world_size)))]
    config = LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, cooldown_s=0.2, agree_timeout_s=AGREE_S,
                             canary_timeout_s=4, two_phase=False, control_group=f"{p}.control")
    lc = PGLifecycle(rt, groups, config=config, plan=GroupPlanRules(wake_groups={f"{p}.dp"}, destroy={f"{p}.ep"}))
    lc.sync.pause()
    lc.sync.weight_sync(lambda: None)
    time.sleep(0.3)
    lc.sync.resume()  # ACTIVE_LAZY: ep left down
    out = {"lazy": lc.state.name}
    errors = []
    t0 = time.monotonic()
    if rank == 0:
        calls = [lambda: lc.sync.use([f"{p}.ep"])]
    else:  # skips use() and goes straight to a collective on the group left down, then to its next pause
        calls = [lambda: rt.run(rt.all_reduce(torch.ones(1), group=f"{p}.ep", timeout_s=4)),
                 lambda: time.sleep(AGREE_S + 1), lc.sync.pause]
    for call in calls:
        t1 = time.monotonic()
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - which error, is the assertion
            errors.append((type(exc).__name__, str(exc)[:400], time.monotonic() - t1))
    out.update(state=lc.state.name, errors=errors, took=time.monotonic() - t0)
    return out


def test_a_rank_that_skips_use_is_named_by_its_peers_and_every_rank_ends_failed():
    """The rank that called ``use()`` fails at the agreement timeout naming the rank that never came; the skipping
    rank's collective on the group left down is refused at once, and its next lifecycle call fails too."""
    out = run_distributed(_skip_use_and_collective, 2, (), timeout=120)
    assert [o["lazy"] for o in out] == ["ACTIVE_LAZY", "ACTIVE_LAZY"]
    (name, msg, took), = out[0]["errors"]
    assert name == "AgreementTimeoutError" and "'use.request'" in msg and "ranks [1] never reached it" in msg, msg
    assert took < AGREE_S + 2.0
    refused, paused = out[1]["errors"]
    assert refused[0] == "GroupError" and "'raw.ep'" in refused[1] and refused[2] < 1.0, refused
    assert paused[0] in ("AgreementError", "AgreementMismatchError", "AgreementTimeoutError"), paused
    assert [o["state"] for o in out] == ["FAILED", "FAILED"], out
