"""``timeshare bench offload --model NAME``: a real transformers model under FSDP2, the store against verl's way.

One process, one device. The model is a ``transformers`` Qwen2 built from a config
(random weights, nothing downloaded): ``qwen2-0.85b`` (hidden 1536, 16 layers, vocab
32000, untied embeddings) or ``tiny`` (CPU tests), sharded with FSDP2
(``fully_shard`` per layer and at the root, a mesh of one), fp32 parameters and AdamW.
Each method gets a fresh model of the same seed and runs ``cycles + 1`` cycles: a
training step, the offload, the reload, each timed between device synchronisations;
the first cycle is the cold one. After every reload the state (every parameter and
optimizer tensor) is checked bitwise against before the offload.

Methods:

* ``store``: this project's :class:`~refimpl.store.OffloadStore` (model and optimizer attached).
* ``verl_like``: what verl's FSDP2 helpers do, written out: ``model.cpu()`` and
  ``torch.cuda.empty_cache()`` / ``model.to(device)``; the optimizer state tensor by
  tensor ``.to("cpu", non_blocking=True)`` / ``.to(device, non_blocking=True)``.
* ``verl``: verl's own functions (``verl.utils.fsdp_utils``: ``offload_fsdp2_model_to_cpu``,
  ``load_fsdp2_model_to_gpu``, ``offload_fsdp_optimizer``, ``load_fsdp_optimizer``), where
  verl is importable; otherwise the row says why it was skipped.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import time
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

#: model name -> Qwen2 config arguments
MODELS: dict[str, dict[str, Any]] = {
    "qwen2-0.85b": dict(vocab_size=32000, hidden_size=1536, intermediate_size=8960, num_hidden_layers=16,
                        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096),
    "tiny": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256),
}
#: the methods, in the order they run
METHODS = ("store", "verl_like", "verl")


def _ensure_dist(device: torch.device) -> bool:
    """Initialise a one-rank process group (NCCL on CUDA, else Gloo) unless one exists; True if it made one."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
        os.environ.setdefault(k, v)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return True


def build(name: str, device: torch.device, seed: int = 0):
    """A fresh FSDP2 Qwen2 of ``name`` with AdamW, one training step taken (the optimizer state exists); sharded
    over every rank of the process group when one is initialised."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    cfg = Qwen2Config(tie_word_embeddings=False, **MODELS[name])
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    # FSDP2 over every rank of the process group (one rank when run alone)
    mesh = init_device_mesh(device.type, (dist.get_world_size() if dist.is_initialized() else 1,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    seq = 256 if name != "tiny" else 16
    x = torch.randint(0, cfg.vocab_size, (2, seq), generator=torch.Generator().manual_seed(seed)).to(device)

    def train() -> None:
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    train()
    return model, opt, train


def digest(model: torch.nn.Module, opt: Any) -> list[int]:
    """Integer digests of the bits of every parameter and optimizer tensor (equal bits, equal digests)."""
    out = []
    tensors = list(model.parameters()) + [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        t = t.detach().contiguous().reshape(-1)
        bits = t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()]).to(torch.int64)
        w = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 1021 + 1
        out.append(int((bits * w).sum().item()))
    return out


def _verl_like(model, opt, device) -> tuple[Callable[[], None], Callable[[], None]]:
    def offload() -> None:
        model.cpu()
        for st in opt.state.values():
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    st[k] = v.to("cpu", non_blocking=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def reload() -> None:
        model.to(device)
        for st in opt.state.values():
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    st[k] = v.to(device, non_blocking=True)
    return offload, reload


def _verl(model, opt, device) -> tuple[Callable[[], None], Callable[[], None]]:
    from verl.utils import fsdp_utils as fu  # the optional extra: only where verl is installed

    if device.type == "cpu":  # verl has no CPU platform of its own: its device lookups would ask CUDA
        from refimpl.integrations.verl_platform import use_cpu_platform

        use_cpu_platform()

    def offload() -> None:
        fu.offload_fsdp2_model_to_cpu(model)
        fu.offload_fsdp_optimizer(opt)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def reload() -> None:
        fu.load_fsdp2_model_to_gpu(model)
        fu.load_fsdp_optimizer(opt, device.index if device.type == "cuda" else "cpu")
    return offload, reload


def _method(name: str, model, opt, device, rt):
    """(offload, reload, close) of a method; ImportError where its package is missing."""
    if name == "store":
        from refimpl.store import OffloadStore

        store = OffloadStore(rt)
        store.attach_module(model)
        store.attach_optimizer(opt)
        return store.offload, store.reload, store.close
    if name == "verl_like":
        return (*_verl_like(model, opt, device), lambda: None)
    if name == "verl":
        return (*_verl(model, opt, device), lambda: None)
    raise ValueError(f"unknown method {name!r}; expected one of {METHODS}")


def measure(name: str, model_name: str, device: torch.device, cycles: int, rt) -> dict[str, Any]:
    """Cold and steady offload/reload seconds of one method on a fresh model, bitwise after each cycle."""
    def timed(fn: Callable[[], None]) -> float:
        rt.run(rt.synchronize())
        t = time.perf_counter()
        fn()
        rt.run(rt.synchronize())
        return time.perf_counter() - t

    model, opt, train = build(model_name, device)
    ts = list(model.parameters()) + [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    nbytes = sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in ts)
    del ts
    try:
        offload, reload, close = _method(name, model, opt, device, rt)
    except ImportError as e:
        return {"method": name, "skipped": f"not importable: {e}"}
    rows = []
    try:
        for i in range(cycles + 1):
            train()
            before = digest(model, opt)
            off, rel = timed(offload), timed(reload)
            rows.append({"i": i, "offload_s": off, "reload_s": rel, "bitwise": digest(model, opt) == before})
    finally:
        close()
        del model, opt, train
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    steady = rows[1:] or rows
    return {"method": name, "state_bytes": nbytes, "rows": rows, "cold_offload_s": rows[0]["offload_s"],
            "steady_offload_s": [r["offload_s"] for r in steady], "reload_s": [r["reload_s"] for r in steady],
            "bitwise_every_cycle": all(r["bitwise"] for r in rows)}


def run_model_bench(model_name: str, *, device: str | None, cycles: int, methods: list[str], out: str,
                    tick: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every method on ``model_name``; the report (also written to ``out``/model_offload_<model>.json).
    ``tick(method)``, if given, is called after each method (a progress bar over ``len(methods)``)."""
    from refimpl.torch_runtime import TorchRuntime

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        torch.cuda.set_device(dev.index or 0)
        dev = torch.device("cuda", torch.cuda.current_device())
    made = _ensure_dist(dev)
    rt = TorchRuntime(dev)
    report: dict[str, Any] = {"model": model_name, "device": str(dev), "torch": torch.__version__, "methods": []}
    try:
        for m in methods:
            res = measure(m, model_name, dev, cycles, rt)
            if tick is not None:
                tick(m)
            report["methods"].append(res)
            logger.info("%s: %s", m, json.dumps({k: v for k, v in res.items() if k != "rows"}))
    finally:
        if made:  # the caller's process is left as it was (a test run in-process must not leave a group behind)
            import torch.distributed as dist

            dist.destroy_process_group()
    report["state_bytes"] = next((m["state_bytes"] for m in report["methods"] if "state_bytes" in m), None)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"model_offload_{model_name}.json"), "w") as f:
        json.dump(report, f, indent=1)
    return report


def format_report(report: dict[str, Any], wide: bool = False) -> str:
    """The methods side by side: cold offload, steady offload and reload ranges, bitwise (one table, units in the
    headers, at most 100 columns unless ``wide``)."""
    from refimpl.output import table

    rows, skipped = [], []
    for m in report["methods"]:
        if "skipped" in m:
            skipped.append(f"  {m['method']} skipped: {m['skipped']}")
            continue
        rng = (lambda v: f"{min(v):.3f}-{max(v):.3f}")
        rows.append([m["method"], f"{m['cold_offload_s']:.3f}", rng(m["steady_offload_s"]), rng(m["reload_s"]),
                     "yes" if m["bitwise_every_cycle"] else "NO"])
    head = f"model {report['model']} on {report['device']}: {(report.get('state_bytes') or 0) / 2**30:.2f} GiB of state"
    body = table(["method", "cold offload (s)", "steady offload (s)", "reload (s)", "bitwise every cycle"], rows,
                 wide=wide, right=(1, 2, 3))
    return "\n".join([head, body, *skipped])


__all__ = ["METHODS", "MODELS", "build", "digest", "format_report", "measure", "run_model_bench"]
