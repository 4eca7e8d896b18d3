"""``timeshare bench offload --dry-run`` and ``timeshare demo`` run end to end on this machine."""
import importlib.util
import json
import time

import pytest
import torch

from bench.offload import parse_variant
from refimpl.cli import main


def test_bench_dry_run_measures_every_method_and_writes_json(tmp_path, capsys):
    rc = main(["bench", "offload", "--dry-run", "--wide", "--shapes", "moe", "--cycles", "1",
               "--variant", "store_1t:pin_threads=1,pack_below_bytes=0",
               "--variant", "store_ahead:pin_ahead=1", "--variant", "store_raw:consolidate=0",
               "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "moe-tiny" in out and "x line" in out
    files = list(tmp_path.glob("*-offload.json"))
    assert len(files) == 1
    report = json.loads(files[0].read_text())
    (shape,) = report["shapes"]
    assert shape["tensors"] >= 800 and shape["line_rate"]["d2h_gbps"] > 0
    by = {r["method"]: r for r in shape["results"]}
    assert {"store", "store_1t", "per_tensor", "fresh_pin", "memory_saver"} <= set(by)
    for name in ("store", "store_1t", "per_tensor", "fresh_pin"):
        r = by[name]
        assert r["bit_exact"] is True, name
        assert len(r["cycles"]) == 2 and r["offload_gbps"] > 0 and r["reload_gbps"] > 0
    assert by["store"]["pinned_bytes"] >= shape["state_bytes"]
    assert by["store_1t"]["details"]["pin_threads"] == 1 and by["store_1t"]["details"]["copies"]["packed"] == 0
    # pinning ahead is paid at setup and reported apart from the cycle; the CPU default does not pin ahead
    assert by["store_ahead"]["pin_setup_s"] > 0 and by["store"]["pin_setup_s"] is None
    assert report["variants"]["store_ahead"]["pin_ahead"] == "background"
    assert by["store_ahead"]["details"]["cold"]["registrations"] == by["store_ahead"]["details"]["registrations"]
    assert "pin setup" in out  # a --wide column
    assert by["store_ahead"]["bit_exact"] is True
    # store.consolidate() at setup is timed and reported; the raw variant's first cycle pays the collection
    assert by["store"]["details"]["consolidate_s"] > 0 and by["store_raw"]["details"]["consolidate_s"] is None
    assert report["variants"]["store_raw"]["consolidate"] is False and by["store_raw"]["bit_exact"] is True
    assert set(by["store"]["targets_met"]) >= {"offload_vs_line", "cold_vs_steady", "pinned_vs_state"}
    saver = by["memory_saver"]
    if torch.cuda.is_available() and importlib.util.find_spec("torch_memory_saver") is not None:
        assert not saver["skipped"] and saver["bit_exact"] is True
    else:  # this machine cannot run it: reported as skipped, with why, and nothing measured
        assert "torch_memory_saver" in saver["skipped"], saver["skipped"]
        assert saver["cycles"] == [] and saver["offload_gbps"] == 0
        assert "memory_saver" in out and "skipped" in out


def test_variant_parsing_names_bad_fields():
    name, cfg, ahead = parse_variant("fast:segment_bytes=1048576,pin_fallback=pageable_warn,pin_ahead=1")
    assert name == "fast" and cfg.segment_bytes == 1 << 20 and cfg.pin_fallback == "pageable_warn"
    assert cfg.pin_ahead == "background" and ahead  # consolidates at setup unless told not to
    assert parse_variant("slow:pin_ahead=off")[1].pin_ahead == "off"
    assert parse_variant("raw:consolidate=0")[2] is False
    try:
        parse_variant("x:no_such_field=1")
    except ValueError as e:
        assert "no_such_field" in str(e)
    else:
        raise AssertionError("bad field accepted")


def test_demo_round_trips_a_small_model(capsys):
    assert main(["demo", "--hidden", "64", "--layers", "1", "--vocab", "128"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # lines wrap at 100 columns
    assert "bit-exact after reload: True" in out and "tied embedding still tied: True" in out
    assert "1 flat buffer(s)" in out and "reuses" in out


def test_bench_phase_gap_and_other_role_are_applied_and_reported(tmp_path, capsys):
    """The gap and the other role's memory are applied and reported, and one back-to-back cycle is timed
    apart from the steady ones (that the gap is in neither time: the test below)."""
    rc = main(["bench", "offload", "--dry-run", "--wide", "--shapes", "dense", "--cycles", "1", "--methods", "store",
               "--phase-gap-s", "0.2", "--other-role-gb", "0.01", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "phase gap 0.2 s" in out and "the other role takes 0.0 GiB" in out and "b2b rel" in out
    report = json.loads(next(tmp_path.glob("*-offload.json")).read_text())
    assert report["phase_gap_s"] == 0.2 and report["other_role_bytes"] == 10_000_000
    (shape,) = report["shapes"]
    assert shape["line_rate"]["phase_gap_s"] == 0.2 and shape["line_rate"]["h2d_fresh_b2b_gbps"] > 0
    (r,) = shape["results"]
    assert r["phase_gap_s"] == 0.2 and len(r["cycles"]) == 2  # cold + 1 steady; the b2b cycle is apart
    assert r["reload_b2b_s"] > 0 and r["reload_b2b_gbps"] > 0 and r["bit_exact"] is True


def test_measure_waits_the_gap_between_offload_and_reload_and_times_neither_with_it(monkeypatch):
    """The gap is really waited (once per cold and steady cycle, never in the back-to-back one) and is
    in neither the offload nor the reload time. The runtime's clock skips the gap instead of sleeping
    it, so a 1000 s gap costs nothing and no wall-clock bound can flake on a loaded machine: a time that
    included the gap would be >= 1000 s."""
    from bench import offload
    from bench.baselines import StoreMethod, line_rate
    from refimpl.torch_runtime import TorchRuntime

    class SkippingClock(TorchRuntime):
        skipped = 0.0
        gaps: list = []

        def now(self):
            return time.monotonic() + self.skipped

    rt = SkippingClock("cpu")

    def sleep(seconds):
        SkippingClock.skipped += seconds
        SkippingClock.gaps.append(seconds)

    monkeypatch.setattr(offload.time, "sleep", sleep)
    (dense,) = offload.shapes_by_name(["dense"], tiny=True)
    line = line_rate(rt, 1 << 20)
    res = offload.measure(rt, StoreMethod(), dense, cycles=2, line=line, phase_gap_s=1000.0)
    assert res.bit_exact is True and not res.skipped
    assert SkippingClock.gaps == [1000.0] * 3  # cold + 2 steady cycles; the back-to-back cycle has none
    assert len(res.cycles) == 3
    for c in res.cycles:
        assert 0 < c["offload_s"] < 1000.0 and 0 < c["reload_s"] < 1000.0, c
    assert 0 < res.reload_b2b_s < 1000.0
    with pytest.raises(ValueError, match="phase_gap_s"):
        offload.measure(rt, StoreMethod(), dense, cycles=1, line=line, phase_gap_s=-1)


def test_bench_rejects_a_negative_gap(tmp_path, capsys):
    assert main(["bench", "offload", "--dry-run", "--phase-gap-s", "-1", "--out", str(tmp_path)]) == 2
    assert "--phase-gap-s: expected a number >= 0" in capsys.readouterr().err  # one line on stderr, exit 2
