"""Properties of SUSPEND_PLANNED, checked in the simulator.

For every mesh with one-rank and multi-rank groups, every declaration of the
weight-sync groups (per rank, possibly different), every number of weight
syncs per pause, every event schedule, and every single-rank fault (a crash,
hang, exception or delay at any planned point, including between two groups
of the plan's walk; a corrupted canary; a weight sync that uses a group the
plan took down, racing its peers' collectives):

* the job never deadlocks (the simulator raises DeadlockError if it does);
* every rank still running ends in the same state after the same transitions,
  or every one of them fails (FAILED, each with an error);
* a crash, hang or exception fails every surviving rank;
* the plan is the same on every rank;
* a collective racing the wake on a group the plan took down is refused at once and the wake
  still succeeds on every rank;
* a group one rank declares keep_live stays live on every member (and its canary runs after the pause);
* without faults every group's all-reduce is right after every wake, NCCL
  memory in the rollout is the persistent part of the suspended groups only,
  and device memory returns exactly.
"""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import sim
from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.comm.group_plan import GroupPlanRules, SwitchCosts
from refimpl.runtime.base import GroupError, GroupSpec

POINTS = ["lifecycle.pause.decide", "lifecycle.plan", "lifecycle.plan.apply", "lifecycle.plan.group",
          "lifecycle.plan.preflight", "lifecycle.resume.preflight", "lifecycle.resume", "lifecycle.canary",
          "lifecycle.rebuild", "lifecycle.weight_sync", "lifecycle.release_memory"]
AGREE_S, CANARY_S, CREATE_S, ROLLOUT_S = 40.0, 8.0, 20.0, 30.0


def mesh(n: int) -> list[GroupSpec]:
    """TP pairs, two DP groups, one group of all ranks and one one-rank group per rank."""
    tp = [GroupSpec(f"tp{i}", (2 * i, 2 * i + 1), timeout_s=CREATE_S) for i in range(n // 2)]
    dp = [GroupSpec(f"dp{j}", tuple(range(j, n, 2)), timeout_s=CREATE_S) for j in range(2)]
    solo = [GroupSpec(f"solo{r}", (r,), timeout_s=CREATE_S) for r in range(n)]
    return tp + dp + solo + [GroupSpec("mp", tuple(range(n)), timeout_s=CREATE_S)]


class DrawnFault:
    """One fault on one rank, fired the ``nth`` time it reaches its point (or at its next canary)."""

    def __init__(self, kind: str, rank: int, point: str, nth: int):
        self.kind, self.rank, self.point, self.nth = kind, rank, point, nth
        self.seen = 0
        self.fired = False
        self._armed = False

    def on_point(self, rank, name):
        if rank != self.rank or self.fired:
            return None
        if self.kind == "corrupt_canary":
            self._armed = self._armed or name == "lifecycle.canary"
            return None
        if name == self.point and self.kind in ("crash", "hang", "raise", "delay"):
            self.seen += 1
            if self.seen == self.nth:
                self.fired = True
                return {"crash": sim.FaultAction.crash, "hang": sim.FaultAction.hang,
                        "raise": lambda: sim.FaultAction.fail(RuntimeError(f"injected at {self.point}")),
                        "delay": lambda: sim.FaultAction.delay(3 * CANARY_S)}[self.kind]()
        return None

    def on_collective(self, rank, group, op, seq):
        if self._armed and rank == self.rank and group != "lifecycle.control" and op == "all_reduce":
            self._armed, self.fired = False, True
            return sim.FaultAction.corrupt()
        return None

    def on_group_create(self, rank, spec):
        return None

    def on_pin(self, rank, nbytes):
        return None


faults = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["crash", "hang", "raise", "delay", "corrupt_canary"]), st.integers(0, 3),
              st.sampled_from(POINTS), st.integers(1, 3)),
)
declarations = st.one_of(st.none(), st.sets(st.sampled_from(["tp", "dp", "mp", "solo"]), max_size=3))



def ranks_end_together(results: list, drawn: "DrawnFault | None", same: str, why: str) -> tuple[list[dict], PGState]:
    """The ranks' ends agree: crashed or hung ranks only, one state for the rest; on FAILED every survivor raised,
    otherwise one history, no error and one value of ``same`` (``why`` says what it is); a crash, hang or injected
    exception fails every survivor. Returns the surviving ranks' results and their state."""
    event("no fault" if drawn is None else f"{drawn.kind} {'fired' if drawn.fired else 'not reached'}")
    alive = [r for r in results if isinstance(r, dict)]
    gone = [r for r in results if not isinstance(r, dict)]
    assert all(isinstance(g, (sim.RankCrashedError, sim.RankHungError)) for g in gone), gone
    assert alive
    states = {r["state"] for r in alive}
    assert len(states) == 1, f"ranks ended in different states: {[r['state'] for r in alive]}"
    (state,) = states
    if state is PGState.FAILED:
        assert all(r["error"] is not None for r in alive), "every surviving rank raised"
    else:
        assert len({tuple(r["history"]) for r in alive}) == 1, "every rank took the same transitions"
        assert all(r["error"] is None for r in alive)
        assert len({str(r[same]) for r in alive}) == 1, why
    if gone or (drawn is not None and drawn.fired and drawn.kind == "raise"):
        assert state is PGState.FAILED, "a crash, hang or exception fails every surviving rank"
    return alive, state

def _names(decl, rank, n):
    if decl is None:
        return None
    out = set()
    for d in decl:
        out |= {"tp": {f"tp{rank // 2}"}, "dp": {f"dp{rank % 2}"}, "mp": {"mp"}, "solo": {f"solo{rank}"}}[d]
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.sampled_from([2, 4]),
    steps=st.integers(1, 2),
    syncs=st.integers(1, 2),
    decl=st.lists(declarations, min_size=4, max_size=4),
    single_rank=st.booleans(),
    keep_mp=st.booleans(),
    by_cost=st.booleans(),
    parallel=st.booleans(),
    early=st.one_of(st.none(), st.integers(0, 3)),
    misuse=st.one_of(st.none(), st.integers(0, 3)),
    fault=faults,
    data=st.data(),
)
def test_planned_suspend_never_deadlocks_and_ranks_end_together(n, steps, syncs, decl, single_rank, keep_mp, by_cost,
                                                                 parallel, early, misuse, fault, data):
    drawn = None if fault is None else DrawnFault(fault[0], fault[1] % n, fault[2], fault[3])
    misuse_rank = None if misuse is None else misuse % n
    early_rank = None if early is None else early % n
    world = sim.SimWorld(n, faults=drawn, group_timeouts=True, chooser=sim.HypothesisChooser(data, max_choices=50))
    config = LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, agree_timeout_s=AGREE_S, canary_timeout_s=CANARY_S,
                             cooldown_s=2.0, two_phase=False, parallel_destroy=parallel)
    specs = mesh(n)

    async def job(rt):
        rules = GroupPlanRules(sync_groups=_names(decl[rt.rank], rt.rank, n), destroy_single_rank=single_rank,
                               keep_live={"mp"} if keep_mp and rt.rank == 0 else (),
                               costs=SwitchCosts() if by_cost else None)
        lc = PGLifecycle(rt, specs, config=config, plan=rules)
        error, sums, held, plans, refused = None, [], [], [], []
        before = rt.memory_info().used

        async def sync():
            # what every rank's sync may use: the groups the agreed plan kept up for it (all if not planned)
            plan = lc.planned.plan if lc.state is PGState.SYNC_READY else None
            names = sorted(g for g in (plan.for_sync if plan else lc.groups) if rt.is_member(g))
            if rt.rank == misuse_rank:  # uses a group it did not declare (refused if the plan took it down)
                names = sorted(g for g in lc.groups if rt.is_member(g))
            for g in names:
                await rt.all_reduce(torch.ones(1), group=g, timeout_s=CANARY_S)

        try:
            await lc.start()
            before = rt.memory_info().used
            for _ in range(steps):
                await lc.pause()
                plans.append(dict(lc.planned.plan.actions) if lc.planned.plan else None)
                for _ in range(syncs):
                    await lc.weight_sync(sync)
                held.append((lc.state, lc.comm_memory()))
                await rt.sleep(ROLLOUT_S)
                if rt.rank == early_rank and lc.state is PGState.PLANNED:
                    # a collective racing the wake on a group the plan took down: refused at once, no hang
                    down = [g for g, a in lc.planned.plan.actions.items() if a.name != "KEEP" and rt.is_member(g)]
                    for g in down[:1]:
                        try:
                            await rt.all_reduce(torch.ones(1), group=g, timeout_s=CANARY_S)
                            refused.append(None)
                        except GroupError as exc:
                            refused.append(type(exc).__name__)
                await lc.resume()
                step = {}
                for g in lc.groups:
                    if rt.is_member(g):
                        t = torch.full((1,), float(rt.rank + 1))
                        await rt.all_reduce(t, group=g, timeout_s=CANARY_S)
                        step[g] = t.item()
                sums.append(step)
        except Exception as exc:  # noqa: BLE001 - the property is about how ranks end
            error = exc
        return dict(state=lc.state, history=[(a, e, b) for _, a, e, b in lc.history], error=error, sums=sums,
                    refused=refused,
                    held=held, plans=plans, end=rt.now(), leaked=rt.memory_info().used - before)

    results = world.run(job, return_exceptions=True)  # a deadlock raises here and fails the property
    alive, state = ranks_end_together(results, drawn, "plans", "one plan on every rank")
    assert max(r["end"] for r in alive) <= steps * (ROLLOUT_S + 14 * (AGREE_S + CREATE_S + CANARY_S)) + 200
    for r in alive:
        assert None not in r["refused"], "a collective on a group the plan took down is refused"
    if drawn is None and misuse_rank is None:
        assert state is PGState.ACTIVE
        by_name = {s.name: s for s in specs}
        for rank, r in enumerate(results):
            for step in r["sums"]:
                assert step == {g: float(sum(x + 1 for x in by_name[g].ranks)) for g in step}
                assert len(step) == sum(rank in s.ranks for s in specs)
            for st_, mem in r["held"]:
                assert st_ is PGState.PLANNED
                assert mem.suspendable == (384 << 20 if keep_mp else 0), "only the kept-live group holds memory"
            assert r["leaked"] == 0, "communicator memory returns exactly"
