"""Reload right after another role frees its memory: three ways of colocating the roles, beside the line rate.

The trainer's state (``--state-gib`` in 256 MiB tensors) lives in an
:class:`~refimpl.store.OffloadStore` (``empty_cache=False``; the driver trips
below are made explicitly, exactly where ``empty_cache=True`` would make them).
Each cycle: offload, the other role allocates ``--other-gb`` GB, writes it and
frees it (in 1 GB blocks, as a rollout engine's per-layer KV caches are), then
the timed reload. Modes:

* ``driver``: the store returns its memory to the driver after the offload
  (``empty_cache``) and the other role frees through the driver
  (``del`` + ``empty_cache``): the reload's ``cudaMalloc`` gets memory the driver
  must scrub first (docs/store.md has the figures).
* ``allocator``: both roles in one process share torch's caching allocator; the
  other role's memory goes back to the allocator only (``del``), so the reload's
  allocation reuses it without a driver trip.
* ``mempool``: the same, but both roles allocate inside one ``torch.cuda.MemPool``
  (``torch.cuda.use_mem_pool``), so the memory handed back stays the roles' own
  even if something else empties the default pool.

The line rate: the same bytes copied host-to-device from registered 256 MiB host
segments into cached device memory, best of ``--repeat``, in the same run. Every
reload is checked (each tensor holds its own fill value again). Each mode runs in
try/except; the JSON is rewritten after each.

    python3 bench/gpu/reload_probe.py [--state-gib 11] [--other-gb 40] [--repeat 3] [--out reload.json]
    python3 bench/gpu/reload_probe.py --device cpu --state-gib 0.03 --other-gb 0.05   # dry run of the code path
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from refimpl.store import OffloadStore, StoreConfig  # noqa: E402
from refimpl.torch_runtime import TorchRuntime  # noqa: E402

logger = logging.getLogger("reload_probe")
SEG = 256 << 20
MODES = ("driver", "allocator", "mempool")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _empty_cache(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def line_rate(rt: TorchRuntime, nbytes: int, seg: int, repeat: int) -> float:
    """GB/s of copying ``nbytes`` from registered host segments into cached device memory (best of ``repeat``)."""
    dev = rt.device
    n = max(1, nbytes // seg)
    host = [rt.alloc_host(seg, torch.uint8, pinned=True, tag="line") for _ in range(n)]
    out = torch.empty(n * seg, dtype=torch.uint8, device=dev)
    best = float("inf")
    for _ in range(repeat + 1):  # the first is a warm-up
        _sync(dev)
        t0 = time.perf_counter()
        for i, h in enumerate(host):
            out[i * seg:(i + 1) * seg].copy_(h, non_blocking=True)
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    for h in host:
        rt.free_host(h)
    del out
    _empty_cache(dev)
    return n * seg / best / 1e9


def run(device: str, state_bytes: int, other_bytes: int, repeat: int, out_path: str | None,
        modes: tuple[str, ...] = MODES, seg: int = SEG, chunk: int = 10**9) -> dict:
    """Measure the line rate and every mode; return (and write after each step) the result dict."""
    rt = TorchRuntime(device)
    dev = rt.device
    res: dict = {"device": str(dev), "state_bytes": 0, "other_bytes": other_bytes, "repeat": repeat, "modes": {}}

    def save() -> None:
        if out_path:
            with open(out_path, "w") as f:
                json.dump(res, f, indent=1)

    n = max(1, state_bytes // seg)
    res["state_bytes"] = n * seg
    try:
        res["line_gbps"] = line_rate(rt, n * seg, seg, repeat)
        print(f"reload_probe line: {res['line_gbps']:.2f} GB/s", flush=True)
    except Exception as e:  # noqa: BLE001
        logger.error("line rate failed: %s", e)
        res["line_error"] = f"{type(e).__name__}: {e}"
    save()
    state = {f"t{i}": torch.full((seg,), i % 251 + 1, dtype=torch.uint8, device=dev) for i in range(n)}
    store = OffloadStore(rt, config=StoreConfig(empty_cache=False))
    store.attach_tensors("params", state, name="state")
    for mode in modes:
        if mode == "mempool" and (dev.type != "cuda" or not hasattr(torch.cuda, "MemPool")):
            res["modes"][mode] = {"skipped": "needs CUDA and torch.cuda.MemPool"}
            save()
            continue
        pool = torch.cuda.MemPool() if mode == "mempool" else None
        ctx = (lambda: torch.cuda.use_mem_pool(pool)) if pool is not None else contextlib.nullcontext
        times: list[float] = []
        try:
            for _ in range(repeat):
                store.offload()
                _sync(dev)
                if mode == "driver":
                    _empty_cache(dev)
                with ctx():
                    # the rollout's KV cache: 1 GB blocks (as per-layer caches are), written, then freed
                    other = [torch.empty(min(chunk, other_bytes - i), dtype=torch.uint8, device=dev)
                             for i in range(0, other_bytes, chunk)]
                    for block in other:
                        block.fill_(7)
                    _sync(dev)
                    block = None  # noqa: F841 - drop the loop's reference to the last block too
                    del other
                if mode == "driver":
                    _empty_cache(dev)
                _sync(dev)
                t0 = time.perf_counter()
                with ctx():
                    store.reload()
                _sync(dev)
                times.append(time.perf_counter() - t0)
                bad = [k for i, (k, t) in enumerate(state.items()) if not bool((t[::4096] == i % 251 + 1).all())]
                if bad:
                    raise AssertionError(f"after the reload {len(bad)} tensors lost their values (first {bad[0]})")
            gbps = [n * seg / t / 1e9 for t in times]
            r = {"reload_s": times, "best_gbps": max(gbps), "median_gbps": statistics.median(gbps)}
            if res.get("line_gbps"):
                r["best_x_line"] = r["best_gbps"] / res["line_gbps"]
                r["median_x_line"] = r["median_gbps"] / res["line_gbps"]
            res["modes"][mode] = r
            print(f"reload_probe {mode}: {r['median_gbps']:.2f} GB/s median ({r.get('median_x_line', 0):.3f} x line)",
                  flush=True)
        except Exception as e:  # noqa: BLE001 - record, bring the state back, go on
            logger.error("mode %s failed: %s", mode, e)
            res["modes"][mode] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            try:
                store.reload()
            except Exception:  # noqa: BLE001
                logger.exception("reload after a failed mode")
        save()
    store.close()
    return res


def main(argv: list[str] | None = None) -> int:
    """CLI; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--state-gib", type=float, default=11.0)
    ap.add_argument("--other-gb", type=float, default=40.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seg-mib", type=int, default=256)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("refimpl").setLevel(logging.WARNING)
    seg = a.seg_mib << 20
    try:
        run(a.device, int(a.state_gib * (1 << 30)), int(a.other_gb * 1e9), a.repeat, a.out, seg=seg)
    except Exception as e:  # noqa: BLE001 - record why (the modes write their own errors)
        logger.exception("reload probe failed")
        if a.out:
            try:
                with open(a.out) as f:
                    res = json.load(f)
            except (OSError, ValueError):
                res = {}
            res["error"] = f"{type(e).__name__}: {e}"
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
