"""Properties of SUSPEND_PLANNED's lazy wake (``GroupPlanRules.wake_groups`` + ``PGLifecycle.use``), in the simulator.

For every mesh with one-rank and multi-rank groups, every per-rank declaration
of the wake groups and the weight-sync groups, every sequence of ``use()``
calls (each rank naming its own groups), every event schedule, and every
single-rank fault (a crash, hang, exception or delay at any lifecycle point,
including between two groups of a walk, i.e. a rank dying between suspends, and
inside ``use()``; a corrupted canary), with one rank's collective on a group
left down racing its peers' ``use()``:

* the job never deadlocks (the simulator raises DeadlockError if it does);
* every rank still running ends in the same state after the same transitions,
  or every one of them fails (FAILED, each with an error);
* a crash, hang or exception fails every surviving rank;
* the racing collective is refused at once (GroupSuspendedError / GroupError), never waits;
* without faults: every group up after a ``use()`` (those named by any rank
  among them) is right (all-reduce sums), the groups left down are the same on every rank, no suspendable NCCL
  memory is held in the rollout (the groups the plan took down), and device
  memory returns exactly once everything is back.
"""
from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import sim
from property_tests.test_planned_suspend_properties import DrawnFault, mesh, ranks_end_together
from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.comm.group_plan import GroupPlanRules
from refimpl.runtime.base import GroupError
from tests._hypothesis import BUDGET

POINTS = ["lifecycle.pause.decide", "lifecycle.plan", "lifecycle.plan.group", "lifecycle.plan.preflight",
          "lifecycle.resume.preflight", "lifecycle.resume", "lifecycle.canary", "lifecycle.rebuild",
          "lifecycle.weight_sync", "lifecycle.use", "lifecycle.use.request"]
AGREE_S, CANARY_S, CREATE_S, ROLLOUT_S = 40.0, 8.0, 20.0, 30.0
FAMILIES = ["tp", "dp", "mp", "solo"]


def _names(decl, rank):
    if decl is None:
        return None
    out = set()
    for d in decl:
        out |= {"tp": {f"tp{rank // 2}"}, "dp": {f"dp{rank % 2}"}, "mp": {"mp"}, "solo": {f"solo{rank}"}}[d]
    return out


faults = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["crash", "hang", "raise", "delay", "corrupt_canary"]), st.integers(0, 3),
              st.sampled_from(POINTS), st.integers(1, 3)),
)
family_sets = st.sets(st.sampled_from(FAMILIES), max_size=3)


@BUDGET.settings(40)
@given(
    n=st.sampled_from([2, 4]),
    steps=st.integers(1, 2),
    wake=st.lists(family_sets, min_size=4, max_size=4),
    sync=st.lists(st.one_of(st.none(), family_sets), min_size=4, max_size=4),
    # every rank calls use() the same number of times (the contract), each naming its own groups
    uses=st.integers(0, 2).flatmap(lambda k: st.lists(st.lists(family_sets, min_size=k, max_size=k),
                                                      min_size=4, max_size=4)),
    single_rank=st.booleans(),
    racer=st.one_of(st.none(), st.integers(0, 3)),
    fault=faults,
    data=st.data(),
)
def test_lazy_wake_never_deadlocks_and_ranks_end_together(n, steps, wake, sync, uses, single_rank, racer, fault,
                                                          data):
    drawn = None if fault is None else DrawnFault(fault[0], fault[1] % n, fault[2], fault[3])
    racer_rank = None if racer is None else racer % n
    world = sim.SimWorld(n, faults=drawn, group_timeouts=True, chooser=sim.HypothesisChooser(data, max_choices=50))
    config = LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, agree_timeout_s=AGREE_S, canary_timeout_s=CANARY_S,
                             cooldown_s=2.0, two_phase=False)
    specs = mesh(n)
    by_name = {s.name: s for s in specs}

    async def job(rt):
        rules = GroupPlanRules(sync_groups=_names(sync[rt.rank], rt.rank), wake_groups=_names(wake[rt.rank], rt.rank),
                               destroy_single_rank=single_rank, costs=None)
        lc = PGLifecycle(rt, specs, config=config, plan=rules)
        error, checked, held, refused, left = None, [], [], [], []
        before = rt.memory_info().used
        try:
            await lc.start()
            before = rt.memory_info().used
            for _ in range(steps):
                await lc.pause()
                await lc.weight_sync(lambda: None)
                held.append(lc.comm_memory())
                await rt.sleep(ROLLOUT_S)
                await lc.resume()
                left.append(sorted(lc.planned.left_down))
                for fams in uses[rt.rank]:
                    names = sorted(_names(fams, rt.rank))
                    if rt.rank == racer_rank and lc.state is PGState.ACTIVE_LAZY:
                        # a collective racing the peers' use(): on a group still down it is refused at once
                        down = [g for g in lc.planned.left_down if rt.is_member(g)]
                        for g in down[:1]:
                            t0 = rt.now()
                            try:
                                await rt.all_reduce(torch.ones(1), group=g, timeout_s=CANARY_S)
                                refused.append(None)
                            except GroupError as exc:
                                refused.append((type(exc).__name__, rt.now() - t0))
                    await lc.use(names)
                    # every group up now (the same on every rank), in one global order: members all take part
                    for g in sorted(g for g in lc.groups if g not in lc.planned.left_down and rt.is_member(g)):
                        t = torch.full((1,), float(rt.rank + 1))
                        await rt.all_reduce(t, group=g, timeout_s=CANARY_S)
                        checked.append((g, t.item()))
            await lc.resume() if lc.state is PGState.ACTIVE_LAZY else None
        except Exception as exc:  # noqa: BLE001 - the property is about how ranks end
            error = exc
        return dict(state=lc.state, history=[(a, e, b) for _, a, e, b in lc.history], error=error, checked=checked,
                    held=held, refused=refused, left=left, end=rt.now(), leaked=rt.memory_info().used - before)

    results = world.run(job, return_exceptions=True)  # a deadlock raises here and fails the property
    alive, state = ranks_end_together(results, drawn, "left", "the same groups left down on every rank")
    assert max(r["end"] for r in alive) <= steps * (ROLLOUT_S + 20 * (AGREE_S + CREATE_S + CANARY_S)) + 200
    for r in alive:
        for got in r["refused"]:
            assert got is not None, "a collective on a group left down is refused"
            assert got[1] == 0.0, "refused at once, without waiting for peers"
    if drawn is None:
        assert state is PGState.ACTIVE
        for r in results:
            for g, value in r["checked"]:
                assert value == float(sum(x + 1 for x in by_name[g].ranks)), f"group {g} wrong after its use()"
            for mem in r["held"]:
                assert mem.suspendable == 0, "the plan took down every group holding NCCL memory"
            assert r["leaked"] == 0, "communicator memory returns exactly"
