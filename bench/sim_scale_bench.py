"""How the simulator's run time grows with ranks: one RL step of the scale_1024 scenario at 8..1024 ranks.

    python bench/sim_scale_bench.py [--ranks 8,64,1024] [--out bench/results/sim_scale.json]

For each size it runs the shipped ``scale_1024`` scenario shrunk to that many ranks (TP8 x DP n/8 on
n/8 HGX nodes) twice, both with meta payloads: the offload store alone (pg_policy none), and the full step with
the lifecycle keeping the groups live through the pause (paused_live, as shipped). It prints wall and CPU seconds, events, and the ratio of time per rank to
the 8-rank run measured in the same process (after a warm-up run). The target is one 1,024-rank step in
at most 5 s on a 2-core CI machine; the verdict uses CPU seconds, which other load on the machine does not inflate.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.presets import scenario_path  # noqa: E402
from sim.runner import run_scenario  # noqa: E402
from sim.scenario import parse_scenario  # noqa: E402


def scenario(n: int, arm: str) -> dict:
    raw = json.loads(scenario_path("scale_1024").read_text())
    raw["name"] = f"scale_{n}_{arm}"
    raw["world_size"] = n
    raw["topology"] = {"preset": "hgx-h200-8x-ib", "nodes": max(1, n // 8)}
    raw["mesh"] = {"dp": n // 8, "tp": 8}
    if arm == "store":
        raw["pg_policy"] = "none"
    return raw


def measure(n: int, arm: str) -> dict:
    scn = parse_scenario(scenario(n, arm))
    w0, c0 = time.perf_counter(), time.process_time()
    result, _, _ = run_scenario(scn)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if not result.ok:
        raise SystemExit(f"{scn.name}: invariant violated: {result.violations[:3]}")
    return {"ranks": n, "arm": arm, "wall_s": wall, "cpu_s": cpu, "events": result.data["events"],
            "simulated_s": result.data["simulated_time_s"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="8,16,32,64,128,256,512,1024")
    p.add_argument("--out", help="write the measurements as JSON here")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.ranks.split(",")]
    for arm in ("store", "lifecycle"):  # warm-up: imports and first-use caches stay out of the numbers
        measure(8, arm)
    rows = []
    print(f"{'arm':<10}{'ranks':>6}{'wall s':>9}{'cpu s':>9}{'events':>9}{'cpu per rank vs 8':>20}")
    for arm in ("store", "lifecycle"):
        base = None
        for n in sizes:
            m = measure(n, arm)
            per = m["cpu_s"] / n
            base = base or per
            m["per_rank_ratio"] = per / base
            rows.append(m)
            print(f"{arm:<10}{n:>6}{m['wall_s']:>9.2f}{m['cpu_s']:>9.2f}{m['events']:>9}{m['per_rank_ratio']:>20.2f}")
    big = [m for m in rows if m["ranks"] == 1024]
    for m in big:
        verdict = "within" if m["cpu_s"] <= 5 else "OVER"
        print(f"1,024 ranks, {m['arm']}: {m['cpu_s']:.2f} s of CPU, {m['wall_s']:.2f} s wall ({verdict} the 5 s target; "
              "the simulator is single-threaded, so on an otherwise idle machine wall = CPU)")
    if args.out:
        Path(args.out).write_text(json.dumps({"python": sys.version.split()[0], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
