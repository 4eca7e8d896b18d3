"""Calibration: the simulator predicts the H200's offload/reload times of the benchmark shapes.

The measurements are H200 runs 6 and 8 of ``bench/offload_bench.py``
(bench/results/2026-11-29-h200-run{6,8}/2026-11-29-h200-offload.json), made
with the store's current code: run 6 cycled back to back (each reload right
after the offload freed the state, so it waited for the driver's scrub), run 8
paused 0.25 s between offload and reload. The shapes come from
``sim.presets.bench_shapes``, the same ones the benchmark moved.
"""
import functools
import json
from pathlib import Path

import pytest

from sim.presets.bench_shapes import dense_shape
from sim.calibrate.calibration import RESULTS_DIR, compare, host_overheads, latest_report, predict
from sim.machine.topology import Topology

RUNS = {n: RESULTS_DIR / f"2026-11-29-h200-run{n}" / "2026-11-29-h200-offload.json" for n in (6, 8)}


@functools.lru_cache(maxsize=None)
def _compared(run):
    """``compare()`` of a recorded run, simulated once per test session."""
    path = RUNS[run]
    assert path.is_file(), f"the recorded H200 measurement {path} is missing"
    return compare(json.loads(path.read_text()))


@pytest.fixture(scope="module", params=sorted(RUNS))
def run_rows(request):
    return request.param, _compared(request.param)


def test_predictions_match_the_recorded_h200_measurements_within_5_percent(run_rows):
    run, rows = run_rows
    assert {(r["shape"], r["phase"]) for r in rows} == {
        (s, p) for s in ("dense-7b-1of8", "moe-1of8") for p in ("offload", "reload")}
    bad = [r for r in rows if abs(r["rel_error"]) > 0.05]
    assert not bad, f"predictions more than 5% off run {run}: {bad}"


def test_prediction_parts_are_physical_and_count_the_measured_copies(run_rows):
    """Checked against the measurement and physics, not against the prediction's own formula: the copy count
    is the one the H200 run counted; no copy phase beats the line rate measured on that machine in that run;
    host time is positive and small next to the copies."""
    run, rows = run_rows
    for r in rows:
        assert r["copies"] == r["measured_copies"]  # one copy per 256 MiB host segment in steady state
        assert r["copy_s"] >= r["state_bytes"] / (r["line_gbps"] * 1e9), r
        assert 0 < r["predicted_s"] - r["copy_s"] < 0.1 * r["predicted_s"], r
        if r["phase"] == "reload":  # back to back the reload waits for the scrub; after run 8's gap it does not
            assert (r["scrub_wait_s"] > 0.01) == (run == 6), r
            assert r["phase_gap_s"] == (0.0 if run == 6 else 0.25)
    moe = [r for r in rows if r["shape"] == "moe-1of8"]
    assert moe and all(r["tensors"] >= 20_000 for r in moe)


def test_the_scrub_wait_predicts_the_measured_slowdown_of_a_back_to_back_reload():
    """Runs 6 (back to back) and 8 (0.25 s gap) moved the same shapes: the measured reload is slower in run 6
    by the driver's scrub; the predicted difference has the same sign and is within a factor of two of it."""
    rows = {n: {(r["shape"], r["phase"]): r for r in _compared(n)} for n in RUNS}
    for shape in ("dense-7b-1of8", "moe-1of8"):
        b2b, gap = rows[6][(shape, "reload")], rows[8][(shape, "reload")]
        measured = b2b["measured_s"] / b2b["state_bytes"] - gap["measured_s"] / gap["state_bytes"]
        predicted = b2b["predicted_s"] / b2b["state_bytes"] - gap["predicted_s"] / gap["state_bytes"]
        assert measured > 0 and predicted > 0, (shape, measured, predicted)
        assert 0.5 < predicted / measured < 2.0, (shape, measured, predicted)


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
    scrub = p["steady_scrub_wait_s"]
    assert p["steady_reload_copy_s"] == pytest.approx(shape.nbytes / h2d + copies * topo.copy.latency_s + scrub,
                                                      rel=1e-6)
    assert p["cold_offload_s"] >= p["steady_offload_s"]


def test_reload_waits_for_the_scrub_of_what_the_offload_freed_unless_a_gap_hides_it():
    """Back to back, the reload's first copy waits for the rest of the scrub of what the offload freed (freed
    bytes / ~428 GB/s on the H200, less the offload's host time after the free); after a phase gap longer than
    that it does not, and a gap shorter than that hides part of it."""
    topo = Topology.from_preset("h200-1x")
    assert topo.copy.scrub_bps == pytest.approx(428e9)
    shape = dense_shape()
    b2b = predict(shape, cycles=1)
    # the flat buffers the offload frees hold the state plus alignment padding (< 1 MiB here)
    expected = shape.nbytes / topo.copy.scrub_bps - b2b["offload_host_s"]
    assert expected > 0.01 and b2b["steady_scrub_wait_s"] == pytest.approx(expected, rel=1e-3)
    gap = predict(shape, cycles=1, phase_gap_s=0.25)
    assert gap["steady_scrub_wait_s"] == 0.0
    assert b2b["steady_reload_copy_s"] - gap["steady_reload_copy_s"] == pytest.approx(b2b["steady_scrub_wait_s"],
                                                                                         rel=1e-6)
    assert gap["steady_offload_copy_s"] == pytest.approx(b2b["steady_offload_copy_s"], rel=1e-9)  # D2H unaffected
    half = predict(shape, cycles=1, phase_gap_s=b2b["steady_scrub_wait_s"] / 2)
    assert half["steady_scrub_wait_s"] == pytest.approx(b2b["steady_scrub_wait_s"] / 2, rel=1e-6)
    with pytest.raises(ValueError, match="phase_gap_s"):
        predict(shape, cycles=1, phase_gap_s=-1)


def test_latest_report_is_the_newest_cuda_record_of_the_device(tmp_path):
    import json

    from sim.calibrate.calibration import latest_report

    for date, name, device_type in [("2026-11-01", "a", "cuda"), ("2026-11-20", "b", "cuda"), ("2026-11-30", "c", "cpu")]:
        (tmp_path / f"{name}-offload.json").write_text(json.dumps({"date": date, "device": "NVIDIA H200",
                                                                      "device_type": device_type}))
    assert latest_report(tmp_path).name == "b-offload.json"
    assert latest_report(tmp_path, device="A100") is None
