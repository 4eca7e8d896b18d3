"""A communicator's channels: what fewer of them save at its creation and cost its collectives.

    torchrun --nproc-per-node=N bench/gpu/channels_probe.py --caps none,16,8,4 --rounds 4 --out $OUT/channels.json
    torchrun --nproc-per-node=N bench/gpu/channels_probe.py --caps none,8 --rounds 1 --nccl-log $OUT/log  # channels
    torchrun --nproc-per-node=2 bench/gpu/channels_probe.py --dry-run             # CPU, Gloo: the script runs

A group the lifecycle destroys at the pause is created again at the wake, by its first collective (the warm-up).
NCCL's own log of a two-rank creation on two H200s puts most of it in the connection that collective makes: one
exchange of a cuMem buffer's handle through the proxy per channel and direction, about 2 ms each over 24 channels
(``python -m sim.calibrate.nccl_init_log``; docs/calibration.md, "Communicator costs by size"). NCCL's ``maxCTAs``
(ProcessGroupNCCL's ``config.max_ctas``, the RL step's ``--nccl-max-ctas``) caps the channels a communicator
uses, so it should shorten the connection in proportion, and lower the bandwidth of each collective.

For each cap of ``--caps`` (``none``: NCCL's choice), through :class:`refimpl.torch_runtime.TorchRuntime` as the
lifecycle does it (a group over every rank whose spec carries the cap, so every rebuild keeps it), ``--rounds``
times: the group destroyed, every rank at a Gloo barrier, then ``recreate_group`` and a one-element all-reduce,
to its end on the device (``creation_s``; the device memory it took, ``nccl_bytes``, from ``cudaMemGetInfo``);
then, on the created communicator, ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` of bf16 at each
size of ``--mib`` (the gathered size, as FSDP2 gathers a unit), each timed with CUDA events over ``--iters``
after one untimed (``ms`` and NCCL's bus bandwidth ``busbw_gbps``, ``(n - 1) / n`` of the gathered bytes per
second). The first round of each cap is left out of the medians. With ``--nccl-log DIR`` NCCL logs its INIT
lines there and each creation's ``coll channels`` are read back (``channels``), which shows the cap took; the
log slows the creation, so time without it. Rank 0 prints the medians and writes every round to ``--out``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

#: the prefix of the probe's groups (one per cap: ``probe.channels.none``, ``probe.channels.8`` ...)
GROUP = "probe.channels"


def parse_caps(text: str) -> list[int | None]:
    """``"none,16,8"`` -> ``[None, 16, 8]``; a cap below 1 or a word other than ``none`` raises ValueError."""
    caps: list[int | None] = []
    for item in text.split(","):
        item = item.strip().lower()
        if item in ("none", "default", ""):
            caps.append(None)
            continue
        try:
            cap = int(item)
        except ValueError:
            raise ValueError(f"a cap is a channel count >= 1 or 'none', got {item!r}") from None
        if cap < 1:
            raise ValueError(f"a cap is a channel count >= 1 or 'none', got {cap}")
        caps.append(cap)
    return caps


def channels_in_log(paths: list[str]) -> list[int]:
    """The ``coll channels`` of every communicator NCCL's INFO log files ``paths`` report, in order
    (:func:`sim.calibrate.nccl_init_log.channels_in_lines`)."""
    from sim.calibrate.nccl_init_log import channels_in_lines

    out: list[int] = []
    for p in paths:
        with open(p, errors="replace") as f:
            out.extend(channels_in_lines(f))
    return out


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--caps", default="none,16,8,4", help="channel caps, comma-separated (none: NCCL's choice)")
    p.add_argument("--rounds", type=int, default=4, help="creations per cap (the first left out of the medians)")
    p.add_argument("--mib", default="16,64,256", help="gathered sizes of the collectives, MiB, comma-separated")
    p.add_argument("--iters", type=int, default=5, help="timed collectives per size")
    p.add_argument("--nccl-log", default="", help="a folder for NCCL's INFO log: each creation's channels read back")
    p.add_argument("--out", default="", help="JSON record (rank 0)")
    p.add_argument("--dry-run", action="store_true", help="CPU/Gloo, tiny sizes, no caps (the logic only)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.iters < 1:
        p.error("--rounds and --iters must be >= 1")
    try:
        a.caps = parse_caps(a.caps)
        a.mib = [float(x) for x in a.mib.split(",")]
    except ValueError as e:
        p.error(str(e))
    if any(m <= 0 for m in a.mib):
        p.error("--mib sizes must be > 0")
    return a


class ChannelRig:
    """This rank's probe group under :class:`TorchRuntime`, re-made with a cap on each :meth:`use`."""

    def __init__(self, cuda: bool) -> None:
        import torch
        import torch.distributed as dist

        from refimpl.torch_runtime import TorchRuntime

        self.torch, self.dist, self.cuda = torch, dist, cuda
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.rt = TorchRuntime(self.device)
        self.world = dist.get_world_size()
        self.gloo = dist.new_group(backend="gloo")  # the barriers: no NCCL communicator of their own
        self.name = ""

    def sync(self) -> None:
        """Wait for the device (a no-op on CPU)."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def use(self, cap: int | None) -> None:
        """This cap's group (its spec's ``config.max_ctas``; none on CPU), made and taken down at once, as the
        lifecycle leaves a group in the rollout: :meth:`create` re-makes it from the spec."""
        from refimpl.runtime import GroupSpec

        self.name = f"{GROUP}.{cap if cap is not None else 'none'}"
        options = (("config.max_ctas", cap),) if cap is not None and self.cuda else ()
        self.rt.run(self.rt.new_group(GroupSpec(self.name, tuple(range(self.world)), options=options)))
        self.rt.run(self.rt.destroy_group(self.name))

    def create(self) -> tuple[float, int]:
        """Every rank at a barrier, then the group re-made and created by a one-element all-reduce: (seconds to
        its end on the device, device bytes it took; 0 on CPU)."""
        from refimpl.runtime import ReduceOp

        self.dist.barrier(group=self.gloo)
        free0 = self.torch.cuda.mem_get_info(self.device)[0] if self.cuda else 0
        t = time.perf_counter()
        self.rt.run(self.rt.recreate_group(self.name))
        buf = self.torch.zeros(1, device=self.device)
        self.rt.run(self.rt.all_reduce(buf, ReduceOp.SUM, self.name, timeout_s=120))
        self.sync()
        s = time.perf_counter() - t
        free1 = self.torch.cuda.mem_get_info(self.device)[0] if self.cuda else 0
        return s, max(0, free0 - free1)

    def down(self) -> None:
        """The group destroyed (the pause)."""
        self.dist.barrier(group=self.gloo)
        self.rt.run(self.rt.destroy_group(self.name))

    def collectives(self, mib: float, iters: int) -> dict[str, dict[str, float]]:
        """All-gather and reduce-scatter of ``mib`` MiB gathered (bf16) on the created group: median ms and bus
        bandwidth of ``iters`` after one untimed."""
        torch, dist = self.torch, self.dist
        pg = self.rt.process_group(self.name)
        n = self.world
        numel = max(n, int(mib * (1 << 20)) // 2 // n * n)
        full = torch.ones(numel, dtype=torch.bfloat16, device=self.device)
        part = torch.ones(numel // n, dtype=torch.bfloat16, device=self.device)
        out: dict[str, dict[str, float]] = {}
        for name, call in (("all_gather", lambda: dist.all_gather_into_tensor(full, part, group=pg)),
                           ("reduce_scatter", lambda: dist.reduce_scatter_tensor(part, full, group=pg))):
            call()
            self.sync()
            times = []
            for _ in range(iters):
                self.dist.barrier(group=self.gloo)
                if self.cuda:
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    call()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b) / 1e3)
                else:
                    t = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t)
            s = statistics.median(times)
            out[name] = {"ms": s * 1e3, "busbw_gbps": (n - 1) / n * numel * 2 / s / 1e9 if n > 1 else 0.0}
        return out


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """The probe on this rank; rank 0's record (None elsewhere)."""
    import torch
    import torch.distributed as dist

    cuda = not args.dry_run and torch.cuda.is_available()
    if args.nccl_log and cuda:  # read by NCCL at its first use in this process: before any communicator
        os.makedirs(args.nccl_log, exist_ok=True)
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT",
                          NCCL_DEBUG_FILE=os.path.join(args.nccl_log, "nccl.%h.%p.log"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rig = ChannelRig(cuda)
    caps = args.caps if cuda else [None]
    mibs = args.mib if cuda else [0.01]
    rows = []
    for cap in caps:
        rig.use(cap)
        for r in range(args.rounds):
            s, nbytes = rig.create()
            row: dict[str, Any] = {"cap": cap, "round": r, "creation_s": s, "nccl_bytes": nbytes}
            if r == args.rounds - 1 or args.rounds == 1:
                row["collectives"] = {str(m): rig.collectives(m, args.iters) for m in mibs}
            rows.append(row)
            rig.down()
    channels = []
    if args.nccl_log and cuda:
        dist.barrier(group=rig.gloo)
        channels = channels_in_log(sorted(glob.glob(os.path.join(args.nccl_log, f"nccl.*.{os.getpid()}.log"))))
    summary = summarize(rows, caps, channels, args.rounds)
    rec = None
    if dist.get_rank() == 0:
        rec = {"kind": "channels_probe", "world_size": rig.world,
               "device": torch.cuda.get_device_name(rig.device) if cuda else "cpu", "torch": torch.__version__,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
               "nccl_log": bool(args.nccl_log), "caps": caps, "mib": mibs, "iters": args.iters,
               "rounds": rows, "channels_logged": channels, "summary": summary}
        print(format_summary(summary, rig.world))
    dist.barrier(group=rig.gloo)
    dist.destroy_process_group()
    return rec


def summarize(rows: list[dict[str, Any]], caps: list[int | None], channels: list[int],
              rounds: int) -> list[dict[str, Any]]:
    """Per cap: the median creation and memory over the rounds after the first, the collectives of its last
    round, and the channels its creations logged (``channels``: one entry per creation, in order)."""
    out = []
    for i, cap in enumerate(caps):
        mine = [r for r in rows if r["cap"] == cap]
        steady = mine[1:] or mine
        last = next((r["collectives"] for r in reversed(mine) if "collectives" in r), {})
        logged = sorted(set(channels[i * rounds:(i + 1) * rounds])) if len(channels) >= (i + 1) * rounds else []
        out.append({"cap": cap, "creation_s": statistics.median(r["creation_s"] for r in steady),
                    "creation_all_s": [r["creation_s"] for r in mine],
                    "nccl_bytes": statistics.median(r["nccl_bytes"] for r in steady),
                    "channels": logged, "collectives": last})
    return out


def format_summary(summary: list[dict[str, Any]], world: int) -> str:
    """The medians as a Markdown table, one row per cap and collective size."""
    lines = [f"ranks {world}: creation (median after the first), its device memory, each collective's ms and bus "
             "bandwidth", "",
             "| cap | channels | creation ms | memory MiB | size MiB | all-gather ms (GB/s) | reduce-scatter ms (GB/s) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in summary:
        chans = ",".join(map(str, s["channels"])) or "-"
        for mib, c in (s["collectives"] or {"-": None}).items():
            ag = f"{c['all_gather']['ms']:.3f} ({c['all_gather']['busbw_gbps']:.0f})" if c else "-"
            rs = f"{c['reduce_scatter']['ms']:.3f} ({c['reduce_scatter']['busbw_gbps']:.0f})" if c else "-"
            lines.append(f"| {s['cap'] or 'none'} | {chans} | {s['creation_s'] * 1e3:.1f} | "
                         f"{s['nccl_bytes'] / (1 << 20):.0f} | {mib} | {ag} | {rs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the probe; rank 0 writes ``--out``."""
    args = _parse(argv)
    rec = run(args)
    if rec is not None and args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
