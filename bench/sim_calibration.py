"""The simulator against the H200: predicted vs measured offload/reload times of the benchmark shapes.

    python bench/offload_bench.py                       # on the H200: writes <date>-<gpu>-offload.json
    python bench/sim_calibration.py --measured REPORT.json [--out CAL.json]

``--measured`` defaults to the newest H200 report under bench/results/ (searched recursively);
``--out`` defaults to ``sim-calibration.json`` next to the report. Compared: the steady medians
of the default ``store`` method, offload and reload, for every shape, simulated with the report's
phase gap (``of it scrub``: the part of the copy time a reload waits for the driver's scrub). Without a recorded report
it prints the simulator's predictions only. Exits 1 if any prediction is more than 10% off.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.presets.bench_shapes import dense_shape, moe_shape  # noqa: E402
from sim.calibrate.calibration import DEFAULT_METHOD, compare, latest_report, predict  # noqa: E402

TOLERANCE = 0.10


def main(argv: list[str]) -> int:
    """Compare the simulator with the offload report (or print predictions when none is recorded) and write the
    comparison. Returns 1 if the largest error is over 10% (or there are no rows), else 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured", nargs="?", type=Path, help="offload report (same as --measured)")
    ap.add_argument("--measured", dest="measured_opt", type=Path, help="offload report of bench/offload_bench.py")
    ap.add_argument("--out", type=Path, help="where to write the comparison (default: sim-calibration.json beside it)")
    ap.add_argument("--preset", default="h200-1x", help="topology preset to simulate (default h200-1x)")
    args = ap.parse_args(argv)
    path = args.measured_opt or args.measured or latest_report()
    if path is None:
        print(f"no H200 offload report under bench/results/; predictions only ({args.preset} preset):")
        for shape in (dense_shape(), moe_shape()):
            p = predict(shape, preset=args.preset)
            print(f"  {p['shape']:<15} {p['tensors']:>6} tensors {p['state_bytes'] / 1e9:6.2f} GB: steady offload "
                  f"{p['steady_offload_s']:.4f} s, reload {p['steady_reload_s']:.4f} s (copies {p['copies']})")
        return 0
    report = json.loads(path.read_text())
    rows = compare(report, preset=args.preset)
    print(f"calibration against {path} ({report['device']}, {report['date']}), method {DEFAULT_METHOD!r}, "
          f"preset {args.preset}, phase gap {float(report.get('phase_gap_s') or 0.0):g} s")
    print(f"{'shape':<15}{'phase':<9}{'line GB/s':>10}{'copies':>8}{'copy s':>9}{'of it scrub':>12}{'host s':>9}"
          f"{'predicted s':>13}{'measured s':>12}{'ratio':>8}")
    worst = 0.0
    for r in rows:
        worst = max(worst, abs(r["rel_error"]))
        print(f"{r['shape']:<15}{r['phase']:<9}{r['line_gbps']:>10.2f}{r['copies']:>8}{r['copy_s']:>9.4f}"
              f"{r['scrub_wait_s']:>12.4f}{r['host_s']:>9.4f}{r['predicted_s']:>13.4f}{r['measured_s']:>12.4f}{r['ratio']:>8.3f}")
    ok = bool(rows) and worst <= TOLERANCE
    print(f"largest error {worst:.1%} ({'within' if ok else 'OUTSIDE'} the {TOLERANCE:.0%} target)")
    out = args.out or path.parent / "sim-calibration.json"
    out.write_text(json.dumps({
        "measured": str(path), "device": report["device"], "date": report["date"], "preset": args.preset,
        "method": DEFAULT_METHOD, "tolerance": TOLERANCE, "largest_error": worst, "within_tolerance": ok,
        "command": "python bench/sim_calibration.py --measured " + str(path), "rows": rows,
    }, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
