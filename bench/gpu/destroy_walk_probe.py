"""Each destroy of the lifecycle's destroy walk, timed against its group's first collective.

    torchrun --nproc-per-node=2 bench/gpu/destroy_walk_probe.py [--policy destroy_deferred] [--steps 6] [--sync tp|none]
        [--parallel]
    torchrun --nproc-per-node=2 bench/gpu/destroy_walk_probe.py --dry-run     # CPU, Gloo: the script runs

The simulator charges a destroy of an initialised NCCL communicator the wait for its UDS proxy thread's next
500 ms poll timeout, counted from the end of its initialisation ([Note: the proxy's 500 ms poll] in
sim/presets/__init__.py); a measured walk may run a whole poll period longer than that model says
(docs/calibration.md has the records). This probe runs the switch-window driver of ``bench/switch_window.py`` with the
same settings as ``bench/gpu/multigpu.py`` (``mesh_groups(N, 1)``, cooldown 2 s, rollout 3 s, train 0 s) and
records, per rank and step, when each group's first collective of the training step returned (its lazy NCCL
init) and when each destroy started and ended, on the host clock: which destroy waits a whole extra period, and
how much slack the others had. Rank 0 writes ``destroy-walk-<date>-<policy>-sync-<tp|none>-<device>x<N>.json`` to
``$OUT`` (default bench/results) and prints its three longest destroys; ``python -m sim.calibrate.destroy_walks FILE`` names,
per walk, the destroy from which the walk ran one poll period later than its first destroy.

``--sync none`` runs the weight sync without its collective on the tp group: ``--policy suspend_planned`` with
``--sync tp`` and with ``--sync none`` says whether that collective changes the sync's destroy walk
(docs/calibration.md).
"""
from __future__ import annotations

import argparse
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

from refimpl.torch_runtime import TorchRuntime  # noqa: E402


class TimedRuntime(TorchRuntime):
    """TorchRuntime that notes when each collective returned and each destroy started and ended (host clock)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.events: list[tuple[str, str, float]] = []

    async def all_reduce(self, tensor, op=None, group="world", *, timeout_s=None):
        """``TorchRuntime.all_reduce``, then note ``("collective", group, host time)`` when it returned."""
        kw = {} if op is None else {"op": op}
        await super().all_reduce(tensor, group=group, timeout_s=timeout_s, **kw)
        self.events.append(("collective", group, time.perf_counter()))

    async def destroy_group(self, name, *, abort=False):
        """``TorchRuntime.destroy_group``, noting ``("destroy_start", name, t)`` before and ``("destroy_end", name,
        t)`` after (host ``perf_counter`` seconds)."""
        self.events.append(("destroy_start", name, time.perf_counter()))
        await super().destroy_group(name, abort=abort)
        self.events.append(("destroy_end", name, time.perf_counter()))

    async def destroy_groups(self, names, *, abort=False):
        """``TorchRuntime.destroy_groups`` (``--parallel``): every group's ``destroy_start`` at the call and its
        ``destroy_end`` when the call returned (they end together)."""
        t0 = time.perf_counter()
        self.events.extend(("destroy_start", n, t0) for n in names)
        errors = await super().destroy_groups(names, abort=abort)
        t1 = time.perf_counter()
        self.events.extend(("destroy_end", n, t1) for n in names)
        return errors

    async def suspend_group(self, name):
        """``TorchRuntime.suspend_group`` between ``suspend_start`` / ``suspend_end`` events."""
        self.events.append(("suspend_start", name, time.perf_counter()))
        await super().suspend_group(name)
        self.events.append(("suspend_end", name, time.perf_counter()))

    async def resume_group(self, name):
        """``TorchRuntime.resume_group`` between ``resume_start`` / ``resume_end`` events."""
        self.events.append(("resume_start", name, time.perf_counter()))
        await super().resume_group(name)
        self.events.append(("resume_end", name, time.perf_counter()))

    def comm_memory(self, name):
        """``TorchRuntime.comm_memory`` (the ``ncclCommMemStats`` reads), noting ``("memstats", name, t)`` after."""
        out = super().comm_memory(name)
        self.events.append(("memstats", name, time.perf_counter()))
        return out

    async def synchronize(self):
        """``TorchRuntime.synchronize``, noting ``("synchronize", "", t)`` when the device drained."""
        await super().synchronize()
        self.events.append(("synchronize", "", time.perf_counter()))


def main() -> int:
    """Run ``--steps`` switch-window steps of ``--policy`` on every rank with a :class:`TimedRuntime`; rank 0 writes
    every rank's events and steps and prints each rank's three longest destroys. Returns 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default="destroy_deferred", help="a PGPolicy value (default destroy_deferred)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rollout-s", type=float, default=3.0)
    p.add_argument("--cooldown-s", type=float, default=2.0)
    p.add_argument("--sync", choices=("tp", "none"), default="tp",
                   help="the weight sync's collective: on the rank's tp group, as the benchmark (default), or none "
                        "(SUSPEND_PLANNED's sync walk then follows the pause's agreements alone: whether the extra poll "
                        "period of that walk comes from the sync's collective)")
    p.add_argument("--parallel", action="store_true",
                   help="LifecycleConfig.parallel_destroy: each walk destroys its groups together")
    p.add_argument("--dry-run", action="store_true", help="CPU/Gloo, short rollout")
    args = p.parse_args()
    from bench.switch_window import mesh_groups, run_steps
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec

    cuda = torch.cuda.is_available() and not args.dry_run
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    policy = PGPolicy.parse(args.policy)
    rt = TimedRuntime()
    specs = [GroupSpec(f"p.{s.name}", s.ranks, backend="nccl" if cuda else None) for s in mesh_groups(n, 1)]
    lc = PGLifecycle(rt, specs, config=LifecycleConfig(policy=policy, cooldown_s=args.cooldown_s,
                                                       control_group="p.control", parallel_destroy=args.parallel))
    tp = next(s.name for s in specs if s.name.split(".")[1].rstrip("0123456789") == "tp" and rank in s.ranks)
    rollout = 0.2 if args.dry_run else args.rollout_s
    steps = rt.run(run_steps(rt, lc, steps=args.steps, train_s=0.0, rollout_s=rollout,
                             sync_group=tp if args.sync == "tp" else None))
    everyone = [None] * n
    # perf_counter against the wall clock, so NCCL's own log lines (NCCL_DEBUG_TIMESTAMP_FORMAT="[%s.%6f] ")
    # can be placed on the events' time line
    clock = {"perf_counter": time.perf_counter(), "time": time.time()}
    dist.all_gather_object(everyone, {"events": rt.events, "steps": [s.__dict__ for s in steps], "clock": clock})
    if rank == 0:
        rec = {"kind": "destroy_walk_probe", "schema": 1, "world_size": n, "policy": policy.name, "sync": args.sync,
               "parallel_destroy": args.parallel,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name() if cuda else "cpu", "dry_run": args.dry_run,
               "command": "torchrun --nproc-per-node=%d bench/gpu/destroy_walk_probe.py %s" % (n, " ".join(sys.argv[1:])),
               "ranks": everyone}
        out = Path(os.environ.get("OUT", REPO / "bench" / "results"))
        out.mkdir(parents=True, exist_ok=True)
        path = out / (f"destroy-walk-{rec['date'][:10]}-{policy.value}{'-parallel' if args.parallel else ''}-sync-{args.sync}-"
                      f"{rec['device'].replace(' ', '-').lower()}x{n}.json")
        path.write_text(json.dumps(rec, indent=1) + "\n")
        for r, data in enumerate(everyone):
            ev, walk = data["events"], []
            for kind, name, t in ev:
                if kind == "destroy_start":
                    walk.append([name, t, None])
                elif kind == "destroy_end" and walk and walk[-1][0] == name:
                    walk[-1][2] = t
            durations = sorted(((e - s, name) for name, s, e in walk if e is not None), reverse=True)[:3]
            print(f"rank {r}: {len(walk)} destroys; longest: " +
                  ", ".join(f"{name} {d * 1e3:.1f} ms" for d, name in durations))
        print(f"wrote {path}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
