"""Fault plans: each kind hits the rank, the time or the protocol point it names, and nothing else."""
import pytest
import torch

from refimpl.runtime.base import AddressInUseError, CollectiveFailedError, CopyKind, GroupSpec, PinningError
from sim import RankCrashedError, RankHungError, SimWorld
from sim.machine.faults import Fault, FaultPlan, FaultPlanError, FaultType
from sim.machine.flows import FlowTransport
from sim.machine.topology import Topology


def _world(n, faults, **kw):
    return SimWorld(n, payload="real", faults=FaultPlan(faults), **kw)


async def _steps(rt):
    """Three all-reduces on the world group with a protocol point before each."""
    out = []
    for i in range(3):
        await rt.point(f"step.{i}")
        t = torch.ones(1)
        await rt.all_reduce(t)
        out.append(float(t))
    return out


def test_crash_at_a_named_point_stops_only_that_rank():
    world = _world(2, [Fault(FaultType.CRASH, ranks=(1,), at_point="step.1")], group_timeouts=True)
    res = world.run(_steps, return_exceptions=True)
    assert isinstance(res[1], RankCrashedError)
    assert isinstance(res[0], Exception)  # rank 0 waits in the all-reduce rank 1 never joins, then times out
    assert [f.kind for f in world.faults.fired] == ["crash"] and world.faults.fired[0].rank == 1


def test_hang_at_a_simulated_time_fires_at_the_ranks_next_operation():
    async def fn(rt):
        await rt.sleep(5.0)
        await rt.point("after.sleep")
        return rt.now()

    world = _world(2, [Fault(FaultType.HANG, ranks=(0,), at_time=3.0)])
    res = world.run(fn, return_exceptions=True)
    assert isinstance(res[0], RankHungError) and res[1] == 5.0
    assert world.faults.fired[0].time == 5.0


def test_nccl_error_fails_the_nth_collective_on_a_matching_group():
    world = _world(2, [Fault(FaultType.NCCL_ERROR, ranks=(0,), group="world", nth=2)], group_timeouts=True)
    res = world.run(_steps, return_exceptions=True)
    assert isinstance(res[0], CollectiveFailedError) and "NCCL error" in str(res[0])
    assert world.faults.fired[0].where == "all_reduce on 'world' seq 1"


def test_canary_corruption_gives_one_rank_a_wrong_result():
    world = _world(2, [Fault(FaultType.CANARY_CORRUPTION, ranks=(1,), at_point="step.2")])
    res = world.run(_steps)
    assert res[0] == [2.0, 2.0, 2.0]
    assert res[1][:2] == [2.0, 2.0] and res[1][2] != 2.0


def test_address_in_use_hits_rebuilds_only():
    spec = GroupSpec("tp", (0, 1), backend="nccl")

    async def fn(rt):
        await rt.new_group(spec)
        await rt.destroy_group("tp")
        try:
            await rt.recreate_group("tp")
        except AddressInUseError as exc:
            return str(exc)
        return "rebuilt"

    world = _world(2, [Fault(FaultType.ADDRESS_IN_USE, group="tp")], group_timeouts=True)
    res = world.run(fn, return_exceptions=True)
    assert all("Address already in use" in str(r) for r in res)
    assert {f.where for f in world.faults.fired} == {"recreate_group 'tp' gen 1"}


def test_pin_failure_above_a_size():
    async def fn(rt):
        rt.alloc_host(1024, torch.uint8, pinned=True)  # small: pins fine
        rt.alloc_host(1024, torch.uint8, pinned=False)  # pageable: never a pinning fault
        with pytest.raises(PinningError, match="cudaHostRegister failed"):
            rt.alloc_host(1 << 20, torch.uint8, pinned=True)
        return "ok"

    world = _world(1, [Fault(FaultType.PIN_FAILURE, min_bytes=4096)])
    assert world.run(fn) == ["ok"]


def test_slow_link_at_a_time_slows_the_copies_through_it():
    topo = Topology.from_preset("h200-1x")

    async def fn(rt):
        src = rt.alloc_device(4 * 10**9 // 4, torch.float32)
        dst = rt.alloc_host(4 * 10**9 // 4, torch.float32)
        await rt.copy_async(dst, src, CopyKind.D2H)
        return rt.now()

    plain = SimWorld(1, payload="meta", transport=FlowTransport(topo)).run(fn)[0]
    slowed = SimWorld(1, payload="meta", transport=FlowTransport(topo), faults=FaultPlan(
        [Fault(FaultType.SLOW_LINK, link="n0/gpu0", factor=0.25, at_time=0.0, duration_s=0.02)])).run(fn)[0]
    lat = 3.6e-6
    assert plain == pytest.approx(lat + 4e9 / 55.2e9)
    moved_slowly = (0.02 - lat) * 55.2e9 / 4  # after the copy's latency, a quarter of the rate until 0.02 s
    assert slowed == pytest.approx(0.02 + (4e9 - moved_slowly) / 55.2e9, rel=1e-9)


@pytest.mark.parametrize("raw, field", [
    ([{"kind": "meteor"}], r"faults\[0\]\.kind: 'meteor'"),
    ([{"kind": "crash", "ranks": "all"}], r"faults\[0\]\.ranks"),
    ([{"kind": "crash"}, {"kind": "hang", "at_time": -1}], r"faults\[1\]: hang: at_time"),
    ([{"kind": "slow_link", "at_time": 1.0}], r"faults\[0\]: slow_link: 'link' is required"),
    ([{"kind": "crash", "when": 3}], r"faults\[0\]\.when: unknown field"),
])
def test_a_bad_fault_plan_names_the_field(raw, field):
    with pytest.raises(FaultPlanError, match=field):
        FaultPlan.from_json(raw)


def test_a_plan_naming_ranks_outside_the_world_is_refused():
    with pytest.raises(FaultPlanError, match=r"faults\[0\]\.ranks"):
        _world(2, [Fault(FaultType.CRASH, ranks=(5,))])


def test_slow_link_at_a_point_fires_once_when_the_first_rank_gets_there():
    topo = Topology.from_preset("hgx-h200-8x")
    plan = FaultPlan([Fault(FaultType.SLOW_LINK, link="n0/pcisw0", factor=0.5, at_point="go")])

    async def fn(rt):
        await rt.sleep(0.001 * rt.rank)
        await rt.point("go")
        src = rt.alloc_device(10**9, torch.uint8)
        dst = rt.alloc_host(10**9, torch.uint8)
        await rt.copy_async(dst, src, CopyKind.D2H)
        return rt.now()

    ends = SimWorld(4, payload="meta", transport=FlowTransport(topo), faults=plan).run(fn)
    assert [f.where for f in plan.fired] == ["n0/pcisw0 x0.5"] and plan.fired[0].time == 0.0
    # ranks 0 and 1 share the slowed switch; ranks 2 and 3 sit behind pcisw1 at full speed
    assert ends[0] > ends[2] and ends[1] > ends[3]
