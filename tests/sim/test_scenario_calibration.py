"""Calibration: the simulator predicts the H200's offload/reload times of the benchmark shapes within 10%.

The measurement is H200 run 1 of ``bench/offload_bench.py``
(bench/results/2026-11-29-h200-run1/2026-11-29-h200-offload.json); the shapes
come from ``refimpl.benchmarks.shapes``, the same ones the benchmark moved.
"""
import json
from pathlib import Path

import pytest

from refimpl.benchmarks.shapes import dense_shape
from sim.calibration import RESULTS_DIR, compare, host_overheads, latest_report, predict
from sim.topology import Topology

RUN1 = RESULTS_DIR / "2026-11-29-h200-run1" / "2026-11-29-h200-offload.json"


@pytest.fixture(scope="module")
def rows():
    assert RUN1.is_file(), f"the recorded H200 measurement {RUN1} is missing"
    return compare(json.loads(RUN1.read_text()))


def test_predictions_match_the_recorded_h200_measurement(rows):
    assert {(r["shape"], r["phase"]) for r in rows} == {
        (s, p) for s in ("dense-7b-1of8", "moe-1of8") for p in ("offload", "reload")}
    bad = [r for r in rows if abs(r["rel_error"]) > 0.10]
    assert not bad, f"predictions more than 10% off {RUN1.name}: {bad}"


def test_prediction_is_segment_copies_at_the_measured_line_rate_plus_measured_host_time(rows):
    lat = Topology.from_preset("h200-1x").copy.latency_s
    for r in rows:
        # one copy per 256 MiB host segment in steady state, as the H200 run counted
        assert r["copies"] == r["measured_copies"]
        assert r["copy_s"] == pytest.approx(r["state_bytes"] / (r["line_gbps"] * 1e9) + r["copies"] * lat, rel=1e-6)
        host = host_overheads("h200-1x", r["tensors"], r["state_bytes"])[f"{r['phase']}_host_s"]
        assert r["predicted_s"] == pytest.approx(r["copy_s"] + host, rel=1e-9)
    moe = [r for r in rows if r["shape"] == "moe-1of8"]
    assert moe and all(r["tensors"] >= 20_000 for r in moe)


def test_latest_report_finds_the_run_directory_report():
    path = latest_report()  # reports live in per-run subdirectories of bench/results/
    assert path is not None, "latest_report() did not find the H200 report under bench/results/<run>/"
    assert "H200" in json.loads(Path(path).read_text())["device"]


def test_default_prediction_uses_the_presets_per_direction_rates():
    topo = Topology.from_preset("h200-1x")
    shape = dense_shape()
    p = predict(shape, cycles=1)
    d2h, h2d = (topo.constant(n).value for n in ("pcie_gen5_x16_d2h_run1", "pcie_gen5_x16_h2d_run1"))
    copies = sum(p["copies"].values())
    assert p["steady_offload_copy_s"] == pytest.approx(shape.nbytes / d2h + copies * topo.copy.latency_s, rel=1e-6)
    assert p["steady_reload_copy_s"] == pytest.approx(shape.nbytes / h2d + copies * topo.copy.latency_s, rel=1e-6)
    assert p["cold_offload_s"] >= p["steady_offload_s"]
