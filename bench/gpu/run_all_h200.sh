#!/usr/bin/env bash
# Everything the project measures on one H200, in one call (device time is scarce).
#
# Before it: five calls that each carry one part of the compressed NCCL 2.32.3 library
# (.nccl/p00..p04) and copy it to /root/ncclparts/ (see docs/gpu.md). This script:
#   1. installs the carried wheels (.whl: zstandard, torch_memory_saver) into /tmp/site,
#   2. assembles /root/ncclparts/libnccl.so.2,
#   3. runs the store (tests + benchmark), comm (stock NCCL, then NCCL 2.32.3 preloaded),
#      the CUDA-marked tests under NCCL 2.32.3, and the dedup benchmark,
# writing logs and JSON to $OUT. Usage: bash bench/gpu/run_all_h200.sh [store] [comm] [tests] [dedup]
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
# at most 8 files come back from a call: everything is written to a work folder and packed
# into one archive under the real $OUT at the end
REAL_OUT=${OUT:-bench/results}; mkdir -p "$REAL_OUT"
export OUT=/tmp/h200_results; rm -rf "$OUT"; mkdir -p "$OUT"
WHAT=" ${*:-store comm tests dedup} "
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD"
NCCL=/root/ncclparts/libnccl.so.2
if [ -d /root/ncclparts ]; then python3 bench/gpu/nccl_assemble.py /root/ncclparts; fi
rc=0
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }

if [[ "$WHAT" == *" store "* ]]; then
  stamp "store"
  PYTHON=python3 bash bench/gpu/store_h200.sh ${STORE_PARTS:-tests bench} > "$OUT/store.log" 2>&1 || rc=1
  tail -40 "$OUT/store.log"
fi
if [[ "$WHAT" == *" comm "* ]]; then
  stamp "comm, stock NCCL"
  python3 bench/gpu/comm_h200.py > "$OUT/comm_stock.log" 2>&1 || rc=1
  tail -25 "$OUT/comm_stock.log"
  if [ -f "$NCCL" ]; then
    stamp "comm, NCCL 2.32.3 preloaded"
    python3 bench/gpu/comm_h200.py --nccl "$NCCL" > "$OUT/comm_nccl2323.log" 2>&1 || rc=1
    tail -40 "$OUT/comm_nccl2323.log"
  fi
fi
if [[ "$WHAT" == *" tests "* ]]; then
  stamp "CUDA-marked tests (NCCL 2.32.3 preloaded when present)"
  pre=""; [ -f "$NCCL" ] && pre="$NCCL"
  LD_PRELOAD="$pre" python3 -m pytest -q -p no:cacheprovider -m cuda tests > "$OUT/cuda_tests.log" 2>&1 || rc=1
  tail -15 "$OUT/cuda_tests.log"
fi
if [[ "$WHAT" == *" dedup "* ]]; then
  stamp "dedup"
  python3 bench/gpu/dedup_h200.py > "$OUT/dedup.log" 2>&1 || rc=1
  tail -25 "$OUT/dedup.log"
fi
stamp "done rc=$rc"
tar czf "$REAL_OUT/h200_results.tgz" -C "$OUT" .
exit $rc
