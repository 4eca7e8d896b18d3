"""NCCL communicator suspend/resume and the switch window of each PG policy, on one GPU (one rank).

Run it twice (see bench/gpu/comm_h200.md):

* with the stock NCCL of the torch wheel (2.28.9): the offload_nccl validation
  must refuse it with a clear error (PASS line), and the switch window of the
  policies that need no suspend is measured;
* with NCCL >= 2.29.7 preloaded (``--nccl /path/libnccl.so.2`` re-executes the
  script under ``LD_PRELOAD``): for each of ``--groups`` one-rank NCCL process
  groups, ``ncclCommMemStats``, device memory free before/after
  ``ncclCommSuspend`` (PASS if >= 99% of the suspendable bytes are freed),
  ``ncclCommResume`` (memory comes back) and all-reduces afterwards (PASS if the
  values are right); a collective on a suspended group is refused; then the
  switch window of DESTROY (2 s inline waits), DESTROY_DEFERRED, PAUSED_LIVE,
  SUSPEND and SUSPEND_PLANNED through :class:`refimpl.comm.PGLifecycle` on TorchRuntime.

Writes ``comm_h200-nccl<version>.json`` to ``$OUT`` (or ``bench/results/``) and
exits non-zero if a check failed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse() -> argparse.Namespace:
    """The command line (see the module docstring and ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nccl", help="path of a libnccl.so.2 to LD_PRELOAD (the script re-executes itself)")
    p.add_argument("--groups", type=int, default=14, help="one-rank NCCL groups to create (Relax: 14 per rank)")
    p.add_argument("--steps", type=int, default=3, help="RL steps per policy in the switch-window benchmark")
    p.add_argument("--rollout-s", type=float, default=3.0, help="rollout time per step (longer than the cooldown)")
    p.add_argument("--cooldown-s", type=float, default=2.0, help="port-release cooldown (Relax baseline: 2 s)")
    p.add_argument("--allreduce-mib", type=int, default=64, help="size of the correctness all-reduce after resume")
    p.add_argument("--skip-bench", action="store_true", help="only the binding checks")
    return p.parse_args()


def reexec_with_preload(path: str) -> None:
    """Re-execute this script with ``path`` first in ``LD_PRELOAD``; return (without re-executing) if it already is.
    Exits with a message if ``path`` is not a file."""
    path = str(Path(path).resolve())
    if not Path(path).is_file():
        sys.exit(f"--nccl {path}: no such file")
    if os.environ.get("LD_PRELOAD", "").split(":")[0] == path:
        return
    env = dict(os.environ, LD_PRELOAD=":".join(filter(None, [path, os.environ.get("LD_PRELOAD", "")])))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


class Checks:
    """PASS/FAIL lines and the JSON record."""

    def __init__(self) -> None:
        self.record: dict = {"checks": []}
        self.failed = 0

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Print a PASS/FAIL line for ``name``, record it, count a failure; return ``ok``."""
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.record["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
        self.failed += not ok
        return ok


def library_facts(c: Checks) -> "object":
    """Record torch's version and the built and loaded NCCL (version, path, whether it has suspend/resume and mem
    stats) in ``c.record``, print them, and return the :class:`NcclFacts` the validation reads."""
    import torch

    from refimpl.torch_runtime import nccl
    from refimpl.torch_runtime.nccl_validation import NcclFacts

    facts = NcclFacts.probe()
    lib = nccl.NcclLibrary.load()
    c.record["torch"] = torch.__version__
    c.record["nccl_built"] = list(torch.cuda.nccl.version())
    c.record["nccl_loaded"] = {"version": list(lib.version), "path": lib.path,
                               "suspend_resume": lib.has_suspend_resume, "mem_stats": lib.has_mem_stats}
    c.record["ld_preload"] = os.environ.get("LD_PRELOAD", "")
    print(f"torch {torch.__version__}; NCCL built {torch.cuda.nccl.version()}; loaded {lib.version_string} "
          f"from {lib.path}; suspend/resume {lib.has_suspend_resume}; mem stats {lib.has_mem_stats}", flush=True)
    return facts


def check_validation(c: Checks, facts) -> bool:
    """True if suspend is usable here; with stock NCCL, check that validation refuses it."""
    from refimpl.torch_runtime.nccl_validation import NcclOffloadUnavailableError, require_offload_nccl

    try:
        require_offload_nccl(facts=facts)
    except NcclOffloadUnavailableError as e:
        stock = facts.version is not None and facts.version < (2, 29, 7)
        c.check("validation refuses an NCCL without suspend/resume", stock and "2.29.7" in str(e),
                str(e).replace("\n", " | "))
        return False
    c.check("validation accepts the loaded NCCL", True, f"NCCL {facts.version} at {facts.path}")
    return True


def binding_checks(c: Checks, n_groups: int, allreduce_mib: int) -> None:
    """Suspend/resume each group's communicator through refimpl.torch_runtime.nccl; memory seen by mem_get_info."""
    import torch
    import torch.distributed as dist

    from refimpl.torch_runtime import nccl

    dev = torch.device("cuda", 0)
    pgs = [dist.new_group([0], backend="nccl") for _ in range(n_groups)]
    lazy = [nccl.pg_comm_handles(pg, create_lazy=False) for pg in pgs]
    c.check("lazy communicators are skipped before their first collective", all(h == [] for h in lazy),
            f"handles before first use: {lazy[:3]}...")
    handles = [nccl.pg_comm_handles(pg, create_lazy=True) for pg in pgs]
    flat = [h for hs in handles for h in hs]
    c.check("create_lazy makes one communicator per group", len(set(flat)) == n_groups and all(flat),
            f"{len(set(flat))} distinct handles for {n_groups} groups")
    c.check("handles are deduplicated", nccl.unique_comm_handles([pgs[0], pgs[0], pgs[1]]) == flat[:2],
            "unique_comm_handles([g0, g0, g1]) == [h0, h1]")
    reports = [nccl.comm_mem_report(h) for h in flat]
    c.record["mem_stats"] = [r.__dict__ for r in reports]
    c.check("ncclCommMemStats is consistent (total = persistent + suspendable)", all(r.consistent for r in reports),
            f"group 0: {reports[0]}")
    c.check("communicators hold suspendable memory", all(r.suspendable > 0 for r in reports),
            f"suspendable MiB per group: {sorted({r.suspendable >> 20 for r in reports})}")
    per_group = []
    for h, r in zip(flat, reports):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free0 = torch.cuda.mem_get_info(dev)[0]
        t0 = time.perf_counter()
        nccl.suspend_comms([h])
        t_s = time.perf_counter() - t0
        free1 = torch.cuda.mem_get_info(dev)[0]
        suspended = nccl.comm_mem_report(h).suspended
        per_group.append(dict(suspendable=r.suspendable, freed=free1 - free0, suspend_s=t_s, suspended_flag=suspended))
    worst = min(g["freed"] / g["suspendable"] for g in per_group)
    c.check("suspend frees >= 99% of each group's ncclStatGpuMemSuspend", worst >= 0.99,
            f"worst group freed {worst:.4f} of its suspendable bytes; "
            f"median suspend {sorted(g['suspend_s'] for g in per_group)[len(per_group) // 2]:.3f} s")
    c.check("ncclStatGpuMemSuspended reads 1 while suspended", all(g["suspended_flag"] for g in per_group), "")
    for h, g in zip(flat, per_group):
        free0 = torch.cuda.mem_get_info(dev)[0]
        t0 = time.perf_counter()
        nccl.resume_comms([h])
        g["resume_s"] = time.perf_counter() - t0
        g["retaken"] = free0 - torch.cuda.mem_get_info(dev)[0]
    worst_back = min(g["retaken"] / g["suspendable"] for g in per_group)
    c.check("resume takes the memory back", worst_back >= 0.99,
            f"worst group re-took {worst_back:.4f}; median resume "
            f"{sorted(g['resume_s'] for g in per_group)[len(per_group) // 2]:.3f} s")
    c.record["per_group"] = per_group
    n = (allreduce_mib << 20) // 4
    ok = True
    for i, pg in enumerate(pgs):
        x = torch.randn(n, device=dev)
        want = x.clone()
        dist.all_reduce(x, group=pg)
        small = torch.full((8,), float(i), device=dev)
        dist.all_reduce(small, op=dist.ReduceOp.MAX, group=pg)
        torch.cuda.synchronize()
        ok &= torch.equal(x, want) and small.tolist() == [float(i)] * 8
    c.check("collectives after resume are right", ok, f"{n_groups} groups, {allreduce_mib} MiB all-reduce each")
    for pg in pgs:
        dist.destroy_process_group(pg)


def refused_check(c: Checks) -> None:
    """Through TorchRuntime: a collective on a suspended group raises GroupSuspendedError, not a GPU fault."""
    import torch

    from refimpl.runtime import GroupSpec, GroupSuspendedError, ReduceOp
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime()

    async def go():
        await rt.new_group(GroupSpec("refuse", (0,), backend="nccl"))
        t = torch.ones(4, device=rt.device)
        await rt.all_reduce(t, ReduceOp.SUM, "refuse")
        await rt.suspend_group("refuse")
        try:
            await rt.all_reduce(t, ReduceOp.SUM, "refuse")
            refused = None
        except GroupSuspendedError as e:
            refused = str(e)
        await rt.resume_group("refuse")
        await rt.all_reduce(t, ReduceOp.SUM, "refuse")
        await rt.destroy_group("refuse")
        return refused, t.tolist()

    refused, values = rt.run(go())
    c.check("a collective on a suspended group is refused", bool(refused) and values == [1.0] * 4, str(refused))


def switch_window(c: Checks, args, can_suspend: bool) -> None:
    """The Relax-style switch window of each policy on this one rank, with 14 one-rank groups."""
    import torch

    from bench.switch_window import format_results, mesh_groups, run_steps, summarize
    from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    policies = [p for p in PGPolicy if can_suspend or not p.suspends]
    results = []
    for policy in policies:
        rt = TorchRuntime()
        specs = [GroupSpec(f"{policy.value}.{s.name}", s.ranks, backend="nccl") for s in mesh_groups(1, 1)]
        lc = PGLifecycle(rt, specs, config=LifecycleConfig(policy=policy, cooldown_s=args.cooldown_s,
                                                           control_group=f"{policy.value}.control"))
        sync_group = specs[0].name
        steps = rt.run(run_steps(rt, lc, steps=args.steps, train_s=0.0, rollout_s=args.rollout_s,
                                 sync_group=sync_group))
        results.append(summarize(policy, [steps], warmup=1))
        torch.cuda.synchronize()
        rt.run(lc.pause(policy=PGPolicy.DESTROY_DEFERRED))  # leave no communicators behind for the next policy
        torch.cuda.empty_cache()
    header = (f"switch window per RL step (measured, one H200, one rank): {len(mesh_groups(1, 1))} NCCL groups, "
              f"cooldown {args.cooldown_s:g} s, rollout {args.rollout_s:g} s; mean of steps 2-{args.steps}")
    text = format_results(results, header)
    print(text, flush=True)
    c.record["switch_window"] = {"header": header, "results": [r.__dict__ for r in results]}
    base = next(r for r in results if r.policy == "DESTROY")
    c.check("the deferred cooldown beats the inline waits", next(r for r in results if r.policy == "DESTROY_DEFERRED").total
            < base.total, f"DESTROY {base.total:.3f} s")


def main() -> int:
    """Run the checks and the switch-window benchmark on GPU 0 in a one-rank NCCL world; write the JSON record even
    when a step raises. Returns 2 without a CUDA GPU, 1 if a check failed, else 0."""
    args = parse()
    if args.nccl:
        reexec_with_preload(args.nccl)
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("this script needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.cuda.set_device(0)
    c = Checks()
    c.record["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    c.record["device"] = torch.cuda.get_device_name(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    facts = library_facts(c)
    try:
        can_suspend = check_validation(c, facts)
        if can_suspend:
            binding_checks(c, args.groups, args.allreduce_mib)
            refused_check(c)
        if not args.skip_bench:
            switch_window(c, args, can_suspend)
    finally:
        out = Path(os.environ.get("OUT") or REPO / "bench" / "results")
        out.mkdir(parents=True, exist_ok=True)
        version = ".".join(map(str, c.record["nccl_loaded"]["version"]))
        path = out / f"comm_h200-nccl{version}.json"
        path.write_text(json.dumps(c.record, indent=1, default=str))
        print(f"wrote {path}; {c.failed} check(s) failed", flush=True)
        dist.destroy_process_group()
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
