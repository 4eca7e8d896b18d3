"""Can the first-touch cost of fresh device memory be hidden behind the H2D copy?

11 GiB from registered 256 MiB host segments into a buffer allocated after empty_cache:
A: the copies alone; B: the first half copied while the compute stream zero-fills the second
half, then the second half copied; C: in quarters, each quarter zero-filled while the previous
one copies. Median GB/s of 3 (allocation included).

    python3 bench/gpu/h2d_pretouch_probe.py [OUT.json]
"""
import json
import statistics
import sys
import time

import torch

from refimpl.torch_runtime import TorchRuntime

TOTAL = 11 * (1 << 30)
SEG = 256 << 20
rt = TorchRuntime("cuda")
segs = [rt.alloc_host(SEG, torch.uint8, pinned=True) for _ in range(TOTAL // SEG)]
copy = torch.cuda.Stream()
main = torch.cuda.current_stream()


def run2(parts):
    """Clean version: events mark each part's zero-fill; a part's copies wait for its own event."""
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dev = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
    n = len(segs)
    bounds = [round(k * n / parts) for k in range(parts + 1)]
    events = [None] * parts
    for p in range(1, parts):
        dev[bounds[p] * SEG:bounds[p + 1] * SEG].zero_()
        events[p] = torch.cuda.Event()
        events[p].record(main)
    with torch.cuda.stream(copy):
        for p in range(parts):
            if events[p] is not None:
                copy.wait_event(events[p])
            for i in range(bounds[p], bounds[p + 1]):
                dev[i * SEG:(i + 1) * SEG].copy_(segs[i], non_blocking=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del dev
    return TOTAL / dt / 1e9


res = {}
for parts in (1, 2, 4, 8):
    run2(parts)
    res[f"parts_{parts}_gbps"] = statistics.median(run2(parts) for _ in range(3))
    print(json.dumps({f"parts_{parts}_gbps": res[f"parts_{parts}_gbps"]}))
if len(sys.argv) > 1:
    json.dump(res, open(sys.argv[1], "w"), indent=1)
