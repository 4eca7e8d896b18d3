"""Where does H2D into fresh device memory lose its time, and does committing memory chunk by chunk win it back?

Run 3 found 11 GiB of H2D at ~49 GB/s into a buffer allocated after empty_cache (allocation
included) against ~55 GB/s into a reused one. This times, for 11 GiB from registered 256 MiB host
segments (median of 3 each):

* ``reused``: copies into a buffer allocated once (the line rate);
* ``alloc_only`` / ``free_only``: ``torch.empty`` after ``empty_cache``, and ``del`` + ``empty_cache``;
* ``fresh``: allocation, then the copies (run 3's figure);
* ``torch_chunks_1g``: 11 separate 1 GiB allocations, each followed by its copies (does cudaMalloc
  overlap a running copy?);
* ``vmm_<chunk>``: :class:`vmm_buffer.VmmBuffer` (bench/gpu/vmm_buffer.py) -- address range reserved, each chunk
  mapped just before the copies into it are issued (reservation included in the time);
* ``vmm_map_only`` / ``vmm_release_only``: mapping all 11 GiB, and unmapping it;
* ``vmm_reused``: copies into an already mapped VMM buffer (are its pages as fast as cudaMalloc's?);
* D2H out of a cudaMalloc buffer then ``del`` + ``empty_cache``, against D2H out of a VMM buffer then
  :func:`release_vmm`; and ``mem_get_info`` before and after, to show the memory really goes back.

    python3 bench/gpu/h2d_alloc_probe.py [OUT.json]
"""
import json
import statistics
import sys
import time
import traceback

import torch

from refimpl.torch_runtime import TorchRuntime
from vmm_buffer import VmmBuffer, release_vmm, vmm_supported

TOTAL = 11 * (1 << 30)
SEG = 256 << 20
NSEG = TOTAL // SEG
rt = TorchRuntime("cuda")
segs = [rt.alloc_host(SEG, torch.uint8, pinned=True) for _ in range(NSEG)]
for i, s in enumerate(segs):
    s.fill_(i % 251)
res: dict = {"total_bytes": TOTAL, "host_segment_bytes": SEG, "torch": torch.__version__,
             "device": torch.cuda.get_device_name(), "vmm_supported": vmm_supported(torch.cuda.current_device())}


def timed(fn):
    """Seconds ``fn()`` takes, with a device synchronize before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def copy_all(dev, commit=None):
    """Issue the H2D copies of every host segment into ``dev`` (not synchronized); before segment ``i`` call
    ``commit((i + 1) * SEG)``, the bytes that must be mapped by then (a VMM buffer's ``commit``)."""
    for i, h in enumerate(segs):
        if commit is not None:
            commit((i + 1) * SEG)
        dev[i * SEG:(i + 1) * SEG].copy_(h, non_blocking=True)


def median_gbps(setup_and_run, n=3):
    """``TOTAL`` bytes over the seconds ``setup_and_run()`` returns, in GB/s (1e9): one untimed warm-up call, then the
    median of ``n`` calls."""
    setup_and_run()
    return statistics.median(TOTAL / setup_and_run() / 1e9 for _ in range(n))


def record(name, value):
    """Store ``value`` under ``name`` in the results and print it as one JSON line."""
    res[name] = value
    print(json.dumps({name: value}), flush=True)


# reused buffer: the line rate
dev = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
record("reused_gbps", median_gbps(lambda: timed(lambda: copy_all(dev))))
del dev


def alloc_only():
    """Seconds of one ``torch.empty`` of ``TOTAL`` device bytes after ``empty_cache`` (the buffer is then dropped)."""
    torch.cuda.empty_cache()
    box = []
    dt = timed(lambda: box.append(torch.empty(TOTAL, dtype=torch.uint8, device="cuda")))
    box.clear()
    return dt


def free_only():
    """Seconds of giving a ``TOTAL``-byte device buffer back (``del`` + ``empty_cache``); its allocation is not timed.
    """
    d = [torch.empty(TOTAL, dtype=torch.uint8, device="cuda")]
    torch.cuda.synchronize()
    def f():
        d.clear()
        torch.cuda.empty_cache()
    return timed(f)


alloc_only()
record("alloc_only_s", statistics.median(alloc_only() for _ in range(3)))
free_only()
record("free_only_s", statistics.median(free_only() for _ in range(3)))


def fresh():
    """Seconds of allocating ``TOTAL`` device bytes after ``empty_cache`` and copying every segment into them."""
    torch.cuda.empty_cache()
    box = []
    def f():
        d = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
        box.append(d)
        copy_all(d)
    dt = timed(f)
    box.clear()
    return dt


record("fresh_gbps", median_gbps(fresh))


def torch_chunks():
    """Seconds of 11 allocations of ``TOTAL / 11`` bytes (1 GiB), each followed by the copies into it, after
    ``empty_cache``."""
    torch.cuda.empty_cache()
    box = []
    per = NSEG // 11
    def f():
        for c in range(11):
            d = torch.empty(per * SEG, dtype=torch.uint8, device="cuda")
            box.append(d)
            for j in range(per):
                d[j * SEG:(j + 1) * SEG].copy_(segs[c * per + j], non_blocking=True)
    dt = timed(f)
    box.clear()
    return dt


record("torch_chunks_1g_gbps", median_gbps(torch_chunks))
torch.cuda.empty_cache()

try:
    for chunk in (64 << 20, 256 << 20, 1 << 30):
        def vmm(chunk=chunk):
            box = []
            def f():
                b = VmmBuffer(TOTAL, torch.uint8, torch.cuda.current_device(), chunk_bytes=chunk)
                box.append(b)
                copy_all(b.tensor, b.commit)
            dt = timed(f)
            b = box.pop()
            ok = all(int(b.tensor[i * SEG + 12345]) == i % 251 for i in range(0, NSEG, 7))
            res.setdefault("vmm_data_ok", True)
            res["vmm_data_ok"] &= ok
            del b
            return dt
        record(f"vmm_{chunk >> 20}m_gbps", median_gbps(vmm))

    def vmm_map_only():
        box = []
        dt = timed(lambda: box.append(VmmBuffer(TOTAL, torch.uint8, torch.cuda.current_device()))
                   or box[0].commit_all())
        b = box.pop()
        t_rel = timed(lambda: release_vmm(b.tensor))
        res.setdefault("vmm_release_only_s_list", []).append(t_rel)
        return dt
    vmm_map_only()
    record("vmm_map_only_s", statistics.median(vmm_map_only() for _ in range(3)))
    record("vmm_release_only_s", statistics.median(res.pop("vmm_release_only_s_list")[1:]))

    b = VmmBuffer(TOTAL, torch.uint8, torch.cuda.current_device())
    b.commit_all()
    record("vmm_reused_gbps", median_gbps(lambda: timed(lambda: copy_all(b.tensor))))

    # D2H: native buffer + del/empty_cache against VMM buffer + release_vmm
    def d2h(src):
        for i, h in enumerate(segs):
            h.copy_(src[i * SEG:(i + 1) * SEG], non_blocking=True)
    record("vmm_d2h_reused_gbps", median_gbps(lambda: timed(lambda: d2h(b.tensor))))
    del b

    def native_offload():
        # the buffer lives only in ``box``, so clearing it really frees it (run 7's record was made while a
        # local name still held it: its native_offload_gbps left the free out)
        box = [torch.empty(TOTAL, dtype=torch.uint8, device="cuda")]
        torch.cuda.synchronize()
        def f():
            d2h(box[0])
            torch.cuda.synchronize()
            box.clear()
            torch.cuda.empty_cache()
        return timed(f)
    del_free0 = torch.cuda.mem_get_info()[0]
    record("native_offload_gbps", median_gbps(native_offload))

    def vmm_offload():
        b = VmmBuffer(TOTAL, torch.uint8, torch.cuda.current_device())
        b.commit_all()
        box = [b]
        torch.cuda.synchronize()
        def f():
            d2h(box[0].tensor)
            torch.cuda.synchronize()
            release_vmm(box[0].tensor)
        dt = timed(f)
        box.clear()
        return dt
    record("vmm_offload_gbps", median_gbps(vmm_offload))
    free_before = torch.cuda.mem_get_info()[0]
    b = VmmBuffer(TOTAL, torch.uint8, torch.cuda.current_device())
    b.commit_all()
    free_mapped = torch.cuda.mem_get_info()[0]
    release_vmm(b.tensor)
    free_after = torch.cuda.mem_get_info()[0]
    record("vmm_mem_get_info", {"free_before": free_before, "free_mapped": free_mapped, "free_after": free_after,
                                "returned_fraction": (free_after - free_mapped) / TOTAL})
    del b
    record("free_after_del", torch.cuda.mem_get_info()[0] - del_free0)
except Exception:  # report what ran and why the rest did not
    res["vmm_error"] = traceback.format_exc()
    print(res["vmm_error"], flush=True)

print(json.dumps(res, indent=1))
if len(sys.argv) > 1:
    json.dump(res, open(sys.argv[1], "w"), indent=1)
