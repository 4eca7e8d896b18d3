"""Decisions that change what ranks do next are agreed, and agreements cannot pair across operations (simulator).

* SUSPEND: whether the groups are suspended again after a weight sync depends
  on group preservation, which is switched off per process (another lifecycle of
  the process failed). It is voted in the sync's agreement, so a rank whose
  process turned it off during the sync takes every rank with it: all destroy
  the groups (DESTROYED), none suspends while a peer destroys.
* A lazy wake where one rank skips ``use()``: the peer's ``use`` agreement and
  the skipping rank's next ``pause`` meet; both report
  :class:`AgreementMismatchError` naming both points, and end FAILED.
"""
from __future__ import annotations

import sim
from bench.switch_window import mesh_groups
from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState, preservation_disabled_reason
from refimpl.comm.group_plan import GroupPlanRules
from refimpl.runtime.base import GroupSpec


def _mesh(n: int) -> list[GroupSpec]:
    return [GroupSpec(f"tp{i}", (2 * i, 2 * i + 1)) for i in range(n // 2)] + [GroupSpec("dp", tuple(range(n)))]


def test_a_process_that_turns_preservation_off_during_the_sync_takes_every_rank_to_destroyed():
    world = sim.SimWorld(4, group_timeouts=True)

    async def job(rt):
        cfg = LifecycleConfig(policy=PGPolicy.SUSPEND, two_phase=False, agree_timeout_s=30.0, canary_timeout_s=5.0)
        lc = PGLifecycle(rt, _mesh(4), config=cfg)
        other = PGLifecycle(rt, [], config=LifecycleConfig(control_group="other.control"))  # another role

        async def sync():
            if rt.rank == 1:  # another lifecycle of rank 1's process fails: preservation off for that process
                await other.fall_back("test", RuntimeError("the other role failed"))

        paused = await lc.pause()
        await lc.weight_sync(sync)
        after = lc.state
        await lc.resume()
        second = await lc.pause()
        return dict(paused=paused, after=after, end=lc.state, second=second, off=preservation_disabled_reason(rt),
                    suspends=lc.stats.comm_suspends, destroys=lc.stats.destroys)

    out = world.run(job)
    assert [o["paused"] for o in out] == [PGState.SUSPENDED] * 4
    assert [o["after"] for o in out] == [PGState.DESTROYED] * 4, out
    assert [o["second"] for o in out] == [PGState.DESTROYED] * 4, "preservation stays off on every rank"
    assert out[1]["off"] and not out[0]["off"], "only rank 1's process turned it off; the others follow the vote"
    assert len({o["destroys"] for o in out}) == 1


def test_a_rank_that_skips_use_meets_a_reported_mismatch_on_every_rank():
    world = sim.SimWorld(2, group_timeouts=True)
    specs = mesh_groups(2, 1)

    async def job(rt):
        cfg = LifecycleConfig(policy=PGPolicy.SUSPEND_PLANNED, cooldown_s=2.0, two_phase=False, agree_timeout_s=30.0,
                              canary_timeout_s=5.0)
        lc = PGLifecycle(rt, specs, config=cfg, plan=GroupPlanRules(costs=None, sync_groups={f"tp{rt.rank}"},
                                                                    wake_groups={"dp"}))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        await rt.sleep(5.0)
        await lc.resume()
        lazy = lc.state
        t0 = rt.now()
        errors = []
        calls = [lambda: lc.use(["tp_dp"]), lc.pause] if rt.rank == 0 else [lc.pause]
        for call in calls:
            try:
                await call()
            except Exception as exc:  # noqa: BLE001 - which error, is the assertion
                errors.append((type(exc).__name__, str(exc)))
        return dict(lazy=lazy, state=lc.state, errors=errors, took=rt.now() - t0)

    out = world.run(job)
    assert [o["lazy"] for o in out] == [PGState.ACTIVE_LAZY] * 2
    assert [o["state"] for o in out] == [PGState.FAILED] * 2, out
    for o in out:
        name, msg = o["errors"][0]
        assert name == "AgreementMismatchError" and "'use.request'" in msg and "'pause.decide'" in msg, o
        assert o["took"] < 30.0, "reported at once, within the agreement timeout"


class _PortInUseOnce:
    """Rank 2's first rebuild of ``tp1`` (the last group of the walk) cannot bind its port (TIME_WAIT)."""

    def __init__(self):
        self.fired = False

    def on_point(self, rank, name):
        return None

    def on_collective(self, rank, group, op, seq):
        return None

    def on_group_create(self, rank, spec):
        if rank == 2 and spec.name == "tp1" and spec.generation > 0 and not self.fired:
            self.fired = True
            from refimpl.runtime.base import AddressInUseError

            return sim.FaultAction.fail(AddressInUseError("tp1: port in TIME_WAIT"))
        return None

    def on_pin(self, rank, nbytes):
        return None


def test_an_address_in_use_at_one_ranks_rebuild_is_retried_with_the_deployments_timeouts():
    """Agreements wait 300 s by default, group creation 600 s: the rank whose bind failed waits at the rebuild's
    agreement for peers still in the group's rendezvous, then every rank retries together."""
    faults = _PortInUseOnce()
    world = sim.SimWorld(4, group_timeouts=True, faults=faults)
    specs = [GroupSpec(s.name, s.ranks) for s in _mesh(4)]  # torch's default timeout (600 s)

    async def job(rt):
        lc = PGLifecycle(rt, specs, config=LifecycleConfig(policy=PGPolicy.DESTROY_DEFERRED))
        await lc.pause()
        await lc.weight_sync(lambda: None)
        await rt.sleep(30.0)
        await lc.resume()
        return lc.state, lc.stats.address_in_use_retries

    out = world.run(job)
    assert faults.fired
    assert out == [(PGState.ACTIVE, 1)] * 4, out


class _CorruptControl:
    """Rank 0's copy of the result of the first control-group collective after ``point`` comes back corrupted (+1)."""

    def __init__(self, point: str):
        self.point, self.armed, self.fired = point, False, False

    def on_point(self, rank, name):
        self.armed = self.armed or (rank == 0 and name == self.point)
        return None

    def on_collective(self, rank, group, op, seq):
        if rank == 0 and self.armed and not self.fired and group == "lifecycle.control":
            self.fired = True
            return sim.FaultAction.corrupt()
        return None

    def on_group_create(self, rank, spec):
        return None

    def on_pin(self, rank, nbytes):
        return None


def test_a_control_group_result_corrupted_on_one_rank_is_named_as_such_not_as_a_mismatch():
    """No agreement survives a corrupted result of its last round on one rank (that rank cannot tell its peers, who
    read the true result); the lifecycle assumes a reliable control group (Gloo over TCP). What it can do: a header
    that no all_reduce(MIN) can produce is reported as a corrupted result, not as ranks calling different operations."""
    faults = _CorruptControl("lifecycle.pause.decide")
    world = sim.SimWorld(2, group_timeouts=True, faults=faults)

    async def job(rt):
        lc = PGLifecycle(rt, _mesh(2), config=LifecycleConfig(policy=PGPolicy.DESTROY, agree_timeout_s=30.0))
        await lc.start()
        try:
            await lc.pause()  # its decision's agreement: corrupted on rank 0
        except Exception as exc:  # noqa: BLE001 - which error, is the assertion
            return lc.state, type(exc).__name__, str(exc)
        return lc.state, None, None

    state, name, msg = world.run(job, return_exceptions=True)[0]
    assert faults.fired
    assert state is PGState.FAILED
    assert name == "AgreementError" and "corrupted" in msg and "'pause.decide'" in msg, (name, msg)
