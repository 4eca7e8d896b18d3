"""SimRuntime through SimWorld: data, groups, memory, time and injected faults."""
from __future__ import annotations

import pytest
import torch

import sim
from refimpl.runtime import (
    WORLD, AddressInUseError, CollectiveTimeoutError, CopyKind, GroupError, GroupSpec, GroupSuspendedError,
    PinningError, ReduceOp,
)
from sim.machine.protocols import FaultAction, LedgerMemory, NcclCommCosts, NoFaults

MiB = 1 << 20
COMM = NcclCommCosts()
COMM_BYTES = COMM.nccl_suspendable + COMM.nccl_persistent


class PointFaults(NoFaults):
    """Inject ``action`` on ``rank`` at the named point / collective / group creation."""

    def __init__(self, rank, action, *, point=None, collective=None, create=False, pin=False):
        self.rank, self.action = rank, action
        self.point, self.collective, self.create, self.pin = point, collective, create, pin

    def on_point(self, rank, name):
        return self.action if rank == self.rank and name == self.point else None

    def on_collective(self, rank, group, op, seq):
        return self.action if rank == self.rank and (group, op, seq) == self.collective else None

    def on_group_create(self, rank, spec):
        return self.action if rank == self.rank and self.create and spec.name != WORLD else None

    def on_pin(self, rank, nbytes):
        return self.action if rank == self.rank and self.pin else None


# --------------------------------------------------------------------------- data


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_copy_round_trip_is_bitwise(dtype):
    async def fn(rt):
        src = rt.alloc_device(257, dtype, tag="param")
        gen = torch.Generator().manual_seed(rt.rank)
        src.copy_(torch.randint(0, 120, (257,), generator=gen).to(dtype))
        if dtype.is_floating_point:
            src.mul_(1.37)
        host = rt.alloc_host(257, dtype, tag="backup")
        await rt.copy_async(host, src, CopyKind.D2H)
        back = rt.alloc_device(257, dtype, tag="restored")
        done = rt.copy_async(back, host, CopyKind.H2D)
        await done
        assert done.done()
        return src.view(torch.uint8).clone(), back.view(torch.uint8).clone(), rt.copy_stats.host_copies

    for src, back, copies in sim.run_ranks(3, fn):
        assert torch.equal(src, back)
        assert copies == 2


def test_copy_lands_only_when_awaited_and_takes_transport_time():
    transport = sim.FixedBandwidthTransport(d2h_bps=1e9, latency_s=0.0)

    async def fn(rt):
        src = rt.alloc_device(1000, torch.float32)
        src.fill_(7.0)
        dst = rt.alloc_host(1000, torch.float32)
        dst.zero_()
        c1 = rt.copy_async(dst, src, CopyKind.D2H)
        before = dst.sum().item()
        t0 = rt.now()
        c2 = rt.copy_async(rt.alloc_host(1000, torch.float32), src, CopyKind.D2H)
        await c1
        t1 = rt.now()
        await c2  # same copy engine: runs after c1
        return before, dst.sum().item(), t1 - t0, rt.now() - t0

    before, after, t1, t2 = sim.run_ranks(1, fn, transport=transport)[0]
    assert before == 0.0 and after == 7000.0
    assert t1 == pytest.approx(4000 / 1e9) and t2 == pytest.approx(8000 / 1e9)


@pytest.mark.parametrize("released", ["source", "destination"])
def test_a_buffer_released_before_its_copy_completes_fails_the_copy_clearly(released):
    """Releasing a copy's buffer while the copy is in flight is a use-after-free on a GPU; here the copy
    fails with a SimUsageError naming the side (torch itself would read freed storage and may crash)."""
    async def fn(rt):
        src = rt.alloc_device(1000, torch.float32)
        dst = rt.alloc_host(1000, torch.float32)
        copy = rt.copy_async(dst, src, CopyKind.D2H)
        rt.release(src) if released == "source" else dst.untyped_storage().resize_(0)
        await copy

    with pytest.raises(sim.RankFailedError) as info:
        sim.run_ranks(1, fn)
    assert isinstance(info.value.__cause__, sim.SimUsageError)
    assert f"copy's {released} was released or resized before the copy completed" in str(info.value)


@pytest.mark.parametrize("n", [2, 5, 16])
def test_all_gather_all_reduce_broadcast_values(n):
    async def fn(rt):
        x = rt.alloc_device(3, torch.float64)
        x.copy_(torch.tensor([rt.rank, 10 * rt.rank, -rt.rank], dtype=torch.float64))
        out = rt.alloc_device(3 * n, torch.float64)
        await rt.all_gather_into_tensor(out, x)
        s, lo, hi = x.clone(), x.clone(), x.clone()
        await rt.all_reduce(s, ReduceOp.SUM)
        await rt.all_reduce(lo, ReduceOp.MIN)
        await rt.all_reduce(hi, ReduceOp.MAX)
        b = x.clone()
        await rt.broadcast(b, src=n - 1)
        await rt.barrier()
        return out.tolist(), s.tolist(), lo.tolist(), hi.tolist(), b.tolist()

    total = sum(range(n))
    for out, s, lo, hi, b in sim.run_ranks(n, fn):
        assert out == [v for r in range(n) for v in (r, 10 * r, -r)]
        assert s == [total, 10 * total, -total]
        assert lo == [0, 0, -(n - 1)] and hi == [n - 1, 10 * (n - 1), 0]
        assert b == [n - 1, 10 * (n - 1), -(n - 1)]


def test_all_gather_input_may_be_a_slice_of_the_output():
    async def fn(rt):
        out = rt.alloc_device(8, torch.int32)
        out.fill_(-1)
        mine = out[rt.rank * 2:(rt.rank + 1) * 2]
        mine.fill_(rt.rank + 1)
        await rt.all_gather_into_tensor(out, mine)
        return out.tolist()

    assert sim.run_ranks(4, fn) == [[1, 1, 2, 2, 3, 3, 4, 4]] * 4


def test_subgroup_collectives_use_group_rank_order():
    async def fn(rt):
        await rt.new_group(GroupSpec("odd", (3, 1)))  # sorted to (1, 3)
        if not rt.is_member("odd"):
            with pytest.raises(GroupError, match="not a member"):
                await rt.barrier("odd")
            return None
        x = torch.tensor([float(rt.rank)])
        out = torch.empty(2)
        await rt.all_gather_into_tensor(out, x, group="odd")
        return out.tolist(), rt.group_rank("odd")

    res = sim.run_ranks(4, fn)
    assert res[0] is None and res[2] is None
    assert res[1] == ([1.0, 3.0], 0) and res[3] == ([1.0, 3.0], 1)


def test_meta_payload_moves_no_data_but_counts_bytes():
    shard = 70 * 10**9 // 8  # elements of a 70B-parameter bf16 model sharded 8 ways

    async def fn(rt):
        x = rt.alloc_device(shard, torch.bfloat16, tag="shard")
        out = rt.alloc_device(x.numel() * rt.world_size, torch.bfloat16)
        await rt.all_gather_into_tensor(out, x)
        h = rt.alloc_host(x.numel(), torch.bfloat16)
        await rt.copy_async(h, x, CopyKind.D2H)
        return x.device.type, rt.now()

    world = sim.SimWorld(8, payload="meta", memory=LedgerMemory(device_capacity=10**12))
    res = world.run(fn)
    assert all(dev == "meta" for dev, _ in res)
    gather_s = sim.RingCollectiveCost().time("all_gather", tuple(range(8)), 8 * 2 * shard)
    copy_s = 10e-6 + 2 * shard / 55.2e9
    assert all(t == pytest.approx(gather_s + copy_s) for _, t in res)
    assert world.memory.ledger(0).device_peak == COMM_BYTES + 9 * 2 * shard
    assert world.memory.ledger(0).host_pinned_peak == 2 * shard


# --------------------------------------------------------------------------- memory


def test_alloc_release_and_memory_info_track_device_bytes():
    async def fn(rt):
        base = rt.memory_info()
        t = rt.alloc_device(MiB, torch.float32, tag="grad")
        view = t[10:20]
        after_alloc = rt.memory_info()
        rt.release(view)  # any view releases the whole storage
        after_release = rt.memory_info()
        return base, after_alloc, after_release, t.untyped_storage().nbytes(), tuple(t.shape)

    world = sim.SimWorld(2)
    for base, a, r, nbytes, shape in world.run(fn):
        assert base.total == int(141e9) and base.used == COMM_BYTES  # the world group's communicator
        assert a.used - base.used == 4 * MiB
        assert r == base and nbytes == 0 and shape == (MiB,)
    assert world.memory.ledger(1).device_peak == COMM_BYTES + 4 * MiB


def test_dropped_buffer_stays_cached_until_empty_cache_or_reuse():
    async def fn(rt):
        base = rt.memory_info().used
        t = rt.alloc_device(1000, torch.float32)
        del t  # like PyTorch's caching allocator: the driver still sees the block
        cached = rt.memory_info().used - base
        reused = rt.alloc_device(500, torch.float32)  # takes from the cache, no new bytes
        after_reuse = rt.memory_info().used - base
        rt.empty_cache()
        after_empty = rt.memory_info().used - base
        rt.release(reused)
        return cached, after_reuse, after_empty, rt.memory_info().used - base

    assert sim.run_ranks(1, fn) == [(4000, 4000, 2000, 0)]


def test_device_oom_names_rank_size_and_holders():
    async def fn(rt):
        keep = rt.alloc_device(600, torch.uint8, tag="weights")
        try:
            rt.alloc_device(600, torch.uint8, tag="optimizer")
        except torch.OutOfMemoryError as exc:  # a SimOutOfMemoryError is also torch's OOM
            return type(exc), str(exc), keep.numel()

    cls, msg, _ = sim.run_ranks(1, fn, memory=LedgerMemory(device_capacity=1000), comm=NcclCommCosts(0, 0))[0]
    assert cls is sim.SimOutOfMemoryError
    assert "rank 0" in msg and "600 bytes" in msg and "'optimizer'" in msg and "weights=600" in msg


def test_host_pinned_ledger_and_free_host():
    async def fn(rt):
        a = rt.alloc_host(100, torch.float32, pinned=True, tag="pool")
        b = rt.alloc_host(50, torch.float32, pinned=False)
        rt.free_host(a)
        with pytest.raises(ValueError, match="did not allocate"):
            rt.free_host(a)
        return b.numel()

    world = sim.SimWorld(1)
    world.run(fn)
    led = world.memory.ledger(0)
    assert (led.host_pinned, led.host_pinned_peak, led.host_pageable_peak) == (0, 400, 200)


def test_pin_fault_raises_pinning_error():
    async def fn(rt):
        rt.alloc_host(10, torch.uint8, pinned=False)  # pageable: no pinning, no fault
        try:
            rt.alloc_host(10, torch.uint8, pinned=True)
        except PinningError as exc:
            return str(exc)
        return "pinned"

    faults = PointFaults(0, FaultAction.fail(PinningError("ulimit -l")), pin=True)
    world = sim.SimWorld(2, faults=faults)
    assert world.run(fn) == ["ulimit -l", "pinned"]
    assert world.memory.ledger(0).host_pinned_peak == 0 and world.memory.ledger(1).host_pinned_peak == 10


# --------------------------------------------------------------------------- groups


def test_suspend_frees_comm_memory_and_refuses_collectives_until_resume():
    async def fn(rt):
        await rt.new_group(GroupSpec("tp", (0, 1)))
        held = rt.comm_memory("tp")
        used = rt.memory_info().used
        t0 = rt.now()
        await rt.suspend_group("tp")
        suspend_s = rt.now() - t0
        freed = used - rt.memory_info().used
        x = torch.ones(2)
        with pytest.raises(GroupSuspendedError, match="resume_group"):
            await rt.all_reduce(x, group="tp")
        assert rt.group_suspended("tp") and rt.group_live("tp")
        await rt.resume_group("tp")
        await rt.all_reduce(x, group="tp")
        return held, freed, suspend_s, x.tolist(), rt.memory_info().used == used

    for held, freed, suspend_s, x, restored in sim.run_ranks(2, fn):
        assert held == sim.machine.protocols.CommMemory(384 * MiB, 4 * MiB)
        assert freed == 384 * MiB and suspend_s == pytest.approx(0.30)
        assert x == [2.0, 2.0] and restored


def test_gloo_groups_hold_no_comm_memory_and_cannot_suspend():
    async def fn(rt):
        await rt.new_group(GroupSpec("ctl", (0, 1), backend="gloo"))
        with pytest.raises(GroupError, match="gloo"):
            await rt.suspend_group("ctl")
        return rt.comm_memory("ctl")

    assert sim.run_ranks(2, fn) == [sim.machine.protocols.CommMemory()] * 2


def test_destroy_and_recreate_keep_arguments_and_bump_generation():
    async def fn(rt):
        spec = GroupSpec("dp", (0, 1, 2), backend="nccl", timeout_s=30.0, options=(("k", 1),))
        await rt.new_group(spec)
        before = rt.memory_info().used
        await rt.destroy_group("dp")
        freed = before - rt.memory_info().used
        assert not rt.group_live("dp") and rt.group_spec("dp") == spec
        with pytest.raises(GroupError, match="destroyed"):
            await rt.barrier("dp")
        new = await rt.recreate_group("dp")
        x = torch.tensor([1])
        await rt.all_reduce(x, group="dp")
        with pytest.raises(GroupError, match="destroy it before"):
            await rt.recreate_group("dp")
        return freed, new, x.item(), rt.group_names()

    for freed, new, x, names in sim.run_ranks(3, fn):
        assert freed == COMM_BYTES and x == 3 and names == [WORLD, "dp"]
        assert new.generation == 1 and new.store_prefix == "dp/gen1"
        assert (new.ranks, new.backend, new.timeout_s, new.options) == ((0, 1, 2), "nccl", 30.0, (("k", 1),))


def test_group_creation_is_a_rendezvous_among_members():
    async def fn(rt):
        await rt.sleep(float(rt.rank))  # members arrive at t=0, 1, 2; rank 3 is not a member
        await rt.new_group(GroupSpec("g", (0, 1, 2)))
        return rt.now()

    t = sim.run_ranks(4, fn)
    assert t[0] == t[1] == t[2] == pytest.approx(2.0 + COMM.nccl_create_s)
    assert t[3] == 3.0  # a non-member returns at once


def test_duplicate_group_and_world_destroy_are_refused():
    async def fn(rt):
        await rt.new_group(GroupSpec("g", (0, 1)))
        with pytest.raises(GroupError, match="already exists"):
            await rt.new_group(GroupSpec("g", (0, 1)))
        with pytest.raises(GroupError, match="never destroyed"):
            await rt.destroy_group(WORLD)
        with pytest.raises(GroupError, match="unknown group"):
            rt.group_spec("nope")
        return True

    assert sim.run_ranks(2, fn) == [True, True]


def test_address_in_use_on_rebuild_and_retry_takes_a_new_generation():
    faults = PointFaults(0, FaultAction.fail(AddressInUseError("port 29500 in TIME_WAIT")), create=False)

    async def fn(rt):
        await rt.new_group(GroupSpec("g", (0,)))
        await rt.destroy_group("g")
        faults.create = True  # the rendezvous port is still in TIME_WAIT
        with pytest.raises(AddressInUseError):
            await rt.recreate_group("g")
        failed = (rt.group_live("g"), rt.group_spec("g").generation)
        faults.create = False
        spec = await rt.recreate_group("g")
        return failed, spec.generation, rt.group_live("g"), rt.comm_memory("g").suspendable == COMM.nccl_suspendable

    # the failed attempt used up generation 1, so stale keys of it are never read by the retry
    assert sim.run_ranks(1, fn, faults=faults) == [((False, 1), 2, True, True)]


# --------------------------------------------------------------------------- time and timeouts


def test_clock_never_goes_back_and_sleep_advances_it():
    async def fn(rt):
        seen = [rt.now()]
        x = torch.ones(1)
        for i in range(5):
            await rt.sleep(0.01 * (rt.rank + i))
            seen.append(rt.now())
            await rt.all_reduce(x)
            seen.append(rt.now())
        return seen

    for seen in sim.run_ranks(4, fn):
        assert seen == sorted(seen) and seen[-1] > 0


def test_collective_timeout_when_a_peer_never_comes():
    async def fn(rt):
        if rt.rank == 1:
            return "skipped"
        t0 = rt.now()
        with pytest.raises(CollectiveTimeoutError, match=r"waiting for ranks \[1\]"):
            await rt.all_reduce(torch.ones(1), timeout_s=5.0)
        return rt.now() - t0

    assert sim.run_ranks(2, fn) == [5.0, "skipped"]


def test_group_timeouts_flag_applies_the_spec_timeout():
    async def fn(rt):
        await rt.new_group(GroupSpec("g", (0, 1), timeout_s=7.0))
        if rt.rank == 0:
            with pytest.raises(CollectiveTimeoutError):
                await rt.barrier("g")
        return rt.now()

    t = sim.run_ranks(2, fn, group_timeouts=True)
    assert t[0] == pytest.approx(COMM.nccl_create_s + 7.0)


def test_completion_at_the_timeout_instant_wins():
    async def fn(rt):
        await rt.sleep(1.0 if rt.rank == 1 else 0.0)
        # rank 0 arrives at 0, rank 1 at 1: the barrier completes exactly when rank 0's timeout is due
        await rt.barrier(timeout_s=1.0 + sim.RingCollectiveCost().time("barrier", (0, 1), 0))
        return "ok"

    assert sim.run_ranks(2, fn) == ["ok", "ok"]


# --------------------------------------------------------------------------- faults and results


def test_raise_at_point_fails_the_rank_with_cause():
    faults = PointFaults(1, FaultAction.fail(RuntimeError("nccl error")), point="lifecycle.canary")

    async def fn(rt):
        await rt.point("lifecycle.canary")
        return rt.rank

    with pytest.raises(sim.RankFailedError, match="rank 1 failed") as info:
        sim.run_ranks(2, fn, faults=faults)
    assert info.value.rank == 1 and isinstance(info.value.__cause__, RuntimeError)
    res = sim.SimWorld(2, faults=faults).run(fn, return_exceptions=True)
    assert res[0] == 0 and isinstance(res[1], RuntimeError)


def test_crash_stops_the_rank_without_running_its_finally_and_peers_time_out():
    faults = PointFaults(0, FaultAction.crash(), point="store.offload")
    ran_finally = []

    async def fn(rt):
        try:
            with rt.span("offload"):
                await rt.point("store.offload")
        finally:
            ran_finally.append(rt.rank)
        await rt.all_reduce(torch.ones(1), timeout_s=2.0)
        return "ok"

    world = sim.SimWorld(2, faults=faults)
    res = world.run(fn, return_exceptions=True)
    assert isinstance(res[0], sim.RankCrashedError) and "store.offload" in str(res[0])
    assert isinstance(res[1], CollectiveTimeoutError)
    assert ran_finally == [1]
    report = world.report()
    assert report.ranks[0].status == "crashed" and report.ranks[0].spans == ()
    assert report.ranks[1].status == "failed" and report.ranks[1].spans[0][0] == "offload"


def test_hang_alone_is_reported_as_hung_not_deadlock():
    faults = PointFaults(1, FaultAction.hang(), point="p")

    async def fn(rt):
        await rt.point("p")
        return rt.rank

    res = sim.SimWorld(2, faults=faults).run(fn, return_exceptions=True)
    assert res[0] == 0 and isinstance(res[1], sim.RankHungError)


def test_delay_fault_holds_the_rank_and_corrupt_perturbs_only_its_result():
    class Faults(NoFaults):
        def on_point(self, rank, name):
            return FaultAction.delay(3.0) if rank == 0 else None

        def on_collective(self, rank, group, op, seq):
            return FaultAction.corrupt() if rank == 1 and op == "all_reduce" else None

    async def fn(rt):
        await rt.point("x")
        t = rt.now()
        x = torch.full((2,), 1.0)
        await rt.all_reduce(x)
        return t, x.tolist()

    (t0, x0), (t1, x1) = sim.run_ranks(2, fn, faults=Faults())
    assert (t0, t1) == (3.0, 0.0)
    assert x0 == [2.0, 2.0] and x1 == [3.0, 3.0]


def test_spans_are_recorded_on_runtime_and_trace_and_report():
    async def fn(rt):
        with rt.span("reload"):
            await rt.sleep(0.5)
        return None

    world = sim.SimWorld(2)
    world.run(fn)
    assert world.runtimes[1].spans == [("reload", 0.0, 0.5)]
    assert (0.5, 1, "end", "reload") in world.engine.trace
    rep = world.report()
    assert rep.ranks[0].status == "finished" and rep.time == 0.5
    assert "rank    1  finished" in rep.format()


def test_runtime_run_is_refused():
    async def noop():
        return 1

    rt = sim.SimWorld(1).runtimes[0]
    with pytest.raises(sim.SimUsageError, match="world.run"):
        rt.run(noop())
