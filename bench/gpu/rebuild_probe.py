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


class RebuildRig:
    """One rank's group ``probe.g`` over every rank, under :class:`TorchRuntime`, and the copies beside it: ``gib``
    GiB host to device on a side stream (CUDA), or a small copy on the CPU (``cuda`` false, Gloo)."""

    NAME = "probe.g"

    def __init__(self, cuda: bool, gib: float, idle_s: float) -> None:
        import torch
        import torch.distributed as dist

        from refimpl.runtime import GroupSpec
        from refimpl.torch_runtime import TorchRuntime

        self.torch, self.dist, self.cuda, self.idle_s = torch, dist, cuda, idle_s
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.rt = TorchRuntime(self.device)
        self.rt.run(self.rt.new_group(GroupSpec(self.NAME, tuple(range(dist.get_world_size())))))
        numel = int((gib if cuda else 0.01) * (1 << 30))
        self.host = torch.empty(numel, dtype=torch.uint8, pin_memory=cuda)
        self.host.fill_(1)
        self.dev = torch.empty(numel, dtype=torch.uint8, device=self.device)
        self.side = torch.cuda.Stream(self.device) if cuda else None
        #: the runtime's own proxy-waker setting, restored at the end
        self.wake_default = self.rt.wake_proxies

    def sync(self) -> None:
        """Wait for the device (a no-op on CPU)."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def warm(self) -> None:
        """One one-element all-reduce on the group: it creates a rebuilt group's communicator."""
        from refimpl.runtime import ReduceOp

        buf = self.torch.zeros(1, device=self.device)
        self.rt.run(self.rt.all_reduce(buf, ReduceOp.SUM, self.NAME, timeout_s=120))

    def recreate(self) -> None:
        """``recreate_group`` and the warm-up, on the host (not waited for on the device)."""
        self.rt.run(self.rt.recreate_group(self.NAME))
        self.warm()

    def rebuild(self) -> float:
        """Seconds of the rebuild and warm-up to their end on the device, nothing else running."""
        t = time.perf_counter()
        self.recreate()
        self.sync()
        return time.perf_counter() - t

    def issue_copies(self) -> None:
        """The host-to-device copies, issued on the side stream (CUDA) or made (CPU)."""
        if self.cuda:
            with self.torch.cuda.stream(self.side):
                self.dev.copy_(self.host, non_blocking=True)
        else:
            self.dev.copy_(self.host)

    def destroy(self, wake: bool) -> float:
        """Seconds of the group's destroy after the idle gap, with the proxy waker ``wake``."""
        self.rt.wake_proxies = wake
        self.dist.barrier()
        time.sleep(self.idle_s)
        t = time.perf_counter()
        self.rt.run(self.rt.destroy_group(self.NAME))
        return time.perf_counter() - t

    def destroy_now(self) -> None:
        """The group down at once, every rank then at a barrier (before a timed rebuild)."""
        self.rt.run(self.rt.destroy_group(self.NAME))
        self.dist.barrier()


def one_round(rig: RebuildRig) -> dict[str, float]:
    """One round's figures: destroys and rebuilds alone, the copies alone, and the rebuild beside the copies in
    three orders (the module docstring names them)."""
    row: dict[str, float] = {}
    for wake in (True, False):
        row[f"destroy_wake{int(wake)}_s"] = rig.destroy(wake and rig.wake_default)
        rig.dist.barrier()
        row[f"rebuild_wake{int(wake)}_s"] = rig.rebuild()
    rig.dist.barrier()  # copies alone
    t = time.perf_counter()
    rig.issue_copies()
    rig.sync()
    row["copies_s"] = time.perf_counter() - t
    rig.destroy_now()  # copies issued, then the rebuild on the host
    t = time.perf_counter()
    rig.issue_copies()
    t1 = time.perf_counter()
    rig.recreate()
    row["after_rebuild_host_s"] = time.perf_counter() - t1
    rig.sync()
    row["after_total_s"] = time.perf_counter() - t
    rig.destroy_now()  # the rebuild first, then the copies
    t = time.perf_counter()
    rig.recreate()
    rig.issue_copies()
    rig.sync()
    row["before_total_s"] = time.perf_counter() - t
    rig.destroy_now()  # the rebuild on a thread beside the copies
    row["thread_rebuild_s"], row["thread_total_s"] = _rebuild_on_thread(rig)
    return row


def _rebuild_on_thread(rig: RebuildRig) -> tuple[float, float]:
    """The rebuild and warm-up on a thread while this thread issues the copies: (the rebuild's seconds on its
    thread, seconds until both are done)."""
    t = time.perf_counter()
    done: dict[str, float] = {}

    def bg() -> None:
        if rig.cuda:
            rig.torch.cuda.set_device(rig.device)
        t0 = time.perf_counter()
        rig.recreate()
        if rig.cuda:
            rig.torch.cuda.current_stream(rig.device).synchronize()
        done["s"] = time.perf_counter() - t0

    th = threading.Thread(target=bg)
    th.start()
    rig.issue_copies()
    th.join()
    rig.sync()
    return done.get("s", float("nan")), time.perf_counter() - t


def main() -> int:
    """Run the rounds on this rank; rank 0 prints and writes the record."""
    args = _parse()
    import torch
    import torch.distributed as dist

    cuda = not args.dry_run and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rig = RebuildRig(cuda, args.gib, args.idle_s)
    rig.warm()
    rig.sync()
    rounds = [one_round(rig) for _ in range(args.rounds)]
    rig.rt.wake_proxies = rig.wake_default
    med = {k: statistics.median(r[k] for r in rounds[1:] or rounds) for k in rounds[0]}
    if dist.get_rank() == 0:
        rec = {"kind": "rebuild_probe", "world_size": dist.get_world_size(),
               "device": torch.cuda.get_device_name(rig.device) if cuda else "cpu", "torch": torch.__version__,
               "gib": args.gib if cuda else 0.01, "idle_s": args.idle_s, "wake_proxies_default": rig.wake_default,
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
