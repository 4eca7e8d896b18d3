"""Properties of the process-group lifecycle, checked in the simulator.

For every mesh, sequence of pause policies, event schedule and fault (a rank
that crashes, hangs, raises or is delayed at any named lifecycle point, a
corrupted canary, a port still in use at a rebuild):

* the job never deadlocks (the simulator raises DeadlockError if it does);
* every rank that is still running ends in the same state, after the same
  history of transitions;
* a fault that fires ends every surviving rank in FAILED, or (canary / port
  faults and delays) in a state every rank agreed on; an error creating one
  group on one rank (mid-walk) fails every rank (a peer waiting in that group's
  rendezvous is released by the group's creation timeout, as torch's is);
* every surviving rank is done within a bound set by the timeouts;
* without faults, the device memory a rank holds after the cycle is what it
  held before (no communicator memory is leaked or double-freed).
"""
from __future__ import annotations

from hypothesis import event, given
from hypothesis import strategies as st

import sim
from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.runtime.base import AddressInUseError, GroupSpec
from tests._hypothesis import BUDGET

POINTS = [
    "lifecycle.pause.decide",
    "lifecycle.release_memory",
    "lifecycle.canary",
    "lifecycle.suspend.preflight",
    "lifecycle.suspend",
    "lifecycle.resume.preflight",
    "lifecycle.resume",
    "lifecycle.destroy",
    "lifecycle.rebuild",
    "lifecycle.weight_sync",
]
AGREE_S, CANARY_S, CREATE_S, ROLLOUT_S = 40.0, 8.0, 20.0, 30.0


def mesh(n: int) -> list[GroupSpec]:
    """TP pairs, two DP groups and one group of all ranks (a 3D-parallel shape in miniature)."""
    tp = [GroupSpec(f"tp{i}", (2 * i, 2 * i + 1), timeout_s=CREATE_S) for i in range(n // 2)]
    dp = [GroupSpec(f"dp{j}", tuple(range(j, n, 2)), timeout_s=CREATE_S) for j in range(2)]
    return tp + dp + [GroupSpec("mp", tuple(range(n)), timeout_s=CREATE_S)]


class DrawnFault:
    """One fault, fired the ``nth`` time its rank reaches its point (or group creation / canary)."""

    def __init__(self, kind: str, rank: int, point: str, nth: int, group: str):
        self.kind, self.rank, self.point, self.nth, self.group = kind, rank, point, nth, group
        self.seen = 0
        self.fired = False
        self._canary_armed = False

    def _action(self):
        return {
            "crash": sim.FaultAction.crash,
            "hang": sim.FaultAction.hang,
            "raise": lambda: sim.FaultAction.fail(RuntimeError(f"injected at {self.point}")),
            "delay": lambda: sim.FaultAction.delay(3 * CANARY_S),
        }[self.kind]()

    def on_point(self, rank, name):
        if rank != self.rank or self.fired:
            return None
        if self.kind == "corrupt_canary" and name == "lifecycle.canary":
            self._canary_armed = True
            return None
        if name == self.point and self.kind in ("crash", "hang", "raise", "delay"):
            self.seen += 1
            if self.seen == self.nth:
                self.fired = True
                return self._action()
        return None

    def on_collective(self, rank, group, op, seq):
        if self._canary_armed and rank == self.rank and group != "lifecycle.control" and op == "all_reduce":
            self._canary_armed, self.fired = False, True
            return sim.FaultAction.corrupt()
        return None

    def on_group_create(self, rank, spec):
        if rank == self.rank and spec.name == self.group and spec.generation > 0 and not self.fired:
            if self.kind == "addr_in_use":
                self.fired = True
                return sim.FaultAction.fail(AddressInUseError(f"{spec.name}: port in TIME_WAIT"))
            if self.kind == "create_error":
                self.fired = True
                return sim.FaultAction.fail(RuntimeError(f"{spec.name}: driver error"))
        return None

    def on_pin(self, rank, nbytes):
        return None


class FaultPlan:
    """Several drawn faults at once (the profile's ``max_faults``): each hook asks them in order."""

    def __init__(self, faults: list[DrawnFault]):
        self.faults = faults

    def _first(self, method, *args):
        for f in self.faults:
            action = getattr(f, method)(*args)
            if action is not None:
                return action
        return None

    def on_point(self, rank, name):
        return self._first("on_point", rank, name)

    def on_collective(self, rank, group, op, seq):
        return self._first("on_collective", rank, group, op, seq)

    def on_group_create(self, rank, spec):
        return self._first("on_group_create", rank, spec)

    def on_pin(self, rank, nbytes):
        return None


KINDS = ["crash", "hang", "raise", "delay", "corrupt_canary", "addr_in_use", "create_error"]
SIZES = [k for k in (2, 4, 8, 16, 32, 64) if k <= max(4, BUDGET.max_ranks)]

fault = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 63),
    st.sampled_from(POINTS),
    st.integers(1, 2),
    st.sampled_from(["tp0", "dp1", "mp"]),
)


@BUDGET.settings(300)
@given(
    n=st.sampled_from(SIZES),
    policies=st.lists(st.sampled_from(list(PGPolicy)), min_size=1, max_size=3),
    two_phase=st.booleans(),
    parallel=st.booleans(),
    plan=st.lists(fault, max_size=BUDGET.max_faults),
    data=st.data(),
)
def test_lifecycle_never_deadlocks_and_ranks_end_together(n, policies, two_phase, parallel, plan, data):
    drawn = [DrawnFault(kind, rank % n, point, nth, group) for kind, rank, point, nth, group in plan]
    world = sim.SimWorld(n, faults=FaultPlan(drawn) if drawn else None, group_timeouts=True,
                         chooser=sim.HypothesisChooser(data, max_choices=BUDGET.chooser_depth))
    config = LifecycleConfig(agree_timeout_s=AGREE_S, canary_timeout_s=CANARY_S, cooldown_s=2.0, two_phase=two_phase,
                             parallel_destroy=parallel)

    async def job(rt):
        lc = PGLifecycle(rt, mesh(n), config=config)
        before = rt.memory_info().used
        error = None
        try:
            await lc.start()
            before = rt.memory_info().used
            for policy in policies:
                await lc.pause(policy=policy)
                await lc.weight_sync(lambda: None)
                await rt.sleep(ROLLOUT_S)
                await lc.resume()
        except Exception as exc:  # noqa: BLE001 - the property is about how ranks end
            error = exc
        return dict(state=lc.state, history=[(a, e, b) for _, a, e, b in lc.history], error=error,
                    end=rt.now(), leaked=rt.memory_info().used - before)

    results = world.run(job, return_exceptions=True)  # a deadlock raises here and fails the property
    event("no fault" if not drawn else ", ".join(f"{d.kind} {'fired' if d.fired else 'not reached'}" for d in drawn))
    alive = [r for r in results if isinstance(r, dict)]
    gone = [r for r in results if not isinstance(r, dict)]
    assert all(isinstance(g, (sim.RankCrashedError, sim.RankHungError)) for g in gone), gone
    killed = {d.rank for d in drawn if d.fired and d.kind in ("crash", "hang")}
    if len(killed) == n:  # several faults can crash or hang every rank: nobody is left to report
        return
    assert alive, "at least the ranks without a crash or hang report"
    states = {r["state"] for r in alive}
    assert len(states) == 1, f"ranks ended in different states: {[r['state'] for r in results if isinstance(r, dict)]}"
    (state,) = states
    if state is not PGState.FAILED:
        assert len({tuple(r["history"]) for r in alive}) == 1, "every rank took the same transitions"
        assert all(r["error"] is None for r in alive)
    else:
        assert all(r["error"] is not None for r in alive), "every surviving rank raised"
    if gone or any(d.fired and d.kind in ("raise", "create_error") for d in drawn):
        assert state is PGState.FAILED, "a crash, hang or exception fails every surviving rank"
    bound = len(policies) * (ROLLOUT_S + 12 * (AGREE_S + CREATE_S + CANARY_S)) + 200 * max(1, len(drawn))
    assert max(r["end"] for r in alive) <= bound
    if not drawn:
        assert state is PGState.ACTIVE
        assert all(r["leaked"] == 0 for r in alive), "communicator memory returns exactly"
