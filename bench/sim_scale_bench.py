"""How the simulator's run time grows with ranks: one RL step of the scale_1024 scenario at 8..1024 ranks.

    python bench/sim_scale_bench.py [--ranks 8,64,1024] [--out bench/results/sim_scale.json]
    python bench/sim_scale_bench.py --growth [--ranks 1024,2048,4096,8192,16384] [--no-fold] [--out FILE]

``--growth`` (issue 18) measures what a user gets from ``timeshare sim run`` on the default
multi-node scenario, ``{"world_size": N, "topology": "hgx-h200-8x-ib"}`` (a dense 7B FSDP shard of
1,455 tensors per rank): each size runs the CLI in a fresh process, which reports its own wall
time, CPU time and peak RSS, and the table shows seconds per 1k ranks and the ratio to the first
row (1.0 = linear growth). The goal: 16,384 ranks in at most 60 s and 4 GB, 1,024 in at most 3 s.
``--no-fold`` simulates every rank (the simulator before issue 18); keep it to 1,024 ranks or less
on a shared machine (about 5 MB per rank).

For each size it runs the shipped ``scale_1024`` scenario shrunk to that many ranks (TP8 x DP n/8 on
n/8 HGX nodes) twice, both with meta payloads: the offload store alone (pg_policy none), and the full step with
the lifecycle keeping the groups live through the pause (paused_live, as shipped). It prints wall and CPU seconds, events, and the ratio of time per rank to
the 8-rank run measured in the same process (after a warm-up run). The target is one 1,024-rank step in
at most 5 s on a 2-core CI machine; the verdict uses CPU seconds, which other load on the machine does not inflate.
"""
from __future__ import annotations

import argparse
import json
import os
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


def _child(n: int, fold: bool) -> int:
    """One CLI run in this process; prints one JSON line with its cost (the parent reads it)."""
    import resource
    import tempfile

    w0 = time.perf_counter()
    from refimpl.cli import main as cli_main

    with tempfile.TemporaryDirectory() as tmp:
        scn, out = Path(tmp) / "s.json", Path(tmp) / "r.json"
        scn.write_text(json.dumps({"world_size": n, "topology": "hgx-h200-8x-ib"}))
        argv = ["sim", "run", str(scn), "--quiet", "--out", str(out), "--force"] + ([] if fold else ["--no-fold"])
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli_main(argv)
        result = json.loads(out.read_text())
    wall = time.perf_counter() - w0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss is KiB on Linux
    print(json.dumps({"ranks": n, "rc": rc, "ok": result["ok"], "events": result["events"], "wall_s": wall,
                      "peak_rss_gb": rss, "simulated_s": result["simulated_time_s"], "folded": fold}))
    return 0


def growth(sizes: list[int], fold: bool, out: str | None) -> int:
    """The growth table of the default multi-node scenario (see the module docstring)."""
    import platform
    import subprocess

    rows = []
    print(f"{'ranks':>7}{'events':>10}{'wall s':>9}{'cpu s':>8}{'peak RSS GB':>13}{'s per 1k ranks':>16}{'ratio':>7}")
    import resource

    for n in sizes:
        cmd = [sys.executable, __file__, "--child", str(n)] + ([] if fold else ["--no-fold"])
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - w0  # the whole process: interpreter start, imports, run, result JSON
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{n} ranks: the run failed:\n{proc.stderr[-2000:]}")
        m = json.loads(proc.stdout.strip().splitlines()[-1])
        m["in_process_wall_s"] = m.pop("wall_s")
        m["wall_s"] = wall
        m["cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        if not m["ok"] or m["rc"] != 0:
            raise SystemExit(f"{n} ranks: invariant violated (rc {m['rc']})")
        m["s_per_1k_ranks"] = m["wall_s"] / n * 1000
        m["ratio_to_first"] = m["s_per_1k_ranks"] / rows[0]["s_per_1k_ranks"] if rows else 1.0
        rows.append(m)
        print(f"{n:>7}{m['events']:>10}{m['wall_s']:>9.2f}{m['cpu_s']:>8.2f}{m['peak_rss_gb']:>13.2f}"
              f"{m['s_per_1k_ranks']:>16.3f}{m['ratio_to_first']:>7.2f}", flush=True)
    by = {m["ranks"]: m for m in rows}
    if 16384 in by:
        m = by[16384]
        ok = m["wall_s"] <= 60 and m["peak_rss_gb"] <= 4
        print(f"16,384 ranks: {m['wall_s']:.1f} s, {m['peak_rss_gb']:.2f} GB ({'within' if ok else 'OVER'} 60 s / 4 GB)")
    if 1024 in by:
        m = by[1024]
        print(f"1,024 ranks: {m['wall_s']:.2f} s wall, {m['cpu_s']:.2f} s CPU ({'within' if m['wall_s'] <= 3 else 'OVER'} 3 s)")
    if out:
        Path(out).write_text(json.dumps({
            "command": " ".join([Path(sys.executable).name] + sys.argv), "python": sys.version.split()[0],
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "folded": fold, "rows": rows}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default=None, help="comma-separated sizes")
    p.add_argument("--out", help="write the measurements as JSON here")
    p.add_argument("--growth", action="store_true", help="the default multi-node scenario through the CLI (issue 18)")
    p.add_argument("--no-fold", action="store_true", help="with --growth: simulate every rank")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return _child(args.child, not args.no_fold)
    if args.growth:
        return growth([int(x) for x in (args.ranks or "1024,2048,4096,8192,16384").split(",")], not args.no_fold,
                      args.out)
    sizes = [int(x) for x in (args.ranks or "8,16,32,64,128,256,512,1024").split(",")]
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
