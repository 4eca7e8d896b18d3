"""Two lifecycles (two roles) in one process cannot pair across roles, on real Gloo processes (TorchRuntime).

Each process runs the lifecycles of two roles, ``actor`` and ``critic``, both on
the default control group name, and each role's weight sync all-reduces a value of
its own (actor ``rank + 1``, critic ``10 * (rank + 1)``). Driven in the same order
on every rank, each sync sums its own role's values. Driven in different orders
(rank 0 actor first, rank 1 critic first), agreements used to pair across the
roles, then the rebuilt groups did (torch pairs group creations by their order in
the process): each sync summed the other role's data, every state ACTIVE, no
error. Now every agreement carries its lifecycle's scope (its role's group
names) and no group is created before an agreement of its operation, so the first
agreement that meets another role's raises :class:`AgreementMismatchError` naming
both roles on every rank, no sync runs on mixed groups, and every lifecycle ends
FAILED on every rank.
"""
from __future__ import annotations

import time

import pytest

from tests._dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

VALUE = {"actor": 1, "critic": 10}


def _roles(rt, counts):
    """The two roles' lifecycles: ``counts[role]`` groups of both ranks each, one control group name for both."""
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec

    config = LifecycleConfig(policy=PGPolicy.DESTROY, cooldown_s=0.1, agree_timeout_s=20, canary_timeout_s=10)
    assert config.control_group == LifecycleConfig().control_group, "both roles on the default control group"
    return {role: PGLifecycle(rt, [GroupSpec(f"{role}.g{i}", (0, 1), timeout_s=20.0) for i in range(counts[role])],
                              config=config)
            for role in ("actor", "critic")}


def _sync(rt, lc, role, sums):
    """The role's weight sync: all-reduce its value over its first group; records what came back."""
    import torch

    def fn():
        t = torch.tensor([VALUE[role] * (rt.rank + 1)], dtype=torch.int64)
        rt.run(rt.all_reduce(t, group=lc.groups[0], timeout_s=20))
        sums.append((role, int(t.item())))
    return fn


def _two_roles(rank, world_size, counts, crossed):
    """Phase 1 in the same order on both ranks; then ``crossed`` ("pause" or "weight_sync") in different orders."""
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()
    lcs = _roles(rt, counts)
    same = ("actor", "critic")
    sums: list = []
    for role in same:
        lcs[role].sync.start()
    for op in ("pause", "weight_sync", "resume"):  # the same order on every rank: each role its own data
        for role in same:
            lc = lcs[role]
            getattr(lc.sync, op)(*([_sync(rt, lc, role, sums)] if op == "weight_sync" else []))
    lockstep = list(sums)
    sums.clear()
    order = same if rank == 0 else same[::-1]
    if crossed == "weight_sync":
        for role in same:  # the pause still in step: every role DESTROYED
            lcs[role].sync.pause()
    errors = {}
    t0 = time.monotonic()
    for role in order:
        lc = lcs[role]
        try:
            if crossed == "pause":
                lc.sync.pause()
            lc.sync.weight_sync(_sync(rt, lc, role, sums))
            lc.sync.resume()
        except Exception as exc:  # noqa: BLE001 - which error, is the assertion
            errors[role] = (type(exc).__name__, str(exc))
    return dict(lockstep=lockstep, crossed=sums, errors=errors, took=time.monotonic() - t0,
                states={role: lc.state.name for role, lc in lcs.items()},
                live=sorted(n for lc in lcs.values() for n in lc.groups if rt.group_live(n)))


@pytest.mark.parametrize("counts,crossed", [
    ({"actor": 1, "critic": 1}, "pause"),
    ({"actor": 2, "critic": 1}, "weight_sync"),  # the rebuild first: the roles' group creations must not pair
], ids=["pause_in_different_orders", "rebuild_in_different_orders"])
def test_two_roles_driven_in_different_orders_fail_together_and_never_sum_each_others_data(counts, crossed):
    out = run_distributed(_two_roles, 2, (counts, crossed), timeout=150)
    for o in out:  # in step: each role's sync summed its own role's values only
        assert o["lockstep"] == [("actor", 3), ("critic", 30)], o["lockstep"]
    for o in out:
        assert o["crossed"] == [], f"a sync ran while the ranks were in different roles: {o['crossed']}"
        assert o["states"] == {"actor": "FAILED", "critic": "FAILED"}, o
        assert o["live"] == [], "every role group aborted"
        for role, (name, msg) in o["errors"].items():
            assert name == "AgreementMismatchError", o["errors"]
            assert "actor.g0" in msg and "critic.g0" in msg, msg  # names both roles by their groups
        assert sorted(o["errors"]) == ["actor", "critic"]
        assert o["took"] < 15.0, "reported at once, not after a creation or agreement timeout"
