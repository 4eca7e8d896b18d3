#!/usr/bin/env bash
# The training step after a switch against a plain one, profiled, per switch mode, on one GPU. From the repo root:
#   OUT=/tmp/prof POLICY=PAUSED_LIVE MODES="overlapped streamed" [EXTRA="--batch 32 --seq 1024"] bash bench/gpu/profile_switch.sh
# Per mode: bench/gpu/rl_step.py --profile (3 steps), then bench/gpu/trace_gaps.py on its two traces (the step
# after the last switch, a plain one) and the profiler's op tables, into $OUT/gaps_<mode>.txt; the traces
# gzipped and the step's record kept ($OUT/<mode>/), the rest removed (8 files in all for two modes).
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=${PYTHONPATH:-$PWD}
OUT=${OUT:-/tmp/prof_out}
POLICY=${POLICY:-PAUSED_LIVE}
mkdir -p "$OUT"
for m in ${MODES:-overlapped streamed}; do
  d=$OUT/$m
  CUDA_VISIBLE_DEVICES=0 timeout 180 python3 -m torch.distributed.run --standalone --nproc-per-node=1 \
    bench/gpu/rl_step.py --steps 3 --policy "$POLICY" --mode "$m" --new-tokens 16 --profile ${EXTRA:-} --out "$d" >"$d.log" 2>&1
  echo "== $m rc=$?"; grep -E "^rl_step|Error" "$d.log" | tail -n 3
  { python3 bench/gpu/trace_gaps.py "$d"/profile_*.json; for t in "$d"/profile_*.txt; do echo "== $t"; cat "$t"; done; } >"$OUT/gaps_$m.txt" 2>&1
  python3 bench/gpu/trace_gaps.py "$d"/profile_*.json 2>&1 | head -n 60
  gzip -f "$d"/profile_*.json
  rm -f "$d"/profile_*.txt "$d"/*.png "$d.log"
done
