"""Destroys of NCCL communicators long after their last use, with ``NCCL_CUMEM_ENABLE`` as the job sets it.

    torchrun --nproc-per-node=2 bench/gpu/idle_destroy_probe.py --cumem 0      # as Relax's trainers run
    torchrun --nproc-per-node=2 bench/gpu/idle_destroy_probe.py --cumem 1      # NCCL's default on Hopper
    torchrun --nproc-per-node=2 bench/gpu/idle_destroy_probe.py --dry-run      # CPU, Gloo: the script runs

The simulator charges a destroy of an initialised communicator the wait for its NCCL UDS proxy thread's next 500 ms
poll timeout ([Note: the proxy's 500 ms poll] in sim/presets/__init__.py). This probe asks whether
``NCCL_CUMEM_ENABLE=0``, as the Relax report's trainers run, takes that wait away (docs/calibration.md says what
the 8 x H20 case needs; docs/gpu.md what one H200 showed). NCCL's source starts and joins that thread whatever
cuMem is set to, so the question is for the hardware.

Each round creates ``--groups`` groups over all ranks, runs one all-reduce on each (torch's lazy NCCL init),
waits ``--idle-s`` plus a random part of a period (the same on every rank), as a training step does between its
first collectives and the pause, then destroys the groups one by one (``dist.destroy_process_group``) and times
each destroy on the host. With the poll each waits 0-0.5 s (0.25 s on average); without it a few ms. Rank 0
writes ``idle-destroy-<date>-cumem<0|1|unset>-<device>x<N>.json`` to ``$OUT`` (default bench/results) and prints
the mean and the range.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cumem", choices=("0", "1", "unset"), default="unset",
                   help="NCCL_CUMEM_ENABLE for this process, set before NCCL starts (default: as the environment has it)")
    p.add_argument("--groups", type=int, default=4, help="groups per round (default 4)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--idle-s", type=float, default=3.0, help="wait after the inits, before the destroys (default 3)")
    p.add_argument("--dry-run", action="store_true", help="CPU/Gloo, no waits")
    return p.parse_args()


def _round(dist, torch, device, n_groups: int, idle_s: float, rng: random.Random) -> list[dict[str, float]]:
    """One round: create, first-use, idle, destroy; per group its init end and destroy times (host seconds)."""
    ranks = list(range(dist.get_world_size()))
    groups = [dist.new_group(ranks) for _ in range(n_groups)]
    rows = []
    for g in groups:
        x = torch.ones(1, device=device)
        dist.all_reduce(x, group=g)
        if device.type == "cuda":
            torch.cuda.synchronize()
        rows.append({"init_end": time.perf_counter()})
    extra = torch.tensor([rng.random() * 0.5], device=device)
    dist.broadcast(extra, src=0)  # the same idle time on every rank (on the default group, Gloo-free on CPU too)
    time.sleep(idle_s + float(extra))
    for g, row in zip(groups, rows):
        row["destroy_start"] = time.perf_counter()
        dist.destroy_process_group(g)
        row["destroy_end"] = time.perf_counter()
        row["destroy_s"] = row["destroy_end"] - row["destroy_start"]
        row["since_init_s"] = row["destroy_start"] - row["init_end"]
    return rows


def main() -> int:
    """Run the rounds; rank 0 writes the record and prints the destroys' mean and range. Returns 0."""
    args = _parse()
    if args.cumem != "unset":
        os.environ["NCCL_CUMEM_ENABLE"] = args.cumem  # read by NCCL at its first communicator, below
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and not args.dry_run
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda") if cuda else torch.device("cpu")
    idle = 0.0 if args.dry_run else args.idle_s
    rng = random.Random(1234)
    rounds = [_round(dist, torch, device, args.groups, idle, rng) for _ in range(args.rounds)]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rounds)
    if dist.get_rank() == 0:
        d = [r["destroy_s"] for rank in everyone for rnd in rank for r in rnd]
        rec = {"kind": "idle_destroy_probe", "schema": 1, "world_size": dist.get_world_size(),
               "nccl_cumem_enable": os.environ.get("NCCL_CUMEM_ENABLE", "unset"),
               "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
               "torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": "torchrun --nproc-per-node=%d bench/gpu/idle_destroy_probe.py %s"
                          % (dist.get_world_size(), " ".join(sys.argv[1:])),
               "groups": args.groups, "idle_s": idle, "ranks": everyone,
               "destroy_s": {"mean": statistics.fmean(d), "min": min(d), "max": max(d), "n": len(d)}}
        out = Path(os.environ.get("OUT", REPO / "bench" / "results"))
        out.mkdir(parents=True, exist_ok=True)
        path = out / (f"idle-destroy-{rec['date'][:10]}-cumem{rec['nccl_cumem_enable']}-"
                      f"{rec['device'].replace(' ', '-').lower()}x{rec['world_size']}.json")
        path.write_text(json.dumps(rec, indent=1) + "\n")
        s = rec["destroy_s"]
        print(f"NCCL_CUMEM_ENABLE={rec['nccl_cumem_enable']}: {s['n']} destroys, mean {s['mean'] * 1e3:.1f} ms, "
              f"{s['min'] * 1e3:.1f}-{s['max'] * 1e3:.1f} ms (the proxy poll: 0-500 ms, 250 on average)")
        print(f"wrote {path}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
