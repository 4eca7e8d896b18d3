"""Every multi-GPU measurement in one call, written as one JSON record.

    torchrun --nproc-per-node=N bench/gpu/multigpu.py [--parts switch comm dedup] [--gib 8]
    torchrun --nproc-per-node=2 bench/gpu/multigpu.py --dry-run     # CPU, Gloo, tiny sizes: the script runs

On N GPUs of one host (one process per GPU, NCCL; preload NCCL >= 2.29.7 for SUSPEND, see docs/gpu.md):

* ``switch_window``: the lifecycle of every :class:`PGPolicy` and benchmark variant
  (``SUSPEND_PLANNED_LAZY``, :data:`sim.calibrate.switch_window.VARIANTS`) over the 14 Relax group families of a
  (dp=N, tp=1) mesh (:func:`mesh_groups`), driven by the same :func:`run_steps` as the simulator's
  ``timeshare bench switch-window``; one :class:`PolicyResult` per row (field names as there: the
  phases, NCCL memory in the rollout, the first collectives after the wake and whether they were
  bitwise right), so ``timeshare bench switch-window --dp N --tp 1 --steps S --warmup W --train-s 0
  --rollout-s R`` predicts the same record. ``goals`` says how SUSPEND_PLANNED compares with its
  goal (window <= 0.5 x DESTROY_DEFERRED, NCCL memory in the rollout <= 2% of PAUSED_LIVE's).
* ``comm_raw``: 14 NCCL communicators over all ranks, created and used once, suspended one after the
  other (bytes freed per ``cudaMemGetInfo``), resumed (collective checked), destroyed; totals and
  per communicator.
* ``dedup``: for every replica-group size g the GPUs allow (g >= 2 dividing N), the same ``--gib`` of
  replicated bf16 state per rank reloaded by the ``local`` store and by ``local_dedup`` (groups of g
  consecutive ranks), every rank at once after a barrier and a ``--gap-s`` pause (the other role's
  turn, which lets the driver scrub freed memory, see docs/store.md), each reload closed by a device
  synchronize; the dedup reload's ``dedup.h2d`` and ``dedup.all_gather`` spans (device-closed); the
  reload checked bitwise. ``dedup_reload_one_gather_s`` is the reload with one all-gather per layout
  (``segment_bytes`` larger than the slice), the path before pipelining.

Rank 0 writes ``multigpu-<date>-<device>x<N>.json`` to ``$OUT`` (default bench/results) and prints
tables; the exit code is 1 if a check failed (a reload not bitwise, a suspend freeing < 99%).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DTYPE = torch.bfloat16


def parse() -> argparse.Namespace:
    """The command line (see ``--help``); an unknown name in ``--policies`` is a usage error naming the choices."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=["switch", "comm", "dedup"], choices=["switch", "comm", "dedup"])
    p.add_argument("--steps", type=int, default=4, help="RL steps per policy")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the means")
    p.add_argument("--train-s", type=float, default=0.0)
    p.add_argument("--rollout-s", type=float, default=3.0)
    p.add_argument("--cooldown-s", type=float, default=2.0)
    p.add_argument("--policies", nargs="+", default=None, metavar="POLICY",
                   help="PGPolicy names, or benchmark variants (SUSPEND_PLANNED_LAZY), for the switch window "
                        "(default: every policy and variant, sim.calibrate.switch_window.row_names())")
    p.add_argument("--comms", type=int, default=14, help="communicators in comm_raw")
    p.add_argument("--gib", type=float, default=8.0, help="replicated bf16 state per rank for dedup, GiB")
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gap-s", type=float, default=0.25, help="pause between offload and reload")
    p.add_argument("--dry-run", action="store_true", help="CPU/Gloo, tiny sizes, short rollout")
    args = p.parse_args()
    if args.policies is not None:
        from sim.calibrate.switch_window import resolve, row_names

        bad = []
        for n in args.policies:
            try:
                resolve(n)
            except ValueError:
                bad.append(n)
        if bad:
            p.error(f"unknown --policies {bad}; choose from {row_names()}")
    return args


def log(msg: str) -> None:
    """Print ``msg`` on rank 0 only."""
    if dist.get_rank() == 0:
        print(msg, flush=True)


def gathered(obj):
    """Every rank's ``obj``, in rank order."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def nccl_loaded() -> str | None:
    """The version string of the NCCL library this process loaded, or ``"unknown: <why>"``."""
    try:
        from refimpl.torch_runtime import nccl

        return nccl.NcclLibrary.load().version_string
    except Exception as e:  # noqa: BLE001 - recorded as unknown, with why
        return f"unknown: {e}"


def can_suspend() -> str | None:
    """None if NCCL suspend works here, else why not."""
    if dist.get_backend() != "nccl":
        return "Gloo run (no NCCL communicators)"
    from refimpl.torch_runtime.nccl_validation import NcclOffloadUnavailableError, require_offload_nccl

    try:
        require_offload_nccl()
    except NcclOffloadUnavailableError as e:
        return str(e).splitlines()[0]
    return None


# --------------------------------------------------------------------------- switch window


def switch_window(args, checks: list) -> dict:
    """The ``switch_window`` part: every row of ``--policies`` (default every policy and variant) through
    :func:`run_steps` on a fresh TorchRuntime; rows that suspend are skipped (with why) when NCCL cannot suspend here.
    Appends its checks to ``checks``; returns the settings, one result per row, issue 12's goals and every rank's
    lifecycle spans."""
    from bench.switch_window import (format_results, mesh_groups, plan_rules, resolve, row_config, row_names, run_steps,
                                     summarize)
    from refimpl.comm import PGLifecycle, PGPolicy
    from refimpl.runtime import GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    n = dist.get_world_size()
    backend = "nccl" if dist.get_backend() == "nccl" else None
    no_suspend = can_suspend()
    results, skipped, spans = [], {}, {}
    for row in (args.policies or row_names()):
        row, policy = resolve(row)
        if policy.suspends and no_suspend:
            skipped[row] = no_suspend
            continue
        t0 = time.monotonic()
        rt = TorchRuntime()
        prefix = row.lower()
        specs = [GroupSpec(f"{prefix}.{s.name}", s.ranks, backend=backend) for s in mesh_groups(n, 1)]
        tp = next(s.name for s in specs if s.name.split(".")[1].rstrip("0123456789") == "tp" and rt.rank in s.ranks)
        lc = PGLifecycle(rt, specs, config=row_config(row, cooldown_s=args.cooldown_s, control_group=f"{prefix}.control"),
                         plan=plan_rules(row, tp))
        steps = rt.run(run_steps(rt, lc, steps=args.steps, train_s=args.train_s, rollout_s=args.rollout_s,
                                 sync_group=tp))
        results.append(summarize(row, gathered(steps), warmup=args.warmup))
        # every lifecycle span (pause, plan walks, destroy/rebuild walks, canary, weight sync) of every step, per
        # rank: where each phase's time goes ([name, start s from the first, duration s])
        base = min((a for _, a, _ in rt.spans), default=0.0)
        spans[row] = gathered([[name, round(a - base, 6), round(b - a, 6)] for name, a, b in rt.spans])
        rt.run(lc.pause(policy=PGPolicy.DESTROY_DEFERRED))  # no communicators left for the next policy
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        log(f"  {row}: {time.monotonic() - t0:.1f} s")
    per_rank = sum(1 for s in mesh_groups(n, 1) if 0 in s.ranks)
    header = (f"switch window per RL step (measured, {n} ranks): {per_rank} groups per rank, "
              f"cooldown {args.cooldown_s:g} s, rollout {args.rollout_s:g} s; mean of steps "
              f"{args.warmup + 1}-{args.steps}")
    log(format_results(results, header))
    by = {r.policy: r for r in results}
    if "DESTROY" in by and "DESTROY_DEFERRED" in by:
        base, dd = by["DESTROY"].total, by["DESTROY_DEFERRED"].total
        checks.append(("DESTROY_DEFERRED beats DESTROY", dd < base, f"{dd:.3f} s vs {base:.3f} s"))
    for r in results:
        if r.bitwise_after_wake is not None:
            checks.append((f"{r.policy}: first collectives after every wake bitwise right", r.bitwise_after_wake, ""))
    goals = []
    for row in ("SUSPEND_PLANNED", "SUSPEND_PLANNED_LAZY", "SUSPEND_PLANNED_PARALLEL"):
        if row in by and "DESTROY_DEFERRED" in by and "PAUSED_LIVE" in by:
            r, dd, live = by[row], by["DESTROY_DEFERRED"], by["PAUSED_LIVE"]
            held = None if r.held_in_rollout_gib is None or not live.held_in_rollout_gib else \
                r.held_in_rollout_gib / live.held_in_rollout_gib
            goals.append({"row": row, "window_vs_destroy_deferred": r.total / dd.total,
                          "window_goal_met": r.total <= 0.5 * dd.total,
                          "held_vs_paused_live": held, "memory_goal_met": held is not None and held <= 0.02,
                          "switch_cost_vs_destroy_deferred": r.switch_cost / dd.switch_cost,
                          "bitwise_after_every_wake": r.bitwise_after_wake})
            log(f"{row}: switch cost {r.switch_cost:.3f} s = {r.switch_cost / dd.switch_cost:.3f} x DESTROY_DEFERRED's, "
                f"window {r.total:.3f} s = {r.total / dd.total:.3f} x (goal <= 0.5), NCCL memory in the rollout "
                f"{'unknown' if held is None else f'{held:.4f}'} x PAUSED_LIVE's (goal <= 0.02), bitwise after every "
                f"wake: {r.bitwise_after_wake}")
    out = {"settings": {"dp": n, "tp": 1, "steps": args.steps, "warmup": args.warmup, "train_s": args.train_s,
                        "rollout_s": args.rollout_s, "cooldown_s": args.cooldown_s,
                        "groups_per_rank": sum(1 for s in mesh_groups(n, 1) if 0 in s.ranks)},
           "results": [asdict(r) for r in results], "goals": goals, "spans": spans}
    if skipped:
        out["skipped"] = skipped
    return out


# --------------------------------------------------------------------------- raw NCCL


def comm_raw(args, checks: list) -> dict | None:
    """The ``comm_raw`` part: ``--comms`` NCCL communicators over all ranks created, used, suspended and resumed one
    by one (bytes freed and taken back), checked, destroyed, and as many aborted; then :func:`_mesh_walk`. Figures are
    the slowest rank's. Appends its checks to ``checks``; returns ``{"skipped": why}`` when NCCL cannot suspend here.
    """
    why = can_suspend()
    if why:
        log(f"comm_raw skipped: {why}")
        return {"skipped": why}
    dev = torch.device("cuda", torch.cuda.current_device())
    ranks = list(range(dist.get_world_size()))
    # apart, as the lifecycle pays them (torch initialises NCCL lazily, at the first collective)
    pgs: list = []
    group_s = _timed(lambda: pgs.extend(dist.new_group(ranks, backend="nccl") for _ in range(args.comms)))
    first_s = _timed(lambda: _first_collectives(pgs, dev))
    unused: list = []
    _timed(lambda: unused.extend(dist.new_group(ranks, backend="nccl") for _ in range(args.comms)))
    destroy_unused_s = _timed(lambda: [dist.destroy_process_group(pg) for pg in unused])
    per = _suspend_resume_each(pgs, dev)
    first_after_resume_s = _timed(lambda: _first_collectives(pgs, dev))  # the canary's cost on a resumed communicator
    ok = True
    for pg in pgs:
        x = torch.full((1 << 20,), float(dist.get_rank() + 1), device=dev)
        dist.all_reduce(x, group=pg)
        ok &= bool(torch.all(x == sum(r + 1 for r in ranks)).item())
    destroy_s = _timed(lambda: [dist.destroy_process_group(pg) for pg in pgs])
    abort_s = _abort_initialised(args.comms, ranks, dev)
    mesh = _mesh_walk(dev)
    mine = {"create_first_collective_s": group_s + first_s, "create_s": group_s, "first_collective_s": first_s,
            "first_collective_after_resume_s": first_after_resume_s, "destroy_uninitialized_s": destroy_unused_s,
            "destroy_s": destroy_s, "abort_s": abort_s, "per_comm": per, "ok": ok, "mesh": mesh}
    return _comm_raw_record(gathered(mine), len(ranks), checks)


def _timed(fn) -> float:
    """Seconds of ``fn()`` on this rank, from a device synchronize and a barrier to a device synchronize."""
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _first_collectives(pgs: list, dev) -> None:
    """A one-element all-reduce on each group (a new group's first one creates its NCCL communicator)."""
    for pg in pgs:
        dist.all_reduce(torch.ones(1, device=dev), group=pg)


def _suspend_resume_each(pgs: list, dev) -> list[dict]:
    """Each group's communicators suspended one after the other, as the lifecycle walks them, then resumed one
    after the other: per communicator its suspendable and persistent bytes, the seconds of each call, the device
    memory the suspend freed and the resume took back."""
    from refimpl.torch_runtime import nccl

    handles = [nccl.pg_comm_handles(pg, create_lazy=False) for pg in pgs]
    flat = [h for hs in handles for h in hs]
    per = []
    for h in flat:
        st = nccl.comm_mem_stats(h)
        per.append({"suspendable_bytes": st.suspendable, "persistent_bytes": st.persistent})
    for h, row in zip(flat, per):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free0 = torch.cuda.mem_get_info(dev)[0]
        dist.barrier()
        t0 = time.perf_counter()
        nccl.suspend_comms([h])
        row["suspend_s"] = time.perf_counter() - t0
        row["freed_bytes"] = torch.cuda.mem_get_info(dev)[0] - free0
    for h, row in zip(flat, per):
        free0 = torch.cuda.mem_get_info(dev)[0]
        dist.barrier()
        t0 = time.perf_counter()
        nccl.resume_comms([h])
        row["resume_s"] = time.perf_counter() - t0
        row["retaken_bytes"] = free0 - torch.cuda.mem_get_info(dev)[0]
    return per


def _abort_initialised(comms: int, ranks: list[int], dev) -> float | None:
    """Seconds of aborting ``comms`` initialised communicators (``ncclCommAbort``, no graceful shutdown) instead of
    destroying them: a candidate for SUSPEND_PLANNED's DESTROY action if it is much cheaper; None if it failed."""
    try:
        from refimpl.torch_runtime.runtime import _abort

        doomed: list = []
        _timed(lambda: doomed.extend(dist.new_group(ranks, backend="nccl") for _ in range(comms)))
        _timed(lambda: [dist.all_reduce(torch.ones(1, device=dev), group=pg) for pg in doomed])
        return _timed(lambda: [_abort(pg) for pg in doomed])
    except Exception as e:  # noqa: BLE001 - recorded, the figures above stand
        log(f"comm_raw: aborting initialised communicators failed: {e!r}")
        return None


def _comm_raw_record(everyone: list[dict], n_ranks: int, checks: list) -> dict:
    """The ``comm_raw`` record from every rank's figures (each figure the slowest rank's), its checks appended to
    ``checks`` and its line logged."""
    worst = min(r["freed_bytes"] / r["suspendable_bytes"] for m in everyone for r in m["per_comm"])
    back = min(r["retaken_bytes"] / r["suspendable_bytes"] for m in everyone for r in m["per_comm"])
    checks.append(("suspend frees >= 99% of every communicator's suspendable bytes", worst >= 0.99, f"worst {worst:.4f}"))
    checks.append(("resume takes the memory back", back >= 0.99, f"worst {back:.4f}"))
    checks.append(("collectives right after resume", all(m["ok"] for m in everyone), ""))
    r0 = everyone[0]["per_comm"]
    out = {
        "n_comms": len(r0),
        "ranks_per_comm": n_ranks,
        "suspendable_bytes": sum(r["suspendable_bytes"] for r in r0),
        "persistent_bytes": sum(r["persistent_bytes"] for r in r0),
        # the slowest rank sets each figure
        "suspend_s": max(sum(r["suspend_s"] for r in m["per_comm"]) for m in everyone),
        "resume_s": max(sum(r["resume_s"] for r in m["per_comm"]) for m in everyone),
        "destroy_s": max(m["destroy_s"] for m in everyone),
        "create_first_collective_s": max(m["create_first_collective_s"] for m in everyone),
        "abort_s": None if any(m["abort_s"] is None for m in everyone) else max(m["abort_s"] for m in everyone),
        **{k: max(m[k] for m in everyone) for k in ("create_s", "first_collective_s",
                                                     "first_collective_after_resume_s", "destroy_uninitialized_s")},
        "per_comm": r0,
        # the switch window's 14 groups per rank, walked as the lifecycle walks them: per rank, per group
        "mesh_walk": [m["mesh"] for m in everyone],
    }
    log(f"comm_raw: {out['n_comms']} communicators of {n_ranks} ranks, "
        f"{out['suspendable_bytes'] / 2**30:.2f} GiB suspendable + {out['persistent_bytes'] / 2**20:.0f} MiB "
        f"persistent; suspend {out['suspend_s']:.3f} s, resume {out['resume_s']:.3f} s, destroy "
        f"{out['destroy_s']:.3f} s (unused {out['destroy_uninitialized_s']:.3f} s), create {out['create_s']:.3f} s + "
        f"first collective {out['first_collective_s']:.3f} s, first collective after resume "
        f"{out['first_collective_after_resume_s']:.3f} s, abort (initialised) "
        f"{'failed' if out['abort_s'] is None else format(out['abort_s'], '.3f') + ' s'}")
    return out


def _mesh_walk(dev) -> dict | None:
    """The switch window's groups (``mesh_groups(N, 1)``, sorted names, as the lifecycle walks them): each
    member's first collective and every rank's destroy, timed per group on this rank (what the simulator's
    SUSPEND_PLANNED/DESTROY walks are checked against); then a group destroyed right
    after its collective against one destroyed after 0.5 s, per size."""
    from bench.switch_window import mesh_groups

    try:
        specs = sorted(mesh_groups(dist.get_world_size(), 1), key=lambda s: s.name)
        me = dist.get_rank()
        backend = "nccl" if dist.get_backend() == "nccl" else "gloo"
        sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
        pgs = {s.name: dist.new_group(list(s.ranks), backend=backend) for s in specs}
        rows = []
        sync()
        dist.barrier()
        for s in specs:
            row = {"name": s.name, "size": len(s.ranks), "member": me in s.ranks}
            if row["member"]:
                t0 = time.perf_counter()
                dist.all_reduce(torch.ones(1, device=dev), group=pgs[s.name])
                sync()
                row["first_collective_s"] = time.perf_counter() - t0
            rows.append(row)
        sync()
        dist.barrier()
        for row in rows:  # the lifecycle's walk: TorchRuntime holds no process group where it is not a member
            pg = pgs[row["name"]]
            t0 = time.perf_counter()
            if pg is not dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(pg)
            row["destroy_s"] = time.perf_counter() - t0
        # is a destroy right after the group's collective (as after the weight sync) dearer than one after a
        # pause? one group of one rank per rank and one of all ranks, each way, three times
        hot_cold = []
        n = dist.get_world_size()
        for size in (1, n):
            for settle_s in (0.0, 0.5, 0.0, 0.5, 0.0, 0.5):
                groups = {r: dist.new_group([r], backend=backend) for r in range(n)} if size == 1 else \
                    {me: dist.new_group(list(range(n)), backend=backend)}
                pg = groups[me]
                dist.all_reduce(torch.ones(1, device=dev), group=pg)
                sync()
                time.sleep(settle_s)
                t0 = time.perf_counter()
                dist.destroy_process_group(pg)
                hot_cold.append({"size": size, "settle_s": settle_s, "destroy_s": time.perf_counter() - t0})
                dist.barrier()
        return {"groups": rows, "destroy_after_use": hot_cold}
    except Exception as e:  # noqa: BLE001 - recorded; the figures above stand
        log(f"comm_raw: the mesh walk failed: {e!r}")
        return None


# --------------------------------------------------------------------------- dedup


def _tensors(rt, total_bytes: int, count: int) -> dict:
    per = total_bytes // DTYPE.itemsize // count
    tensors = {f"w{i}": rt.alloc_device(per, DTYPE) for i in range(count)}
    for i, t in enumerate(tensors.values()):  # the same bytes on every rank: replicated state
        t.copy_(torch.arange(t.numel(), device=t.device, dtype=torch.float32).remainder_(251 + i).to(DTYPE))
    return tensors


def _cycles(rt, store, args, spans: bool) -> list[dict]:
    rows = []
    for i in range(args.repeats + 1):
        store.offload()
        rt.run(rt.synchronize())
        time.sleep(args.gap_s)
        dist.barrier()
        rt.spans.clear()
        t0 = time.perf_counter()
        store.reload()
        rt.run(rt.synchronize())
        row = {"reload_s": time.perf_counter() - t0}
        if spans:
            row["h2d_s"] = sum(e - s for name, s, e in rt.spans if name == "dedup.h2d")
            row["all_gather_s"] = sum(e - s for name, s, e in rt.spans if name == "dedup.all_gather")
            row["all_gathers"] = sum(1 for name, s, e in rt.spans if name == "dedup.all_gather")
        if i:  # the first cycle pins the host buffers
            rows.append(row)
    return rows


def raw_all_gather(rt, numel: int, g: int, args) -> float:
    """One NCCL all-gather of ``numel`` elements per rank over groups of ``g`` ranks, synchronized: the
    link's own time for the dedup reload's all-gather (median of the repeats, slowest rank)."""
    n = dist.get_world_size()
    groups = [dist.new_group(list(range(s, s + g))) for s in range(0, n, g)]
    pg = groups[dist.get_rank() // g]
    inp = rt.alloc_device(numel, DTYPE)
    out = rt.alloc_device(numel * g, DTYPE)
    times = []
    for i in range(args.repeats + 1):
        rt.run(rt.synchronize())
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_gather_into_tensor(out, inp, group=pg)
        rt.run(rt.synchronize())
        if i:
            times.append(time.perf_counter() - t0)
    rt.release(inp)
    rt.release(out)
    for grp in groups:
        dist.destroy_process_group(grp)
    return statistics.median(max(t) for t in zip(*gathered(times)))


def dedup(args, checks: list) -> list[dict]:
    """The ``dedup`` part: for every replica-group size g >= 2 dividing the world size, the ``local`` store's reload
    against ``local_dedup``'s (pipelined and one all-gather per layout) and a bare NCCL all-gather of the slice; the
    slowest rank per cycle, median over cycles. Appends a bitwise check per reload to ``checks``; returns one row per
    g."""
    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.backends.dedup_config import DedupConfig
    from refimpl.store.backends.replica import MeshReplica, MeshTopology, ReplicaPolicy
    from refimpl.store.backends.replica_sync import content_digest

    n = dist.get_world_size()
    rt = TorchRuntime()
    state_bytes = int(args.gib * 2**30)
    tensors = _tensors(rt, state_bytes, args.tensors)
    expect = content_digest(list(tensors.values()))
    out = []
    for g in [g for g in range(2, n + 1) if n % g == 0]:
        mesh = MeshTopology((n // g, g), ("rep", "ddp"))
        rows = {}
        store = OffloadStore(rt, backend="local")
        store.attach_tensors("params", tensors, name="p")
        rows["local"] = _cycles(rt, store, args, False)
        host_local = store.stats().host_pinned_bytes
        store.close()
        for label, config in (("one_gather", StoreConfig(segment_bytes=state_bytes + (1 << 20))),
                              ("dedup", StoreConfig())):
            policy = ReplicaPolicy(overrides={"*": MeshReplica(mesh, ("ddp",))})
            store = OffloadStore(rt, backend="local_dedup", config=config,
                                 dedup=DedupConfig(policy=policy, groups=tuple(mesh.groups_over(["ddp"]))))
            store.attach_tensors("params", tensors, name="p")
            rows[label] = _cycles(rt, store, args, True)
            if label == "dedup":
                host_dedup = store.backend.host_bytes()
            store.close()
            bitwise = bool(torch.equal(content_digest(list(tensors.values())), expect))
            checks.append((f"{label} reload over groups of {g} is bitwise", bitwise, ""))
        everyone = gathered(rows)
        log(f"  per cycle, rank 0: {json.dumps(everyone[0])}")

        def slowest(label, key):  # per cycle the slowest rank, then the median over cycles
            return statistics.median(max(r[label][i][key] for r in everyone) for i in range(args.repeats))

        row = {"group_size": g, "state_bytes_per_rank": sum(t.numel() for t in tensors.values()) * DTYPE.itemsize,
               "host_bytes_per_rank_local": host_local, "host_bytes_per_rank_dedup": host_dedup,
               "local_reload_s": slowest("local", "reload_s"), "dedup_reload_s": slowest("dedup", "reload_s"),
               "h2d_s": slowest("dedup", "h2d_s"), "all_gather_s": slowest("dedup", "all_gather_s"),
               "dedup_reload_one_gather_s": slowest("one_gather", "reload_s"),
               "one_gather_h2d_s": slowest("one_gather", "h2d_s"),
               "one_gather_all_gather_s": slowest("one_gather", "all_gather_s"),
               "repeats": args.repeats, "gap_s": args.gap_s}
        row["dedup_vs_local"] = row["dedup_reload_s"] / row["local_reload_s"]
        row["raw_all_gather_s"] = raw_all_gather(rt, row["state_bytes_per_rank"] // g // DTYPE.itemsize, g, args)
        # bytes each rank receives in the all-gather, over the time of its spans: not faster than NVLink
        row["all_gather_recv_gbps"] = row["state_bytes_per_rank"] * (g - 1) / g / max(row["all_gather_s"], 1e-9) / 1e9
        out.append(row)
        log(f"dedup g={g}: state {row['state_bytes_per_rank'] / 1e9:.2f} GB/rank, host {host_local / 1e9:.2f} -> "
            f"{host_dedup / 1e9:.2f} GB/rank; reload local {row['local_reload_s']:.4f} s, dedup "
            f"{row['dedup_reload_s']:.4f} s ({row['dedup_vs_local']:.3f} x; h2d spans {row['h2d_s']:.4f}, "
            f"all-gather spans {row['all_gather_s']:.4f} s = {row['all_gather_recv_gbps']:.0f} GB/s received), "
            f"one all-gather per layout {row['dedup_reload_one_gather_s']:.4f} s "
            f"(all-gather {row['one_gather_all_gather_s']:.4f} s); a bare NCCL all-gather of the slice "
            f"{row['raw_all_gather_s']:.4f} s")
    for t in tensors.values():
        rt.release(t)
    return out


def main() -> int:
    """Run the ``--parts`` on every rank; rank 0 writes the record after each part (so a later failure keeps what was
    measured) and prints the checks. Returns 1 if a check failed, else 0."""
    args = parse()
    if args.dry_run:
        args.gib, args.tensors, args.repeats, args.gap_s = 1 / 128, 8, 2, 0.0
        args.rollout_s, args.cooldown_s, args.steps, args.warmup = 0.3, 0.2, 3, 1
    cuda = torch.cuda.is_available() and not args.dry_run
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    n = dist.get_world_size()
    device = torch.cuda.get_device_name().replace(" ", "-").lower() if cuda else "cpu"
    record = {"kind": "multigpu", "schema": 1, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "device": device, "world_size": n, "torch": torch.__version__,
        "nccl_loaded": nccl_loaded() if cuda else None, "command": " ".join(["torchrun", f"--nproc-per-node={n}",
                                                                             *sys.argv]),
        "ld_preload": os.environ.get("LD_PRELOAD", ""), "dry_run": args.dry_run}
    log(f"{n} x {device}, torch {torch.__version__}, NCCL loaded {record['nccl_loaded']}")
    checks: list = []
    t0 = time.monotonic()
    out = Path(os.environ.get("OUT") or REPO / "bench" / "results")
    path = out / f"multigpu-{datetime.date.today()}-{device}x{n}.json"

    def save() -> None:  # after every part, so a later failure keeps what was measured
        record["checks"] = [{"name": a, "ok": bool(b), "detail": c} for a, b, c in checks]
        record["wall_s"] = time.monotonic() - t0
        if dist.get_rank() == 0:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1, default=str))

    for part, key, fn in (("switch", "switch_window", switch_window), ("comm", "comm_raw", comm_raw),
                          ("dedup", "dedup", dedup)):
        if part in args.parts:
            record[key] = fn(args, checks)
            save()
    save()
    failed = [c for c in record["checks"] if not c["ok"]]
    if dist.get_rank() == 0:
        for c in record["checks"]:
            print(f"{'PASS' if c['ok'] else 'FAIL'} {c['name']} {c['detail']}", flush=True)
        print(f"wrote {path}; {len(failed)} check(s) failed", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
