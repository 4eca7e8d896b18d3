"""Rebuilding a process group beside the reload's copies: does a communicator's creation wait for them?

    torchrun --nproc-per-node=N bench/gpu/rebuild_probe.py --gib 8 --rounds 4 --out $OUT/rebuild.json
    torchrun --nproc-per-node=2 bench/gpu/rebuild_probe.py --dry-run       # CPU, Gloo: the script runs

A switch that destroys the trainer's groups rebuilds them at the wake, while the reload's host-to-device copies
run on the copy engine. Each round, through :class:`refimpl.torch_runtime.TorchRuntime` as the lifecycle uses it,
on a group over all ranks:

``destroy``     the group's destroy after an idle gap (the proxy waker on, as by default, and off)
``rebuild``     ``recreate_group`` then one one-element all-reduce (the warm-up that creates the communicator),
                host time to its end, nothing else running
``copies``      ``--gib`` GiB host-to-device on a side stream, nothing else running
``after``       the copies issued, then the rebuild and warm-up on the host; the rebuild's own time and the
                time until both are done
``before``      the rebuild and warm-up first, then the copies
``thread``      the rebuild and warm-up on a thread while the caller issues the copies

If the rebuild beside the copies takes about as long as alone, the two overlap and a switch can hide one under
the other; if it takes the copies' time more, something in the creation waits for the device.
Rank 0 prints the medians and writes the rounds to ``--out`` (JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=8.0, help="GiB copied host to device per round (default 8)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--idle-s", type=float, default=0.7, help="idle gap before each destroy (default 0.7 s)")
    p.add_argument("--out", default="", help="JSON record (rank 0)")
    p.add_argument("--dry-run", action="store_true", help="CPU/Gloo, tiny sizes")
    return p.parse_args()


def main() -> int:
    """Run the rounds on this rank; rank 0 prints and writes the record."""
    args = _parse()
    import torch
    import torch.distributed as dist

    from refimpl.runtime import GroupSpec, ReduceOp
    from refimpl.torch_runtime import TorchRuntime

    cuda = not args.dry_run and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    rt = TorchRuntime(device)
    ranks = tuple(range(world))
    name = "probe.g"
    rt.run(rt.new_group(GroupSpec(name, ranks)))
    numel = int((args.gib if cuda else 0.01) * (1 << 30))
    host = torch.empty(numel, dtype=torch.uint8, pin_memory=cuda)
    host.fill_(1)
    dev = torch.empty(numel, dtype=torch.uint8, device=device)
    side = torch.cuda.Stream(device) if cuda else None

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def warm() -> None:
        buf = torch.zeros(1, device=device)
        rt.run(rt.all_reduce(buf, ReduceOp.SUM, name, timeout_s=120))

    def rebuild() -> float:
        t = time.perf_counter()
        rt.run(rt.recreate_group(name))
        warm()
        sync()
        return time.perf_counter() - t

    def issue_copies() -> None:
        if cuda:
            with torch.cuda.stream(side):
                dev.copy_(host, non_blocking=True)
        else:
            dev.copy_(host)

    def destroy(wake: bool) -> float:
        rt.wake_proxies = wake
        dist.barrier()
        time.sleep(args.idle_s)
        t = time.perf_counter()
        rt.run(rt.destroy_group(name))
        return time.perf_counter() - t

    wake_default = rt.wake_proxies
    warm()
    sync()
    rounds = []
    for r in range(args.rounds):
        row: dict[str, float] = {}
        for wake in (True, False):
            row[f"destroy_wake{int(wake)}_s"] = destroy(wake and wake_default)
            dist.barrier()
            row[f"rebuild_wake{int(wake)}_s"] = rebuild()
        # copies alone
        dist.barrier()
        t = time.perf_counter()
        issue_copies()
        sync()
        row["copies_s"] = time.perf_counter() - t
        # copies issued, then the rebuild on the host
        rt.run(rt.destroy_group(name))
        dist.barrier()
        t = time.perf_counter()
        issue_copies()
        t1 = time.perf_counter()
        rt.run(rt.recreate_group(name))
        warm()
        row["after_rebuild_host_s"] = time.perf_counter() - t1
        sync()
        row["after_total_s"] = time.perf_counter() - t
        # the rebuild first, then the copies
        rt.run(rt.destroy_group(name))
        dist.barrier()
        t = time.perf_counter()
        rt.run(rt.recreate_group(name))
        warm()
        issue_copies()
        sync()
        row["before_total_s"] = time.perf_counter() - t
        # the rebuild on a thread beside the copies
        rt.run(rt.destroy_group(name))
        dist.barrier()
        t = time.perf_counter()
        done: dict[str, float] = {}

        def bg() -> None:
            if cuda:
                torch.cuda.set_device(device)
            t0 = time.perf_counter()
            rt.run(rt.recreate_group(name))
            warm()
            if cuda:
                torch.cuda.current_stream(device).synchronize()
            done["s"] = time.perf_counter() - t0

        th = threading.Thread(target=bg)
        th.start()
        issue_copies()
        th.join()
        sync()
        row["thread_rebuild_s"] = done.get("s", float("nan"))
        row["thread_total_s"] = time.perf_counter() - t
        rounds.append(row)
    rt.wake_proxies = wake_default
    med = {k: statistics.median(r[k] for r in rounds[1:] or rounds) for k in rounds[0]}
    if rank == 0:
        rec = {"kind": "rebuild_probe", "world_size": world, "device": torch.cuda.get_device_name(device) if cuda
               else "cpu", "torch": torch.__version__, "gib": args.gib if cuda else 0.01,
               "idle_s": args.idle_s, "wake_proxies_default": wake_default,
               "nccl_cumem_enable": os.environ.get("NCCL_CUMEM_ENABLE", "unset"),
               "rounds": rounds, "median_after_first": med}
        for k, v in med.items():
            print(f"{k:24s} {v:8.4f}")
        if args.out:
            Path(args.out).write_text(json.dumps(rec, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
