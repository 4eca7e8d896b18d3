"""Calibration: the simulator predicts the H200's offload/reload times of the benchmark shapes within 10%.

The measurement comes from ``python bench/offload_bench.py`` on the H200 (bench/results/*-offload.json);
without one recorded, only the prediction's own model is checked.
"""
import json

import pytest

from refimpl.benchmarks.shapes import dense_shape, moe_shape
from sim.calibration import compare, latest_report, predict
from sim.topology import Topology


@pytest.fixture(scope="module")
def predictions():
    return {s.name: predict(s, cycles=1) for s in (dense_shape(), moe_shape())}


def test_steady_cycles_run_at_the_measured_pcie_rate_plus_per_copy_latency(predictions):
    topo = Topology.from_preset("h200-1x")
    rate, lat = topo.constant("pcie_gen5_x16").value, topo.copy.latency_s
    for p in predictions.values():
        copies = sum(p["copies"].values())
        assert p["steady_offload_s"] == pytest.approx(p["state_bytes"] / rate + copies * lat, rel=1e-6)
        assert p["steady_reload_s"] == pytest.approx(p["steady_offload_s"], rel=0.01)
        assert p["cold_offload_s"] >= p["steady_offload_s"]
    assert predictions["moe-1of8"]["tensors"] >= 20_000


def test_predictions_match_the_recorded_h200_measurement():
    path = latest_report()
    if path is None:
        pytest.skip("no H200 run of bench/offload_bench.py under bench/results/ yet")
    rows = compare(json.loads(path.read_text()))
    assert rows, f"{path} has no store results"
    bad = [r for r in rows if abs(r["rel_error"]) > 0.10]
    assert not bad, f"predictions more than 10% off {path.name}: {bad}"
