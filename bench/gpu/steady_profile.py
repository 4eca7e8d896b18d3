"""Where the steady offload of a real model loses time against the line rate (one GPU).

A Qwen2 model of about 0.85 B parameters (hidden 1536, 16 layers, vocab 32000, built
from a config: random weights, nothing downloaded) under FSDP2 on one GPU, fp32
parameters and AdamW (about 10.2 GB of state), one training step between cycles.
Each cycle: ``zero_grad(set_to_none=True)`` (or the grads kept and dropped by the
store with ``--drop-grads``), then ``store.offload()`` and ``store.reload()``, each
timed between device synchronisations, against the line rate measured in the same
run. The store's own phase laps (``stats().phases``) say which stage the time goes
to; one steady offload runs under cProfile and one under ``torch.profiler``.

    python bench/gpu/steady_profile.py [--layers 16] [--cycles 3] [--out DIR]

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


def main() -> int:
    """Run the cycles and write the record."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from refimpl.store import OffloadStore
    from refimpl.torch_runtime import TorchRuntime

    dist.init_process_group("nccl")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    cfg = Qwen2Config(vocab_size=32000, hidden_size=1536, intermediate_size=8960, num_hidden_layers=a.layers,
                      num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen2ForCausalLM(cfg)
    mesh = init_device_mesh("cuda", (1,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randint(0, cfg.vocab_size, (2, 256), device=dev)

    def train() -> float:
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        return float(out.loss.item())

    rec: dict = {"params": sum(p.numel() for p in model.parameters()), "gpu": torch.cuda.get_device_name(dev),
                 "torch": torch.__version__, "cycles": []}
    train()
    opt.zero_grad(set_to_none=True)
    rt = TorchRuntime(dev)
    store = OffloadStore(rt)
    store.attach_module(model)
    store.attach_optimizer(opt)
    # line rate of this run: 1 GiB between registered host memory and device memory, best of 4
    n = 1 << 30
    host = rt.alloc_host(n, torch.uint8, pinned=True, tag="line")
    d = torch.empty(n, dtype=torch.uint8, device=dev)
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
    rt.free_host(host)
    del d
    rec["line"] = line

    def timed(fn) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    for mode in ("set_to_none", "drop_grads"):
        for i in range(a.cycles + 1):  # the first of each mode is a warm-up (cold offload)
            train()
            if mode == "set_to_none":
                opt.zero_grad(set_to_none=True)
                off = timed(lambda: store.offload())
            else:
                off = timed(lambda: store.offload(drop_grads=True))
            st = store.stats()
            nbytes = st.last_offload_bytes
            phases_off = {k: round(v, 5) for k, v in st.phases.items() if k.startswith("offload.")}
            path = st.last_offload_path
            rel = timed(lambda: store.reload())
            st2 = store.stats()
            c = {"mode": mode, "i": i, "offload_s": off, "reload_s": rel, "offload_bytes": nbytes,
                 "reload_bytes": st2.last_reload_bytes,
                 "offload_x_line": (nbytes / line["d2h_gbps"] / 1e9) / off if off else None,
                 "reload_x_line": (st2.last_reload_bytes / line["h2d_gbps"] / 1e9) / rel if rel else None,
                 "offload_phases": phases_off,
                 "reload_phases": {k: round(v, 5) for k, v in st2.phases.items() if k.startswith("reload.")},
                 "path": path}
            print(json.dumps(c), flush=True)
            rec["cycles"].append(c)
    # one steady offload under cProfile, one under torch.profiler
    train()
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
    train()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        store.offload()
        torch.cuda.synchronize()
        store.reload()
        torch.cuda.synchronize()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "steady_profile_cprofile.txt"), "w") as f:
        f.write(s.getvalue())
    with open(os.path.join(a.out, "steady_profile_torch.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        f.write("\n\n")
        f.write(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
    try:
        prof.export_chrome_trace(os.path.join(a.out, "steady_profile_trace.json"))
    except Exception as e:  # noqa: BLE001
        print("trace not exported:", e)
    rec["store_stats"] = {k: v for k, v in store.stats().__dict__.items() if isinstance(v, (int, float, str))}
    with open(os.path.join(a.out, "steady_profile.json"), "w") as f:
        json.dump(rec, f, indent=1)
    print(s.getvalue()[:6000])
    store.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
