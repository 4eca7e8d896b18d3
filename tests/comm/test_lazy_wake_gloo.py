"""The lazy wake of SUSPEND_PLANNED on real Gloo processes (TorchRuntime, tests/_dist.py).

Gloo has no communicator memory to suspend, so the plan keeps Gloo groups live
unless they are declared for destroying (``GroupPlanRules.destroy``). These tests
declare some, and a wake that brings back only ``wake_groups``: the groups left
down are destroyed process groups until ``use()`` rebuilds them, so the agreed
union of the names, the rebuild at first use, the refusal of a collective on a
group still down (at once, with the fix in the message, on every rank through
``run_on``) and a pause from ACTIVE_LAZY all run on real ``torch.distributed``
processes. The NCCL resume of the same path runs in the simulator
(test_lazy_wake_sim.py) and on GPUs (tests/multigpu/test_lifecycle_multigpu.py).
"""
from __future__ import annotations

import time

import pytest

from tests._dist import run_distributed

from tests.comm.test_planned_suspend_gloo import _sums

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _lazy(rank, world_size):
    from refimpl.comm import LifecycleConfig, PeerFailedError, PGLifecycle, PGPolicy
    from refimpl.comm.group_plan import GroupPlanRules
    from refimpl.comm.lazy_wake import LazyGroupError
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    p = "lazy"
    groups = [GroupSpec(f"{p}.tp", (0, 1)), GroupSpec(f"{p}.dp", tuple(range(world_size))),
              GroupSpec(f"{p}.ep", tuple(range(world_size)))]
    groups += [GroupSpec(f"{p}.solo{r}", (r,)) for r in range(world_size)]
    config = LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, cooldown_s=0.2, agree_timeout_s=20,
                             canary_timeout_s=10, two_phase=False, control_group=f"{p}.control")
    rules = GroupPlanRules(sync_groups={f"{p}.tp"} if rank < 2 else set(), wake_groups={f"{p}.dp"},
                           destroy={f"{p}.dp", f"{p}.ep", *(f"{p}.solo{r}" for r in range(world_size))})
    lc = PGLifecycle(rt, groups, config=config, plan=rules)
    lc.sync.pause()
    lc.sync.weight_sync(lambda: _sums(rt, [f"{p}.tp"]))
    time.sleep(0.3)  # the rollout: longer than the 0.2 s cooldown
    state = lc.sync.resume()
    out = dict(state=state.name, left=sorted(lc.planned.left_down), live=sorted(g for g in lc.groups if rt.group_live(g)),
               dp=_sums(rt, [f"{p}.dp"]))
    # a collective on ep (left down) before use(): refused at once, nothing waits for peers
    t0 = time.monotonic()
    try:
        _sums(rt, [f"{p}.ep"])
        out["refused"] = None
    except Exception as exc:  # noqa: BLE001 - what it is, is the assertion
        out["refused"] = (type(exc).__name__, str(exc), time.monotonic() - t0)
    # rank 0 names ep, the others their own one-rank group: the union comes up everywhere
    lc.sync.use([f"{p}.ep"] if rank == 0 else [f"{p}.solo{rank}"])  # the synchronous facade
    out["after_use"] = dict(state=lc.state.name, left=sorted(lc.planned.left_down),
                            sums=_sums(rt, [f"{p}.ep", *(f"{p}.solo{r}" for r in range(1, world_size))]),
                            gen=rt.group_spec(f"{p}.ep").generation)
    # second step from ACTIVE_LAZY: groups still down (solo0) are not touched; the plan is the same on every rank
    lc.sync.pause()
    lc.sync.weight_sync(lambda: _sums(rt, [f"{p}.tp"]))
    time.sleep(0.3)
    lc.sync.resume()
    out["step2"] = dict(state=lc.state.name, left=sorted(lc.planned.left_down),
                        solo0_gen=rt.group_spec(f"{p}.solo0").generation)
    # run_on naming dp but using ep on rank 1 only: every rank fails together, rank 1 with the fix in the message
    t0 = time.monotonic()
    try:
        rt.run(lc.run_on([f"{p}.dp"], lambda: _sums(rt, [f"{p}.dp"] + ([f"{p}.ep"] if rank == 1 else []))))
        out["run_on"] = None
    except (LazyGroupError, PeerFailedError) as exc:
        out["run_on"] = (type(exc).__name__, str(exc), lc.state.name, time.monotonic() - t0)
    return out


def test_lazy_wake_on_gloo_processes():
    results = run_distributed(_lazy, 3, timeout=180)
    p = "lazy"
    for rank, r in enumerate(results):
        assert r["state"] == "ACTIVE_LAZY"
        assert r["left"] == sorted([f"{p}.ep", f"{p}.solo0", f"{p}.solo1", f"{p}.solo2"]), "all but dp left down"
        assert f"{p}.dp" in r["live"] and f"{p}.ep" not in r["live"]
        assert r["dp"] == {f"{p}.dp": [6.0, 6.0]}, "the wake group works right after the wake"
        name, msg, took = r["refused"]
        assert "destroyed" in msg and f"'{p}.ep'" in msg and took < 5, "refused at once, with the fix"
        a = r["after_use"]
        assert a["state"] == "ACTIVE_LAZY" and a["left"] == [f"{p}.solo0"], "the union came up; solo0 was not named"
        want = {f"{p}.ep": [6.0, 6.0], **({f"{p}.solo{rank}": [float(rank + 1)] * 2} if rank else {})}
        assert a["sums"] == want and a["gen"] == 1, "ep rebuilt (generation 1) and right at its first use"
        s2 = r["step2"]
        assert s2["state"] == "ACTIVE_LAZY" and s2["solo0_gen"] == 0, "solo0 stayed down: never rebuilt or destroyed"
        assert f"{p}.solo0" in s2["left"]
        kind, msg, state, took = r["run_on"]
        assert state == "FAILED" and took < 15
        assert kind == ("LazyGroupError" if rank == 1 else "PeerFailedError")
    assert "use()" in results[1]["run_on"][1] and "wake_groups" in results[1]["run_on"][1]
