"""PGLifecycle on N GPUs with NCCL role groups: every policy, a canary failure, faults in the weight sync.

The role groups are four of the Relax group families over a (dp=N, tp=1) mesh
(:func:`bench.switch_window.mesh_groups`: one-rank and all-rank
groups) plus a pair group (ranks 0 and 1); the
control group is Gloo, as in production. Every policy of :class:`PGPolicy` is
run (a policy added later is picked up) for 3 RL steps, and after every resume
every group's all-reduce is checked on the GPU.
"""
from __future__ import annotations

import time

import pytest

from tests.multigpu._jobs import gather_ranks, group_sums, suspend_unavailable

STEPS, COOLDOWN_S, ROLLOUT_S = 3, 0.3, 0.5


def _specs(world_size, prefix):
    from bench.switch_window import RELAX_FAMILIES, mesh_groups
    from refimpl.runtime import GroupSpec

    # four of the 14 families (tp, dp, dp_cp, mp): one-rank and all-rank groups; the benchmark runs all 14
    specs = [GroupSpec(f"{prefix}.{s.name}", s.ranks, backend=None)
             for s in mesh_groups(world_size, 1, RELAX_FAMILIES[:4])]
    return specs + [GroupSpec(f"{prefix}.pair", (0, 1))]


def _config(prefix, policy, **kw):
    from refimpl.comm import LifecycleConfig

    return LifecycleConfig(policy=policy, cooldown_s=kw.pop("cooldown_s", COOLDOWN_S),
                           agree_timeout_s=kw.pop("agree_timeout_s", 60), canary_timeout_s=10,
                           control_group=f"{prefix}.control", **kw)


def _every_policy(rank, world_size):
    from refimpl.comm import PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    rt.run(rt.new_group(GroupSpec("weights", tuple(range(world_size)))))  # resident, never rebuilt
    no_suspend = suspend_unavailable()
    report = {}
    for policy in PGPolicy:
        if policy.suspends and no_suspend:
            report[policy.name] = {"skipped": no_suspend}
            continue
        p = policy.value
        specs = _specs(world_size, p)
        lc = PGLifecycle(rt, specs, config=_config(p, policy), resident=["weights"])
        sync = lc.sync
        sync.start()
        steps = []
        for _ in range(STEPS):
            released = []
            state = sync.pause(release_memory=lambda: released.append(True))
            live = sorted(g for g in lc.groups if rt.group_live(g))
            suspended = sorted(g for g in lc.groups if rt.group_live(g) and rt.group_suspended(g))
            gathered = sync.weight_sync(lambda: gather_ranks(rt, f"{p}.dp"))
            time.sleep(ROLLOUT_S)
            sync.resume()
            steps.append(dict(state=state.name, released=released, live=live, suspended=suspended,
                              gathered=gathered, sums=group_sums(rt, lc.groups),
                              resident=group_sums(rt, ["weights"]),
                              generation=rt.group_spec(f"{p}.pair").generation))
        report[policy.name] = dict(steps=steps, end=lc.state.name, preserves=policy.preserves,
                                   history=[(a.name, e.name, b.name) for _, a, e, b in lc.history],
                                   sizes={s.name: s.size for s in specs if rank in s.ranks})
        rt.run(lc.pause(policy=PGPolicy.DESTROY_DEFERRED))  # leave no communicators to the next policy
    return report


def test_every_policy_keeps_every_rank_in_step_and_every_group_working(gpus):
    results = gpus.run(_every_policy, timeout=600)
    from refimpl.comm import PGPolicy

    assert set(results[0]) == {p.name for p in PGPolicy}, "every policy ran or says why not"
    n = gpus.world_size
    for rank, report in enumerate(results):
        for policy, r in report.items():
            if "skipped" in r:
                assert PGPolicy[policy].suspends and (not gpus.nccl or "2.29.7" in r["skipped"]), r["skipped"]
                continue
            assert r["end"] == "ACTIVE", (policy, r["history"])
            states = [s["state"] for s in r["steps"]]
            for i, s in enumerate(r["steps"]):
                assert s["released"] == [True], "release_memory runs once per pause"
                assert s["gathered"] == list(range(n)), f"{policy} step {i}: the weight sync saw every rank"
                assert s["sums"] == r["sizes"], f"{policy} step {i}: a group is broken after resume: {s['sums']}"
                assert s["resident"] == {"weights": n}
            if not r["preserves"]:
                assert states == ["DESTROYED"] * STEPS
                assert all(s["live"] == [] for s in r["steps"])
                assert [s["generation"] for s in r["steps"]] == [2, 4, 6], "rebuilt for the sync and for training"
            else:  # two-phase: the first pause destroys, later ones keep every group
                assert states[0] == "DESTROYED" and "DESTROYED" not in states[1:], states
                if policy != "SUSPEND_PLANNED":  # its plan destroys some groups (one-rank, or by cost) and rebuilds them
                    assert [s["generation"] for s in r["steps"]][1:] == [2] * (STEPS - 1), "no rebuild once armed"
                assert all(set(r["sizes"]) <= set(s["live"]) for s in r["steps"][1:]), "groups kept live"
            if policy == "SUSPEND":
                assert states[1:] == ["SUSPENDED"] * (STEPS - 1)
                assert all(len(s["suspended"]) >= len(r["sizes"]) for s in r["steps"][1:]), \
                    "every member group's communicator is suspended in the rollout"
            if policy == "SUSPEND_PLANNED":
                assert states[1:] == ["SYNC_READY"] * (STEPS - 1), "no sync groups declared: all up for the sync"
            if policy == "PAUSED_LIVE":
                assert states[1:] == ["PAUSED_LIVE"] * (STEPS - 1)
                assert all(s["suspended"] == [] for s in r["steps"])
    for policy in results[0]:
        assert len({tuple(map(tuple, r[policy].get("history", []))) for r in results}) == 1, \
            f"{policy}: ranks went through different transitions"


# --------------------------------------------------------------------------- faults (one spawn)


def _canary_failure(rt, rank, world_size):
    from refimpl.comm import PGLifecycle, PGPolicy, preservation_disabled_reason

    # rank 1 contributes 0 instead of 1 to every canary: every member sees a wrong sum
    cfg = _config("c", PGPolicy.PAUSED_LIVE, two_phase=False, canary_value=0.0 if rank == 1 else 1.0)
    lc = PGLifecycle(rt, _specs(world_size, "c"), config=cfg)
    sync = lc.sync
    first = sync.pause()
    live_after = [g for g in lc.groups if rt.group_live(g)]
    gathered = sync.weight_sync(lambda: gather_ranks(rt, "c.dp"))  # rebuilds the aborted groups
    sync.resume()
    second = sync.pause()  # preservation is off for the process now
    sync.resume()
    return dict(first=first.name, second=second.name, live_after=live_after, gathered=gathered,
                end=lc.state.name, disabled=preservation_disabled_reason(rt), failures=lc.stats.canary_failures,
                history=[(a.name, e.name, b.name) for _, a, e, b in lc.history], sums=group_sums(rt, lc.groups),
                sizes={g: rt.group_size(g) for g in lc.groups if rt.is_member(g)})


def _sync_raises(rt, rank, world_size, policy_name):
    """An exception on rank 1 in the middle of a weight sync: rank 1 has already issued half its collectives."""
    from refimpl.comm import LifecycleFailedError, PeerFailedError, PGLifecycle, PGPolicy

    p = f"x{policy_name.lower()}"
    lc = PGLifecycle(rt, _specs(world_size, p), config=_config(p, PGPolicy[policy_name], two_phase=False,
                                                              agree_timeout_s=20))
    sync = lc.sync
    sync.pause()

    def update():
        gather_ranks(rt, f"{p}.dp")  # the first bucket of the sync goes through on every rank
        if rank == 1:
            raise ValueError("weight update exploded on rank 1")
        return "ok"

    t0 = time.monotonic()
    try:
        sync.weight_sync(update)
        raised = None
    except ValueError as e:
        raised = ("ValueError", str(e))
    except PeerFailedError as e:
        raised = ("PeerFailedError", str(e))
    elapsed = time.monotonic() - t0
    try:
        sync.resume()
        after = None
    except LifecycleFailedError as e:
        after = str(e)
    return dict(raised=raised, elapsed=elapsed, state=lc.state.name, live=[rt.group_live(g) for g in lc.groups],
                after=after, control_live=rt.group_live(f"{p}.control"))


def _hang(rt, rank, world_size, agree_timeout, hang_s):
    from refimpl.comm import AgreementError, PGLifecycle, PGPolicy

    lc = PGLifecycle(rt, _specs(world_size, "h"), config=_config("h", PGPolicy.DESTROY_DEFERRED,
                                                                agree_timeout_s=agree_timeout))
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


AGREE_S, HANG_S = 3.0, 6.0


def _faults(rank, world_size):
    from refimpl.torch_runtime import TorchRuntime

    out = {"canary": _canary_failure(TorchRuntime(), rank, world_size)}
    for policy in ("DESTROY_DEFERRED", "PAUSED_LIVE"):
        out[f"sync_raises_{policy}"] = _sync_raises(TorchRuntime(), rank, world_size, policy)
    out["hang"] = _hang(TorchRuntime(), rank, world_size, AGREE_S, HANG_S)
    return out


@pytest.fixture(scope="module")
def faults(gpus):
    return gpus.run(_faults, timeout=600)


def test_canary_failure_on_one_rank_sends_every_rank_down_the_fallback(faults):
    results = [r["canary"] for r in faults]
    for r in results:
        assert r["first"] == "DESTROYED" and r["live_after"] == []
        assert ("PAUSED_LIVE", "CANARY_FAILED", "DESTROYED") in r["history"]
        assert r["failures"] == 1 and r["disabled"] and "canary" in r["disabled"]
        assert r["second"] == "DESTROYED", "preservation stays off for the life of the process"
        assert r["gathered"] == list(range(len(results)))
        assert r["end"] == "ACTIVE" and r["sums"] == r["sizes"]
    assert len({tuple(r["history"]) for r in results}) == 1


@pytest.mark.parametrize("policy", ["DESTROY_DEFERRED", "PAUSED_LIVE"])
def test_exception_mid_weight_sync_fails_every_rank_together(faults, policy):
    results = [r[f"sync_raises_{policy}"] for r in faults]
    assert results[1]["raised"] == ("ValueError", "weight update exploded on rank 1")
    for rank, r in enumerate(results):
        if rank != 1:
            assert r["raised"][0] == "PeerFailedError" and "rank 1 failed" in r["raised"][1], r["raised"]
        assert r["elapsed"] < 20.0, "failed together within the agreement timeout, no hang"
        assert r["state"] == "FAILED" and not any(r["live"]), "every rank aborted its role groups"
        assert r["control_live"]
        assert r["after"] and "Restart the workers" in r["after"]


def test_a_hung_rank_makes_the_others_fail_within_the_agreement_timeout(faults):
    results = [r["hang"] for r in faults]
    r0 = results[0]
    assert r0["error"][0] == "AgreementTimeoutError" and "weight_sync" in r0["error"][1]
    assert AGREE_S * 0.9 <= r0["elapsed"] < AGREE_S + 5.0, "bounded, not a hang"
    for r in results:
        assert r["error"] is not None and r["state"] == "FAILED" and not any(r["live"])


def test_a_port_held_on_one_rank_at_the_rebuild_makes_every_rank_retry_after_the_cooldown(gpus):
    """tests/comm/test_port_held.py's job on NCCL: the pair group's own rendezvous port is taken on rank 0."""
    from tests._dist import _free_port
    from tests.comm.test_port_held import check_port_held, port_held_job

    check_port_held(gpus.run(port_held_job, _free_port(), timeout=180))
