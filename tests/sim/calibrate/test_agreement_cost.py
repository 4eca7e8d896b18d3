"""A lifecycle agreement costs what bench/agreement_probe.py measured (issue 11: agreement costs named in the preset)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from refimpl.comm.agreement import ControlGroup
from sim.machine.collectives import NcclComm, TopologyCollectiveCost
from sim.calibrate.fit import calibrated_preset
from sim.presets import load_preset_data
from sim.calibrate.records import AgreementRecord, RecordError, load_record
from sim.machine.topology import Topology
from sim.world import SimWorld

#: bench/agreement_probe.py on the 2 x H200 host (the shipped presets' agreement; the development VM's record,
#: 2026-11-30-cpu-agreement, measured 0.43 ms)
RECORD = (Path(__file__).resolve().parents[3] / "bench" / "results" / "2026-11-30-h200x2-walk-probes"
          / "agreement-2026-11-30-h200x2-host.json")


def _agreement_s(world_size: int, data) -> float:
    topo = Topology(data)
    world = SimWorld(world_size, trace=False, collective_cost=TopologyCollectiveCost(topo), comm=NcclComm(topo))

    async def fn(rt):
        control = ControlGroup("c")
        await control.ensure(rt)
        t0 = rt.now()
        assert await control.reduce_min(rt, [rt.rank, -rt.rank], "probe") == [0, -(world_size - 1)]
        return rt.now() - t0

    return max(world.run(fn))


def test_the_probe_record_is_fitted_and_charged_per_agreement():
    rec = load_record(RECORD)
    assert isinstance(rec, AgreementRecord) and rec.world_size == 2
    data, obs = calibrated_preset("hgx-h200-8x", [rec])
    assert [o.constant for o in obs] == ["gloo_agreement"]
    assert data["comm"]["agreement"] == "gloo_agreement" and "agreement-2026-11-30-h200x2-host.json" in \
        data["constants"]["gloo_agreement"]["source"]
    a = rec.per_agreement_s
    assert _agreement_s(2, data) == pytest.approx(a)
    assert _agreement_s(4, data) == pytest.approx(3 * a)  # Gloo's ring: n - 1 exchanges (assumed)
    assert _agreement_s(1, data) == 0.0
    # the shipped calibrated preset carries it; a preset without it times Gloo groups like NCCL (microseconds)
    shipped = load_preset_data("calibrated/hgx-h200-8x")
    assert shipped["constants"]["gloo_agreement"]["value"] == pytest.approx(a * 1e3, rel=1e-5)
    assert _agreement_s(2, load_preset_data("hgx-h200-8x")) < 1e-4


def test_a_bad_probe_record_names_the_field(tmp_path):
    raw = json.loads(RECORD.read_text())
    raw["per_agreement_s"] = -1
    p = tmp_path / "a.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(RecordError, match=r"per_agreement_s: expected a non-negative number"):
        load_record(p)


def _probe(rank, world_size):
    from bench.agreement_probe import measure

    return measure(5)


def test_the_probe_times_real_agreements_on_gloo():
    """bench/agreement_probe.py's measurement on two real Gloo processes (tests/_dist.py)."""
    from tests._dist import run_distributed

    per_rank = run_distributed(_probe, world_size=2)
    assert [len(t) for t in per_rank] == [5, 5]
    assert all(0 < t < 5.0 for times in per_rank for t in times)
