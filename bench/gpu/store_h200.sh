#!/usr/bin/env bash
# The offload store on the H200: CUDA tests, then the offload benchmark. One call, about 5.5 min.
#
#   bash bench/gpu/store_h200.sh [tests] [segments] [bench] [expandable] [probe]   (default: tests
#       bench; roughly tests 1.5 min, segments 0.3 min, bench 3 min, expandable 0.5 min, probe 0.5 min)
#
# * tests: tests/store/test_store_cuda.py (bitwise training equality on the GPU, FSDP2 on one GPU,
#   memory returned per cudaMemGetInfo with host memory pinned at attach and at the first offload,
#   copy ordering) and the CPU store tests on this machine's torch.
# * bench: `timeshare bench offload` on the dense 7B 1/8-shard state (11.8 GB, 1,164 tensors) and the
#   MoE state (18.5 GB, 25,164 tensors): the store with its defaults (host memory pinned ahead at
#   attach; the pinning time is the `pin setup s` column, paid at setup, outside the cycles), and
#   store_stage4 (4 staging buffers instead of 2: does the first MoE offload's pack/copy pipeline
#   stall on the staging ring?), against per-tensor copies (verl), fresh pin_memory (ROLL Megatron),
#   torch_memory_saver with CPU backup (slime/Relax; its retain_cpu_backup mode is left out for time)
#   and the line rate, with the default phase gap (0.25 s between offload and reload) and one
#   back-to-back cycle per method. Prints the ratio tables and whether each store variant meets the
#   store's targets (bench.offload.TARGETS); writes <date>-<device>-offload.json.
# * expandable: the unconsolidated store alone on the MoE shape in a second process with
#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (does the cold offload's ~0.2 s of empty_cache,
#   one cudaFree per allocator segment, shrink?); writes offload_expandable/<date>-<device>-offload.json.
# * segments: how many caching-allocator segments the MoE state occupies, and how
#   long empty_cache takes to cudaFree them after releasing every storage at once or in order (as
#   early_release does); shows whether early release leaves fewer segments to free (store_segments.json).
# * probe: cudaHostRegister throughput (run 1 measured it: bench/results/2026-11-29-h200-run1/).
#
# Everything lands in $OUT (or bench/results). Exit status: non-zero if the tests failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
PY=${PYTHON:-python}
WHAT=" ${*:-tests bench} "
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rc=0

if ! $PY -c "import torch_memory_saver" 2>/dev/null; then
  for w in .whl/torch_memory_saver-*.whl; do
    [ -f "$w" ] && $PY -m pip install -q --no-deps "$w" && echo "installed $w"
  done
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
ulimit -l

if [[ "$WHAT" == *" probe "* ]]; then
  echo "=== pinning probe"
  $PY - "$OUT/store_pin_probe.json" <<'EOF'
import json, mmap, sys, time
from concurrent.futures import ThreadPoolExecutor
import torch
from refimpl.torch_runtime import TorchRuntime

GIB = 1 << 30
TOTAL, SEG = 4 * GIB, 256 << 20
cr = torch.cuda.cudart()
dev = torch.empty(SEG, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()

def mapped(n, thp=False, prefault=False):
    m = mmap.mmap(-1, n)
    if thp and hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    t = torch.frombuffer(m, dtype=torch.uint8)
    if prefault:
        t.zero_()
    return m, t

def register(t):
    rc = int(cr.cudaHostRegister(t.data_ptr(), t.numel(), 0))
    assert rc == 0, f"cudaHostRegister failed: {rc}"

def run(label, n_seg, threads, thp=False, prefault=False):
    size = TOTAL // n_seg
    bufs = [mapped(size, thp, prefault) for _ in range(n_seg)]
    t0 = time.perf_counter()
    if threads == 1:
        for _, t in bufs: register(t)
    else:
        with ThreadPoolExecutor(threads) as ex: list(ex.map(lambda b: register(b[1]), bufs))
    dt = time.perf_counter() - t0
    # a D2H copy into the registered memory, to show it is really pinned
    host = bufs[0][1][:SEG] if size >= SEG else None
    gbps = None
    if host is not None:
        torch.cuda.synchronize(); c0 = time.perf_counter()
        host.copy_(dev, non_blocking=True); torch.cuda.synchronize()
        gbps = SEG / (time.perf_counter() - c0) / 1e9
    for _, t in bufs: cr.cudaHostUnregister(t.data_ptr())
    del bufs
    r = {"label": label, "segments": n_seg, "threads": threads, "thp": thp, "prefault": prefault,
         "seconds": dt, "gbps": TOTAL / dt / 1e9, "d2h_gbps_into_it": gbps}
    print(json.dumps(r))
    return r

res = [run("one call", 1, 1), run("16 segs, 1 thread", 16, 1), run("16 segs, 8 threads", 16, 8),
       run("16 segs, 16 threads", 16, 16), run("16 segs, 8 threads, THP", 16, 8, thp=True),
       run("16 segs, 8 threads, prefaulted (not timed)", 16, 8, prefault=True)]
rt = TorchRuntime("cuda")
t0 = time.perf_counter()
with ThreadPoolExecutor(8) as ex:
    bufs = list(ex.map(lambda i: rt.alloc_host(SEG, torch.uint8, pinned=True), range(16)))
dt = time.perf_counter() - t0
for b in bufs: rt.free_host(b)
res.append({"label": "TorchRuntime.alloc_host, 16 segs, 8 threads", "seconds": dt, "gbps": TOTAL / dt / 1e9,
            "runtime_pinned_bytes_after_free": rt.pinned_bytes})
print(json.dumps(res[-1]))
json.dump(res, open(sys.argv[1], "w"), indent=1)
EOF
fi

if [[ "$WHAT" == *" tests "* ]]; then
  echo "=== store tests (CUDA ones included)"
  $PY -m pytest -q -p no:cacheprovider tests/store/test_store_cuda.py tests/runtime/test_torch_runtime_cuda.py tests/store/test_store_consolidate.py tests/store/test_store_offload.py \
      tests/store/test_store_errors.py tests/store/backends/test_store_pool.py 2>&1 | tee "$OUT/store_tests.txt" | tail -25
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if [[ "$WHAT" == *" segments "* ]]; then
  echo "=== allocator segments of the MoE state and the cost of returning them (empty_cache)"
  $PY - "$OUT/store_segments.json" <<'EOF2'
import json, sys, time
import torch
from sim.presets.bench_shapes import moe_shape

def segs():
    return torch.cuda.memory_stats().get("segment.all.current", 0)

res = {}
for order in ("all_at_once", "in_copy_order_with_sync"):
    torch.cuda.empty_cache(); base = segs()
    state = moe_shape().materialize(torch.device("cuda"))
    tensors = [t for g in state.values() for t in g.values()]
    torch.cuda.synchronize()
    res[order] = {"tensors": len(tensors), "segments": segs() - base}
    if order == "all_at_once":
        for t in tensors:
            t.untyped_storage().resize_(0)
    else:  # release in order, as early_release does, syncing every 1000 storages
        for i, t in enumerate(tensors):
            t.untyped_storage().resize_(0)
            if i % 1000 == 999:
                torch.cuda.synchronize()
    torch.cuda.synchronize()
    t0 = time.perf_counter(); torch.cuda.empty_cache(); dt = time.perf_counter() - t0
    res[order] |= {"segments_after_empty_cache": segs() - base, "empty_cache_s": dt,
                   "us_per_segment": dt / max(res[order]["segments"], 1) * 1e6}
    print(json.dumps({order: res[order]}))
    del state, tensors
json.dump(res, open(sys.argv[1], "w"), indent=1)
EOF2
fi

if [[ "$WHAT" == *" bench "* ]]; then
  echo "=== offload benchmark"
  # store: the defaults (pinning ahead at attach, store.consolidate() at setup, both timed and
  # reported); store_raw: no consolidation, so its first cycle collects the separately allocated tensors
  $PY -m refimpl -v bench offload --shapes dense,moe --cycles 3 --baseline-cycles 1 --line-max-gb 4 \
      --variant store_raw:consolidate=0 --methods store,store_raw,per_tensor,fresh_pin,memory_saver \
      --out "$OUT" 2>&1 | tee "$OUT/store_bench.txt" | grep -v "^INFO refimpl.store"
fi
if [[ "$WHAT" == *" expandable "* ]]; then
  echo "=== offload benchmark, MoE, unconsolidated store, expandable segments"
  mkdir -p "$OUT/offload_expandable"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    $PY -m refimpl -v bench offload --shapes moe --cycles 2 --line-max-gb 4 \
      --variant store_raw:consolidate=0 --methods store_raw \
      --out "$OUT/offload_expandable" 2>&1 | tee "$OUT/store_bench_expandable.txt" | grep -v "^INFO refimpl.store"
fi
exit $rc
