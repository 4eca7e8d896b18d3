"""The switch window measured on GPUs over one Megatron mesh, written as a record ``timeshare sim validate`` scores.

    torchrun --nproc-per-node=2 bench/switch_window_gpu.py --tp 2 --out $OUT/switch-window-tp2.json
    torchrun --nproc-per-node=2 bench/switch_window_gpu.py --dp 2 --ep 2 --out $OUT/switch-window-ep2.json
    torchrun --nproc-per-node=2 bench/switch_window_gpu.py --dry-run      # CPU, Gloo: the script runs

Every policy and variant of ``timeshare bench switch-window`` (or ``--policies``) runs the same driver as the
simulator, :func:`sim.calibrate.switch_window.run_steps`, on a fresh :class:`~refimpl.torch_runtime.TorchRuntime`
over the mesh's Megatron group families (:func:`sim.calibrate.switch_window.megatron_groups`): train, pause, weight
sync, rollout, resume, and the training step's first collectives after each wake. Rows that suspend are skipped,
with why, where NCCL cannot suspend. Rank 0 writes a ``"kind": "multigpu"`` record whose ``switch_window.settings``
carry the mesh and the runtime's proxy-waker condition (``wake_proxies``: whether the destroys woke NCCL's proxy
thread, as the runtime ran them), so that ``timeshare bench switch-window`` with the same options predicts it and
``timeshare sim validate`` scores it ([Note: the runtime's proxy waker in a record] in :mod:`sim.calibrate.records`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

log = logging.getLogger(__name__)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The script's options (the mesh and the settings of ``timeshare bench switch-window``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for dim in ("dp", "tp", "cp", "pp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=None if dim == "dp" else 1,
                       help="data-parallel size (default: the world size over tp x cp x pp)" if dim == "dp" else
                       f"{dim} size (default 1)")
    p.add_argument("--etp", type=int, default=None, help="expert tensor-parallel size (default as megatron_groups)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--train-s", type=float, default=0.0)
    p.add_argument("--rollout-s", type=float, default=2.0)
    p.add_argument("--cooldown-s", type=float, default=1.0)
    p.add_argument("--policies", nargs="+", default=None, metavar="ROW", help="rows to run (default: every row)")
    p.add_argument("--out", default="", help="the record (rank 0); default: print only")
    p.add_argument("--dry-run", action="store_true", help="CPU, Gloo, a short rollout: the script runs")
    return p.parse_args(argv)


def _gathered(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _why_no_suspend(cuda: bool) -> str | None:
    """None if NCCL can suspend here, else the first reason it cannot."""
    if not cuda:
        return "Gloo run (no NCCL communicators)"
    from refimpl.torch_runtime.nccl_validation import NcclFacts, offload_nccl_problems

    problems = offload_nccl_problems(NcclFacts.probe(), os.environ)
    return str(problems[0]) if problems else None


def _mesh(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """The mesh sizes, ``dp`` defaulting to what the world leaves; ValueError if they do not make the world."""
    rest = args.tp * args.cp * args.pp
    dp = args.dp if args.dp is not None else max(1, world // rest)
    if dp * rest != world:
        raise ValueError(f"tp {args.tp} x cp {args.cp} x dp {dp} x pp {args.pp} = {dp * rest} ranks, but the job has "
                         f"{world}; choose sizes whose product is the world size")
    return {"dp": dp, "tp": args.tp, "cp": args.cp, "pp": args.pp, "ep": args.ep, "etp": args.etp}


def _row(row: str, mesh: dict[str, Any], args: argparse.Namespace, cuda: bool) -> tuple[Any, list, bool]:
    """One row on a fresh TorchRuntime: (its PolicyResult over every rank, rank 0's spans, whether the runtime woke
    NCCL's proxy in its destroys)."""
    import torch

    from refimpl.comm import PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime
    from sim.calibrate.switch_window import megatron_groups, plan_rules, row_config, run_steps, summarize

    rt = TorchRuntime()
    prefix = row.lower()
    specs = [GroupSpec(f"{prefix}.{s.name}", s.ranks, backend="nccl" if cuda else None)
             for s in megatron_groups(**mesh)]
    tp = next(s.name for s in specs if s.name.split(".")[1].rstrip("0123456789") == "tp" and rt.rank in s.ranks)
    lc = PGLifecycle(rt, specs, config=row_config(row, cooldown_s=args.cooldown_s, control_group=f"{prefix}.control"),
                     plan=plan_rules(row, tp))
    rollout = 0.1 if args.dry_run else args.rollout_s
    steps = rt.run(run_steps(rt, lc, steps=args.steps, train_s=args.train_s, rollout_s=rollout, sync_group=tp))
    result = summarize(row, _gathered(steps), warmup=args.warmup)
    base = min((a for _, a, _ in rt.spans), default=0.0)
    spans = _gathered([[name, round(a - base, 6), round(b - a, 6)] for name, a, b in rt.spans])
    rt.run(lc.pause(policy=PGPolicy.DESTROY_DEFERRED))  # no communicators left for the next row
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return result, spans, bool(rt.wake_proxies)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every row on this rank (``torch.distributed`` initialised); the record (the same on every rank)."""
    import torch
    import torch.distributed as dist

    from sim.calibrate.switch_window import megatron_groups, resolve, row_names

    world = dist.get_world_size()
    cuda = dist.get_backend() == "nccl"
    mesh = _mesh(args, world)
    no_suspend = _why_no_suspend(cuda)
    results, spans, skipped, woke = [], {}, {}, set()
    for name in args.policies or row_names():
        row, policy = resolve(name)
        if policy.suspends and no_suspend:
            skipped[row] = no_suspend
            continue
        t0 = time.monotonic()
        res, spans[row], wake = _row(row, mesh, args, cuda)
        results.append(asdict(res))
        woke.add(wake)
        log.info("%s: %.1f s", row, time.monotonic() - t0)
    groups = sum(1 for s in megatron_groups(**mesh) if 0 in s.ranks)
    settings = {**mesh, "steps": args.steps, "warmup": args.warmup, "train_s": args.train_s,
                "rollout_s": 0.1 if args.dry_run else args.rollout_s, "cooldown_s": args.cooldown_s,
                "groups_per_rank": groups, "wake_proxies": woke == {True},
                "nccl_cumem_enable": os.environ.get("NCCL_CUMEM_ENABLE", "unset")}
    device = torch.cuda.get_device_name() if cuda else "cpu"
    return {"kind": "multigpu", "schema": 1, "dry_run": bool(args.dry_run),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": f"{device} x {world}", "world_size": world, "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "command": "torchrun --nproc-per-node=%d bench/switch_window_gpu.py %s" % (world, " ".join(sys.argv[1:])),
            "switch_window": {"settings": settings, "results": results, "spans": spans,
                              **({"skipped": skipped} if skipped else {})}}


def main(argv: Sequence[str] | None = None) -> int:
    """Under torchrun: initialise the process group, measure every row, rank 0 writes ``--out``. Returns 0."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and not args.dry_run
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        record = measure(args)
        if dist.get_rank() == 0:
            for r in record["switch_window"]["results"]:
                log.info("%-26s switch cost %s s, window %.3f s, first use after the wake %s s", r["policy"],
                         r["switch_cost"] if r["switch_cost"] is None else f"{r['switch_cost']:.3f}", r["total"],
                         r["first_use_after_wake"] if r["first_use_after_wake"] is None
                         else f"{r['first_use_after_wake']:.3f}")
            if args.out:
                Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
                log.info("wrote %s", args.out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
