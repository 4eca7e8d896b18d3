"""SUSPEND_PLANNED on real Gloo processes (TorchRuntime): the agreed plan, its walks and its failures.

Gloo has no communicator memory to suspend, so the plan keeps every Gloo group
live unless it is declared for destroying (``GroupPlanRules.destroy``); these
tests declare some, so the real destroy/rebuild walk, the declared weight-sync
groups, the second weight sync from PLANNED and the refusal of an undeclared
group all run on real ``torch.distributed`` processes (tests/_dist.py). The
NCCL suspend of the same walk is covered in the simulator
(test_planned_suspend_sim.py) and on GPUs by the multi-GPU benchmark.
"""
from __future__ import annotations

import time

import pytest

from tests._dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _setup(rt, prefix, **rules):
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.comm.group_plan import GroupPlanRules
    from refimpl.runtime import GroupSpec

    n = rt.world_size
    groups = [GroupSpec(f"{prefix}.tp", (0, 1)), GroupSpec(f"{prefix}.dp", tuple(range(n)))]
    groups += [GroupSpec(f"{prefix}.solo{r}", (r,)) for r in range(n)]
    config = LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, cooldown_s=0.2, agree_timeout_s=20,
                             canary_timeout_s=10, two_phase=False, control_group=f"{prefix}.control")
    return PGLifecycle(rt, groups, config=config, plan=GroupPlanRules(**rules))


def _sums(rt, names):
    import torch

    out = {}
    for name in names:
        if rt.is_member(name):
            t = torch.full((2,), float(rt.rank + 1))
            rt.run(rt.all_reduce(t, group=name, timeout_s=10))
            out[name] = t.tolist()
    return out


def _planned_cycles(rank, world_size):
    from refimpl.comm import PeerFailedError
    from refimpl.comm.group_plan import UndeclaredGroupError
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    out = {}
    # 1. three RL steps: dp and the solo groups destroyed (declared), tp kept; the sync uses tp
    p = "a"
    lc = _setup(rt, p, sync_groups={f"{p}.tp"}, destroy={f"{p}.dp", *(f"{p}.solo{r}" for r in range(world_size))})
    steps = []
    for _ in range(3):
        state = lc.sync.pause()
        down_at_pause = sorted(g for g in lc.groups if not rt.group_live(g))
        synced = lc.sync.weight_sync(lambda: _sums(rt, [f"{p}.tp"]))
        after_sync = lc.state.name
        time.sleep(0.3)  # the rollout: longer than the 0.2 s cooldown
        lc.sync.resume()
        steps.append(dict(state=state.name, down=down_at_pause, synced=synced, after_sync=after_sync,
                          sums=_sums(rt, lc.groups), gen=rt.group_spec(f"{p}.dp").generation))
    out["cycles"] = dict(steps=steps, end=lc.state.name, history=[(a.name, e.name, b.name) for _, a, e, b in lc.history])

    # 2. dp declared for the sync and for destroying: live through the first sync, destroyed after it,
    #    rebuilt for a second sync in the same pause
    p = "b"
    lc = _setup(rt, p, sync_groups={f"{p}.dp"}, destroy={f"{p}.dp"})
    lc.sync.pause()
    first = lc.sync.weight_sync(lambda: _sums(rt, [f"{p}.dp"]))
    between = (lc.state.name, rt.group_live(f"{p}.dp"))
    time.sleep(0.25)
    second = lc.sync.weight_sync(lambda: _sums(rt, [f"{p}.dp"]))
    out["second_sync"] = dict(first=first, between=between, second=second, state=lc.state.name,
                              gen=rt.group_spec(f"{p}.dp").generation)
    lc.sync.resume()

    # 3. the sync uses dp, destroyed at the pause because it was not declared: refused, every rank fails
    p = "c"
    lc = _setup(rt, p, sync_groups={f"{p}.tp"}, destroy={f"{p}.dp"})
    lc.sync.pause()
    t0 = time.monotonic()
    try:
        lc.sync.weight_sync(lambda: _sums(rt, [f"{p}.dp"]))
        err = None
    except (UndeclaredGroupError, PeerFailedError) as exc:
        err = f"{type(exc).__name__}: {exc}"
    out["undeclared"] = dict(err=err, state=lc.state.name, took=time.monotonic() - t0)
    return out


def test_planned_suspend_on_gloo_processes():
    results = run_distributed(_planned_cycles, 3, timeout=180)
    for rank, r in enumerate(results):
        c = r["cycles"]
        first, *later = c["steps"]
        assert first["state"] == "SYNC_READY" and all(s["state"] == "SYNC_READY" for s in later)
        assert first["down"] == sorted(["a.dp", "a.solo0", "a.solo1", "a.solo2"]), "undeclared groups down at pause"
        for s in c["steps"]:
            assert s["after_sync"] == "PLANNED"
            if rank in (0, 1):
                assert s["synced"] == {"a.tp": [3.0, 3.0]}
            expect = {"a.dp": [6.0, 6.0], f"a.solo{rank}": [float(rank + 1)] * 2}
            if rank in (0, 1):
                expect["a.tp"] = [3.0, 3.0]
            assert s["sums"] == expect, "every group works after every wake"
        assert [s["gen"] for s in c["steps"]] == [1, 2, 3], "dp rebuilt once per step"
        assert c["end"] == "ACTIVE"
        assert ("ACTIVE", "PAUSE_PLANNED", "SYNC_READY") in c["history"]
        assert ("SYNC_READY", "APPLY_PLAN", "PLANNED") in c["history"]
        assert ("PLANNED", "RELOAD", "RELOADING") in c["history"]

        s2 = r["second_sync"]
        assert s2["first"] == s2["second"] == {"b.dp": [6.0, 6.0]}
        assert s2["between"] == ("PLANNED", False) and s2["state"] == "PLANNED" and s2["gen"] == 1

        u = r["undeclared"]
        assert u["state"] == "FAILED" and u["took"] < 20
        assert "UndeclaredGroupError" in u["err"] and "'c.dp'" in u["err"] and "sync_groups" in u["err"]
    assert results[0]["cycles"]["history"] == results[2]["cycles"]["history"]
