#!/usr/bin/env bash
# A streamed reload's window (StoreConfig.stream_window_bytes) in the RL step, one GPU, stock NCCL. Repo root:
#   OUT=/tmp/w POLICY=PAUSED_LIVE WINDOWS="0 256 512 1024" [ROUNDS=1] [TESTS=1] bash bench/gpu/run_window.sh
# Runs the paced-copy and streamed-reload CUDA tests (TESTS=0: not), then ROUNDS rounds of
# bench/gpu/rl_step.py --mode streamed per window (MiB; 0: every piece queued at once; the windows interleaved
# so a drift of the machine's speed falls on each alike), printing each run's summary line; records under
# $OUT/w<MiB>_r<round>/. EXTRA: more arguments for rl_step.py (e.g. "--batch 32 --seq 1024": a step bound by
# the device). SMS: program counts for copies on SMs, interleaved with the windows (--stream-sm-ctas; 0, the
# default: the copy engine); records of SMS > 0 under $OUT/w<MiB>_sm<N>_r<round>/.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=${PYTHONPATH:-$PWD}
OUT=${OUT:-/tmp/window_out}
mkdir -p "$OUT"
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -m cuda tests/runtime/test_paced_copies.py tests/runtime/test_sm_copies.py \
    tests/store/moves/test_store_streamed_reload.py 2>&1 | tail -n 3
fi
for r in $(seq 1 "${ROUNDS:-1}"); do
  for w in ${WINDOWS:-0 256 512 1024}; do
   for c in ${SMS:-0}; do
    d="$OUT/w${w}_r$r"; [ "$c" = 0 ] || d="$OUT/w${w}_sm${c}_r$r"
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node=1 \
      bench/gpu/rl_step.py --steps "${STEPS:-3}" --policy "${POLICY:-PAUSED_LIVE}" --mode "${MODE:-streamed}" \
      --new-tokens 16 --stream-window-mib "$w" --stream-sm-ctas "$c" ${EXTRA:-} --out "$d" >"$d.log" 2>&1
    echo "== window ${w} MiB, SM programs $c, round $r: rc=$?"; grep -E "^rl_step world|Error" "$d.log" | tail -n 2
    rm -f "$d"/*.png "$d.log"
   done
  done
done
