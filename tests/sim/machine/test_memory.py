"""HBM and host-memory ledgers: capacities from the topology, peaks, and OOM errors that name the holders."""
import pytest

from refimpl.runtime.base import PinningError
from sim.kernel.errors import SimOutOfMemoryError
from sim.machine.memory import HostOutOfMemoryError, TopologyMemory
from sim.machine.topology import Topology

GiB = 1 << 30


def _mem(preset="hgx-h200-8x", **kw):
    return TopologyMemory(Topology.from_preset(preset), **kw)


def test_device_capacity_comes_from_the_preset_and_peaks_are_kept():
    mem = _mem()
    assert mem.device_info(3).total == 141 * 10**9
    mem.alloc_device(3, 40 * GiB, "params")
    mem.alloc_device(3, 20 * GiB, "optimizer")
    mem.free_device(3, 40 * GiB, "params")
    info = mem.device_info(3)
    assert info.used == 20 * GiB and mem.ledger(3).device_peak == 60 * GiB
    assert mem.holders(3) == {"optimizer": 20 * GiB}
    assert mem.device_info(4).used == 0  # ranks have their own GPUs


def test_out_of_memory_lists_who_holds_what_largest_first():
    mem = _mem("a6000-4x-nvlink")
    mem.alloc_device(0, 20 * GiB, "rollout engine")
    mem.alloc_device(0, 12 * GiB, "optimizer")
    mem.alloc_device(0, 1 * GiB, "comm tp0")
    with pytest.raises(SimOutOfMemoryError) as err:
        mem.alloc_device(0, 14 * GiB, "params")
    msg = str(err.value)
    assert "rank 0" in msg and "'params'" in msg
    assert msg.index("rollout engine=20.00 GiB") < msg.index("optimizer=12.00 GiB") < msg.index("comm tp0=1.00 GiB")
    assert mem.device_info(0).used == 33 * GiB  # the failed allocation charged nothing


def test_freeing_more_than_a_tag_holds_is_an_error():
    mem = _mem()
    mem.alloc_device(0, 10, "a")
    with pytest.raises(ValueError, match="holds only 10"):
        mem.free_device(0, 11, "a")


def test_pinned_host_memory_is_charged_to_the_gpus_numa_node_up_to_its_pinnable_limit():
    topo = Topology.from_preset("hgx-h200-8x")
    for numa in topo.host_memory_nodes():
        topo.element(numa)["pinnable"] = 100 * GiB  # as if ulimit -l allowed 100 GiB per node
    mem = TopologyMemory(topo)
    for r in range(4):  # GPUs 0-3 sit on socket 0
        mem.alloc_host(r, 24 * GiB, True, "store")
    assert mem.numa["n0/numa0"].pinned == 96 * GiB and mem.numa["n0/numa1"].pinned == 0
    with pytest.raises(PinningError) as err:
        mem.alloc_host(1, 8 * GiB, True, "store")
    assert "n0/numa0" in str(err.value) and "rank 0=24.00 GiB" in str(err.value)
    mem.alloc_host(4, 8 * GiB, True, "store")  # the other socket still has room
    mem.free_host(0, 24 * GiB, True, "store")
    mem.alloc_host(1, 8 * GiB, True, "store")
    assert mem.ledger(1).host_pinned_peak == 32 * GiB and mem.numa["n0/numa0"].pinned_peak == 96 * GiB


def test_pageable_memory_beyond_the_node_raises_host_oom():
    mem = _mem("h200-1x")  # 128 GiB on the test machine
    mem.alloc_host(0, 100 * GiB, False, "pageable copy")
    with pytest.raises(HostOutOfMemoryError, match="total limit 128.00 GiB"):
        mem.alloc_host(0, 40 * GiB, False, "pageable copy")


def test_device_timeline_gives_the_peak_of_a_window():
    class Clock:
        now = 0.0

    class World:
        engine = Clock()

    mem = _mem()
    mem.bind(World())
    for t, n in ((1.0, 10), (2.0, 30), (3.0, -25), (4.0, 50)):
        World.engine.now = t
        if n > 0:
            mem.alloc_device(0, n, "x")
        else:
            mem.free_device(0, -n, "x")
    assert mem.peak_between(0, 2.5, 3.5) == 40  # what was held when the window opened counts
    assert mem.peak_between(0, 3.0, 3.9) == 15
    assert mem.peak_between(0, 0.0, 10.0) == 65
    # issue 11: what changes at the window's end belongs to the next window (it starts at that instant)
    assert mem.peak_between(0, 1.0, 2.0) == 10
    assert mem.peak_between(0, 2.0, 2.0) == 40  # an empty window: what was held at its instant


def test_a_phase_peak_does_not_include_the_next_phases_allocation():
    """The default scenario: the rollout engine takes half the GPU when update_weights starts, the instant
    sleep ends; sleep's peak is the training state (14.42 GB), not the engine's 71 GB (issue 11)."""
    from sim.scenarios.runner import run_scenario
    from sim.scenarios.scenario import load_scenario

    result, _, _ = run_scenario(load_scenario("default"))
    peaks = result.data["ranks"][0]["phase_peak_device_bytes"]
    assert peaks["sleep"] == peaks["train"] < 15e9
    assert peaks["update_weights"] > 70e9
