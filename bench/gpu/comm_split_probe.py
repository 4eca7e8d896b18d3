"""What creating, first using and destroying NCCL process groups cost, apart, per group size.

    torchrun --nproc-per-node=N bench/gpu/comm_split_probe.py [OUT_DIR] [--comms 14] [--backend nccl]

``bench/gpu/multigpu.py``'s ``comm_raw`` times group creation and the first collective together
(``create_first_collective_s``). The lifecycle pays them apart: torch creates NCCL communicators
lazily, so a rebuild pays ``new_group`` and the first collective comes later (or never, before the
next destroy). For communicators over every rank and for one-rank communicators (one per rank,
created on every rank as ``new_group`` requires), all ranks at once as in the lifecycle, this times
``--comms`` of each, one after the other:

* ``create_s``: ``dist.new_group`` alone;
* ``first_collective_s``: the first one-element all-reduce on each (NCCL init and connection);
* ``destroy_s``: destroying the used groups;
* ``destroy_uninitialized_s``: creating ``--comms`` more and destroying them unused (the destroy part);
* ``steady_collective_s``: a second all-reduce on each (for reference).

Every figure is the slowest rank's total over the communicators (a barrier and a device synchronize
before and after). Rank 0 writes one multigpu record (``"kind": "multigpu"``, ``comm_raw`` only)
per group size: ``comm-split-<world>x-ranks<k>.json`` in OUT_DIR (default ``$OUT`` or the current
directory). Suspend and resume are not timed here (they need NCCL >= 2.29.7; multigpu.py does them).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


class GroupTimer:
    """This rank's timed group operations on ``backend`` (``nccl``: on this rank's GPU), every rank together."""

    def __init__(self, backend: str, comms: int) -> None:
        self.backend, self.comms = backend, comms
        self.cuda = backend == "nccl"
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.dev = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")

    def sync(self) -> None:
        """The device's queued work done, then every rank at a barrier."""
        if self.cuda:
            torch.cuda.synchronize()
        dist.barrier()

    def timed(self, fn) -> float:
        """Seconds of ``fn()`` on this rank, device-synchronised, every rank starting and ending together."""
        self.sync()
        t0 = time.perf_counter()
        fn()
        if self.cuda:
            torch.cuda.synchronize()
        t = time.perf_counter() - t0
        self.sync()
        return t

    def make(self, ranks_per_comm: int) -> list:
        """--comms groups this rank belongs to; every rank calls new_group for every group, in one order."""
        mine = []
        for _ in range(self.comms):
            if ranks_per_comm == self.n:
                mine.append(dist.new_group(list(range(self.n)), backend=self.backend))
            else:
                for r in range(self.n):  # one-rank groups: one per rank, all created on every rank
                    g = dist.new_group([r], backend=self.backend)
                    if r == self.rank:
                        mine.append(g)
        return mine

    def use(self, groups) -> None:
        """A one-element all-reduce on each group, device-synchronised at the end."""
        for g in groups:
            t = torch.ones(1, device=self.dev)
            dist.all_reduce(t, group=g)
        if self.cuda:
            torch.cuda.synchronize()

    @staticmethod
    def destroy(groups) -> None:
        """Each group destroyed, one after the other."""
        for g in groups:
            dist.destroy_process_group(g)

    def row(self, k: int) -> dict[str, float]:
        """The figures for ``--comms`` groups of ``k`` ranks each, the slowest rank's."""
        box: dict = {}
        row = {"create_s": self.timed(lambda: box.setdefault("g", self.make(k)))}
        groups = box["g"]
        row["first_collective_s"] = self.timed(lambda: self.use(groups))
        row["steady_collective_s"] = self.timed(lambda: self.use(groups))
        row["destroy_s"] = self.timed(lambda: self.destroy(groups))
        spare = self.make(k)
        row["destroy_uninitialized_s"] = self.timed(lambda: self.destroy(spare))
        every = [None] * self.n
        dist.all_gather_object(every, row)
        return {key: max(r[key] for r in every) for key in row}


def write_records(out: dict[int, dict[str, float]], out_dir: str, comms: int, cuda: bool) -> None:
    """One multigpu record per group size into ``out_dir`` (``comm-split-<world>x-ranks<k>.json``), each row
    printed."""
    n = dist.get_world_size()
    device = torch.cuda.get_device_name().replace(" ", "-").lower() if cuda else "cpu"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    for k, row in out.items():
        rec = {
            "kind": "multigpu", "schema": 1,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device, "world_size": n, "torch": torch.__version__,
            "nccl_loaded": {"built_with": nccl, "note": "the library torch was built with; nothing preloaded"},
            "command": " ".join(["torchrun", f"--nproc-per-node={n}", *sys.argv]),
            "dry_run": not cuda,
            "comm_raw": {"n_comms": comms, "ranks_per_comm": k, "create_first_collective_s":
                         row["create_s"] + row["first_collective_s"], **row},
        }
        path = Path(out_dir) / f"comm-split-{n}x-ranks{k}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec, indent=1) + "\n")
        print(f"{k}-rank communicators x {comms}: " + ", ".join(f"{a} {b:.4f} s" for a, b in row.items()),
              flush=True)


def main() -> int:
    """Time create, first collective, steady collective and destroy (used and unused) of ``--comms`` groups, for
    all-rank and one-rank communicators; rank 0 writes one record per group size. Returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT", "."))
    ap.add_argument("--comms", type=int, default=14)
    ap.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
    args = ap.parse_args()
    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(args.backend)
    timer = GroupTimer(args.backend, args.comms)
    out = {k: timer.row(k) for k in sorted({timer.n, 1}, reverse=True)}
    if timer.rank == 0:
        write_records(out, args.out, args.comms, timer.cuda)
    timer.sync()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
