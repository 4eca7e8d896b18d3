"""Why does the store's H2D reload run at ~50 GB/s when one large H2D copy runs at ~55?

Times 11.8 GB host-to-device in several ways (median of 3 after a warm-up), each into a device
buffer freshly allocated after empty_cache (as a reload does) and into a reused one:
host memory registered with cudaHostRegister (as TorchRuntime.alloc_host) in one buffer, in
256 MiB and 1 GiB segments, on one or two copy streams; and cudaHostAlloc memory (pin_memory).

    python3 bench/gpu/h2d_probe.py [OUT.json]
"""
import json
import statistics
import sys
import time

import torch

from refimpl.torch_runtime import TorchRuntime

GB = 1e9
TOTAL = 11 * (1 << 30)
rt = TorchRuntime("cuda")
streams = [torch.cuda.Stream(), torch.cuda.Stream()]


def host_segments(seg, registered=True):
    """``TOTAL // seg`` host buffers of ``seg`` bytes: registered with cudaHostRegister (``TorchRuntime.alloc_host``)
    if ``registered``, else cudaHostAlloc (``pin_memory``)."""
    n = TOTAL // seg
    if registered:
        return [rt.alloc_host(seg, torch.uint8, pinned=True) for _ in range(n)]
    return [torch.empty(seg, dtype=torch.uint8).pin_memory() for _ in range(n)]


def timed_copy(segs, fresh, nstreams):
    """GB/s (1e9) of copying ``segs`` into one ``TOTAL``-byte device buffer, round-robin over ``nstreams`` copy
    streams. With ``fresh`` the buffer is allocated after ``empty_cache``; the allocation is not timed."""
    if fresh:
        torch.cuda.empty_cache()
    dev = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    off = 0
    for i, h in enumerate(segs):
        s = streams[i % nstreams]
        with torch.cuda.stream(s):
            dev[off:off + h.numel()].copy_(h, non_blocking=True)
        off += h.numel()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del dev
    return TOTAL / dt / GB


res = []
for label, seg, reg in [("registered 1 x 11 GiB", TOTAL, True), ("registered 256 MiB segs", 256 << 20, True),
                        ("registered 1 GiB segs", 1 << 30, True), ("cudaHostAlloc 256 MiB segs", 256 << 20, False)]:
    segs = host_segments(seg, reg)
    for fresh in (True, False):
        for ns in (1, 2):
            if seg == TOTAL and ns == 2:
                continue
            timed_copy(segs, fresh, ns)
            rates = [timed_copy(segs, fresh, ns) for _ in range(3)]
            r = {"host": label, "fresh_device_buffer": fresh, "streams": ns, "h2d_gbps": statistics.median(rates)}
            print(json.dumps(r))
            res.append(r)
    if reg:
        for h in segs:
            rt.free_host(h)
    del segs
if len(sys.argv) > 1:
    json.dump(res, open(sys.argv[1], "w"), indent=1)
