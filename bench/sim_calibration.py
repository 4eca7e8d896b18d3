"""The simulator against the H200: predicted vs measured offload/reload times of the benchmark shapes.

    python bench/offload_bench.py                 # on the H200: writes bench/results/<date>-<gpu>-offload.json
    python bench/sim_calibration.py [REPORT.json] # anywhere: the comparison (newest H200 report by default)

Without a recorded report it prints the simulator's predictions only. Exits 1 if any steady
offload/reload prediction is more than 10% off the measurement.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refimpl.benchmarks.shapes import dense_shape, moe_shape  # noqa: E402
from sim.calibration import compare, latest_report, predict  # noqa: E402

TOLERANCE = 0.10


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else latest_report()
    if path is None:
        print("no H200 offload report under bench/results/; predictions only (h200-1x preset):")
        for shape in (dense_shape(), moe_shape()):
            p = predict(shape)
            print(f"  {p['shape']:<15} {p['tensors']:>6} tensors {p['state_bytes'] / 1e9:6.2f} GB: steady offload "
                  f"{p['steady_offload_s']:.4f} s, reload {p['steady_reload_s']:.4f} s; cold offload "
                  f"{p['cold_offload_s']:.4f} s (copies {p['copies']})")
        return 0
    report = json.loads(path.read_text())
    rows = compare(report)
    print(f"calibration against {path} ({report['device']}, {report['date']})")
    print(f"{'shape':<16}{'method':<16}{'phase':<9}{'measured s':>12}{'predicted s':>13}{'error':>9}")
    worst = 0.0
    for r in rows:
        worst = max(worst, abs(r["rel_error"]))
        print(f"{r['shape']:<16}{r['method']:<16}{r['phase']:<9}{r['measured_s']:>12.4f}{r['predicted_s']:>13.4f}"
              f"{r['rel_error']:>+9.1%}")
    print(f"largest error {worst:.1%} ({'within' if worst <= TOLERANCE else 'OUTSIDE'} the {TOLERANCE:.0%} target)")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
