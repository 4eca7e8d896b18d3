"""A lifecycle resume on a background thread beside a main thread running Python, at the interpreter's switch
interval and at the switch's lowered one ([Note: the GIL's switch interval] in refimpl/runtime/switch_interval.py).

``torchrun --nproc-per-node=N bench/resume_gil_probe.py [--groups 2] [--rounds 6] [--busy-ms 300] [--out F.json]``

Each round pauses the lifecycle (DESTROY_DEFERRED: the groups destroyed), then runs its resume as the RL step does
(``OverlappedSwitch.resume(join=False, background=True)``: the rebuild of every group and, on NCCL, the warm-up that
creates its communicators) while the main thread either waits for it at once (``alone``) or first runs pure Python
for ``--busy-ms`` (a training step's launching thread: FSDP2's hooks, the autograd engine's callbacks), then joins.
The figure is the resume thread's own duration (its start to its end), the median of the rounds after the first,
rank 0's; against ``alone`` at the same interval. On a CPU use one rank per spare core: ranks that outnumber the
cores time the cores' sharing, not the GIL.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def busy_python(ms: float) -> int:
    """Run Python (small calls in a loop, as hooks are) for ``ms`` milliseconds without releasing the GIL."""
    end = time.perf_counter() + ms / 1e3
    n = 0

    def hook(x: int) -> int:
        return x + 1

    while time.perf_counter() < end:
        for _ in range(200):
            n = hook(n)
    return n


def measure(sw, release_memory, interval_s: float | None, busy_ms: float, rounds: int) -> list[float]:
    """The background resume's durations (seconds) over ``rounds`` rounds at switch interval ``interval_s``."""
    sw.switch_interval_s = interval_s
    out = []
    for _ in range(rounds):
        sw.pause(release_memory)
        sw.resume(join=False, background=True)
        bg = sw.running("lifecycle.resume")
        if busy_ms:
            busy_python(busy_ms)
        sw.join()
        out.append(bg.ended_at - bg.started_at)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every arm, print rank 0's table, write ``--out``; 0 on success, 2 on bad arguments."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=2, help="groups over every rank the lifecycle rebuilds (default 2)")
    p.add_argument("--rounds", type=int, default=6, help="resumes per arm; the first is left out (default 6)")
    p.add_argument("--busy-ms", type=float, default=300.0, help="the main thread's Python per round (default 300)")
    p.add_argument("--intervals-us", default="5000,200",
                   help="switch intervals to compare, microseconds, comma-separated (default 5000,200: the "
                        "interpreter's default and the switch's)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cuda: NCCL groups (one GPU per rank); cpu: Gloo; auto: cuda when present")
    p.add_argument("--out", type=Path, default=None, help="JSON record (rank 0)")
    args = p.parse_args(argv)
    try:
        intervals = [int(x) * 1e-6 for x in args.intervals_us.split(",") if x.strip()]
        if not intervals or any(not 0 < i <= 1 for i in intervals):
            raise ValueError
    except ValueError:
        p.error(f"--intervals-us must be microseconds in (0, 1000000], comma-separated; got {args.intervals_us!r}")
    if args.groups < 1 or args.rounds < 2 or args.busy_ms <= 0:
        p.error("--groups must be >= 1, --rounds >= 2 (the first is left out), --busy-ms > 0")

    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.comm.overlap import OverlappedSwitch
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)  # alone: a world of one
    dist.init_process_group("nccl" if cuda else "gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    rt = TorchRuntime(torch.device("cuda" if cuda else "cpu"))
    specs = [GroupSpec(f"gil.g{i}", tuple(range(n))) for i in range(args.groups)]
    lc = PGLifecycle(rt, specs, config=LifecycleConfig(policy=PGPolicy.DESTROY_DEFERRED, cooldown_s=0.0,
                                                       agree_timeout_s=120, control_group="gil.control"))
    lc.sync.start()
    sw = OverlappedSwitch(lc)
    rows = []
    for interval in intervals:
        for busy in (0.0, args.busy_ms):
            t = measure(sw, lambda: None, interval, busy, args.rounds)[1:]
            rows.append({"interval_s": interval, "busy_ms": busy, "median_s": statistics.median(t), "rounds_s": t})
            if rank == 0:
                print(f"  interval {interval * 1e6:>6.0f} us, main {'busy %.0f ms' % busy if busy else 'idle':>12}: "
                      f"resume {statistics.median(t) * 1e3:7.1f} ms", flush=True)
    if rank == 0:
        alone = {r["interval_s"]: r["median_s"] for r in rows if not r["busy_ms"]}
        print(f"\nthe resume beside Python against alone ({n} rank(s), {args.groups} group(s), "
              f"{'NCCL' if cuda else 'Gloo'}):")
        for r in rows:
            if r["busy_ms"]:
                print(f"  interval {r['interval_s'] * 1e6:>6.0f} us: {r['median_s'] * 1e3:.1f} ms = "
                      f"{r['median_s'] / alone[r['interval_s']]:.1f} x alone ({alone[r['interval_s']] * 1e3:.1f} ms)")
        if args.out:
            rec = {"kind": "resume_gil_probe", "schema": 1, "world_size": n, "groups": args.groups,
                   "backend": "nccl" if cuda else "gloo",
                   "device": torch.cuda.get_device_name() if cuda else "cpu",
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "command": "torchrun --nproc-per-node=%d bench/resume_gil_probe.py %s" % (n, " ".join(
                       argv if argv is not None else sys.argv[1:])),
                   "rows": rows}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rec, indent=1) + "\n")
            print(f"wrote {args.out}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
