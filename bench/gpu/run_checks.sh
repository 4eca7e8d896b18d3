#!/usr/bin/env bash
# One H200, one call (about 7 minutes): every CUDA test (megatron-core from a carried wheel, NCCL 2.32.3 preloaded
# where its parts were carried), the access guard's cost on the steady cycle, and the RL step's switch in the
# given modes. From the repository root, after the five NCCL part calls of docs/gpu.md:
#   bash bench/gpu/run_checks.sh            # MODES (default "sequential overlapped streamed"), PARTS as run_switch.sh
# Writes into $OUT: cuda_tests.log, guard.log, guard_cost.json, summary.txt and switch.tgz.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/checks}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD"
if [ -d /root/ncclparts ] && python3 bench/gpu/nccl_assemble.py; then export LD_PRELOAD=/root/ncclparts/libnccl.so.2; fi
echo "LD_PRELOAD=${LD_PRELOAD:-} $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" | tee "$OUT/cuda_tests.log"
timeout -k 5 ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m cuda tests -rs >>"$OUT/cuda_tests.log" 2>&1
echo "cuda tests rc=$?"; tail -n 4 "$OUT/cuda_tests.log"
timeout -k 5 ${GUARD_TIMEOUT:-150} python3 bench/gpu/guard_cost.py --cycles 9 --out "$OUT/guard_cost.json" >"$OUT/guard.log" 2>&1
echo "guard rc=$?"; tail -n 8 "$OUT/guard.log"
OUT="$OUT/sw" PARTS="${PARTS:-rl_auto rl_dd rl_live}" BUDGET_S=${BUDGET_S:-260} bash bench/gpu/run_switch.sh | tail -n 16
cp "$OUT/sw/summary.txt" "$OUT/sw/switch.tgz" "$OUT/" 2>/dev/null
rm -rf "$OUT/sw"
