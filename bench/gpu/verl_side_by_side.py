"""verl's own FSDP2 offload functions against the drop-ins (``refimpl.integrations.verl``), on one GPU or N.

    python bench/gpu/verl_side_by_side.py --out DIR                 # qwen2-0.85b, fp32 + AdamW (10.2 GB of state)
    python bench/gpu/verl_side_by_side.py --dry-run --out DIR       # CPU, tiny model, seconds (CI runs this)
    torchrun --nproc-per-node=N bench/gpu/verl_side_by_side.py --out DIR             # FSDP2 over N GPUs, NCCL
    torchrun --nproc-per-node=2 bench/gpu/verl_side_by_side.py --dry-run --out DIR   # 2 CPU ranks, Gloo

The model is ``bench.model_offload``'s FSDP2 Qwen2 built from a transformers config (random weights,
nothing downloaded), one fresh model of the same seed per method. Each method runs ``--cycles + 1``
cycles of a training step, the offload of the model then the optimizer (verl's engine order), and
their reload, each timed between device synchronisations; the first offload is the cold one. It prints
the seconds and the ratios verl / drop-in, and writes ``DIR/verl_side_by_side.json``. The losses of the
two runs are compared bit for bit.

Under ``torchrun`` the model is sharded over all N ranks (rank r on GPU ``LOCAL_RANK``; Gloo on the CPU
with ``--dry-run``), each rank trains on its own batch (seed 1 + rank) and times its own phases, the
ranks starting each phase together (a barrier outside the timing). Rank 0 writes the record: ``ranks``
holds every rank's figures, losses and stores' statistics; ``methods`` and the ratios hold, for each
cycle and phase, the max over the ranks (``"timings": "max over ranks"``); ``bitwise_losses`` is true only
where every rank's two runs gave the same losses bit for bit, an outcome all ranks agree on (every
rank exits 1 when any rank's losses differ). Run alone it is one rank and the record is as before.

verl is loaded without running ``verl/__init__.py`` (which imports Ray and ``verl.protocol``): a package
object for ``verl`` is put in ``sys.modules`` with verl's directory as its path, and
``verl.utils.fsdp_utils`` imported under it; that pulls tensordict, omegaconf, peft, accelerate and
transformers, not Ray (docs/integrations.md lists the wheels). On the CPU (``--dry-run``) verl's platform
is the CPU (``refimpl.integrations.verl_platform``).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

METHODS = ("verl", "store")


def load_verl_fsdp_utils():
    """``verl.utils.fsdp_utils`` without running ``verl/__init__.py`` (see the module docstring)."""
    if "verl" not in sys.modules:
        spec = importlib.util.find_spec("verl")
        if spec is None:
            raise SystemExit("verl is not importable here: install its wheel (docs/integrations.md lists them)")
        pkg = types.ModuleType("verl")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        pkg.__file__ = spec.origin
        sys.modules["verl"] = pkg
    return importlib.import_module("verl.utils.fsdp_utils")


def _functions(method, fu, device):
    """(offload, reload) of the model and optimizer for a method."""
    if method == "verl":
        f = fu
        device_id = device.index if device.type == "cuda" else "cpu"
    else:
        import refimpl.integrations.verl as f
        device_id = device

    def offload(model, opt):
        f.offload_fsdp2_model_to_cpu(model)
        f.offload_fsdp_optimizer(opt)

    def reload(model, opt):
        f.load_fsdp2_model_to_gpu(model)
        f.load_fsdp_optimizer(opt, device_id)
    return offload, reload


def run_method(method, model_name, device, cycles, rt, fu, rank=0, world=1):
    """Seconds of every cycle of one method on a fresh model, the losses (as int32 bits) and the store's stats
    (this rank's; with ``world`` > 1 the ranks meet at a barrier before each timed phase)."""
    import torch.distributed as dist

    from bench.model_offload import MODELS, build

    model, opt, _ = build(model_name, device)
    state_bytes = sum(getattr(t, "_local_tensor", t).nbytes for t in
                      [*model.parameters(), *(v for st in opt.state.values() for v in st.values())])
    offload, reload = _functions(method, fu, device)
    vocab = MODELS[model_name]["vocab_size"]
    x = torch.randint(0, vocab, (2, 256 if model_name != "tiny" else 16),
                      generator=torch.Generator().manual_seed(1 + rank)).to(device)

    def timed(fn):
        if world > 1:  # every rank starts the phase together; the barrier is not timed
            rt.run(rt.synchronize())
            dist.barrier()
        rt.run(rt.synchronize())
        t = time.perf_counter()
        fn(model, opt)
        rt.run(rt.synchronize())
        return time.perf_counter() - t

    rows, losses = [], []
    for _ in range(cycles + 1):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float().view(torch.int32).item())
        rows.append({"offload_s": timed(offload), "reload_s": timed(reload)})
    out = {"method": method, "state_bytes": state_bytes, "rows": rows, "losses": losses,
           "cold_offload_s": rows[0]["offload_s"], "steady_offload_s": [r["offload_s"] for r in rows[1:]],
           "reload_s": [r["reload_s"] for r in rows]}
    out["torch_host_allocator"] = _host_allocator_bytes(device)
    if method == "store":
        from refimpl.integrations.stores import store_of

        for key, obj in (("model", model), ("optim", opt)):
            s = store_of(obj).stats()
            out[f"{key}_store"] = {"host_pinned_bytes": s.host_pinned_bytes, "state_bytes": s.state_bytes,
                                   "registrations": s.registrations, "reuses": s.reuses, "copies": s.copies,
                                   "last_offload_path": s.last_offload_path, "offloads": s.offloads}
        store_of(model).close()
        store_of(opt).close()
    del model, opt
    return out


def _host_allocator_bytes(device):
    """Pinned bytes PyTorch's caching host allocator holds now (where verl's ``.to("cpu", non_blocking=True)``
    copies land), current and peak; None on the CPU."""
    if device.type != "cuda" or not hasattr(torch.cuda, "host_memory_stats"):
        return None
    stats = torch.cuda.host_memory_stats()
    return {k: stats.get(k) for k in ("reserved_bytes.current", "reserved_bytes.peak", "allocated_bytes.current",
                                      "allocated_bytes.peak")}


def ratios(verl, store):
    """verl's seconds over the drop-ins' (medians for steady offload and reload)."""
    med = statistics.median
    return {"cold_offload": verl["cold_offload_s"] / store["cold_offload_s"],
            "steady_offload": med(verl["steady_offload_s"]) / med(store["steady_offload_s"]),
            "reload": med(verl["reload_s"]) / med(store["reload_s"])}


def max_over_ranks(per_rank):
    """Each method's seconds, cycle by cycle and phase by phase, the max over the ranks' ``methods``; the state
    bytes are the ranks' local shards summed (the whole model's state, with FSDP2's padding of uneven shards)."""
    out = {}
    for m in METHODS:
        runs = [r[m] for r in per_rank]
        rows = [{k: max(run["rows"][i][k] for run in runs) for k in ("offload_s", "reload_s")}
                for i in range(len(runs[0]["rows"]))]
        out[m] = {"method": m, "state_bytes": sum(run["state_bytes"] for run in runs), "rows": rows,
                  "cold_offload_s": rows[0]["offload_s"], "steady_offload_s": [r["offload_s"] for r in rows[1:]],
                  "reload_s": [r["reload_s"] for r in rows]}
    return out


def agree_all(flag, device):
    """True on every rank when ``flag`` is true on every rank (an all-reduce of the minimum)."""
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def main(argv=None):
    """Run both methods and write the record; returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for verl_side_by_side.json")
    ap.add_argument("--model", default="qwen2-0.85b", help="a model of bench.model_offload.MODELS")
    ap.add_argument("--cycles", type=int, default=4, help="steady cycles after the cold one")
    ap.add_argument("--dry-run", action="store_true", help="the tiny model on the CPU")
    args = ap.parse_args(argv)
    if args.cycles < 1:
        ap.error("--cycles must be at least 1")
    import torch.distributed as dist

    from bench.model_offload import _ensure_dist
    from refimpl.integrations.stores import use_runtime
    from refimpl.output import table
    from refimpl.torch_runtime import TorchRuntime

    if args.dry_run:
        device, model_name = torch.device("cpu"), "tiny"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device here; use --dry-run for the CPU")
        # under torchrun the rank's GPU is LOCAL_RANK's; alone, GPU 0
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device, model_name = torch.device("cuda", local), args.model
    _ensure_dist(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
    fu = load_verl_fsdp_utils()
    if device.type == "cpu":
        from refimpl.integrations.verl_platform import use_cpu_platform

        use_cpu_platform()
    rt = TorchRuntime(device)
    use_runtime(rt)
    results = {m: run_method(m, model_name, device, args.cycles, rt, fu, rank, world) for m in METHODS}
    bitwise_here = results["verl"]["losses"] == results["store"]["losses"]
    if world == 1:
        bitwise = bitwise_here
    else:
        bitwise = agree_all(bitwise_here, device)
        per_rank = [None] * world
        dist.all_gather_object(per_rank, results)
        if rank != 0:
            return 0 if bitwise else 1
        ranks = [{"rank": r, "methods": res, "ratios_verl_over_store": ratios(res["verl"], res["store"]),
                  "bitwise_losses": res["verl"]["losses"] == res["store"]["losses"]} for r, res in enumerate(per_rank)]
        results = max_over_ranks(per_rank)
    verl, store = results["verl"], results["store"]
    record = {"what": "verl FSDP2 offload functions vs refimpl.integrations.verl drop-ins", "model": model_name,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "verl": _verl_version(), "cycles": args.cycles,
              "state_bytes": store["state_bytes"], "methods": results, "ratios_verl_over_store": ratios(verl, store),
              "bitwise_losses": bitwise}
    if world > 1:
        record.update(world_size=world, timings="max over ranks", ranks=ranks,
                      command=f"torchrun --nproc-per-node={world} bench/gpu/verl_side_by_side.py "
                              + " ".join(sys.argv[1:] if argv is None else argv))
    path = os.path.join(args.out, "verl_side_by_side.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    rng = lambda v: f"{min(v):.3f}-{max(v):.3f}"  # noqa: E731
    rows = [[m, f"{r['cold_offload_s']:.3f}", rng(r["steady_offload_s"]), rng(r["reload_s"])] for m, r in results.items()]
    q = record["ratios_verl_over_store"]
    rows.append(["verl / store", f"{q['cold_offload']:.2f} x", f"{q['steady_offload']:.2f} x", f"{q['reload']:.2f} x"])
    over = f" over {world} ranks (seconds: the max over the ranks)" if world > 1 else ""
    print(f"{model_name} on {record['device']}: {store['state_bytes'] / 2**30:.2f} GiB of state{over}, "
          f"losses bitwise equal{' on every rank' if world > 1 else ''}: {'yes' if record['bitwise_losses'] else 'NO'}")
    print(table(["method", "cold offload (s)", "steady offload (s)", "reload (s)"], rows, right=(1, 2, 3)))
    print(f"record: {path}")
    return 0 if record["bitwise_losses"] else 1


def _verl_version():
    try:
        from importlib.metadata import version

        return version("verl")
    except Exception:  # noqa: BLE001 - a wheel without metadata
        return "unknown"


def _main_then_destroy(argv=None) -> int:
    """:func:`main`, then the process group it started destroyed on every rank (whatever main returned or raised),
    so no rank exits with NCCL's communicators still up."""
    import torch.distributed as dist

    try:
        return main(argv)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(_main_then_destroy())
