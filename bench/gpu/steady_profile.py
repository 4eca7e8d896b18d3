"""Where the steady offload of a real model loses time against the line rate (one GPU).

A Qwen2 model of about 0.85 B parameters (hidden 1536, 16 layers, vocab 32000, built
from a config: random weights, nothing downloaded) under FSDP2 on one GPU, fp32
parameters and AdamW (about 10.2 GB of state), one training step between cycles.
Each cycle: ``zero_grad(set_to_none=True)`` (or the grads kept and dropped by the
store with ``--drop-grads``), then ``store.offload()`` and ``store.reload()``, each
timed between device synchronisations, against the line rate measured in the same
run. The store's own phase laps (``stats().phases``) say which stage the time goes
to; one steady offload runs under cProfile and one under ``torch.profiler``.

Then the same cycles under each of the runtime's device-cache modes (``--cache-modes``,
:mod:`refimpl.torch_runtime.device_cache`): ``shared`` (``empty_cache`` returns the whole
allocator cache: the record's baseline), ``keep`` (nothing returned: the reload reuses
the cached blocks), ``private`` (the store's flat buffers in a private ``MemPool``
released alone). Every cycle checks the state bitwise (a digest of every parameter and
optimizer tensor before the offload against after the reload); each mode gets its own
profiler table of one steady offload and reload.

    python bench/gpu/steady_profile.py [--layers 16] [--cycles 3] [--cache-modes shared,keep,private] [--out DIR]

Writes ``steady_profile.json`` (and the profiler tables as text) to ``--out``.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402


class SteadyRig:
    """The model under FSDP2 on one GPU, its AdamW, a fixed batch, and the store that offloads them."""

    def __init__(self, layers: int, dev) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers import Qwen2Config, Qwen2ForCausalLM

        self.dev = dev
        cfg = Qwen2Config(vocab_size=32000, hidden_size=1536, intermediate_size=8960, num_hidden_layers=layers,
                          num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096,
                          tie_word_embeddings=False)
        torch.manual_seed(0)
        with torch.device(dev):
            self.model = Qwen2ForCausalLM(cfg)
        mesh = init_device_mesh("cuda", (1,))
        for layer in self.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.x = torch.randint(0, cfg.vocab_size, (2, 256), device=dev)
        self.rt = self.store = None

    def train(self) -> float:
        """One training step (forward, backward, optimizer step); its loss."""
        out = self.model(input_ids=self.x, labels=self.x)
        out.loss.backward()
        self.opt.step()
        return float(out.loss.item())

    def open_store(self) -> None:
        """The runtime and the store, the model and its optimizer attached."""
        from refimpl.store import OffloadStore
        from refimpl.torch_runtime import TorchRuntime

        self.rt = TorchRuntime(self.dev)
        self.store = OffloadStore(self.rt)
        self.store.attach_module(self.model)
        self.store.attach_optimizer(self.opt)

    @staticmethod
    def timed(fn) -> float:
        """Seconds of ``fn()`` between device synchronisations."""
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t


def line_rates(rig: SteadyRig) -> dict[str, float]:
    """The line rate of this run: 1 GiB between registered host memory and device memory, best of 4, each way."""
    n = 1 << 30
    host = rig.rt.alloc_host(n, torch.uint8, pinned=True, tag="line")
    host.fill_(1)  # touched before it is timed
    d = torch.empty(n, dtype=torch.uint8, device=rig.dev)
    line = {}
    for name, (dst, src) in (("h2d_gbps", (d, host)), ("d2h_gbps", (host, d))):
        best = 1e9
        for _ in range(4):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        line[name] = n / best / 1e9
    rig.rt.free_host(host)
    del d
    return line


def baseline_cycles(rig: SteadyRig, cycles: int, line: dict[str, float]) -> list[dict]:
    """``cycles`` steady cycles (after a cold one) with the grads set to None, then with the store dropping them:
    offload and reload seconds, x line, the store's phase laps and offload path; each row printed."""
    store, rows = rig.store, []
    for mode in ("set_to_none", "drop_grads"):
        for i in range(cycles + 1):  # the first of each mode is a warm-up (cold offload)
            rig.train()
            if mode == "set_to_none":
                rig.opt.zero_grad(set_to_none=True)
                off = rig.timed(lambda: store.offload())
            else:
                off = rig.timed(lambda: store.offload(drop_grads=True))
            st = store.stats()
            nbytes = st.last_offload_bytes
            phases_off = {k: round(v, 5) for k, v in st.phases.items() if k.startswith("offload.")}
            path = st.last_offload_path
            rel = rig.timed(lambda: store.reload())
            st2 = store.stats()
            c = {"mode": mode, "i": i, "offload_s": off, "reload_s": rel, "offload_bytes": nbytes,
                 "reload_bytes": st2.last_reload_bytes,
                 "offload_x_line": (nbytes / line["d2h_gbps"] / 1e9) / off if off else None,
                 "reload_x_line": (st2.last_reload_bytes / line["h2d_gbps"] / 1e9) / rel if rel else None,
                 "offload_phases": phases_off,
                 "reload_phases": {k: round(v, 5) for k, v in st2.phases.items() if k.startswith("reload.")},
                 "path": path}
            print(json.dumps(c), flush=True)
            rows.append(c)
    return rows


def profile_steady(rig: SteadyRig, out_dir: str) -> str:
    """One steady offload under cProfile and one offload and reload under ``torch.profiler``, their tables (and
    the trace) written into ``out_dir``; returns the cProfile table."""
    from torch.profiler import ProfilerActivity, profile

    store, opt = rig.store, rig.opt
    rig.rt.device_cache.mode = "shared"
    rig.train()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    store.offload()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
    store.reload()
    rig.train()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        store.offload()
        torch.cuda.synchronize()
        store.reload()
        torch.cuda.synchronize()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "steady_profile_cprofile.txt"), "w") as f:
        f.write(s.getvalue())
    with open(os.path.join(out_dir, "steady_profile_torch.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        f.write("\n\n")
        f.write(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
    try:
        prof.export_chrome_trace(os.path.join(out_dir, "steady_profile_trace.json"))
    except Exception as e:  # noqa: BLE001
        print("trace not exported:", e)
    return s.getvalue()


def main() -> int:
    """Run the cycles and write the record."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cache-modes", default="shared,keep,private")
    ap.add_argument("--skip-baseline", action="store_true", help="only the device-cache modes")
    a = ap.parse_args()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    import torch.distributed as dist

    dist.init_process_group("nccl")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    rig = SteadyRig(a.layers, dev)
    rec: dict = {"params": sum(p.numel() for p in rig.model.parameters()), "gpu": torch.cuda.get_device_name(dev),
                 "torch": torch.__version__, "cycles": []}
    rig.train()
    rig.opt.zero_grad(set_to_none=True)
    rig.open_store()
    rec["line"] = line = line_rates(rig)
    if not a.skip_baseline:
        rec["cycles"] = baseline_cycles(rig, a.cycles, line)
    os.makedirs(a.out, exist_ok=True)
    rec["cache_modes"] = cache_modes(a, rig, line)
    with open(os.path.join(a.out, "steady_profile.json"), "w") as f:
        json.dump(rec, f, indent=1)  # written now too, in case the profiling below is cut short
    table = profile_steady(rig, a.out)
    rec["store_stats"] = {k: v for k, v in rig.store.stats().__dict__.items() if isinstance(v, (int, float, str))}
    with open(os.path.join(a.out, "steady_profile.json"), "w") as f:
        json.dump(rec, f, indent=1)
    print(table[:6000])
    rig.store.close()
    dist.destroy_process_group()
    return 0


def _digest(model, opt) -> list[int]:
    """Integer digests of every parameter's and optimizer tensor's bits (the same bits give the same digests)."""
    out = []
    tensors = [p for p in model.parameters()] + [t for st in opt.state.values() for t in st.values()
                                                  if isinstance(t, torch.Tensor)]
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        bits = t.detach().contiguous().view(-1).view(torch.int32 if t.element_size() == 4 else torch.int16)
        out.append(int(bits.to(torch.int64).sum().item()) ^ int((bits[::97].to(torch.int64) * 31).sum().item()))
    return out


def cache_modes(a, rig: SteadyRig, line: dict[str, float]) -> dict:
    """The cycles under each device-cache mode: offload/reload seconds, x line, bitwise, a profiler table each."""
    from torch.profiler import ProfilerActivity, profile

    rt, store, train, opt, timed, model, dev = rig.rt, rig.store, rig.train, rig.opt, rig.timed, rig.model, rig.dev
    out = {}
    for mode in [m for m in a.cache_modes.split(",") if m]:
        rt.device_cache.mode = mode
        rows = []
        for i in range(a.cycles + 1):  # the first is a warm-up into the mode
            train()
            opt.zero_grad(set_to_none=True)
            before = _digest(model, opt)
            off = timed(lambda: store.offload())
            st = store.stats()
            free_after_off = torch.cuda.mem_get_info(dev)[0]
            reserved_after_off = torch.cuda.memory_reserved(dev)
            rel = timed(lambda: store.reload())
            st2 = store.stats()
            row = {"i": i, "offload_s": off, "reload_s": rel, "bytes": st.last_offload_bytes,
                   "offload_x_line": st.last_offload_bytes / (line["d2h_gbps"] * 1e9) / off,
                   "reload_x_line": st2.last_reload_bytes / (line["h2d_gbps"] * 1e9) / rel,
                   "empty_cache_s": st.phases.get("offload.empty_cache"), "free_after_offload": free_after_off,
                   "reserved_after_offload": reserved_after_off, "bitwise": before == _digest(model, opt),
                   "pools_released": rt.device_cache.pools_released}
            print(json.dumps({"cache_mode": mode, **row}), flush=True)
            rows.append(row)
        train()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            store.offload()
            torch.cuda.synchronize()
            store.reload()
            torch.cuda.synchronize()
        with open(os.path.join(a.out, f"steady_profile_torch_{mode}.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        steady = rows[1:] or rows
        out[mode] = {"rows": rows, "offload_x_line_min": min(r["offload_x_line"] for r in steady),
                     "reload_x_line_min": min(r["reload_x_line"] for r in steady),
                     "bitwise_every_cycle": all(r["bitwise"] for r in rows)}
    rt.device_cache.mode = "shared"
    return out


if __name__ == "__main__":
    raise SystemExit(main())
