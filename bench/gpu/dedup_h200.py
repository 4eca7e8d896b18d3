"""``local_dedup`` on the H200: host bytes per rank and reload time, measured and predicted.

    python bench/gpu/dedup_h200.py                      # one GPU: measured H2D part + simulator prediction
    torchrun --nproc-per-node=N bench/gpu/dedup_h200.py # N GPUs of one host: the whole dedup reload, measured
    python bench/gpu/dedup_h200.py --dry-run            # CPU, small sizes (checks the script runs)

One GPU (measured, TorchRuntime): the state is ``--gib`` GiB of bf16 parameters in ``--tensors``
tensors.
* ``local``: the offload store's full cycle; pinned host bytes and reload time (one H2D of everything).
* ``local_dedup`` H2D part, for each group size N of ``--group-sizes``: the slice one rank keeps
  (``MemberSlice``, exactly as the backend cuts it), pinned through the store's ``PinnedHostPool`` and
  copied host-to-device with ``TorchRuntime.copy_async`` into its chunk of the flat buffer, as the
  backend's reload does before its all-gather. Host bytes per rank and H2D time (median of
  ``--repeats``).
Several GPUs of one host, under torchrun (measured): the real store with ``local_dedup`` over NCCL,
everything replicated over all ranks; host bytes per rank, reload time, and its H2D and all-gather
phases (the backend's spans); the reload is checked bitwise (byte hashes of every tensor). The
replica content check (``DedupConfig.verify_replicas``; ``--verify always``, the default here, runs
it at every offload so each cycle times it) is timed per offload (``verify_s``: digests of every
replicated tensor plus their comparison over the group) and reported against the reload
(``verify_over_reload``, goal <= 0.05); ``--verify auto`` is the store's default (only when a layout
is new or changed: the first offload), ``--verify off`` disables it.

    torchrun --nproc-per-node=2 bench/gpu/dedup_h200.py --group-sizes 2 --no-predict   # the check's cost
Several GPUs (predicted): the same store code on the simulator (``sim``, meta payloads) with the
``hgx-h200-8x`` topology preset, for each N; every row says ``"predicted": true``.

Writes ``<date>-<device>-dedup.json`` to ``$OUT`` (default ``bench/results``) and prints a table.
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from refimpl.runtime import CopyKind  # noqa: E402
from refimpl.torch_runtime import TorchRuntime  # noqa: E402
from refimpl.store import OffloadStore, PinnedHostPool, StoreConfig  # noqa: E402
from refimpl.store.backends.dedup_config import DedupConfig, MemberSlice  # noqa: E402
from refimpl.store.backends.replica import MeshReplica, MeshTopology, ReplicaPolicy  # noqa: E402
from refimpl.store.backends.replica_sync import content_digest  # noqa: E402

DTYPE = torch.bfloat16


def parse() -> argparse.Namespace:
    """The command line (see the module docstring and ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0, help="replicated state per rank, GiB (bf16)")
    p.add_argument("--tensors", type=int, default=64, help="number of tensors the state is split into")
    p.add_argument("--group-sizes", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--preset", default="hgx-h200-8x", help="topology preset for the prediction")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes, CPU allowed")
    p.add_argument("--no-predict", action="store_true", help="skip the simulator prediction")
    p.add_argument("--verify", choices=["always", "auto", "off"], default="always",
                   help="replica content check under torchrun: every offload (timed each cycle), the store's "
                        "default (new or changed layouts only), or off")
    return p.parse_args()


def _sizes(total_bytes: int, count: int) -> list[int]:
    per = total_bytes // DTYPE.itemsize // count
    return [per] * count


def _fill(tensors: dict[str, torch.Tensor]) -> None:
    for i, t in enumerate(tensors.values()):
        t.copy_(torch.arange(t.numel(), device=t.device, dtype=torch.float32).remainder_(251 + i).to(DTYPE))


def measure_local(rt: TorchRuntime, sizes: list[int], repeats: int) -> dict:
    """The store's ``local`` backend: pinned host bytes and reload seconds (median)."""
    tensors = {f"w{i}": rt.alloc_device(n, DTYPE) for i, n in enumerate(sizes)}
    _fill(tensors)
    store = OffloadStore(rt, backend="local")
    store.attach_tensors("params", tensors, name="p")
    reloads = []
    for i in range(repeats + 1):
        store.offload()
        store.reload()
        if i:
            reloads.append(store.stats().last_reload_s)
    out = {"backend": "local", "group_size": 1, "host_bytes_per_rank": store.stats().host_pinned_bytes,
           "reload_s": statistics.median(reloads), "state_bytes": sum(sizes) * DTYPE.itemsize, "predicted": False}
    store.close()
    for t in tensors.values():
        rt.release(t)
    return out


def measure_slice_h2d(rt: TorchRuntime, sizes: list[int], n: int, repeats: int) -> dict:
    """One rank's reload H2D part for a group of ``n``: its slice, pinned by the store's pool, into its chunk."""
    numel = sum(sizes)
    plan = MemberSlice.balanced(numel, n, 0, itemsize=DTYPE.itemsize)  # rank 0 keeps a full chunk
    pool = PinnedHostPool(rt)
    host = pool.acquire("slice", DTYPE, (plan.valid,))
    seg = host.segment(0)
    seg.copy_(torch.arange(plan.valid, dtype=torch.float32).remainder_(241).to(DTYPE))
    flat = rt.alloc_device(plan.padded_numel, DTYPE)
    mine = flat[:plan.chunk]
    times = []
    for _ in range(repeats + 1):
        rt.run(rt.synchronize())
        t0 = time.perf_counter()
        rt.run(_await(rt.copy_async(mine[:plan.valid], seg, CopyKind.H2D)))
        rt.run(rt.synchronize())
        times.append(time.perf_counter() - t0)
    ok = torch.equal(mine[:plan.valid].cpu(), seg)
    out = {"backend": "local_dedup", "group_size": n, "part": "h2d of this rank's slice",
           "host_bytes_per_rank": pool.stats().host_pinned_bytes,
           "state_bytes": numel * DTYPE.itemsize, "h2d_s": statistics.median(times[1:]),
           "h2d_gbps": plan.valid * DTYPE.itemsize / statistics.median(times[1:]) / 1e9, "bitwise": ok,
           "predicted": False}
    pool.close()
    rt.release(flat)
    return out


async def _await(completion) -> None:
    await completion


def measure_distributed(sizes: list[int], repeats: int, verify: str = "always") -> dict:
    """Under torchrun: the real ``local_dedup`` reload over NCCL, everything replicated over all ranks."""
    import torch.distributed as dist

    rt = TorchRuntime()
    w = rt.world_size
    mesh = MeshTopology((w,), ("ddp",))
    tensors = {f"w{i}": rt.alloc_device(n, DTYPE) for i, n in enumerate(sizes)}
    _fill(tensors)
    expect = content_digest(list(tensors.values()))
    policy = ReplicaPolicy(overrides={"*": MeshReplica(mesh, ("ddp",))})
    mode = {"always": True, "auto": None, "off": False}[verify]
    store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(),
                         dedup=DedupConfig(policy=policy, groups=tuple(mesh.groups_over(["ddp"])), verify_replicas=mode))
    store.attach_tensors("params", tensors, name="p")
    reloads, h2d, ag, checks = [], [], [], []
    first_check = None
    for i in range(repeats + 1):
        store.offload()
        if i == 0:
            first_check = store.backend.last_verify_s  # the scattered first offload (auto checks here too)
        else:
            checks.append(store.backend.last_verify_s)
        rt.spans.clear()
        dist.barrier()
        store.reload()
        if i:
            reloads.append(store.stats().last_reload_s)
            h2d.append(sum(e - s for name, s, e in rt.spans if name == "dedup.h2d"))
            ag.append(sum(e - s for name, s, e in rt.spans if name == "dedup.all_gather"))
    bitwise = bool(torch.equal(content_digest(list(tensors.values())), expect))
    row = {"backend": "local_dedup", "group_size": w, "part": "whole reload (H2D + NCCL all-gather)",
           "host_bytes_per_rank": store.stats().host_pinned_bytes, "state_bytes": sum(sizes) * DTYPE.itemsize,
           "reload_s": statistics.median(reloads), "h2d_s": statistics.median(h2d),
           "all_gather_s": statistics.median(ag), "bitwise": bitwise, "predicted": False,
           "verify": verify, "verify_first_offload_s": first_check, "verify_s": statistics.median(checks),
           "verify_over_reload": statistics.median(checks) / statistics.median(reloads),
           "verified_offloads": store.backend.verified_offloads}
    rows = [None] * w
    dist.all_gather_object(rows, row)
    return {"rank_rows": rows}


def predict(sizes: list[int], n: int, preset: str, backend: str) -> dict:
    """The same store code on the simulator (meta payloads, topology ``preset``): a predicted row."""
    import sim
    from sim.machine.collectives import NcclComm, TopologyCollectiveCost
    from sim.machine.flows import FlowTransport
    from sim.machine.memory import TopologyMemory
    from sim.presets import load_preset_data
    from sim.machine.topology import Topology

    topo = Topology.from_dict(load_preset_data(preset))
    world = sim.SimWorld(n, payload="meta", transport=FlowTransport(topo), collective_cost=TopologyCollectiveCost(topo),
                         memory=TopologyMemory(topo), comm=NcclComm(topo), trace=False)
    mesh = MeshTopology((n,), ("ddp",))

    async def run(rt):
        tensors = {f"w{i}": rt.alloc_device(k, DTYPE) for i, k in enumerate(sizes)}
        if backend == "local":
            store = OffloadStore(rt, backend="local")
        else:
            store = OffloadStore(rt, backend="local_dedup", dedup=DedupConfig(
                policy=ReplicaPolicy(overrides={"*": MeshReplica(mesh, ("ddp",))}),
                groups=tuple(mesh.groups_over(["ddp"]))))
        store.attach_tensors("params", tensors, name="p")
        await store.offload_async()  # first cycle: groups, pinning
        await store.reload_async()
        await store.offload_async()
        start = len(rt.spans)
        t0 = rt.now()
        await store.reload_async()
        spans = rt.spans[start:]
        return (store.backend.host_bytes(), rt.now() - t0,
                sum(e - s for name, s, e in spans if name == "dedup.h2d"),
                sum(e - s for name, s, e in spans if name == "dedup.all_gather"))

    res = world.run(run)
    host, reload_s, h2d, ag = max(res, key=lambda r: r[1])
    return {"backend": backend, "group_size": n, "topology": preset, "host_bytes_per_rank": host,
            "state_bytes": sum(sizes) * DTYPE.itemsize, "reload_s": reload_s, "h2d_s": h2d, "all_gather_s": ag,
            "predicted": True}


def main() -> int:
    """Measure (one GPU, or every rank under torchrun) and predict (rank 0, unless ``--no-predict``), write the record
    and print the table. Returns 2 without CUDA and without ``--dry-run``, 1 if a distributed reload was not bitwise,
    else 0 (ranks other than 0 return 0 after measuring)."""
    args = parse()
    if args.dry_run:
        args.gib, args.repeats = 1 / 256, 2
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist

        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("no CUDA device: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    sizes = _sizes(int(args.gib * 2**30), args.tensors)
    rt = TorchRuntime()
    rows = []
    if distributed:
        rows += measure_distributed(sizes, args.repeats, args.verify)["rank_rows"]
        if rt.rank != 0:
            return 0
    else:
        rows.append(measure_local(rt, sizes, args.repeats))
        rows += [measure_slice_h2d(rt, sizes, n, args.repeats) for n in args.group_sizes]
    if not args.no_predict and rt.rank == 0:
        pred_sizes = _sizes(int((4.0 if args.dry_run else args.gib) * 2**30), args.tensors)
        for n in [1, *[g for g in args.group_sizes if g > 1]]:
            # local on n GPUs at once is the fair baseline: ranks share PCIe switches and uplinks
            rows.append(predict(pred_sizes, n, args.preset, "local"))
            if n > 1:
                rows.append(predict(pred_sizes, n, args.preset, "local_dedup"))
    device = torch.cuda.get_device_name().replace(" ", "-").lower() if cuda else "cpu"
    doc = {"command": " ".join([sys.executable, *sys.argv]), "device": device, "torch": torch.__version__,
           "cuda": torch.version.cuda, "world_size": rt.world_size, "gib": args.gib, "tensors": args.tensors,
           "rows": rows}
    out = Path(os.environ.get("OUT", REPO / "bench" / "results"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{datetime.date.today()}-{device}-dedup{'-dist' if distributed else ''}.json"
    path.write_text(json.dumps(doc, indent=2))
    print(f"{'backend':12} {'N':>3} {'kind':10} {'host/rank GB':>13} {'x state':>8} {'reload s':>9} "
          f"{'h2d s':>8} {'allgather s':>11}")
    for r in rows:
        kind = "PREDICTED" if r["predicted"] else "measured"
        frac = r["host_bytes_per_rank"] / r["state_bytes"]
        fmt = lambda k: f"{r[k]:.4f}" if k in r else "-"  # noqa: E731
        print(f"{r['backend']:12} {r['group_size']:>3} {kind:10} {r['host_bytes_per_rank'] / 1e9:13.3f} "
              f"{frac:8.3f} {fmt('reload_s'):>9} {fmt('h2d_s'):>8} {fmt('all_gather_s'):>11}")
    for r in rows:
        if "verify_s" in r:
            print(f"replica check ({r['verify']}): {r['verify_s']:.4f} s per checked offload = "
                  f"{r['verify_over_reload']:.3f} x reload ({r['reload_s']:.4f} s); first offload's check "
                  f"{r['verify_first_offload_s']:.4f} s; {r['verified_offloads']} offloads checked")
    print(f"wrote {path}")
    bad = [r for r in rows if r.get("bitwise") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
