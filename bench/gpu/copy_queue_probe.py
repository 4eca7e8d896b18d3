"""Does a small host-to-device copy wait behind a bulk one queued on another stream? (one GPU, ~30 s)

    python3 bench/gpu/copy_queue_probe.py [--gb 8] [--piece-mib 64] [--out DIR]

A streamed reload queues gigabytes of host-to-device copies on the store's copy stream and returns; the
training step that follows makes small host-to-device copies of its own on the compute stream (the batch
``.to(device)`` from pageable memory, FSDP2's pinned copies in backward). If the copy engine serves the
queued pieces first, each small copy waits for the whole bulk. Measured per case, right after the bulk
is queued (times from the moment the small copy is issued):

* ``alone``: no bulk (the small copy's own latency);
* ``pageable``: a 16 KiB pageable ``tensor.to(device)``, the host blocked until it is done;
* ``pinned``: a 716 KiB pinned ``non_blocking`` copy, then its stream synchronised;
* ``pinned_hi``: the same on a high-priority stream;
* ``kernel``: a small kernel on the compute stream (not a copy: the control);
* ``window_K``: as ``pageable``, but only K pieces of the bulk queued (a bounded window of copies in flight);
* ``paced_K``: the whole bulk through ``TorchRuntime.paced_copies`` with a window of K pieces (a feeder thread
  keeps K queued), then the pinned small copy.

Prints one line per case and writes ``copy_queue.json`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=8.0)
    ap.add_argument("--piece-mib", type=int, default=64)
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    piece = a.piece_mib << 20
    n = max(1, int(a.gb * 1e9) // piece)
    host = torch.empty(n * piece, dtype=torch.uint8).pin_memory()
    dst = torch.empty(n * piece, dtype=torch.uint8, device=dev)
    bulk_stream = torch.cuda.Stream()
    hi = torch.cuda.Stream(priority=-1)
    pageable = torch.arange(4096, dtype=torch.int32)
    pinned = torch.zeros(731816 // 4, dtype=torch.float32).pin_memory()
    y = torch.ones(1024, device=dev)

    from refimpl.runtime.types import CopyKind
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime("cuda")
    held: list = []

    def bulk(k: int, paced: int = 0) -> None:
        if paced:
            with rt.paced_copies(paced * piece):
                held.extend(rt.copy_async(dst[i * piece:(i + 1) * piece], host[i * piece:(i + 1) * piece],
                                          CopyKind.H2D) for i in range(k))
            return
        with torch.cuda.stream(bulk_stream):
            for i in range(k):
                dst[i * piece:(i + 1) * piece].copy_(host[i * piece:(i + 1) * piece], non_blocking=True)

    def small(case: str) -> None:
        if case == "pinned":
            pinned.to(dev, non_blocking=True)
            torch.cuda.current_stream().synchronize()
        elif case == "pinned_hi":
            with torch.cuda.stream(hi):
                pinned.to(dev, non_blocking=True)
            hi.synchronize()
        elif case == "kernel":
            (y * 2).sum()
            torch.cuda.current_stream().synchronize()
        else:
            pageable.to(dev)

    rows = []
    cases = [("alone", 0), ("pageable", n), ("pinned", n), ("pinned_hi", n), ("kernel", n),
             ("window_1", 1), ("window_2", 2), ("window_4", 4), ("window_16", 16),
             ("paced_1", n), ("paced_2", n), ("paced_4", n), ("paced_8", n)]
    for rep in range(2):
        for case, k in cases:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            bulk(k, int(case.split("_")[1]) if case.startswith("paced") else 0)
            t1 = time.perf_counter()
            small({"window": "pageable", "paced": "pinned"}.get(case.split("_")[0], case))
            t2 = time.perf_counter()
            for h in held:
                h._wait_issued()
            held.clear()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            row = {"case": case, "rep": rep, "pieces_queued": k, "queue_s": t1 - t0, "small_done_s": t2 - t1,
                   "bulk_done_s": t3 - t0, "bulk_gbps": (k * piece / (t3 - t0) / 1e9) if k else None}
            rows.append(row)
            if rep == 1:
                print(f"{case:10s} pieces {k:4d}: small copy done after {1e3 * row['small_done_s']:8.2f} ms; "
                      f"bulk done after {1e3 * row['bulk_done_s']:8.2f} ms", flush=True)
    os.makedirs(a.out, exist_ok=True)
    rec = {"kind": "copy_queue_probe", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "piece_bytes": piece, "pieces": n, "rows": rows,
           "command": "python3 bench/gpu/copy_queue_probe.py " + " ".join(argv or [])}
    with open(os.path.join(a.out, "copy_queue.json"), "w") as f:
        json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
