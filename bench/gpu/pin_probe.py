"""Pinning setup on the GPU host: GB/s of making N GiB of host memory page-locked, per way of doing it.

Variants (each once, N GiB, registered, then unregistered):

* ``cuda_host_alloc``: ``torch.empty(pin_memory=True)`` (cudaHostAlloc via torch's caching host allocator).
* ``pinner_<mode>``: :class:`refimpl.torch_runtime.pinning.HostPinner` with ``prefault=<mode>``
  (``none``: register untouched; ``touch``; ``thp``; ``populate``) -- the store's own path.
* ``thp_parallel``: a THP mapping touched by ``--threads`` threads, then registered in
  ``--threads`` extents concurrently (one ``cudaHostRegister`` per extent).
* ``store_pin_ahead_<mode>``: the store's own setup, ``OffloadStore.pin_ahead(wait=True)`` of
  N GiB of device state (256 MiB tensors) with ``TorchRuntime(pin_prefault=<mode>)``: the
  pool's threads pin 256 MiB segments. This is the figure the store's pinning target (8 GB/s, ``tests/test_recorded_loop.py``) is about.

Every variant runs in try/except; a failure is recorded as its error text and the rest go on.
Writes JSON (partial results written after each variant).

    python3 bench/gpu/pin_probe.py [--gib 8] [--threads 8] [--out pin.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from refimpl.torch_runtime.pinning import HostPinner, anon_huge_pages_kb, mapped_buffer, thp_mode, touch_pages  # noqa: E402

logger = logging.getLogger("pin_probe")


def _cuda_host_alloc(nbytes: int) -> dict:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dt = time.perf_counter() - t0
    del t
    # keep nothing pinned in torch's caching host allocator for the next variants
    if hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()
    return {"s": dt, "gbps": nbytes / dt / 1e9}


def _pinner(nbytes: int, mode: str) -> dict:
    p = HostPinner(use_cuda=True, prefault=mode)
    t0 = time.perf_counter()
    t = p.alloc(nbytes, torch.uint8, pinned=True, tag=f"probe-{mode}")
    dt = time.perf_counter() - t0
    huge = anon_huge_pages_kb()
    t1 = time.perf_counter()
    p.free(t)
    unreg = time.perf_counter() - t1
    del t
    return {"s": dt, "gbps": nbytes / dt / 1e9, "anon_huge_kb_while_pinned": huge, "unregister_s": unreg}


def _thp_parallel(nbytes: int, threads: int) -> dict:
    cudart = torch.cuda.cudart()
    t0 = time.perf_counter()
    buf = mapped_buffer(nbytes, torch.uint8, nbytes, "thp", touch=False)  # advised, touched below on threads
    ext = -(-nbytes // threads // (2 << 20)) * (2 << 20)
    parts = [buf[i:i + ext] for i in range(0, nbytes, ext)]
    errors: list[str] = []

    def touch(x: torch.Tensor) -> None:
        touch_pages(x, 2 << 20)
        touch_pages(x)

    ts = [threading.Thread(target=touch, args=(x,)) for x in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    t_touch = time.perf_counter() - t0

    def reg(x: torch.Tensor) -> None:
        rc = int(cudart.cudaHostRegister(x.data_ptr(), x.numel(), 0))
        if rc:
            errors.append(f"cudaHostRegister rc={rc}")

    t1 = time.perf_counter()
    ts = [threading.Thread(target=reg, args=(x,)) for x in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    t_reg = time.perf_counter() - t1
    for x in parts:
        cudart.cudaHostUnregister(x.data_ptr())
    dt = t_touch + t_reg
    return {"s": dt, "gbps": nbytes / dt / 1e9, "touch_s": t_touch, "register_s": t_reg, "extents": len(parts),
            "errors": errors}


def _store_pin_ahead(nbytes: int, mode: str, device: str = "cuda") -> dict:
    """The store's own setup: ``pin_ahead(wait=True)`` of ``nbytes`` of state in 256 MiB tensors, with ``mode``."""
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.torch_runtime import TorchRuntime

    seg = 256 << 20
    rt = TorchRuntime(device, pin_prefault=mode)
    state = {f"t{i}": torch.empty(seg, dtype=torch.uint8, device=rt.device) for i in range(max(1, nbytes // seg))}
    store = OffloadStore(rt, config=StoreConfig(pin_ahead="off"))
    store.attach_tensors("params", state, name="state")
    t0 = time.perf_counter()
    reserved = store.pin_ahead(wait=True)
    dt = time.perf_counter() - t0
    threads = store.pool.pin_threads if hasattr(store.pool, "pin_threads") else None
    store.close()
    del state
    if rt.device.type == "cuda":
        torch.cuda.empty_cache()
    return {"s": dt, "gbps": reserved / dt / 1e9, "bytes": reserved, "pin_threads": threads}


def main() -> int:
    """Run every variant; write JSON after each."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--out", default="pin_probe.json")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    nbytes = int(a.gib * (1 << 30))
    res: dict = {"bytes": nbytes, "thp_mode": thp_mode(), "cpus": os.cpu_count(), "variants": {}}

    def save() -> None:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    try:
        torch.cuda.init()
        torch.empty(1, device="cuda")
    except Exception as e:  # noqa: BLE001 - nothing to measure without CUDA; say so in the record
        res["error"] = f"CUDA unavailable: {type(e).__name__}: {e}"
        save()
        logger.error("%s", res["error"])
        return 1
    variants = [("cuda_host_alloc", lambda: _cuda_host_alloc(nbytes))]
    variants += [(f"pinner_{m}", (lambda m=m: _pinner(nbytes, m))) for m in ("none", "touch", "thp", "populate")]
    variants += [("thp_parallel", lambda: _thp_parallel(nbytes, a.threads))]
    # the store's pinning ahead (pool threads, 256 MiB segments): what a job start pays
    variants += [(f"store_pin_ahead_{m}", (lambda m=m: _store_pin_ahead(nbytes, m))) for m in ("touch", "thp", "none")]
    for name, fn in variants:
        try:
            res["variants"][name] = fn()
            print(f"pin {name}: {res['variants'][name]['gbps']:.2f} GB/s", flush=True)
        except Exception as e:  # noqa: BLE001 - record and go on
            logger.error("variant %s failed: %s", name, e)
            res["variants"][name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
