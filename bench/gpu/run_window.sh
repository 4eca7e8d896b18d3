#!/usr/bin/env bash
# A streamed reload's window (StoreConfig.stream_window_bytes) in the RL step, one GPU, stock NCCL. Repo root:
#   OUT=/tmp/w POLICY=PAUSED_LIVE WINDOWS="0 256 512 1024" bash bench/gpu/run_window.sh
# Runs the paced-copy and streamed-reload CUDA tests, then bench/gpu/rl_step.py --mode streamed per window (MiB;
# 0: every piece queued at once), and prints each run's summary line; records under $OUT/w<MiB>/.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=${PYTHONPATH:-$PWD}
OUT=${OUT:-/tmp/window_out}
mkdir -p "$OUT"
python3 -m pytest -q -m cuda tests/runtime/test_paced_copies.py tests/store/test_store_streamed_reload.py 2>&1 | tail -n 3
for w in ${WINDOWS:-0 256 512 1024}; do
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node=1 \
    bench/gpu/rl_step.py --steps 3 --policy "${POLICY:-PAUSED_LIVE}" --mode "${MODE:-streamed}" --new-tokens 16 \
    --stream-window-mib "$w" --out "$OUT/w$w" >"$OUT/w$w.log" 2>&1
  echo "== window ${w} MiB rc=$?"; grep -E "^rl_step world|Error" "$OUT/w$w.log" | tail -n 2
  rm -f "$OUT/w$w"/*.png "$OUT/w$w.log"
done
