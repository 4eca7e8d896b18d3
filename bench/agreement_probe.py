"""What one lifecycle agreement costs: ``all_reduce(MIN)`` of a few integers on the Gloo control group.

    torchrun --nproc-per-node=2 bench/agreement_probe.py [--agreements 400] [--out DIR]

Every branch of the lifecycle ends with one agreement on its Gloo control group
(:class:`refimpl.comm.agreement.ControlGroup`, [Note: agreed steps] in
:mod:`refimpl.comm.role_groups`). This times that exact call, through
:class:`refimpl.runtime.TorchRuntime`, ``--agreements`` times back to back on every rank after a
barrier, and writes ``agreement-<date>-<host>x<N>.json`` (``"kind": "agreement_probe"``) with the
median and 90th percentile per agreement of the slowest rank. ``timeshare sim calibrate`` fits the
preset's ``gloo_agreement`` from it (:mod:`sim.calibrate.fit`); the simulator charges it to every collective on
a Gloo group. The control group's traffic never leaves the host's loopback, so the figure belongs to
the host's CPU and kernel, not to its GPUs: run it on the machine whose switch window is simulated.
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
    """The command line (``--agreements``, ``--out``, ``--note``); ``--out`` defaults to ``$OUT``, else bench/results.
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agreements", type=int, default=400, help="agreements timed (after 20 untimed)")
    p.add_argument("--out", default=os.environ.get("OUT", str(REPO / "bench" / "results")),
                   help="directory of the JSON record (default $OUT, else bench/results)")
    p.add_argument("--note", default="", help="free text stored in the record (e.g. what else ran on the host)")
    return p.parse_args()


def measure(agreements: int) -> list[float]:
    """Seconds of each of ``agreements`` control-group agreements on this rank (a barrier before each)."""
    from refimpl.comm.agreement import ControlGroup
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime("cpu", default_backend="gloo")
    control = ControlGroup("probe.control")
    rt.run(control.ensure(rt))
    times = []
    for i in range(agreements + 20):
        dist.barrier()
        t0 = time.perf_counter()
        rt.run(control.reduce_min(rt, [1, rt.rank, rt.world_size, -rt.rank], "probe"))
        if i >= 20:
            times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    """Run the probe under torchrun; rank 0 writes the record. Returns the exit status: 0, or 2 for bad
    ``--agreements`` or a run outside torchrun."""
    args = parse()
    if args.agreements < 1:
        print("error: --agreements must be >= 1", file=sys.stderr)
        return 2
    if "RANK" not in os.environ:
        print("error: run under torchrun (torchrun --nproc-per-node=2 bench/agreement_probe.py)", file=sys.stderr)
        return 2
    dist.init_process_group("gloo")
    times = measure(args.agreements)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, times)
    if dist.get_rank() == 0:
        slowest = [max(t) for t in zip(*everyone)]
        ordered = sorted(slowest)
        record = {
            "kind": "agreement_probe", "schema": 1,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node() or socket.gethostname(), "cpus": os.cpu_count(),
            "world_size": dist.get_world_size(), "backend": "gloo",
            "command": f"torchrun --nproc-per-node={dist.get_world_size()} bench/agreement_probe.py "
                       f"--agreements {args.agreements}",
            "agreements": args.agreements,
            "per_agreement_s": statistics.median(slowest),
            "p90_s": ordered[int(0.9 * (len(ordered) - 1))],
            "note": args.note,
        }
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"agreement-{record['date'][:10]}-{record['host']}x{record['world_size']}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{args.agreements} agreements on {record['world_size']} ranks: median {record['per_agreement_s'] * 1e6:.0f} us, "
              f"p90 {record['p90_s'] * 1e6:.0f} us (slowest rank); wrote {path}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
