"""PGLifecycle in the simulator: SUSPEND (which Gloo cannot do), communicator memory, and faults.

The protocol code is the same as on TorchRuntime; SimWorld supplies NCCL-like
groups with a communicator memory model (384 MiB suspendable + 4 MiB persistent
per group and rank) and fault hooks that crash, hang, fail or corrupt a rank.
"""
from __future__ import annotations

import pytest

import sim
from refimpl.comm import (
    AgreementTimeoutError,
    LifecycleConfig,
    PeerFailedError,
    PGLifecycle,
    PGPolicy,
    PGState,
    ResumeMemoryError,
)
from refimpl.runtime.base import AddressInUseError, GroupSpec, GroupSuspendedError

MiB = 2**20
SUSPENDABLE, PERSISTENT = 384 * MiB, 4 * MiB


def mesh(n: int = 4) -> list[GroupSpec]:
    """TP pairs and two DP groups over ``n`` ranks (n even)."""
    tp = [GroupSpec(f"tp{i}", (2 * i, 2 * i + 1)) for i in range(n // 2)]
    return tp + [GroupSpec("dp0", tuple(range(0, n, 2))), GroupSpec("dp1", tuple(range(1, n, 2)))]


def config(policy: str, **kw) -> LifecycleConfig:
    kw.setdefault("agree_timeout_s", 60.0)
    kw.setdefault("canary_timeout_s", 10.0)
    return LifecycleConfig(policy=PGPolicy[policy], **kw)


class Faults:
    """Fault hooks for these tests: named actions at points, at group creation, or on a canary."""

    def __init__(self, at_point=None, at_create=None, corrupt_canary_rank=None):
        self.at_point = dict(at_point or {})  # (rank, point) -> FaultAction, fired once
        self.at_create = dict(at_create or {})  # (rank, group) -> FaultAction, fired once on a rebuild
        self.corrupt_canary_rank = corrupt_canary_rank
        self._canary_armed = False

    def on_point(self, rank, name):
        if name == "lifecycle.canary" and rank == self.corrupt_canary_rank:
            self._canary_armed = True
        return self.at_point.pop((rank, name), None)

    def on_collective(self, rank, group, op, seq):
        if self._canary_armed and rank == self.corrupt_canary_rank and op == "all_reduce" and group != "lifecycle.control":
            self._canary_armed = False
            return sim.FaultAction.corrupt()
        return None

    def on_group_create(self, rank, spec):
        return self.at_create.pop((rank, spec.name), None) if spec.generation > 0 else None

    def on_pin(self, rank, nbytes):
        return None


def test_suspend_releases_communicator_memory_and_refuses_collectives_while_suspended():
    world = sim.SimWorld(4)

    async def job(rt):
        import torch

        lc = PGLifecycle(rt, mesh(), config=config("SUSPEND", two_phase=False))
        await lc.start()
        mine = [g for g in lc.groups if rt.is_member(g)]
        live_used = rt.memory_info().used
        held_live = lc.comm_memory()
        state = await lc.pause()
        suspended_used = rt.memory_info().used
        held_suspended = lc.comm_memory()
        refused = None
        try:
            await rt.all_reduce(torch.ones(1), group=mine[0], timeout_s=5)
        except GroupSuspendedError as e:
            refused = str(e)
        gathered = await lc.weight_sync(lambda: "synced")
        after_sync = lc.state
        await lc.resume()
        t = torch.ones(1)
        await rt.all_reduce(t, group=mine[0], timeout_s=5)
        return dict(mine=mine, live_used=live_used, suspended_used=suspended_used, held_live=held_live,
                    held_suspended=held_suspended, state=state, refused=refused, gathered=gathered,
                    after_sync=after_sync, end=lc.state, sum=float(t.item()), resumed_used=rt.memory_info().used,
                    stats=lc.stats)

    for r in world.run(job):
        assert r["state"] is PGState.SUSPENDED and r["after_sync"] is PGState.SUSPENDED
        n = len(r["mine"])
        assert r["held_live"].suspendable == n * SUSPENDABLE
        assert r["held_suspended"].suspendable == 0 and r["held_suspended"].persistent == n * PERSISTENT
        assert r["live_used"] - r["suspended_used"] == n * SUSPENDABLE, "suspend frees exactly the suspendable bytes"
        assert r["resumed_used"] == r["live_used"]
        assert r["refused"] and "suspended" in r["refused"], "a collective on a suspended group is refused clearly"
        assert r["gathered"] == "synced" and r["end"] is PGState.ACTIVE and r["sum"] == 2.0
        assert r["stats"].comm_suspends == 2 * n and r["stats"].comm_resumes == 2 * n and r["stats"].canaries == 2


def test_two_phase_enabling_then_suspend_every_step():
    world = sim.SimWorld(4)

    async def job(rt):
        lc = PGLifecycle(rt, mesh(), config=config("SUSPEND"))
        states = []
        for _ in range(3):
            states.append(await lc.pause())
            await lc.weight_sync(lambda: None)
            await rt.sleep(30.0)
            await lc.resume()
        return states, (lc.preservation.eligible, lc.preservation.ready)

    for states, phases in world.run(job):
        assert states == [PGState.DESTROYED, PGState.SUSPENDED, PGState.SUSPENDED]
        assert phases == (True, True)


def test_corrupted_canary_after_resume_falls_back_to_a_rebuild():
    world = sim.SimWorld(4, faults=Faults(corrupt_canary_rank=3))

    async def job(rt):
        import torch

        lc = PGLifecycle(rt, mesh(), config=config("SUSPEND", two_phase=False))
        await lc.pause()
        await lc.resume()  # resume -> canary (corrupted on rank 3) -> abort -> rebuild
        sums = {}
        for g in lc.groups:
            if rt.is_member(g):
                t = torch.ones(1)
                await rt.all_reduce(t, group=g, timeout_s=5)
                sums[g] = t.item()
        second = await lc.pause()
        return [(a, e, b) for _, a, e, b in lc.history], sums, second, lc.preservation.disabled, lc.stats.rebuilds

    results = world.run(job)
    for history, sums, second, disabled, rebuilds in results:
        names = [(a.name, e.name, b.name) for a, e, b in history]
        assert names[:5] == [("ACTIVE", "SUSPEND", "SUSPENDED"), ("SUSPENDED", "RELOAD", "RELOADING"),
                             ("RELOADING", "CANARY_FAILED", "DESTROYED"), ("DESTROYED", "RELOAD", "RELOADING"),
                             ("RELOADING", "RELOADED", "ACTIVE")]
        assert all(v == 2.0 for v in sums.values()), "rebuilt groups compute right"
        assert second is PGState.DESTROYED and disabled and "canary" in disabled
        assert rebuilds > 0
    assert len({tuple(r[0]) for r in results}) == 1


def test_a_crashed_rank_makes_every_other_rank_fail_within_the_agreement_timeout():
    timeout = 20.0
    world = sim.SimWorld(4, faults=Faults(at_point={(2, "lifecycle.suspend"): sim.FaultAction.crash()}))

    async def job(rt):
        lc = PGLifecycle(rt, mesh(), config=config("SUSPEND", two_phase=False, agree_timeout_s=timeout))
        await lc.start()
        t0 = rt.now()
        try:
            await lc.pause()
        except AgreementTimeoutError as e:
            return lc.state, rt.now() - t0, str(e), [rt.group_live(g) for g in lc.groups]
        return lc.state, rt.now() - t0, None, None

    results = world.run(job, return_exceptions=True)
    assert isinstance(results[2], sim.RankCrashedError)
    for rank in (0, 1, 3):
        state, elapsed, err, live = results[rank]
        assert state is PGState.FAILED and err and "agreement at 'suspend' timed out" in err
        assert elapsed <= timeout + 2.0, "every surviving rank fails within the bound"
        assert live == [False] * 4, "the role's groups are aborted"


def test_address_in_use_on_rebuild_is_retried_together_after_the_cooldown():
    faults = Faults(at_create={(1, "tp0"): sim.FaultAction.fail(AddressInUseError("port 29512 in TIME_WAIT"))})
    world = sim.SimWorld(4, faults=faults, group_timeouts=True)
    specs = [GroupSpec(s.name, s.ranks, timeout_s=5.0) for s in mesh()]

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config("DESTROY_DEFERRED", cooldown_s=2.0))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        return lc.state, lc.stats.address_in_use_retries, rt.group_spec("tp0").generation, lc.cooldown.waited_s

    for state, retries, generation, waited in world.run(job):
        assert state is PGState.DESTROYED
        assert retries == 1
        assert generation == 2, "one failed attempt, one good one, each with a fresh store prefix"
        assert waited >= 2.0


def test_too_little_memory_to_resume_fails_every_rank_before_any_barrier():
    device = 3 * (SUSPENDABLE + PERSISTENT) + 64 * MiB  # the world group, one TP and one DP group
    world = sim.SimWorld(4, memory=sim.LedgerMemory(device_capacity=device))

    async def job(rt):
        import torch

        lc = PGLifecycle(rt, mesh(), config=config("SUSPEND", two_phase=False))
        await lc.pause()
        rollout = rt.alloc_device(800 * MiB if rt.rank == 0 else 1, torch.uint8, tag="rollout")  # not released
        try:
            await lc.resume()
        except (ResumeMemoryError, PeerFailedError) as e:
            rt.release(rollout)
            return type(e).__name__, lc.state
        return None, lc.state

    results = world.run(job)
    assert results[0] == ("ResumeMemoryError", PGState.FAILED)
    assert all(r == ("PeerFailedError", PGState.FAILED) for r in results[1:])


def test_a_peers_failure_is_one_error_class_named_by_the_rank_and_caught_by_either_root():
    """The lifecycle's peer failure is the store's too (local_dedup raises the same PeerFailedError): a
    LifecycleError and a DedupError at once, naming the rank that failed."""
    from refimpl.comm import LifecycleError
    from refimpl.runtime.errors import DedupError

    world = sim.SimWorld(3)

    def release_memory(rt):
        if rt.rank == 2:
            raise RuntimeError("offload failed on rank 2")

    async def job(rt):
        lc = PGLifecycle(rt, mesh(2), config=config("DESTROY_DEFERRED"))
        caught = []
        try:
            await lc.pause(lambda: release_memory(rt))
        except DedupError as e:
            caught.append(("DedupError", type(e).__name__, getattr(e, "ranks", None)))
        except LifecycleError as e:  # only reached if the class were the lifecycle's alone
            caught.append(("LifecycleError", type(e).__name__, getattr(e, "ranks", None)))
        except RuntimeError as e:
            caught.append(("RuntimeError", str(e), None))
        return caught, lc.state

    results = world.run(job)
    for rank in (0, 1):  # ranks 0 and 1 hold the groups; rank 2 holds none but fails the agreed step
        assert results[rank] == ([("DedupError", "PeerFailedError", (2,))], PGState.FAILED), results[rank]
    assert results[2] == ([("RuntimeError", "offload failed on rank 2", None)], PGState.FAILED)


PAUSED = {"PAUSED_LIVE": PGState.PAUSED_LIVE, "SUSPEND": PGState.SUSPENDED,
          "DESTROY_DEFERRED": PGState.DESTROYED, "DESTROY": PGState.DESTROYED}


@pytest.mark.parametrize("policy", sorted(PAUSED))
def test_the_lifecycle_runs_in_a_meta_payload_world(policy):
    """Whole cycles, not only start(): the control group's agreement values are real host tensors and the
    canary falls back to a host scalar, so the simulator combines them even when the model's payloads are
    meta tensors (a 1,024-rank meta run can use the lifecycle). Communicator memory follows the policy."""
    world = sim.SimWorld(4, payload="meta")

    async def job(rt):
        lc = PGLifecycle(rt, mesh(), config=config(policy, two_phase=False, cooldown_s=2.0))
        await lc.start()
        mine = sum(rt.is_member(g) for g in lc.groups)
        used = [rt.memory_info().used]
        states = []
        for _ in range(2):
            states.append(await lc.pause())
            used.append(rt.memory_info().used)
            await lc.weight_sync(lambda: None)
            await rt.sleep(30.0)
            states.append(await lc.resume())
            used.append(rt.memory_info().used)
        return mine, states, used, lc.history, lc.stats

    results = world.run(job)
    assert len({tuple((a, e, b) for _, a, e, b in r[3]) for r in results}) == 1, "every rank took the same transitions"
    for mine, states, used, _history, stats in results:
        assert states == [PAUSED[policy], PGState.ACTIVE] * 2
        assert used[2] == used[4] == used[0], "communicator memory comes back exactly"
        paused_frees = {"PAUSED_LIVE": 0, "SUSPEND": SUSPENDABLE, "DESTROY_DEFERRED": SUSPENDABLE + PERSISTENT,
                        "DESTROY": SUSPENDABLE + PERSISTENT}[policy]
        assert used[0] - used[1] == used[0] - used[3] == mine * paused_frees
        if policy in ("PAUSED_LIVE", "SUSPEND"):
            # PAUSED_LIVE: one canary after each pause; SUSPEND: one after each resume (weight sync, resume)
            assert stats.canaries == {"PAUSED_LIVE": 2, "SUSPEND": 4}[policy] and stats.canary_failures == 0
        else:
            # each cycle destroys and rebuilds every role group twice (for the weight sync, then at resume)
            assert stats.rebuilds == stats.destroys == 2 * 2 * len(mesh())


def test_a_group_failing_mid_walk_fails_every_rank_within_the_creation_timeout():
    # rank 1 cannot rebuild dp1 (not a port problem) and never reaches its rendezvous. It keeps walking,
    # so tp0 (with rank 0) is rebuilt; rank 3 waits in dp1 until the group's creation timeout; then every
    # rank meets at the agreement and fails together
    create_timeout = 5.0
    boom = RuntimeError("driver error while creating dp1")
    world = sim.SimWorld(4, group_timeouts=True, faults=Faults(at_create={(1, "dp1"): sim.FaultAction.fail(boom)}))
    specs = [GroupSpec(s.name, s.ranks, timeout_s=create_timeout) for s in mesh()]

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=config("DESTROY_DEFERRED", cooldown_s=0.0))
        await lc.pause()
        t0 = rt.now()
        try:
            await lc.weight_sync(lambda: None)
        except Exception as e:  # noqa: BLE001 - the type is what the test checks
            return type(e).__name__, str(e), lc.state, rt.now() - t0
        return None, None, lc.state, rt.now() - t0

    results = world.run(job)  # a rank left in a rendezvous for good would be a DeadlockError here
    assert results[1][:2] == ("RuntimeError", "driver error while creating dp1")
    for rank in (0, 2, 3):
        assert results[rank][0] == "PeerFailedError" and "rank 1 failed at 'rebuild'" in results[rank][1]
    assert all(r[2] is PGState.FAILED for r in results)
    assert max(r[3] for r in results) <= 2 * create_timeout + 1.0, "bounded by the creation timeout"
