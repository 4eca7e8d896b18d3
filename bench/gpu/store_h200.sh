#!/usr/bin/env bash
# The offload store on the H200 (Task C): pinning probe, CUDA tests, offload benchmark.
#
#   bash bench/gpu/store_h200.sh [probe] [tests] [bench]     (default: all three; roughly probe 0.5 min,
#                                                           tests 1.5 min, bench 4 min)
#
# * probe: cudaHostRegister throughput of 4 GiB: one call, 16 x 256 MiB segments on 1 and 8
#   threads, with transparent huge pages, pre-faulted, and through TorchRuntime.alloc_host;
#   shows whether pinning can keep up with the first offload's copies (store_pin_probe.json).
# * tests: tests/store/test_store_cuda.py (bitwise training equality on the GPU, FSDP2 on one
#   GPU, memory returned per cudaMemGetInfo, host buffers pinned, copy ordering) and the CPU
#   store tests on this machine's torch.
# * bench: `timeshare bench offload` on the dense 7B 1/8-shard state (11.8 GB, 1,164 tensors) and
#   the MoE state (18.5 GB, 25,164 tensors): the store (defaults) and four variants
#   (1 pinning thread, no device-side packing, 1 GiB host segments, host memory pinned ahead of the
#   first offload with store.pin_ahead()) against per-tensor copies
#   (verl), fresh pin_memory (ROLL Megatron), torch_memory_saver (slime/Relax) and the line rate.
#   Prints the ratio table and whether each store variant meets the issue's targets; writes
#   <date>-<device>-offload.json.
#
# Everything lands in $OUT (or bench/results). Exit status: non-zero if the tests failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
PY=${PYTHON:-python}
WHAT=" ${*:-probe tests bench} "
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
from refimpl.runtime import TorchRuntime

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
  $PY -m pytest -q -p no:cacheprovider tests/store/test_store_cuda.py tests/store/test_store_offload.py \
      tests/store/test_store_errors.py tests/store/test_store_pool.py 2>&1 | tee "$OUT/store_tests.txt" | tail -25
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if [[ "$WHAT" == *" bench "* ]]; then
  echo "=== offload benchmark"
  $PY -m refimpl -v bench offload --shapes dense,moe --cycles 3 --baseline-cycles 1 --line-max-gb 4 \
      --variant store_1thread:pin_threads=1 \
      --variant store_direct:pack_below_bytes=0 \
      --variant store_seg1g:segment_bytes=1073741824 \
      --variant store_pin_ahead:pin_ahead=1 \
      --out "$OUT" 2>&1 | tee "$OUT/store_bench.txt" | grep -v "^INFO refimpl.store"
fi
exit $rc
