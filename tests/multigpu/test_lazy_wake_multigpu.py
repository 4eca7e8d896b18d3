"""SUSPEND_PLANNED's lazy wake on N GPUs: NCCL communicators left suspended at the wake, resumed at first use.

The role groups: an all-rank group ``dp`` (the wake group), an all-rank group
``ep`` and a pair group (ranks 0 and 1) that the plan suspends (cost row off),
and one one-rank group per rank that it destroys. The wake brings back ``dp``
only; ``ep`` stays suspended (its NCCL memory released) and a collective on it
is refused at once until ``use()`` resumes it, after which a 4 MiB all-reduce on
it is bitwise right; ``run_on`` with an unnamed (destroyed) group fails every rank together. The next pause from ACTIVE_LAZY suspends only what was used.
Needs NCCL >= 2.29.7 loaded (docs/comm.md); otherwise the test skips with the
whole reason.
"""
from __future__ import annotations

import time

import pytest

from tests.multigpu._jobs import gather_ranks, suspend_unavailable

COOLDOWN_S, ROLLOUT_S = 0.3, 0.5


def _bitwise_sum(rt, group: str) -> bool:
    """A 1 Mi-element float32 all-reduce whose exact sum is known: bitwise right on this rank?"""
    import torch

    base = torch.arange(1 << 20, dtype=torch.float32, device=rt.device).remainder_(61)
    t = base + 1000.0 * (rt.rank + 1)
    rt.run(rt.all_reduce(t, group=group, timeout_s=60))
    ranks = rt.group_spec(group).ranks
    want = base * len(ranks) + 1000.0 * sum(r + 1 for r in ranks)
    return bool(torch.equal(t, want))


def _lazy(rank, world_size):
    import torch

    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.comm.group_plan import GroupPlanRules
    from refimpl.runtime import GroupSpec
    from refimpl.runtime.base import GroupSuspendedError
    from refimpl.torch_runtime import TorchRuntime

    why = suspend_unavailable()
    if why:
        return {"skipped": why}
    rt = TorchRuntime()
    p = "lz"
    everyone = tuple(range(world_size))
    specs = [GroupSpec(f"{p}.dp", everyone), GroupSpec(f"{p}.ep", everyone), GroupSpec(f"{p}.pair", (0, 1))]
    specs += [GroupSpec(f"{p}.solo{r}", (r,)) for r in range(world_size)]
    config = LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, cooldown_s=COOLDOWN_S, agree_timeout_s=60,
                             canary_timeout_s=10, two_phase=False, control_group=f"{p}.control")
    rules = GroupPlanRules(sync_groups={f"{p}.dp"}, wake_groups={f"{p}.dp"}, costs=None)
    lc = PGLifecycle(rt, specs, config=config, plan=rules)
    sync = lc.sync
    sync.start()
    for name in lc.groups:  # the training step before the first pause creates every communicator
        if rt.is_member(name):
            _bitwise_sum(rt, name)
    out = {"steps": []}
    for step in range(2):
        s0 = dict(vars(lc.stats))
        sync.pause()
        gathered = sync.weight_sync(lambda: gather_ranks(rt, f"{p}.dp"))
        time.sleep(ROLLOUT_S)
        t0 = time.monotonic()
        state = sync.resume()
        wake_s = time.monotonic() - t0
        row = dict(state=state.name, wake_s=wake_s, gathered=gathered, left=sorted(lc.planned.left_down),
                   ep_suspended=rt.group_suspended(f"{p}.ep"), ep_mem=rt.comm_memory(f"{p}.ep").suspendable,
                   dp_bitwise=_bitwise_sum(rt, f"{p}.dp"))
        t0 = time.monotonic()
        try:
            rt.run(rt.all_reduce(torch.ones(1, device=rt.device), group=f"{p}.ep", timeout_s=30))
            row["refused"] = None
        except GroupSuspendedError as exc:
            row["refused"] = (str(exc), time.monotonic() - t0)
        if step == 0:
            t0 = time.monotonic()
            sync_state = rt.run(lc.use([f"{p}.ep"]))
            row.update(use_s=time.monotonic() - t0, after_use=sync_state.name, ep_bitwise=_bitwise_sum(rt, f"{p}.ep"))
        row["delta"] = {k: v - s0[k] for k, v in vars(lc.stats).items()}
        out["steps"].append(row)
    # run_on naming dp; after dp, rank 1 also uses its one-rank group (left destroyed): every rank fails together,
    # at once. The suspended groups come up first: the failure aborts every live group, and aborting a
    # suspended communicator is not what this test is about
    rt.run(lc.use([f"{p}.ep", f"{p}.pair"]))
    out["left_before_run_on"] = sorted(lc.planned.left_down)

    def train():
        ok = _bitwise_sum(rt, f"{p}.dp")
        return _bitwise_sum(rt, f"{p}.solo{rank}") if rank == 1 else ok

    t0 = time.monotonic()
    try:
        rt.run(lc.run_on([f"{p}.dp"], train))
        out["run_on"] = None
    except Exception as exc:  # noqa: BLE001 - the type is the assertion
        out["run_on"] = (type(exc).__name__, str(exc), lc.state.name, time.monotonic() - t0)
    return out


def test_lazy_wake_resumes_a_suspended_communicator_at_its_first_use(gpus):
    results = gpus.run(_lazy, timeout=300)
    if "skipped" in results[0]:
        assert not gpus.nccl or "2.29.7" in results[0]["skipped"], results[0]["skipped"]
        pytest.skip(results[0]["skipped"])
    p = "lz"
    for rank, r in enumerate(results):
        first, second = r["steps"]
        for s in r["steps"]:
            assert s["state"] == "ACTIVE_LAZY" and s["gathered"] == list(range(len(results)))
            assert s["ep_suspended"] and s["ep_mem"] == 0, "ep's NCCL memory stays released after the wake"
            assert s["dp_bitwise"], "the wake group's all-reduce is bitwise right after the wake"
            msg, took = s["refused"]
            assert f"'{p}.ep'" in msg and took < 5, "a collective on the suspended group is refused at once"
        assert first["after_use"] == "ACTIVE_LAZY" and first["ep_bitwise"], "ep bitwise right after its lazy resume"
        assert first["delta"]["comm_resumes"] >= 2 and first["delta"]["lazy_bring_ups"] == 1
        # step 2 from ACTIVE_LAZY: dp and ep (used in step 1) suspended again; the pair group stayed down
        assert second["delta"]["comm_suspends"] == 2, second["delta"]
        assert f"{p}.pair" in second["left"] or rank >= 2
        assert r["left_before_run_on"] == sorted(f"{p}.solo{x}" for x in range(len(results)))
        kind, msg, state, took = r["run_on"]
        assert state == "FAILED" and took < 30
        assert kind == ("LazyGroupError" if rank == 1 else "PeerFailedError"), (kind, msg)
