"""Destroying an initialised NCCL communicator without the runtime's proxy waker waits for its UDS proxy thread's
500 ms poll; with the waker it does not.

NCCL's ``ncclProxyServiceUDS`` reads its stop flag only when ``poll(pollfds, 1, 500)`` returns, and
``ncclCommDestroy`` joins that thread ([Note: the proxy's 500 ms poll] in sim.presets). Without the waker (the records
of 2026-11-30) the lifecycle's weight sync destroys the sync group right after its first collective, so it waits
almost the whole period: the 0.47 s the 2 x H200 update_weights had beyond its raw costs. With the waker (TorchRuntime's
default, ``NcclComm``'s) a destroy costs its own cost alone ([Note: a destroy, with and without the proxy waker] in
sim.machine.collectives).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from refimpl.runtime import GroupSpec, ReduceOp
from sim.machine.collectives import NcclComm, TopologyCollectiveCost
from sim.calibrate.fit import NCCL_PROXY_POLL_S, fit_destroy, replay_destroys
from sim.presets import first_gpus, load_preset_data
from sim.calibrate.records import load_record
from sim.machine.topology import Topology
from sim.world import SimWorld

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"
SPLIT = {k: RESULTS / "2026-11-30-h200x2-commsplit" / f"2026-11-30-h200x2-comm-split-ranks{k}.json" for k in (1, 2)}


def _world(data, n, *, wake=False):
    topo = Topology(first_gpus(data, n))
    return SimWorld(n, trace=False, collective_cost=TopologyCollectiveCost(topo),
                    comm=NcclComm(topo, lazy_init=True, init_at_collective=True, proxy_wake=wake))


def _destroy_after(data, pause_s):
    """Seconds rank 0 spends in destroy_group of a two-rank group ``pause_s`` after its first collective."""
    world = _world(data, 2)

    async def fn(rt):
        await rt.new_group(GroupSpec("g", (0, 1), backend="nccl"))
        await rt.all_reduce(torch.ones(1), ReduceOp.SUM, "g")
        await rt.sleep(pause_s)
        t0 = rt.now()
        await rt.destroy_group("g")
        return rt.now() - t0

    return world.run(fn)[0]


def test_a_destroy_waits_for_the_next_poll_timeout_after_the_init():
    data = load_preset_data("calibrated/hgx-h200-8x")
    base = data["constants"]["nccl_destroy_multi"]["value"]
    assert data["comm"]["proxy_poll"] == "nccl_proxy_poll" and data["constants"]["nccl_proxy_poll"]["value"] == 500
    assert _destroy_after(data, 0.0) == pytest.approx(0.5 + base, abs=1e-4)  # right after: the whole period
    assert _destroy_after(data, 0.3) == pytest.approx(0.2 + base, abs=1e-4)
    assert _destroy_after(data, 1.1) == pytest.approx(0.4 + base, abs=1e-4)  # two periods later
    plain = copy.deepcopy(data)  # a preset without the poll charges the destroy alone, as before
    del plain["comm"]["proxy_poll"]
    assert _destroy_after(plain, 0.0) == pytest.approx(base, abs=1e-9)


def _late_marks(data, pause_s):
    """The times the simulator marked a destroy as possibly one poll period late, for one destroy ``pause_s`` after
    the group's first collective."""
    world = _world(data, 2)

    async def fn(rt):
        await rt.new_group(GroupSpec("g", (0, 1), backend="nccl"))
        await rt.all_reduce(torch.ones(1), ReduceOp.SUM, "g")
        await rt.sleep(pause_s)
        await rt.destroy_group("g")

    world.run(fn)
    return world.comm.poll_late


def test_a_destroy_close_to_its_timeout_is_marked_as_possibly_a_period_late():
    """The preset's poll phase spread (187 ms, fitted on the destroy-walk probe records): a destroy waiting less than
    that for its poll timeout may find it passed on hardware; one right after the init (waiting ~0.5 s) may not."""
    data = load_preset_data("calibrated/hgx-h200-8x")
    spread = data["constants"]["nccl_poll_phase_spread"]["value"] / 1e3
    assert 0.1 < spread < 0.25
    assert _late_marks(data, 0.0) == []  # waits the whole period: never late
    assert _late_marks(data, 0.5 - spread + 0.05) != []  # waits spread - 0.05 s
    assert _late_marks(data, 1.5 - spread / 2) != []  # half the spread before its third timeout
    assert _late_marks(data, 0.5 - spread - 0.05) == []
    plain = copy.deepcopy(data)  # a preset without the spread marks nothing
    del plain["comm"]["poll_phase_spread"]
    assert _late_marks(plain, 0.45) == []


def test_a_never_used_group_does_not_wait():
    world = _world(load_preset_data("calibrated/hgx-h200-8x"), 2)

    async def fn(rt):
        await rt.new_group(GroupSpec("g", (0, 1), backend="nccl"))
        t0 = rt.now()
        await rt.destroy_group("g")
        return rt.now() - t0

    assert world.run(fn)[0] < 1e-3


def test_replay_paces_destroys_by_the_inits_and_fit_recovers_the_base():
    # 3 communicators initialised 0.1 s apart (ends 0.1, 0.2, 0.3), destroyed from 0.3 on: each waits for its
    # own timeout (0.6, 0.7, 0.8), so the walk ends when the last one's does, 0.5 s after it was initialised
    assert replay_destroys(3, 0.1, 0.0, 0.0) == pytest.approx(0.5)
    assert replay_destroys(3, 0.1, 0.0, 0.01) == pytest.approx(0.51)
    # a destroy that starts after its thread's timeout waits for the next one: 0.75 misses 0.7 (-> 1.2 + 0.15),
    # 1.35 misses 1.3 (-> 1.8 + 0.15)
    assert replay_destroys(3, 0.1, 0.0, 0.15) == pytest.approx(1.95 - 0.3)
    for base in (0.0, 0.004, 0.02):
        total = replay_destroys(14, 0.173, 0.001, base)
        fitted, replayed = fit_destroy(14, 0.173, 0.001, total)
        assert replayed == pytest.approx(total, abs=1e-9) and fitted == pytest.approx(base, abs=1e-6)


@pytest.mark.parametrize("k", [1, 2])
def test_the_simulated_probe_gives_the_destroys_of_the_fit_set_records(k):
    """bench/gpu/comm_split_probe.py on the simulator with the calibrated preset, without the proxy waker (as the
    probe ran): 14 groups, their first collectives one after the other, a second collective, then the destroys. The
    destroy's own cost is fitted apart (NCCL's log, the rebuild probe); the walk's total, paced by the inits, is a
    check on the poll rule (these records are in the fit set for the inits: a consistency check, not a
    validation)."""
    raw = load_record(SPLIT[k]).comm_raw
    world = _world(load_preset_data("calibrated/hgx-h200-8x"), 2)

    async def fn(rt):
        names = []
        for i in range(14):
            for q in ((0, 1),) if k == 2 else ((0,), (1,)):
                await rt.new_group(GroupSpec(f"g{i}.{q[0]}", q, backend="nccl"))
                if rt.rank in q:
                    names.append(f"g{i}.{q[0]}")
        await rt.barrier()  # the world group's own first collective, before the timing
        t = [rt.now()]
        for _ in range(2):
            for name in names:
                await rt.all_reduce(torch.ones(1), ReduceOp.SUM, name)
            await rt.barrier()
            t.append(rt.now())
        for name in names:
            await rt.destroy_group(name)
        t.append(rt.now())
        return t[1] - t[0], t[3] - t[2]

    first, destroy = max(world.run(fn), key=lambda r: r[1])
    params = Topology(load_preset_data("calibrated/hgx-h200-8x")).comm.for_size(k)
    assert first == pytest.approx(14 * params.init_s, rel=0.01)
    # two-rank: the mean of three records, this one among them; one-rank: the mean of this record's 34.6 ms and the
    # rebuild probe's 22.3 ms (one H200, the runtime as users run it)
    assert first == pytest.approx(raw.first_collective_s, rel=0.05 if k == 2 else 0.2)
    assert destroy == pytest.approx(raw.destroy_s, rel=0.06)
    if k == 1:  # inits 28 ms apart, more than a destroy's own cost: the walk ends one poll period after the last init
        assert destroy == pytest.approx(NCCL_PROXY_POLL_S + params.destroy_s, abs=0.002)


def test_a_woken_proxy_destroys_without_the_wait():
    """With the runtime's proxy waker (``NcclComm``'s default, as TorchRuntime's) a destroy costs ``destroy`` alone,
    however long ago the communicator was initialised: what the H200 measured (0.299 s -> 0.017 s, the rebuild-probe
    record of 2026-12-04)."""
    data = load_preset_data("calibrated/hgx-h200-8x")
    base = data["constants"]["nccl_destroy_multi"]["value"]
    topo = Topology(first_gpus(data, 2))
    for pause in (0.0, 0.3, 1.1):
        world = SimWorld(2, trace=False, collective_cost=TopologyCollectiveCost(topo),
                         comm=NcclComm(topo, lazy_init=True, init_at_collective=True))

        async def fn(rt, pause=pause):
            await rt.new_group(GroupSpec("g", (0, 1), backend="nccl"))
            await rt.all_reduce(torch.ones(1), ReduceOp.SUM, "g")
            await rt.sleep(pause)
            t0 = rt.now()
            await rt.destroy_group("g")
            return rt.now() - t0

        assert world.run(fn)[0] == pytest.approx(base, abs=1e-9)
