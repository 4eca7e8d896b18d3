"""H2D into freshly allocated device memory: does touching it first on the device help?

Run 3 showed H2D into a buffer allocated after empty_cache runs at ~49 GB/s and into a reused one
at ~55 GB/s. This times, for 11 GiB from registered 256 MiB host segments into a fresh buffer:
the copy alone; zero_() of the fresh buffer, then the copy (both timed); and prints the allocator
backend (run it under PYTORCH_CUDA_ALLOC_CONF=... to compare backends).

    python3 bench/gpu/h2d_fresh_probe.py LABEL [OUT.json]
"""
import json
import os
import statistics
import sys
import time

import torch

from refimpl.torch_runtime import TorchRuntime

TOTAL = 11 * (1 << 30)
SEG = 256 << 20
rt = TorchRuntime("cuda")
segs = [rt.alloc_host(SEG, torch.uint8, pinned=True) for _ in range(TOTAL // SEG)]


def once(touch):
    """GB/s (1e9) of allocating ``TOTAL`` device bytes after ``empty_cache`` and copying every host segment into them,
    allocation included; with ``touch``, ``zero_()`` the buffer before the copies (timed too)."""
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dev = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
    if touch:
        dev.zero_()
    off = 0
    for h in segs:
        dev[off:off + SEG].copy_(h, non_blocking=True)
        off += SEG
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del dev
    return TOTAL / dt / 1e9


res = {"label": sys.argv[1] if len(sys.argv) > 1 else "", "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
for touch in (False, True):
    once(touch)
    res[f"touch_{touch}_gbps_incl_alloc"] = statistics.median(once(touch) for _ in range(3))
print(json.dumps(res))
if len(sys.argv) > 2:
    json.dump(res, open(sys.argv[2], "w"), indent=1)
