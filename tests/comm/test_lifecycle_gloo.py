"""PGLifecycle on real Gloo processes (TorchRuntime): every transition, driven by real collectives.

Each test spawns real ``torch.distributed`` processes (tests/_dist.py); no part of
the runtime is faked. Faults are injected the honest way: a rank contributes a
wrong canary value (``LifecycleConfig.canary_value``), a rank's gate fails, the
weight-sync function raises or sleeps past the agreement timeout.
"""
from __future__ import annotations

import time

import pytest

from tests._dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TP, DP = (0, 1), (0, 1, 2)


def _lifecycle(rt, prefix, policy, **cfg):
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec

    config = LifecycleConfig(
        policy=PGPolicy[policy], cooldown_s=cfg.pop("cooldown_s", 0.2), agree_timeout_s=cfg.pop("agree_timeout_s", 30),
        canary_timeout_s=cfg.pop("canary_timeout_s", 10), control_group=f"{prefix}.control", **cfg,
    )
    groups = [GroupSpec(f"{prefix}.tp", TP), GroupSpec(f"{prefix}.dp", tuple(range(rt.world_size)))]
    return config, groups


def _sums(rt, names):
    """all_reduce(SUM) of 1 on every member group: the group size if the communicator works."""
    import torch

    out = {}
    for name in names:
        if rt.is_member(name):
            t = torch.ones(1)
            rt.run(rt.all_reduce(t, group=name, timeout_s=10))
            out[name] = int(t.item())
    return out


def _gather_ranks(rt, group):
    """The weight sync's collective: all-gather every member's rank over ``group``."""
    import torch

    if not rt.is_member(group):
        return None
    size = rt.group_size(group)
    out = torch.empty(size, dtype=torch.int64)
    rt.run(rt.all_gather_into_tensor(out, torch.tensor([rt.rank]), group, timeout_s=10))
    return out.tolist()


# --------------------------------------------------------------------------- happy paths


def _happy_paths(rank, world_size, rollout_s):
    from refimpl.comm import PGLifecycle
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    rt.run(rt.new_group(GroupSpec("weights", tuple(range(world_size)))))  # cross-role: resident
    report = {}
    for policy in ("DESTROY", "DESTROY_DEFERRED", "PAUSED_LIVE"):
        p = policy.lower()
        config, groups = _lifecycle(rt, p, policy)
        lc = PGLifecycle(rt, groups, config=config, resident=["weights"])
        sync = lc.sync
        sync.start()
        steps = []
        for _ in range(3):
            released = []
            t0 = rt.now()
            state = sync.pause(release_memory=lambda: released.append(True))
            pause_s = rt.now() - t0
            during = {g: rt.group_live(g) for g in lc.groups}
            t0 = rt.now()
            gathered = sync.weight_sync(lambda: _gather_ranks(rt, f"{p}.dp"))
            sync_s = rt.now() - t0
            time.sleep(rollout_s)  # the rollout: wall time passes, ports cool down
            waits_before = lc.cooldown.waits
            sync.resume()
            steps.append(dict(
                state=state.name, released=released, live_while_paused=during, gathered=gathered,
                sums=_sums(rt, lc.groups), resident=_sums(rt, ["weights"]),
                generation=rt.group_spec(f"{p}.tp").generation, pause_s=pause_s, sync_s=sync_s,
                resume_waited=lc.cooldown.waits > waits_before,
            ))
        report[policy] = dict(
            steps=steps, end=lc.state.name, waited=lc.cooldown.waited_s, canaries=lc.stats.canaries,
            history=[(a.name, e.name, b.name) for _, a, e, b in lc.history],
            resident_generation=rt.group_spec("weights").generation,
        )
    return report


def test_happy_paths_of_each_policy_keep_every_rank_in_step():
    cooldown, rollout = 0.2, 0.4
    results = run_distributed(_happy_paths, 3, args=(rollout,), timeout=180)
    for rank, report in enumerate(results):
        expected_sums = lambda p: {n: s for n, s in ((f"{p}.tp", 2), (f"{p}.dp", 3)) if rank in (TP if "tp" in n else DP)}
        for policy, r in report.items():
            p = policy.lower()
            assert r["end"] == "ACTIVE"
            assert r["resident_generation"] == 0, "the resident weight-update group must never be rebuilt"
            for s in r["steps"]:
                assert s["released"] == [True], "release_memory runs once per pause"
                assert s["gathered"] == [0, 1, 2], "the weight sync's collective saw every rank"
                assert s["sums"] == expected_sums(p), "groups work again after resume"
                assert s["resident"] == {"weights": 3}
        # DESTROY: destroyed at every pause, two inline 2 s-style waits per step, rebuilt twice per step
        d = report["DESTROY"]
        assert [s["state"] for s in d["steps"]] == ["DESTROYED"] * 3
        assert [s["generation"] for s in d["steps"]] == [2, 4, 6]
        assert all(not any(s["live_while_paused"].values()) for s in d["steps"])
        assert all(s["pause_s"] >= cooldown * 0.95 for s in d["steps"]), "the baseline waits inline at destroy"
        assert d["waited"] >= 6 * cooldown * 0.95
        # DESTROY_DEFERRED: the pause does not wait; the rebuild after the rollout waits nothing
        dd = report["DESTROY_DEFERRED"]
        assert [s["generation"] for s in dd["steps"]] == [2, 4, 6]
        assert all(s["pause_s"] < cooldown for s in dd["steps"])
        assert not any(s["resume_waited"] for s in dd["steps"]), "the rollout outlasted the cooldown"
        assert dd["waited"] < d["waited"] / 1.5
        # PAUSED_LIVE: two-phase enabling; first pause destroys, later ones keep the groups live
        pl = report["PAUSED_LIVE"]
        assert [s["state"] for s in pl["steps"]] == ["DESTROYED", "PAUSED_LIVE", "PAUSED_LIVE"]
        assert [s["generation"] for s in pl["steps"]] == [2, 2, 2], "no rebuild once preservation is ready"
        assert all(pl["steps"][i]["live_while_paused"] == {"paused_live.dp": True, "paused_live.tp": True} for i in (1, 2))
        assert pl["canaries"] == 2
        assert ("ACTIVE", "PAUSE_LIVE", "PAUSED_LIVE") in pl["history"]
        assert ("PAUSED_LIVE", "RESUME", "ACTIVE") in pl["history"]
    assert results[0]["PAUSED_LIVE"]["history"] == results[2]["PAUSED_LIVE"]["history"]


# --------------------------------------------------------------------------- fault scenarios (one spawn)


def _fault_scenarios(rank, world_size):
    """Each scenario on a fresh TorchRuntime: preservation is switched off per runtime (= per process)."""
    from refimpl.torch_runtime import TorchRuntime

    return {
        "canary": _canary_failure(TorchRuntime(), rank),
        "sync_raises": _sync_raises(TorchRuntime(), rank),
        "eligibility": _eligibility(TorchRuntime(), rank),
        "gloo_suspend": _gloo_suspend_and_mismatch(TorchRuntime(), rank),
    }


@pytest.fixture(scope="module")
def fault_scenarios():
    return run_distributed(_fault_scenarios, 3, timeout=180)


# --------------------------------------------------------------------------- canary failure


def _canary_failure(rt, rank):
    from refimpl.comm import PGLifecycle, preservation_disabled_reason

    # rank 1 contributes 0 instead of 1: every member's canary sum is wrong
    config, groups = _lifecycle(rt, "c", "PAUSED_LIVE", two_phase=False, canary_value=0.0 if rank == 1 else 1.0)
    lc = PGLifecycle(rt, groups, config=config)
    sync = lc.sync
    first = sync.pause()
    live_after = {g: rt.group_live(g) for g in lc.groups}
    gathered = sync.weight_sync(lambda: _gather_ranks(rt, "c.dp"))  # rebuilds the aborted groups
    sync.resume()
    second = sync.pause()  # preservation is now off for the process: the fallback path
    sync.resume()
    return dict(
        first=first.name, second=second.name, live_after=live_after, gathered=gathered, end=lc.state.name,
        disabled=preservation_disabled_reason(rt), failures=lc.stats.canary_failures,
        history=[(a.name, e.name, b.name) for _, a, e, b in lc.history], sums=_sums(rt, lc.groups),
    )


def test_canary_failure_on_one_rank_makes_every_rank_fall_back_and_disable_preservation(fault_scenarios):
    results = [r["canary"] for r in fault_scenarios]
    for rank, r in enumerate(results):
        assert r["first"] == "DESTROYED", "an agreed canary failure ends the pause with the groups aborted"
        assert not any(r["live_after"].values())
        assert ("PAUSED_LIVE", "CANARY_FAILED", "DESTROYED") in r["history"]
        assert r["failures"] == 1
        assert r["disabled"] and "canary" in r["disabled"]
        assert r["second"] == "DESTROYED", "preservation stays off for the life of the process"
        assert r["gathered"] == [0, 1, 2]
        assert r["end"] == "ACTIVE"
        assert r["sums"] == {n: len(TP if n.endswith("tp") else DP) for n in r["sums"]}
    assert len({tuple(r["history"]) for r in results}) == 1


# --------------------------------------------------------------------------- exception in weight update


def _sync_raises(rt, rank):
    from refimpl.comm import LifecycleFailedError, PeerFailedError, PGLifecycle, preservation_disabled_reason

    config, groups = _lifecycle(rt, "x", "PAUSED_LIVE", two_phase=False)
    lc = PGLifecycle(rt, groups, config=config)
    sync = lc.sync
    sync.pause()

    def update():
        if rank == 1:
            raise ValueError("weight update exploded on rank 1")
        return "ok"

    try:
        sync.weight_sync(update)
        raised = None
    except ValueError as e:
        raised = ("ValueError", str(e))
    except PeerFailedError as e:
        raised = ("PeerFailedError", str(e))
    try:
        sync.resume()
        after = None
    except LifecycleFailedError as e:
        after = str(e)
    return dict(raised=raised, state=lc.state.name, live=[rt.group_live(g) for g in lc.groups],
                disabled=preservation_disabled_reason(rt), after=after, control_live=rt.group_live("x.control"))


def test_exception_during_weight_update_fails_every_rank_and_tears_groups_down(fault_scenarios):
    results = [r["sync_raises"] for r in fault_scenarios]
    assert results[1]["raised"] == ("ValueError", "weight update exploded on rank 1"), "the failing rank re-raises its own error"
    for rank in (0, 2):
        kind, msg = results[rank]["raised"]
        assert kind == "PeerFailedError" and "rank 1 failed" in msg
    for r in results:
        assert r["state"] == "FAILED"
        assert r["live"] == [False, False], "role groups are aborted on every rank"
        assert r["control_live"], "the control group is never destroyed"
        assert r["disabled"] and "weight_sync" in r["disabled"]
        assert r["after"] and "Restart the workers" in r["after"]


# --------------------------------------------------------------------------- disagreeing eligibility


def _eligibility(rt, rank):
    from refimpl.comm import Gate, PGLifecycle

    config, groups = _lifecycle(rt, "e", "PAUSED_LIVE", two_phase=False)
    gates = [Gate("colocate", lambda ctx: True), Gate("pp_1", lambda ctx: ctx.facts["pp"] == 1)]
    lc = PGLifecycle(rt, groups, config=config, gates=gates, facts={"pp": 2 if rank == 2 else 1})
    sync = lc.sync
    from refimpl.comm import GateContext, PGPolicy, failing_gates

    failing = failing_gates(gates, GateContext(PGPolicy.PAUSED_LIVE, lc.groups, lc.facts, rank))
    states = []
    for _ in range(2):
        states.append(sync.pause().name)
        sync.weight_sync(lambda: None)
        sync.resume()
    return dict(failing=failing, states=states, eligible=lc.preservation.eligible, ready=lc.preservation.ready)


def test_a_rank_that_fails_a_gate_sends_every_rank_down_the_fallback_path(fault_scenarios):
    results = [r["eligibility"] for r in fault_scenarios]
    assert results[2]["failing"] == ["pp_1"], "the failing gate is reported by name"
    assert results[0]["failing"] == results[1]["failing"] == []
    for r in results:
        assert r["states"] == ["DESTROYED", "DESTROYED"], "no rank keeps its groups when one is ineligible"
        assert r["eligible"] is False and r["ready"] is False


# --------------------------------------------------------------------------- suspend on gloo, policy mismatch


def _gloo_suspend_and_mismatch(rt, rank):
    from refimpl.comm import PGLifecycle, PGPolicy, PolicyMismatchError

    config, groups = _lifecycle(rt, "s", "SUSPEND", two_phase=False)
    lc = PGLifecycle(rt, groups, config=config)
    try:
        lc.sync.pause()
        suspend_error = None
    except Exception as e:  # noqa: BLE001 - the type and text are what the test checks
        suspend_error = (type(e).__name__, str(e))
    config, groups = _lifecycle(rt, "m", "PAUSED_LIVE")
    lc2 = PGLifecycle(rt, groups, config=config)
    try:
        lc2.sync.pause(policy=PGPolicy.PAUSED_LIVE if rank == 0 else PGPolicy.DESTROY)
        mismatch = None
    except PolicyMismatchError as e:
        mismatch = str(e)
    return dict(suspend_error=suspend_error, state=lc.state.name, mismatch=mismatch, state2=lc2.state.name)


def test_suspend_on_gloo_fails_every_rank_with_a_clear_error_and_policies_must_match(fault_scenarios):
    results = [r["gloo_suspend"] for r in fault_scenarios]
    for r in results:
        kind, msg = r["suspend_error"]
        assert kind == "GroupError" and "only NCCL communicators can be suspended" in msg
        assert r["state"] == "FAILED"
        assert r["mismatch"] and "different pause policies" in r["mismatch"]
        assert r["state2"] == "FAILED"


# --------------------------------------------------------------------------- a rank that hangs


def _hang(rank, world_size, agree_timeout, hang_s):
    from refimpl.comm import AgreementError, PGLifecycle
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    config, groups = _lifecycle(rt, "h", "DESTROY_DEFERRED", agree_timeout_s=agree_timeout)
    lc = PGLifecycle(rt, groups, config=config)
    sync = lc.sync
    sync.pause()
    t0 = time.monotonic()
    try:
        sync.weight_sync(lambda: time.sleep(hang_s) if rank == 1 else None)
        error = None
    except AgreementError as e:
        error = (type(e).__name__, str(e))
    return dict(error=error, elapsed=time.monotonic() - t0, state=lc.state.name,
                live=[rt.group_live(g) for g in lc.groups])


def test_a_hung_rank_makes_the_others_fail_within_the_agreement_timeout():
    agree_timeout, hang_s = 2.0, 5.0
    results = run_distributed(_hang, 2, args=(agree_timeout, hang_s), timeout=120)
    r0 = results[0]
    assert r0["error"][0] == "AgreementTimeoutError" and "weight_sync" in r0["error"][1]
    assert agree_timeout * 0.9 <= r0["elapsed"] < agree_timeout + 3.0, "bounded, not a hang"
    assert r0["state"] == "FAILED" and r0["live"] == [False, False]
    r1 = results[1]  # wakes after its peer gave up: its own agreement fails too
    assert r1["error"] is not None and r1["state"] == "FAILED"
    assert r1["elapsed"] < hang_s + agree_timeout + 3.0


# --------------------------------------------------------------------------- the ring's warm-up


def _warm_ring(rank, world_size):
    from refimpl.comm import PGLifecycle
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    config, groups = _lifecycle(rt, "warm", "DESTROY_DEFERRED", warm_rebuilt=True)
    lc = PGLifecycle(rt, groups, config=config)
    sync = lc.sync
    sync.start()
    before = _sums(rt, lc.groups)
    gathers = []
    real = rt.all_gather_into_tensor

    async def spy(output, input, group="world", *, timeout_s=None):  # the real collective, its group noted
        gathers.append((group, output.numel()))
        await real(output, input, group, timeout_s=timeout_s)

    rt.all_gather_into_tensor = spy
    sync.pause()
    sync.resume()
    rt.all_gather_into_tensor = real
    after = _sums(rt, lc.groups)
    out = {"before": before, "after": after, "gathers": gathers, "warm_ups": lc.stats.warm_ups,
           "state": lc.state.name}
    return out


def test_the_warm_up_connects_the_ring_of_a_group_of_more_than_two_ranks():
    """[Note: the ring's warm-up] in refimpl/comm/role_groups.py: with warm_rebuilt, the resume warms every
    rebuilt group this rank is in with an all-reduce, and a group of more than two ranks with a one-element
    all-gather after it (the collective that runs only as a ring); a two-rank group gets none. Real Gloo, 3 ranks:
    the 3-rank dp group is gathered on every rank, the 2-rank tp group never, and both work after the resume."""
    results = run_distributed(_warm_ring, 3, timeout=180)
    for rank, r in enumerate(results):
        assert r["state"] == "ACTIVE"
        assert r["gathers"] == [("warm.dp", 3)], (rank, r["gathers"])
        assert r["warm_ups"] == (2 if rank in TP else 1)
        assert r["before"] == r["after"] == ({"warm.tp": 2, "warm.dp": 3} if rank in TP else {"warm.dp": 3})
