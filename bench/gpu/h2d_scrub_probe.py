"""Is the fresh-memory H2D slowdown the driver scrubbing memory that was just freed?

11 GiB from registered 256 MiB host segments into a buffer allocated after ``empty_cache``,
with a pause of ``delay`` seconds between giving the previous buffer back (``del`` +
``empty_cache``) and allocating the new one. If the driver zero-fills freed memory in the
background, the copy runs slow right after a free and at the line rate after a pause. Also
times the same with a VMM buffer (:class:`vmm_buffer.VmmBuffer` (bench/gpu/vmm_buffer.py)), and for comparison
the copy into a reused buffer. Median of 3 per delay.

    python3 bench/gpu/h2d_scrub_probe.py [OUT.json]
"""
import json
import statistics
import sys
import time

import torch

from refimpl.torch_runtime import TorchRuntime
from vmm_buffer import VmmBuffer

TOTAL = 11 * (1 << 30)
SEG = 256 << 20
rt = TorchRuntime("cuda")
segs = [rt.alloc_host(SEG, torch.uint8, pinned=True) for _ in range(TOTAL // SEG)]
dev_index = torch.cuda.current_device()
res = {}


def copy_all(dev, commit=None):
    """Issue the H2D copies of every host segment into ``dev`` (not synchronized); before segment ``i`` call
    ``commit((i + 1) * SEG)``, the bytes that must be mapped by then (a VMM buffer's ``commit``)."""
    for i, h in enumerate(segs):
        if commit is not None:
            commit((i + 1) * SEG)
        dev[i * SEG:(i + 1) * SEG].copy_(h, non_blocking=True)


def cycle(delay, kind):
    """GB/s (1e9) of the copy into a new buffer allocated ``delay`` seconds after a used ``TOTAL``-byte buffer was
    given back (``del`` + ``empty_cache``); ``kind`` is ``"vmm"`` (a :class:`VmmBuffer`, mapped chunk by chunk) or
    anything else (``torch.empty``). Allocation included; the sleep is not."""
    held = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
    copy_all(held)
    torch.cuda.synchronize()
    del held
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    time.sleep(delay)
    t0 = time.perf_counter()
    if kind == "vmm":
        b = VmmBuffer(TOTAL, torch.uint8, dev_index)
        copy_all(b.tensor, b.commit)
    else:
        b = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
        copy_all(b)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del b
    torch.cuda.empty_cache()
    return TOTAL / dt / 1e9


dev = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
copy_all(dev)
torch.cuda.synchronize()
t0 = time.perf_counter()
copy_all(dev)
torch.cuda.synchronize()
res["reused_gbps"] = TOTAL / (time.perf_counter() - t0) / 1e9
del dev
torch.cuda.empty_cache()
print(json.dumps(res), flush=True)
for kind in ("cudamalloc", "vmm"):
    for delay in (0.0, 0.02, 0.1, 0.5, 2.0):
        v = statistics.median(cycle(delay, kind) for _ in range(3))
        res[f"{kind}_delay_{delay}_gbps"] = v
        print(json.dumps({f"{kind}_delay_{delay}_gbps": v}), flush=True)
if len(sys.argv) > 1:
    json.dump(res, open(sys.argv[1], "w"), indent=1)
