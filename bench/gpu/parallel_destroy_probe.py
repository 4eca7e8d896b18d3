"""Could a destroy walk overlap its proxy-poll waits? Sequential against threaded NCCL group destroys.

    torchrun --nproc-per-node=2 bench/gpu/parallel_destroy_probe.py [--rounds 3] [--out DIR]
    torchrun --nproc-per-node=2 bench/gpu/parallel_destroy_probe.py --dry-run     # CPU, Gloo: the script runs

Destroying an initialised NCCL communicator waits for its UDS proxy thread's next 500 ms poll timeout
([Note: the proxy's 500 ms poll] in sim/presets), so the lifecycle's walk over the 14 groups a training step
just initialised takes 3 poll periods (1.5 s) one destroy after the other. This probe creates the switch-window
benchmark's groups (``mesh_groups(N, 1)``), runs one collective on each in sorted order (their lazy NCCL init,
as the training step does), and destroys them three ways, ``--rounds`` times each, timing the slowest rank:

* ``sequential``: ``dist.destroy_process_group`` per group in sorted order (what ``TorchRuntime`` does);
* ``threads_shutdown``: ``ProcessGroup.shutdown()`` of every group at once from a thread pool, then
  ``dist.destroy_process_group`` per group in order (its bookkeeping);
* ``threads_destroy``: ``dist.destroy_process_group`` of every group at once from a thread pool.

After each round a fresh set of groups runs a collective whose result is checked, so a mode that leaves NCCL or
torch's bookkeeping broken shows as an error in the next round. Rank 0 writes
``parallel-destroy-<date>-<device>x<N>.json`` (``"kind": "parallel_destroy_probe"``) to ``--out`` (or $OUT).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MODES = ("sequential", "threads_shutdown", "threads_destroy")


def _groups(n: int, device: torch.device, check: bool) -> tuple[list, bool]:
    """Every mesh group (each rank calls new_group for all, in order) and a first collective on each member group, in
    sorted order; returns this rank's groups and whether every collective gave the expected sum."""
    from bench.switch_window import mesh_groups

    rank, ok, mine = dist.get_rank(), True, []
    for spec in mesh_groups(n, 1):
        pg = dist.new_group(list(spec.ranks))
        if rank in spec.ranks:
            mine.append((spec.name, pg, len(spec.ranks)))
    for name, pg, size in mine:
        t = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(t, group=pg)
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        if check:
            expected = float(sum(r + 1 for r in range(n))) if size == n else float(rank + 1)
            ok &= bool((t == expected).all()) if size in (1, n) else True
    return mine, ok


def _destroy(mode: str, mine: list) -> list[str]:
    """Destroy this rank's groups in ``mode``; the errors raised, as strings."""
    errors: list[str] = []

    def guarded(fn, *a):
        try:
            fn(*a)
        except Exception as e:  # noqa: BLE001 - recorded: a mode that fails is a finding
            errors.append(f"{fn.__name__}: {type(e).__name__}: {e}"[:300])

    pgs = [pg for _, pg, _ in mine]
    if mode == "sequential":
        for pg in pgs:
            guarded(dist.destroy_process_group, pg)
        return errors
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(pgs)) as pool:
        if mode == "threads_shutdown":
            list(pool.map(lambda pg: guarded(type(pg).shutdown, pg), pgs))
        else:
            list(pool.map(lambda pg: guarded(dist.destroy_process_group, pg), pgs))
    if mode == "threads_shutdown":
        for pg in pgs:
            guarded(dist.destroy_process_group, pg)
    return errors


def main() -> int:
    """Every mode ``--rounds`` times on every rank; rank 0 prints and writes the slowest rank's times. Returns 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT", str(REPO / "bench" / "results")))
    p.add_argument("--dry-run", action="store_true", help="CPU/Gloo")
    args = p.parse_args()
    cuda = torch.cuda.is_available() and not args.dry_run
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    control = dist.new_group(backend="gloo")
    rows = []
    for rnd in range(args.rounds):
        for mode in MODES:
            mine, ok = _groups(n, device, check=True)
            dist.barrier(group=control)
            t0 = time.perf_counter()
            errors = _destroy(mode, mine)
            took = time.perf_counter() - t0
            everyone = [None] * n
            dist.all_gather_object(everyone, {"s": took, "errors": errors, "bitwise": ok}, group=control)
            rows.append({"round": rnd, "mode": mode, "groups_per_rank": len(mine),
                         "slowest_s": max(e["s"] for e in everyone), "per_rank_s": [e["s"] for e in everyone],
                         "errors": [e["errors"] for e in everyone],
                         "collectives_right_before": all(e["bitwise"] for e in everyone)})
            if rank == 0:
                r = rows[-1]
                print(f"round {rnd} {mode:<17} {r['slowest_s']:.3f} s  errors {sum(map(len, r['errors']))}  "
                      f"collectives right: {r['collectives_right_before']}", flush=True)
    _, ok = _groups(n, device, check=True)  # after the last round too
    if rank == 0:
        summary = {m: sorted(r["slowest_s"] for r in rows if r["mode"] == m) for m in MODES}
        rec = {"kind": "parallel_destroy_probe", "schema": 1, "world_size": n, "dry_run": args.dry_run,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
               "command": "torchrun --nproc-per-node=%d bench/gpu/parallel_destroy_probe.py %s" % (n, " ".join(sys.argv[1:])),
               "rows": rows, "collectives_right_after_last_round": ok,
               "median_s": {m: v[len(v) // 2] for m, v in summary.items()}}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"parallel-destroy-{rec['date'][:10]}-{rec['device'].replace(' ', '-').lower()}x{n}.json"
        path.write_text(json.dumps(rec, indent=1) + "\n")
        print("median per mode: " + ", ".join(f"{m} {v:.3f} s" for m, v in rec["median_s"].items())
              + f"; collectives right after the last round: {ok}; wrote {path}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
