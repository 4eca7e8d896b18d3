"""What one outcome vote costs: ``TorchRuntime.vote`` through the job's rendezvous store.

    torchrun --nproc-per-node=2 bench/vote_probe.py [--votes 400] [--out DIR]

``local_dedup`` settles every offload and every reload by two votes among all ranks
(:mod:`refimpl.store.backends.dedup_outcome`, docs/dedup.md), each a few operations on the store
``init_process_group`` set up (:mod:`refimpl.torch_runtime.votes`). This times that call ``--votes``
times back to back on every rank after a barrier, and writes ``vote-<date>-<host>x<N>.json``
(``"kind": "vote_probe"``) with the median and 90th percentile per vote of the slowest rank. The
store lives on one host (torchrun's rendezvous host), so the figure belongs to that host's CPU and
network, not to the GPUs: run it where the jobs run, with their number of ranks per node.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch.distributed as dist  # noqa: E402


def parse() -> argparse.Namespace:
    """The command line (``--votes``, ``--out``, ``--note``); ``--out`` defaults to ``$OUT``, else bench/results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--votes", type=int, default=400, help="votes timed (after 20 untimed)")
    p.add_argument("--out", default=os.environ.get("OUT", str(REPO / "bench" / "results")),
                   help="directory of the JSON record (default $OUT, else bench/results)")
    p.add_argument("--note", default="", help="free text stored in the record (e.g. what else ran on the host)")
    return p.parse_args()


def measure(votes: int) -> list[float]:
    """Seconds of each of ``votes`` votes among all ranks on this rank (a barrier before each)."""
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime("cpu", default_backend="gloo")
    ranks = range(rt.world_size)
    times = []
    for i in range(votes + 20):
        dist.barrier()
        t0 = time.perf_counter()
        rt.run(rt.vote(f"probe/{i}", ranks, "probe", 0, {rt.rank}, timeout_s=60.0))
        if i >= 20:
            times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    """Run the probe under torchrun; rank 0 writes the record. Returns the exit status: 0, or 2 for bad
    ``--votes`` or a run outside torchrun."""
    args = parse()
    if args.votes < 1:
        print("error: --votes must be >= 1", file=sys.stderr)
        return 2
    if "RANK" not in os.environ:
        print("error: run under torchrun (torchrun --nproc-per-node=2 bench/vote_probe.py)", file=sys.stderr)
        return 2
    dist.init_process_group("gloo")
    times = measure(args.votes)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, times)
    if dist.get_rank() == 0:
        slowest = sorted(max(t) for t in zip(*everyone))
        record = {
            "kind": "vote_probe", "schema": 1,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node() or socket.gethostname(), "cpus": os.cpu_count(),
            "world_size": dist.get_world_size(),
            "command": f"torchrun --nproc-per-node={dist.get_world_size()} bench/vote_probe.py --votes {args.votes}",
            "votes": args.votes, "per_vote_s": statistics.median(slowest),
            "p90_s": slowest[int(0.9 * (len(slowest) - 1))], "note": args.note,
        }
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"vote-{record['date'][:10]}-{record['host']}x{record['world_size']}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{args.votes} votes on {record['world_size']} ranks: median {record['per_vote_s'] * 1e6:.0f} us, "
              f"p90 {record['p90_s'] * 1e6:.0f} us (slowest rank); wrote {path}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
