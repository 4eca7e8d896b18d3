"""``timeshare bench offload --dry-run`` and ``timeshare demo`` run end to end on this machine."""
import json

from refimpl.benchmarks.offload import parse_variant
from refimpl.cli import main


def test_bench_dry_run_measures_every_method_and_writes_json(tmp_path, capsys):
    rc = main(["bench", "offload", "--dry-run", "--shapes", "moe", "--cycles", "1",
               "--variant", "store_1t:pin_threads=1,pack_below_bytes=0",
               "--variant", "store_ahead:pin_ahead=1", "--out", str(tmp_path)])
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
    assert by["store_ahead"]["details"]["pin_ahead_s"] > 0 and by["store"]["details"]["pin_ahead_s"] is None
    assert by["store_ahead"]["bit_exact"] is True
    assert set(by["store"]["targets_met"]) >= {"offload_vs_line", "cold_vs_steady", "pinned_vs_state"}
    assert by["memory_saver"]["skipped"] or by["memory_saver"]["bit_exact"]


def test_variant_parsing_names_bad_fields():
    name, cfg, ahead = parse_variant("fast:segment_bytes=1048576,pin_fallback=pageable_warn,pin_ahead=1")
    assert name == "fast" and cfg.segment_bytes == 1 << 20 and cfg.pin_fallback == "pageable_warn" and ahead
    try:
        parse_variant("x:no_such_field=1")
    except ValueError as e:
        assert "no_such_field" in str(e)
    else:
        raise AssertionError("bad field accepted")


def test_demo_round_trips_a_small_model(capsys):
    assert main(["demo", "--hidden", "64", "--layers", "1", "--vocab", "128"]) == 0
    out = capsys.readouterr().out
    assert "bit-exact after reload: True" in out and "tied embedding still tied: True" in out
    assert "1 flat buffer(s)" in out and "reuses" in out
